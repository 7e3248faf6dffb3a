"""A build that rewords what the diagnosis reads, or drops it, live: a real llama-server runs the
LoRA workload and chat clients, and exporters follow its log as it is written, one as it is,
the others through a command that rewords the RAM-cache narrative or the timing lines (INVENTED
wording, as an upstream change would write them), or drops the timing lines (a build that moves
them to debug level). A real Prometheus with the shipped rules scrapes them all:
LlamaCppServerLogChanged fires for the reworded ones, by the function that wrote the lines, and
for nothing else; every reworded line is counted, none is ignored. Without the timing lines
nothing is unrecognized, but the log accounts for none of the tokens the server's /metrics
counted: LlamaCppExporterBlind's condition holds for that exporter alone, and no request is
taken for a failure."""

from __future__ import annotations

import re
import shlex
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
import yaml
from promql import RULE_FILES, Prometheus
from realserver import ExporterProcess, LlamaServer, llama_server_binary, model_files, wait_for
from support import samples
from workload import chat_workload, seed_scenario

pytestmark = pytest.mark.real_server

# sed expressions, the lines they change in the server's log, and the functions that wrote them
REWORDED = {
    "narrative": (
        [
            "s/ - found better prompt with/ - restoring prompt with/",
            "s/updating prompt cache/refreshing the prompt cache/",
        ],
        r" - found better prompt with|updating prompt cache",
        {("srv", "load"), ("srv", "get_availabl")},
    ),
    "timings": (
        ["s/prompt eval time =/prompt processing time =/"],
        r"prompt eval time =",
        {("slot", "print_timing")},
    ),
}


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    work = tmp_path_factory.mktemp("log-changed")
    model, lora = model_files()
    server = LlamaServer(llama_server_binary(), model, lora, work / "server", n_parallel=1, ctx=4096, cache_ram=256)
    server.start()
    base = ["--llama.url", server.url, "--llama.poll-interval", "0.5"]
    exporters = {"as is": ExporterProcess([*base, "--llama.log-path", str(server.log_path)], work / "as-is").start()}
    for name, (seds, _, _) in REWORDED.items():
        cmd = f"tail -n +1 -F {shlex.quote(str(server.log_path))} | sed -u " + " ".join(f"-e '{e}'" for e in seds)
        exporters[name] = ExporterProcess([*base, "--llama.log-command", cmd], work / name).start()
    dropped = f"tail -n +1 -F {shlex.quote(str(server.log_path))} | sed -u -e '/print_timing/d'"
    exporters["no timings"] = ExporterProcess([*base, "--llama.log-command", dropped], work / "no-timings").start()
    prom = Prometheus(
        work / "prometheus",
        {
            "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
            "rule_files": [str(f) for f in RULE_FILES],
            "scrape_configs": [
                {
                    "job_name": "llamacpp",
                    "static_configs": [{"targets": [f"127.0.0.1:{e.port}" for e in exporters.values()]}],
                }
            ],
        },
    )
    try:
        prom.wait_scraped(len(exporters))
        sent = seed_scenario(server.url, seed=7) + seed_scenario(server.url, seed=8)
        sent += chat_workload(server.url, n_convs=4, turns=3, seed=5, max_tokens=24)  # 288 tokens generated
        wanted = len(sent)

        def recorded(e: ExporterProcess) -> float:
            return sum(samples(httpx.get(e.url + "/metrics", timeout=10).text, "llamacpp_requests_total").values())

        wait_for(lambda: recorded(exporters["as is"]) >= wanted, "the exporter holding every request", timeout=60)
        yield {"server": server, "exporters": exporters, "prom": prom}
    finally:
        prom.stop()
        for e in exporters.values():
            e.stop()
        server.stop()


def unrecognized(e: ExporterProcess) -> dict[tuple[str, str], float]:
    got = samples(httpx.get(e.url + "/metrics", timeout=10).text, "llamacpp_exporter_log_lines_unrecognized_total")
    return {(dict(k).get("logger", ""), dict(k).get("function", "")): v for k, v in got.items()}


def firing(prom: Prometheus) -> dict[str, set[tuple[str, str]]]:
    res = prom.query('ALERTS{alertname="LlamaCppServerLogChanged", alertstate="firing"}')["data"]["result"]
    out: dict[str, set[tuple[str, str]]] = {}
    for r in res:
        m = r["metric"]
        out.setdefault(m["instance"], set()).add((m["logger"], m["function"]))
    return out


def test_the_log_as_written_has_no_unrecognized_line_and_fires_nothing(run: dict[str, Any]) -> None:
    e = run["exporters"]["as is"]
    assert unrecognized(e) == {}
    assert f"127.0.0.1:{e.port}" not in firing(run["prom"])


@pytest.mark.parametrize("what", sorted(REWORDED))
def test_reworded_lines_are_counted_by_function_and_page(run: dict[str, Any], what: str) -> None:
    _, pattern, functions = REWORDED[what]
    e, prom = run["exporters"][what], run["prom"]
    changed = sum(
        1 for line in run["server"].log_path.read_text(errors="replace").splitlines() if re.search(pattern, line)
    )
    assert changed > 0
    wait_for(lambda: sum(unrecognized(e).values()) >= changed, f"{changed} unrecognized lines", timeout=30)
    by_function = unrecognized(e)
    print(f"{what} reworded, live: {changed} lines changed in the server's log, unrecognized {by_function}")
    assert set(by_function) == functions and sum(by_function.values()) == changed
    instance = f"127.0.0.1:{e.port}"
    wait_for(lambda: firing(prom).get(instance) == functions, f"LlamaCppServerLogChanged for {functions}", timeout=60)


def blind_condition(prom: Prometheus) -> dict[str, set[str]]:
    """LlamaCppExporterBlind's expression as shipped (without its 10 minutes), by instance: the kinds."""
    rules = yaml.safe_load(next(f for f in RULE_FILES if f.name == "llamacpp-alerts.yaml").read_text())
    (rule,) = [r for g in rules["groups"] for r in g["rules"] if r.get("alert") == "LlamaCppExporterBlind"]
    out: dict[str, set[str]] = {}
    for r in prom.query(rule["expr"])["data"]["result"]:
        out.setdefault(r["metric"]["instance"], set()).add(r["metric"]["kind"])
    return out


def finished(e: ExporterProcess) -> dict[str, float]:
    got = samples(httpx.get(e.url + "/metrics", timeout=10).text, "llamacpp_requests_finished_total")
    return {dict(k)["reason"]: v for k, v in got.items()}


def test_without_timing_lines_the_exporter_knows_it_is_blind(run: dict[str, Any]) -> None:
    blind, seeing, prom = run["exporters"]["no timings"], run["exporters"]["as is"], run["prom"]
    assert unrecognized(blind) == {}  # nothing unknown: the lines are simply not there
    # no request is taken for a failure: their endings are unknown
    ended = finished(blind)
    assert ended["unknown"] == sum(finished(seeing).values()) > 0 and ended["failed"] == ended["cancelled"] == 0
    wait_for(lambda: "generated" in blind_condition(prom).get(f"127.0.0.1:{blind.port}", set()), "blind", timeout=60)
    shares = prom.query("job_instance_model_kind:llamacpp_exporter_log_tokens:share30m")["data"]["result"]
    by = {(r["metric"]["instance"], r["metric"]["kind"]): float(r["value"][1]) for r in shares}
    print("the log's share of the server's tokens:", by)
    assert f"127.0.0.1:{seeing.port}" not in blind_condition(prom)
    assert all(by[(f"127.0.0.1:{seeing.port}", k)] > 0.9 for k in ("generated", "prompt", "prompt_cached"))
