"""End to end: real llama-servers with the LoRA workload, the exporters, a real Prometheus
scraping them and evaluating the shipped rules, a real Alertmanager delivering to a webhook
receiver run by the test. Then every PromQL expression of every dashboard panel and rule
is sent to that Prometheus and must return data, or be listed below as expected-empty with
the reason."""

from __future__ import annotations

import json
import shutil
import subprocess
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from promql import RULE_FILES, Prometheus, dashboard_expressions, free_port, metric_names, rule_expressions
from realserver import (
    ExporterProcess,
    LlamaServer,
    llama_server_binary,
    model_files,
    terminate,
    wait_for,
    wait_healthy,
)
from workload import chat_workload, rotation_workload, seed_scenario

pytestmark = pytest.mark.real_server

# Alerts whose condition is false in this short run, and why. Every other expression must
# return data.
EXPECTED_EMPTY = {
    "rule LlamaCppRamCacheMissRateHigh": "needs 20 long RAM-path prompts in 15 minutes; the run sends a few",
    "rule LlamaCppPrefillContention": "needs 10 contended requests and a 2x slowdown in 10 minutes",
    "rule LlamaCppServerDown": "both servers are up",
    "rule LlamaCppExporterDown": "both exporters are up",
    "rule LlamaCppLogStale": "the exporters read the log",
    "rule LlamaCppLogParseDrift": "every line of this build is recognised",
    "rule LlamaCppServerLogChanged": "every line of this build is recognised",
    "rule LlamaCppExporterBlind": "each exporter's log accounts for its server's tokens",
    "rule LlamaCppCacheDiagnosticsUnavailable": "every server runs at -lv 4",
    "rule LlamaCppServerLoadingTooLong": "no server is loading",
    "rule LlamaCppExporterAbsent": "the exporters are scraped",
    "rule LlamaCppServerLogsPrompts": "every server runs at -lv 4",
    "rule LlamaCppSlotsUnreachable": "/slots answers on every server",
    "rule LlamaCppEventsWriteErrors": "the exporters write no events file here",
    "rule LlamaCppServerCrashLooping": "no server restarts in this run",
    "rule LlamaCppServerFlapping": "every server answers every /health poll",
    "rule LlamaCppExporterFlapping": "every scrape succeeds",
    "rule LlamaCppExporterTargetLost": "no target leaves",
    "rule LlamaCppExporterNotReady": "every exporter is ready",
    "rule LlamaCppExporterPollerStalled": "every poller runs",
    "rule LlamaCppLatencyObjectiveNotABucket": "the exporters serve their default buckets",
    "rule LlamaCppRequestErrorsHigh": "no request fails or is cancelled in this run",
    "rule LlamaCppRequestsTruncated": "no generation fills its context in this run",
}
EXPECTED_EMPTY["dashboard llamacpp-contention / annotation Prefills above 4096 tokens"] = (
    "no prefill of more than 4096 tokens in this run (the long-prefill test is test_conversations_real.py)"
)
EXPECTED_EMPTY["dashboard llamacpp-overview / annotation llama-server restarts"] = "no server restarts in this run"
EXPECTED_EMPTY["dashboard llamacpp-overview / Unrecognized lines by function / A"] = (
    "every line of this build is recognised (the reworded lines: test_log_changed_real.py)"
)
EXPECTED_EMPTY["dashboard llamacpp-overview / Tokens per second / C"] = (
    "b11434 counts reused prompt tokens apart (prompt_tokens_cached_total): the older builds' line stays empty"
)
EXPECTED_EMPTY["dashboard llamacpp-overview / Speculative decoding: draft acceptance / A"] = (
    "no draft model in this run: unknown, never 0 (draft acceptance on real servers: test_facts_real.py)"
)
# May or may not fire, depending on how the concurrent conversations meet the slots.
MAY_BE_EMPTY = {
    "dashboard llamacpp-overview / annotation llama-server build changes": (
        "each build is marked for 5 minutes after it first appears: the run may end before or after that"
    ),
    "rule LlamaCppPromptCacheLoraMismatchReuse": "a restored entry of another LoRA is kept only on some schedules",
    # the latency alerts firing for a saturated server and not for a healthy one:
    # test_latency_alerts_real.py, on a machine otherwise quiet
    "rule LlamaCppTimePerOutputTokenSlow": "a 270M model decodes faster than 10 tokens/s, unless the machine is very busy",
    "rule LlamaCppTimeToFirstTokenSlow": (
        "four servers on a two-CPU machine: the long prompts' first tokens may wait over 10 s for most requests"
    ),
    "rule LlamaCppQueueTimeSlow": "the one-slot servers may queue requests over 5 s while the machine is busy",
    "rule LlamaCppRequestsQueueing": (
        "the run is shorter than its 10-minute window: llama-server's deferred gauge was 0 at its start, and the "
        "queue times of the last 5 minutes are those of the whole window, or none"
    ),
}


class Receiver:
    """The webhook Alertmanager delivers to."""

    def __init__(self) -> None:
        self.alerts: list[dict[str, Any]] = []
        outer = self

        class H(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802
                body = self.rfile.read(int(self.headers["Content-Length"]))
                outer.alerts.extend(json.loads(body)["alerts"])
                self.send_response(200)
                self.end_headers()

            def log_message(self, format: str, *a: Any) -> None:
                pass

        self.srv = ThreadingHTTPServer(("127.0.0.1", 0), H)
        self.url = f"http://127.0.0.1:{self.srv.server_address[1]}/alerts"
        threading.Thread(target=self.srv.serve_forever, daemon=True).start()

    def names(self) -> set[str]:
        return {a["labels"]["alertname"] for a in self.alerts if a["status"] == "firing"}


def start_alertmanager(workdir: Path, receiver_url: str) -> tuple[subprocess.Popen[Any], int]:
    binary = shutil.which("prometheus-alertmanager") or shutil.which("alertmanager")
    assert binary, "alertmanager is missing: the test set-up installs Debian's prometheus-alertmanager"
    cfg = {
        "route": {
            "receiver": "test",
            "group_by": ["alertname", "instance"],
            "group_wait": "1s",
            "group_interval": "1s",
            "repeat_interval": "1h",
        },
        "receivers": [{"name": "test", "webhook_configs": [{"url": receiver_url, "send_resolved": True}]}],
    }
    workdir.mkdir(parents=True, exist_ok=True)
    (workdir / "alertmanager.yml").write_text(yaml.safe_dump(cfg))
    port = free_port()
    log = open(workdir / "alertmanager.log", "wb")
    proc = subprocess.Popen(
        [
            binary,
            f"--config.file={workdir / 'alertmanager.yml'}",
            f"--storage.path={workdir / 'data'}",
            f"--web.listen-address=127.0.0.1:{port}",
            "--cluster.listen-address=",
        ],
        stdout=log,
        stderr=log,
        stdin=subprocess.DEVNULL,
    )
    log.close()
    wait_healthy(proc, f"http://127.0.0.1:{port}/-/ready", 30, "alertmanager")
    return proc, port


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    work = tmp_path_factory.mktemp("e2e")
    binary = llama_server_binary()
    model, lora = model_files()
    receiver = Receiver()
    am, am_port = start_alertmanager(work / "alertmanager", receiver.url)
    # a thread each: four servers on a machine of two cores, none waiting on a thread of its own
    # that the others keep off the CPU
    one = LlamaServer(binary, model, lora, work / "one", n_parallel=1, ctx=4096, cache_ram=256, threads=1).start()
    two = LlamaServer(binary, model, lora, work / "two", n_parallel=2, threads=1).start()
    # one slot each: three conversations taking turns in a cache that holds two of them
    # (thrashing), and one conversation between one-shots in a cache that is full but keeps it
    thrash = LlamaServer(binary, model, lora, work / "thrash", n_parallel=1, ctx=4096, cache_ram=90, threads=1).start()
    fits = LlamaServer(binary, model, lora, work / "fits", n_parallel=1, ctx=4096, cache_ram=160, threads=1).start()
    servers = (one, two, thrash, fits)
    exporters = [
        ExporterProcess(
            [
                *("--llama.url", s.url, "--llama.log-path", str(s.log_path), "--llama.poll-interval", "0.5"),
                *("--events.path", str(s.workdir / "events.jsonl")),  # its write-error counter exists with it
            ],
            s.workdir,
        ).start()
        for s in servers
    ]
    prom = Prometheus(
        work / "prometheus",
        {
            "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
            "rule_files": [str(f) for f in RULE_FILES],
            "alerting": {"alertmanagers": [{"static_configs": [{"targets": [f"127.0.0.1:{am_port}"]}]}]},
            "scrape_configs": [
                {"job_name": "llamacpp", "static_configs": [{"targets": [f"127.0.0.1:{e.port}" for e in exporters]}]},
                # another job of the same Prometheus with a target that is down: not ours to count
                {"job_name": "other", "static_configs": [{"targets": [f"127.0.0.1:{free_port()}"]}]},
            ],
        },
    )
    try:
        prom.wait_scraped(len(exporters))  # the zeroed counters are recorded before any request
        truths: dict[str, list[Any]] = {}
        rotations = [
            threading.Thread(
                target=lambda: truths.setdefault("thrash", rotation_workload(thrash.url, 3, 0, 5, seed=3))
            ),
            threading.Thread(target=lambda: truths.setdefault("fits", rotation_workload(fits.url, 1, 1, 5, seed=4))),
        ]
        for t in rotations:
            t.start()
        sent_one = seed_scenario(one.url, seed=7) + seed_scenario(one.url, seed=8)
        sent_two = chat_workload(two.url, turns=3, seed=19)
        for t in rotations:
            t.join()
        sent = (sent_one, sent_two, truths["thrash"], truths["fits"])  # in the order of servers
        # every request answered is a record in Prometheus, however slow the machine
        want = {f"127.0.0.1:{e.port}": len(s) for s, e in zip(sent, exporters, strict=True)}

        def recorded() -> dict[str, int]:
            res = prom.query("sum by (instance) (llamacpp_requests_total)")["data"]["result"]
            return {r["metric"]["instance"]: round(float(r["value"][1])) for r in res}

        wait_for(lambda: recorded() == want, f"Prometheus holding every request ({want})", timeout=120)
        yield {"prom": prom, "receiver": receiver, "exporters": exporters, "truths": truths}
    finally:
        prom.stop()
        for e in exporters:
            e.stop()
        for srv in servers:
            srv.stop()
        terminate(am)
        receiver.srv.shutdown()


def test_wrongful_lora_discard_alert_reaches_the_receiver(stack: dict[str, Any]) -> None:
    receiver = stack["receiver"]
    seed_server = f"127.0.0.1:{stack['exporters'][0].port}"  # the one-slot server that ran the seed scenario

    def arrived() -> list[dict[str, Any]]:
        return [
            a
            for a in receiver.alerts
            if a["labels"]["alertname"] == "LlamaCppPromptCacheWrongfulLoraDiscard"
            and a["labels"]["instance"] == seed_server
            and a["status"] == "firing"
        ]

    alert = wait_for(arrived, f"the alert at the receiver (received: {len(receiver.alerts)})", 60, 0.5)[0]
    assert alert["labels"]["severity"] == "warning" and alert["labels"]["lora"] == "active"
    assert alert["annotations"]["runbook_url"].endswith("#llamacpppromptcachewrongfulloradiscard")
    assert "re-prefilled for nothing" in alert["annotations"]["description"]


def test_every_dashboard_and_rule_expression_returns_data(stack: dict[str, Any]) -> None:
    prom: Prometheus = stack["prom"]
    problems = []
    for e in dashboard_expressions() + rule_expressions():
        res = prom.query(e.promql)
        if res["status"] != "success":
            problems.append(f"{e.where}: {res.get('error')}")
            continue
        empty = not res["data"]["result"]
        if empty and e.where not in EXPECTED_EMPTY and e.where not in MAY_BE_EMPTY:
            problems.append(f"{e.where}: no data")
        if not empty and e.where in EXPECTED_EMPTY:
            problems.append(f"{e.where}: expected empty ({EXPECTED_EMPTY[e.where]}) but returned data")
    assert not problems, "\n".join(problems)


def test_servers_down_under_all_jobs_counts_only_the_exporters_jobs(stack: dict[str, Any]) -> None:
    """Grafana's All for $job is the values of label_values(llamacpp_up, job) joined, as Grafana
    does for a Prometheus regex; the other job's down target is not a server down."""
    prom: Prometheus = stack["prom"]
    jobs = httpx.get(prom.url + "/api/v1/label/job/values", params={"match[]": "llamacpp_up"}, timeout=10).json()[
        "data"
    ]
    assert jobs == ["llamacpp"]
    wait_for(
        lambda: prom.query('up{job="other"} == 0')["data"]["result"], "the other job's target scraped and down", 30
    )
    (e,) = [e for e in dashboard_expressions() if e.where == "dashboard llamacpp-overview / Servers down / A"]
    all_jobs = "(" + "|".join(jobs) + ")"

    def value(job_regex: str) -> float:
        promql = e.expr.replace("$job", job_regex).replace("$instance", ".+").replace("$model", ".*")
        promql = promql.replace("$cluster", ".*").replace("$namespace", ".*")
        return float(prom.query(promql)["data"]["result"][0]["value"][1])

    assert value(all_jobs) == 0
    assert value(".+") >= 1  # what the old allValue counted


def test_dashboards_and_rules_name_only_metrics_the_exporters_serve(stack: dict[str, Any]) -> None:
    served = set()
    for e in stack["exporters"]:
        for line in e.metrics_text().splitlines():
            if line and not line.startswith("#"):
                served.add(line.split("{", 1)[0].split(" ", 1)[0])
            elif line.startswith("# TYPE "):  # a family declared with no series yet (no line unrecognized)
                served.add(line.split(" ")[2])
    recorded = {e.where.removeprefix("rule ") for e in rule_expressions() if ":" in e.where}
    for e in dashboard_expressions() + rule_expressions():
        for m in metric_names(e.expr):
            assert m in served or m in recorded, f"{e.where}: {m}"


def test_exemplars_reach_prometheus(stack: dict[str, Any]) -> None:
    prom: Prometheus = stack["prom"]
    r = httpx.get(
        prom.url + "/api/v1/query_exemplars",
        params={"query": "llamacpp_prefill_duration_seconds_bucket", "start": time.time() - 600, "end": time.time()},
        timeout=10,
    ).json()
    assert r["status"] == "success"
    labels = [ex["labels"] for series in r["data"] for ex in series["exemplars"]]
    assert labels and all({"slot", "task"} <= set(lab) for lab in labels)


def test_thrashing_shows_for_evicted_conversations_and_not_for_a_full_healthy_cache(stack: dict[str, Any]) -> None:
    """The thrashing rule's condition holds for the server whose conversations came back after
    eviction (the responses say: cache_n 0 on every return) and not for the server whose cache
    is full and evicts, but whose returning conversation always hits."""
    prom: Prometheus = stack["prom"]
    thrash, fits = (f"127.0.0.1:{e.port}" for e in stack["exporters"][2:4])
    truths = stack["truths"]
    returns_missed = [t for t in truths["thrash"] if t.turn > 0 and t.cache_n == 0]
    assert len(returns_missed) >= 10, truths["thrash"]
    assert all(t.cache_n > 0 for t in truths["fits"] if t.turn > 0), truths["fits"]

    def value(q: str, instance: str) -> float:
        res = prom.query(q)["data"]["result"]
        return sum(float(r["value"][1]) for r in res if r["metric"].get("instance") == instance)

    evicted = 'sum by (instance) (increase(llamacpp_prompt_cache_misses_total{cause="evicted"}[15m]))'
    assert round(value(evicted, thrash)) == len(returns_missed)
    assert value(evicted, fits) == 0
    assert value("sum by (instance) (increase(llamacpp_prompt_cache_evictions_total[15m]))", fits) > 0
    # three conversations of 33-41 MiB entries taking turns: a cache twice the 90 MiB holds all
    # three, so the dashboard's larger-cache panel says 2x would have avoided every one of them
    avoidable = (
        'sum by (instance) (increase(llamacpp_prompt_cache_evicted_misses_avoidable_total{cache_ram="2x"}[15m]))'
    )
    assert round(value(avoidable, thrash)) == len(returns_missed)
    assert value(avoidable, fits) == 0
    (rule,) = [e for e in rule_expressions() if e.where == "rule LlamaCppPromptCacheThrashing"]
    firing = {r["metric"]["instance"] for r in prom.query(rule.promql)["data"]["result"]}
    assert firing == {thrash}
