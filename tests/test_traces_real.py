"""Each request's trace from a real llama-server (real model, real LoRA adapter), received by a
real OTLP receiver (oteltap): one trace per response, whose prefill and decode spans last what
the response's timings say, whose attributes are the response's token counts and the LoRA it
asked for, whose exemplars lead to it, and which holds none of the prompts' text."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest
from otlp_receiver import OtlpReceiver, ReceivedSpan
from realserver import LlamaServer
from support import start_exporter, wait_records
from workload import CANARY, chat_workload

pytestmark = pytest.mark.real_server


def test_a_real_servers_requests_arrive_as_traces_equal_to_the_responses(
    parts: tuple[Path, Path, Path], tmp_path: Path
) -> None:
    tap = OtlpReceiver(tmp_path / "tap").start()
    srv = LlamaServer(*parts, workdir=tmp_path, n_parallel=2).start()
    exp = None
    try:
        exp = start_exporter(srv, tmp_path, "--traces.otlp-endpoint", tap.url)
        truths = chat_workload(srv.url, n_convs=4, turns=3)
        recs = wait_records(tmp_path / "events.jsonl", len(truths))
        roots = tap.wait_roots(len(truths))
        openmetrics = httpx.get(exp.url + "/metrics", headers={"Accept": "application/openmetrics-text"}).text
    finally:
        if exp is not None:
            exp.stop()
        srv.stop()
        tap.stop()
    spans = tap.spans()
    assert len(roots) == len(recs) == len(truths)
    by_trace: dict[str, dict[str, ReceivedSpan]] = {}
    for s in spans:
        by_trace.setdefault(s.trace_id, {})[s.name.split(" ")[0]] = s
    matched = set()
    queued = 0
    for t in truths:
        (trace,) = [
            tr
            for tr in by_trace.values()
            if abs(tr["prefill"].seconds * 1000 - t.prompt_ms) <= 0.0051 + 0.002
            and abs(tr["decode"].seconds * 1000 - t.predicted_ms) <= 0.0051 + 0.002
        ]
        a = trace["text_completion"].attributes
        # ... and the record's queue, where the log pins the arrival
        (rec,) = [r for r in recs if r["task"] == a["llamacpp.task"] and r["slot"] == a["llamacpp.slot"]]
        if rec["queue_seconds"] is not None:
            assert abs(trace["queue"].seconds - rec["queue_seconds"]) <= 2e-6
            queued += 1
        assert (a["llamacpp.prompt.computed_tokens"], a["llamacpp.prompt.reused_tokens"]) == (t.prompt_n, t.cache_n)
        assert a["gen_ai.usage.output_tokens"] == t.predicted_n
        assert a["gen_ai.usage.input_tokens"] == t.prompt_n + t.cache_n
        assert a["llamacpp.lora"] == t.lora
        # the request span holds its children, at wall-clock times within the client's
        root = trace["text_completion"]
        assert root.start_ns <= trace["prefill"].start_ns < trace["decode"].end_ns <= root.end_ns
        assert t.t_start - 1.0 <= root.start_ns / 1e9 and root.end_ns / 1e9 <= t.t_end + 1.0
        matched.add(root.trace_id)
    assert len(matched) == len(truths)
    # the latency exemplars name traces that arrived
    ids = [line.split('trace_id="')[1][:32] for line in openmetrics.splitlines() if 'trace_id="' in line]
    assert ids and set(ids) <= matched
    # no prompt or completion text in any span, event or link, nor in the exporter's log
    assert CANARY not in tap.text()
    assert exp is not None and CANARY not in exp.stderr_path.read_text()
    links = sum(len(s.links) for s in spans)
    print(
        f"{len(truths)} responses, {len(roots)} traces ({len(spans)} spans, {links} links, {queued} queue spans), "
        f"{len(ids)} exemplars"
    )
