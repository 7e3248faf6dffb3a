"""Each request as a trace (export/traces.py, export/otlp.py): on recorded real logs, the spans'
durations are the records', their attributes the responses' timings, their links the prefills
that really overlapped; then through a real OTLP receiver (oteltap, from PyPI): analyze --otlp,
the live exporter, and a collector that is down, then slow."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from otlp_receiver import OtlpReceiver, ReceivedSpan
from realserver import ExporterProcess, free_port, wait_for
from support import LOGS, by_timings, log_lines, replay_records, truths, wait_records

from llamacpp_exporter.export.traces import Span, span_id, spans_of, trace_id, trace_id_hex
from llamacpp_exporter.records import RecordKey, RequestRecord

PILEUPS = "b11434-lv4-np4-pileups.log"
CONTENTION = "lv4-np2-contention.log"
US = 1e-6  # spans are placed at microseconds; a duration rounds at most one off


def by_name(spans: list[Span]) -> dict[str, Span]:
    return {s.name.split(" ")[0]: s for s in spans}


def secs(s: Span) -> float:
    return (s.end_ns - s.start_ns) / 1e9


@pytest.mark.parametrize("log", [PILEUPS, CONTENTION])
def test_a_trace_has_the_records_queue_prefill_and_decode_and_the_responses_timings(log: str) -> None:
    recs, _ = replay_records(log_lines(log))
    checked = 0
    for t in truths(log.replace(".log", ".truth.jsonl")):
        rec = by_timings(recs, t)
        spans = by_name(spans_of(rec, offset_us=1_000_000))
        root = spans["text_completion"]
        assert root.parent_id is None and root.server
        assert all(s.parent_id == root.span_id and s.trace_id == root.trace_id for s in spans.values() if s is not root)
        assert abs(secs(spans["prefill"]) - t["prompt_ms"] / 1000) <= 0.0051e-3 + 2 * US
        assert abs(secs(spans["decode"]) - t["predicted_ms"] / 1000) <= 0.0051e-3 + 2 * US
        a = root.attributes
        assert (a["llamacpp.prompt.computed_tokens"], a["llamacpp.prompt.reused_tokens"]) == (
            t["prompt_n"],
            t["cache_n"],
        )
        assert (a["gen_ai.usage.input_tokens"], a["gen_ai.usage.output_tokens"]) == (
            t["prompt_n"] + t["cache_n"],
            t["predicted_n"],
        )
        if rec.queue_seconds is not None:
            assert abs(secs(spans["queue"]) - rec.queue_seconds) <= US
            assert spans["queue"].end_ns == root.start_ns + round(rec.queue_seconds * 1e6) * 1000
            assert abs(secs(root) - float(a["gen_ai.latency.e2e"])) <= US  # the end-to-end histogram's value
        # the children lie within the request, one after the other
        assert root.start_ns <= spans["prefill"].start_ns <= spans["prefill"].end_ns == spans["decode"].start_ns
        assert spans["decode"].end_ns <= root.end_ns
        checked += 1
    assert checked == len(truths(log.replace(".log", ".truth.jsonl"))) > 0
    print(f"{log}: {checked} traces equal the responses' timings")


def test_the_links_name_exactly_the_prefills_that_overlapped_each_decoding() -> None:
    """Computed apart from the exporter's timeline: every other request's prefill span (from its
    own record) that intersects a decode span is linked from it, with the overlap in seconds."""
    recs, _ = replay_records(log_lines(PILEUPS))
    traces = {r.key: by_name(spans_of(r, 0)) for r in recs}
    prefills = {k: (r.slot, s["prefill"]) for r in recs if "prefill" in (s := traces[(k := r.key)])}
    linked = named = 0
    for r in recs:
        decode = traces[r.key].get("decode")
        if decode is None:
            continue
        expected: dict[tuple[int, int], float] = {}
        for key, (slot, p) in prefills.items():
            overlap = min(p.end_ns, decode.end_ns) - max(p.start_ns, decode.start_ns)
            if slot != r.slot and overlap > 0:
                expected[(trace_id(key), span_id(key, "prefill"))] = overlap / 1e9
        got = {(link.trace_id, link.span_id): link.attributes["llamacpp.overlap_seconds"] for link in decode.links}
        assert got.keys() == expected.keys(), r.task
        for ids, seconds in got.items():
            assert abs(float(seconds) - expected[ids]) <= 1e-5, r.task
        linked += len(got)
        named += bool(got)
    assert named >= 10, named  # a contention run: most decodings overlapped another's prefill
    print(f"{PILEUPS}: {linked} links from {named} decodings, each to the prefill that overlapped it")


def test_the_same_request_gets_the_same_ids_and_requests_never_share_them() -> None:
    a, _ = replay_records(log_lines(PILEUPS))
    b, _ = replay_records(log_lines(PILEUPS))
    ids = [(s.trace_id, s.span_id) for r in a for s in spans_of(r, 0)]
    assert ids == [(s.trace_id, s.span_id) for r in b for s in spans_of(r, 7)]  # the offset moves times only
    assert len(set(ids)) == len(ids) and len({t for t, _ in ids}) == len(a)
    key = RecordKey("", 1, 2, 3)
    assert trace_id_hex(key) == f"{trace_id(key):032x}" and len(trace_id_hex(key)) == 32


def test_embeddings_are_their_own_spans_and_n_gt_1_is_one_request() -> None:
    recs, _ = replay_records(log_lines("lv4-np2-mixed-kinds.log"))
    embeddings = [r for r in recs if r.kind == "embedding"]
    assert len(embeddings) >= 4
    for r in embeddings:
        (root,) = spans_of(r, 0)
        assert root.name == "embeddings" and root.attributes["gen_ai.operation.name"] == "embeddings"
        assert r.start_us is not None and r.end_us is not None
        assert (root.start_ns, root.end_ns) == (r.start_us * 1000, r.end_us * 1000)
    (several,) = [r for r in recs if r.choices > 1]
    spans = spans_of(several, 0)
    assert sum(s.server for s in spans) == 1 and spans[0].attributes["gen_ai.request.choice.count"] == several.choices


def test_the_service_is_llama_server_unless_the_standard_variables_name_it(monkeypatch: pytest.MonkeyPatch) -> None:
    from llamacpp_exporter.export.otlp import _resource

    monkeypatch.delenv("OTEL_SERVICE_NAME", raising=False)
    monkeypatch.delenv("OTEL_RESOURCE_ATTRIBUTES", raising=False)
    assert _resource().attributes["service.name"] == "llama-server"
    monkeypatch.setenv("OTEL_RESOURCE_ATTRIBUTES", "service.name=from-attributes,deployment.environment=prod")
    assert _resource().attributes["service.name"] == "from-attributes"
    monkeypatch.setenv("OTEL_SERVICE_NAME", "llama-eu-1")
    resource = _resource()
    assert resource.attributes["service.name"] == "llama-eu-1"
    assert resource.attributes["deployment.environment"] == "prod"


def test_a_record_without_timings_is_a_request_span_alone_and_a_failed_one_an_error() -> None:
    r = RequestRecord(epoch=0, slot=0, task=5, start_us=100, end_us=900, failed=True)
    (only,) = spans_of(r, 0)
    assert only.server and only.error and only.attributes["llamacpp.finish_reason"] == "failed"
    assert (only.start_ns, only.end_ns) == (100_000, 900_000)
    assert spans_of(RequestRecord(epoch=0, slot=0, task=5), 0) == []  # no launch time: no trace


def test_a_span_carries_the_records_numbers_and_words_and_nothing_else() -> None:
    """Span and event names come from a fixed set; every string a span carries is one of its
    record's own string fields (fixed words, LoRA scales, pseudonyms) or a fixed word. A record
    holds no text of a prompt or a completion (test_privacy_real.py sends a canary through a real
    server at -lv 3, 4 and 5), so no span can."""
    fixed = {"llama.cpp", "text_completion", "embeddings", "stop", "truncated", "cancelled", "failed", "unknown"}
    names = {"text_completion", "embeddings", "queue", "prefill", "decode"}
    events = {"slot selected", "prompt cache restored", "context shift"}
    for log in (PILEUPS, CONTENTION, "lv4-np2-mixed-kinds.log", "lv4-np1-seed-scenario.log"):
        recs, _ = replay_records(log_lines(log))
        for r in recs:
            words = {v for v in dataclasses.asdict(r).values() if isinstance(v, str)} | fixed
            for sp in spans_of(r, 0):
                assert sp.name in names, sp.name
                assert {e.name for e in sp.events} <= events
                values = [*sp.attributes.values(), *(v for e in sp.events for v in e.attributes.values())]
                values += [v for link in sp.links for v in link.attributes.values()]
                assert all(not isinstance(v, str) or v in words for v in values), (log, r.task, sp.attributes)


# ------------------------------------------------------------ through a real OTLP receiver
def _check_received(roots: list[ReceivedSpan], spans: list[ReceivedSpan], recs: list[dict[str, Any]]) -> None:
    by_trace: dict[str, list[ReceivedSpan]] = {}
    for s in spans:
        by_trace.setdefault(s.trace_id, []).append(s)
    assert len({r.trace_id for r in roots}) == len(recs)
    for rec in recs:
        key = RecordKey(rec["model"], rec["slot"], rec["task"], rec["start_us"])
        got = {s.name.split(" ")[0]: s for s in by_trace[trace_id_hex(key)]}
        if rec["prefill_seconds"] is not None and rec["decode_seconds"] is not None:
            assert abs(got["prefill"].seconds - rec["prefill_seconds"]) <= 2 * US
            assert abs(got["decode"].seconds - rec["decode_seconds"]) <= 2 * US
        if rec["queue_seconds"] is not None:
            assert abs(got["queue"].seconds - rec["queue_seconds"]) <= 2 * US
        assert got["text_completion"].attributes["llamacpp.task"] == rec["task"]


@pytest.mark.integration
def test_analyze_sends_one_trace_per_request_at_the_logs_times_and_again_the_same(tmp_path: Path) -> None:
    tap = OtlpReceiver(tmp_path / "tap").start()
    try:
        log = LOGS / PILEUPS
        out = tmp_path / "records.jsonl"
        cmd = [sys.executable, "-m", "llamacpp_exporter", "analyze", str(log), "--otlp", tap.url, "--format", "json"]
        first = subprocess.run([*cmd, "--records", str(out)], capture_output=True, text=True, timeout=120)
        assert first.returncode == 0, first.stderr
        recs = [json.loads(x) for x in out.read_text().splitlines()]
        assert f"traces of {len(recs)} requests sent to {tap.url}/v1/traces" in first.stderr
        roots = tap.wait_roots(len(recs))
        spans = tap.spans()
        _check_received(roots, spans, recs)
        # at the log's own times: the last request ended at the file's modification time
        last_end = max(r.end_ns for r in roots)
        assert abs(last_end / 1e9 - os.path.getmtime(log)) < 0.01
        # every link leads to a span of the same log
        ids = {(s.trace_id, s.span_id) for s in spans}
        links = [(t, s) for sp in spans for t, s, _ in sp.links]
        assert links and all(link in ids for link in links)
        # a time window: only the requests started in it (here none: the log is from after 2000)
        none = subprocess.run([*cmd, "--until", "2000-01-01"], capture_output=True, text=True, timeout=120)
        assert none.returncode == 0 and "traces of 0 requests sent" in none.stderr, none.stderr
        # sent again: the same traces, the same spans, nothing new to hold
        again = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
        assert again.returncode == 0, again.stderr
        wait_for(lambda: len(tap.spans()) >= 2 * len(spans), "the second send", 30, 0.1)
        assert {(s.trace_id, s.span_id, s.start_ns, s.end_ns) for s in tap.spans()} == {
            (s.trace_id, s.span_id, s.start_ns, s.end_ns) for s in spans
        }
    finally:
        tap.stop()
    print(f"analyze --otlp: {len(recs)} traces, {len(spans)} spans, {len(links)} links; sent twice, the same ids")


@pytest.mark.integration
def test_analyze_says_when_the_collector_did_not_take_the_traces_and_still_reports(tmp_path: Path) -> None:
    url = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    done = subprocess.run(
        [sys.executable, "-m", "llamacpp_exporter", "analyze", str(LOGS / PILEUPS), "--otlp", url, "--format", "json"],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "OTEL_EXPORTER_OTLP_TRACES_TIMEOUT": "2"},
    )
    assert done.returncode == 1
    assert f"the OTLP collector at {url}/v1/traces did not take the traces of 34 requests" in done.stderr
    assert json.loads(done.stdout)["requests"]["total"] == 34  # the report is there all the same
    bad = subprocess.run(
        [sys.executable, "-m", "llamacpp_exporter", "analyze", str(LOGS / PILEUPS), "--otlp", "tempo:4318"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert bad.returncode == 2 and "--otlp: give an http:// or https:// URL" in bad.stderr
    # a password in the collector's URL is never printed
    secret = f"http://user:Sekr1tPw@127.0.0.1:{free_port()}"
    done = subprocess.run(
        [sys.executable, "-m", "llamacpp_exporter", "analyze", str(LOGS / PILEUPS), "--otlp", secret],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "OTEL_EXPORTER_OTLP_TRACES_TIMEOUT": "2"},
    )
    assert done.returncode == 1 and "user:xxxxx@" in done.stderr and "Sekr1tPw" not in done.stderr + done.stdout


def _write_slowly(path: Path, lines: list[str], parts: int = 6, pause: float = 0.3) -> None:
    """The recorded log appended in parts, as a server writes it."""
    step = len(lines) // parts + 1
    for i in range(0, len(lines), step):
        with open(path, "a", encoding="utf-8") as fh:
            fh.write("\n".join(lines[i : i + step]) + "\n")
        time.sleep(pause)


def _exporter(tmp_path: Path, log: Path, endpoint: str | None, env: dict[str, str] | None = None) -> ExporterProcess:
    """endpoint None: the standard variables in env say where traces go."""
    log.touch()
    return ExporterProcess(
        ["--llama.url", f"http://127.0.0.1:{free_port()}", "--llama.log-path", str(log)]
        + ["--events.path", str(tmp_path / "events.jsonl")]
        + (["--traces.otlp-endpoint", endpoint] if endpoint else []),
        tmp_path / "exporter",
        env={**os.environ, **(env or {})},
    ).start()


def _counted(text: str, result: str) -> float:
    prefix = f'llamacpp_exporter_traces_total{{result="{result}"}} '
    return sum(float(line[len(prefix) :]) for line in text.splitlines() if line.startswith(prefix))


@pytest.mark.integration
def test_the_live_exporter_sends_each_trace_and_its_exemplars_lead_to_it(tmp_path: Path) -> None:
    tap = OtlpReceiver(tmp_path / "tap").start()
    log = tmp_path / "llama-server.log"
    exp = _exporter(tmp_path, log, tap.url)
    try:
        exp.wait_following()
        t0 = time.time()
        _write_slowly(log, log_lines(PILEUPS))
        recs = wait_records(tmp_path / "events.jsonl", 34)
        roots = tap.wait_roots(len(recs))
        _check_received(roots, tap.spans(), recs)
        # placed in wall-clock time by when its lines were read: the recorded run's last request
        # ended when its last lines were written here (the log's earlier times go back from it)
        assert t0 <= max(r.end_ns for r in roots) / 1e9 <= time.time()
        om = httpx.get(exp.url + "/metrics", headers={"Accept": "application/openmetrics-text"}).text
        exemplars = [line for line in om.splitlines() if "_bucket" in line and "trace_id=" in line]
        trace_ids = {r.trace_id for r in roots}
        assert exemplars and all(line.split('trace_id="')[1][:32] in trace_ids for line in exemplars)
        assert _counted(exp.metrics_text(), "sent") == len(recs)
    finally:
        exp.stop()
        tap.stop()
    print(f"live: {len(recs)} records, {len(roots)} traces, {len(exemplars)} exemplars with a trace id")


@pytest.mark.integration
def test_a_collector_down_then_slow_costs_no_record_and_no_scrape(tmp_path: Path) -> None:
    lines = log_lines(PILEUPS)
    # down: nothing listens at the endpoint
    log = tmp_path / "down" / "llama-server.log"
    log.parent.mkdir()
    exp = _exporter(log.parent, log, f"http://127.0.0.1:{free_port()}")
    scrapes: list[float] = []
    try:
        exp.wait_following()
        _write_slowly(log, lines)
        recs = wait_records(log.parent / "events.jsonl", 34)
        for _ in range(5):
            t = time.monotonic()
            text = exp.metrics_text()
            scrapes.append(time.monotonic() - t)
        wait_for(lambda: _counted(exp.metrics_text(), "failed") == len(recs), "the failed traces counted", 30, 0.2)
        assert "did not take" in exp.stderr_path.read_text()
    finally:
        exp.stop()
    assert len(recs) == 34 and max(scrapes) < 1.0, scrapes
    # slow: the collector accepts connections and answers none (stopped); each send waits the
    # OTLP timeout, on the sender's thread only
    tap = OtlpReceiver(tmp_path / "tap").start()
    tap.pause()
    log = tmp_path / "slow" / "llama-server.log"
    log.parent.mkdir()
    exp = _exporter(log.parent, log, tap.url, env={"OTEL_EXPORTER_OTLP_TRACES_TIMEOUT": "3"})
    try:
        exp.wait_following()
        started = time.monotonic()
        _write_slowly(log, lines)
        recs = wait_records(log.parent / "events.jsonl", 34, timeout=20)
        records_after = time.monotonic() - started
        while time.monotonic() - started < 4:  # scrapes while a send hangs
            t = time.monotonic()
            text = exp.metrics_text()
            scrapes.append(time.monotonic() - t)
            time.sleep(0.2)
        assert "llamacpp_requests_total" in text
        wait_for(lambda: _counted(exp.metrics_text(), "failed") > 0, "the timed-out send counted", 30, 0.2)
        tap.resume()
        _write_slowly(log, lines[-400:], parts=1)  # more lines: the sender goes on once answered
    finally:
        exp.stop()
        tap.stop()
    assert len(recs) == 34 and records_after < 10 and max(scrapes) < 1.0, (records_after, max(scrapes))
    print(f"collector down, then slow: 34 records each time, slowest scrape {max(scrapes) * 1000:.0f} ms")


@pytest.mark.integration
def test_an_exporter_restarted_mid_log_sends_each_trace_once(tmp_path: Path) -> None:
    """Stopped half-way through the log and started again (its read position kept next to the
    events file): the requests in flight at the stop go out after the restart, each request's
    trace once, with the same ids a replay gives. Traces asked for by the standard variable
    alone (OTEL_EXPORTER_OTLP_ENDPOINT), no flag."""
    lines = log_lines(PILEUPS)
    tap = OtlpReceiver(tmp_path / "tap").start()
    log = tmp_path / "llama-server.log"
    env = {"OTEL_EXPORTER_OTLP_ENDPOINT": tap.url}
    try:
        first = _exporter(tmp_path, log, None, env)
        first.wait_following()
        _write_slowly(log, lines[: len(lines) // 2], parts=3)
        n_first = len(wait_records(tmp_path / "events.jsonl", 10))
        first.stop()
        second = _exporter(tmp_path, log, None, env)
        _write_slowly(log, lines[len(lines) // 2 :], parts=3)  # the server writes on
        recs = wait_records(tmp_path / "events.jsonl", 34)
        roots = tap.wait_roots(34)
        time.sleep(1.5)  # a second send would come within the sender's interval
        roots = tap.roots()
        second.stop()
    finally:
        tap.stop()
    assert f"sending each request's trace over OTLP/HTTP to {tap.url}/v1/traces" in first.stderr_path.read_text()
    replayed, _ = replay_records(lines)
    assert len(recs) == 34 and len(roots) == 34, (len(recs), len(roots))
    assert {r.trace_id for r in roots} == {trace_id_hex(r.key) for r in replayed}
    print(f"restart after {n_first} records: 34 records, 34 traces, each once")
