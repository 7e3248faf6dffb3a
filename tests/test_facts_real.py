"""Two facts llama-server logs per request, against real servers: context shift (a small context,
`--context-shift`, long answers) and speculative decoding's draft acceptance (a draft model),
each exact against what the log and the responses say, in the records, `/metrics` and analyze."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import httpx
import pytest
from realserver import B11549, LlamaServer, llama_server_binary, model_files, tiny_llama_file
from support import samples, start_exporter, wait_records

from llamacpp_exporter.assemble.finish import AssemblySettings
from llamacpp_exporter.offline import analyze, report

pytestmark = pytest.mark.real_server

N_CTX = 256


def _complete(url: str, n_predict: int, **extra: Any) -> dict[str, Any]:
    body = {"prompt": "Tell me a long story " * 5, "n_predict": n_predict, "ignore_eos": True, "temperature": 0}
    r = httpx.post(url + "/completion", json={**body, **extra}, timeout=120)
    r.raise_for_status()
    answer: dict[str, Any] = r.json()
    return answer


def test_context_shifts_are_counted_per_request_as_the_log_and_the_responses_say(tmp_path: Path) -> None:
    # a llama-architecture model: Gemma 3's sliding-window attention turns KV shifting off
    srv = LlamaServer(
        llama_server_binary(),
        tiny_llama_file(),
        None,
        tmp_path / "srv",
        n_parallel=1,
        ctx=N_CTX,
        extra=["--context-shift"],
    ).start()
    try:
        exp = start_exporter(srv, tmp_path)
        try:
            answers = [_complete(srv.url, n) for n in (40, 700, 300, 20)]
            recs = sorted(wait_records(tmp_path / "events.jsonl", len(answers)), key=lambda r: r["start_us"])
            text = exp.metrics_text()
        finally:
            exp.stop()
    finally:
        srv.stop()
    log = srv.log_path.read_text()
    # the log's own account, read independently: each task's shifts and its slot's tokens at release
    shifts: dict[int, list[int]] = {}
    for task, n in re.findall(r"task (\d+) \| slot context shift, n_keep = \d+, n_left = \d+, n_discard = (\d+)", log):
        shifts.setdefault(int(task), []).append(int(n))
    released = {int(t): int(n) for t, n in re.findall(r"task (\d+) \| stop processing: n_tokens = (\d+)", log)}
    assert len(recs) == len(answers)
    for rec, a in zip(recs, answers, strict=True):
        t = a["timings"]
        assert (rec["prompt_tokens"], rec["generated_tokens"]) == (t["cache_n"] + t["prompt_n"], t["predicted_n"])
        went_past = t["cache_n"] + t["prompt_n"] + t["predicted_n"] > N_CTX
        assert rec["context_shifts"] == len(shifts.get(rec["task"], [])) and (rec["context_shifts"] > 0) == went_past
        assert rec["context_shift_discarded_tokens"] == sum(shifts.get(rec["task"], []))
        # what the slot holds at the end: every token processed (the last one sampled, not decoded), less those dropped
        kept = t["cache_n"] + t["prompt_n"] + t["predicted_n"] - 1 - rec["context_shift_discarded_tokens"]
        assert kept == released[rec["task"]], (rec["task"], kept)
        assert rec["draft_tokens_generated"] is None and rec["draft_acceptance"] is None  # no draft model
    shifted = [r for r in recs if r["context_shifts"]]
    assert len(shifted) == 2
    assert samples(text, "llamacpp_requests_context_shifted_total") == {(): 2.0}
    assert samples(text, "llamacpp_context_shifts_total") == {(): float(sum(len(v) for v in shifts.values()))}
    discarded = sum(r["context_shift_discarded_tokens"] for r in recs)
    assert samples(text, "llamacpp_context_shift_discarded_tokens_total") == {(): float(discarded)}
    assert not samples(text, "llamacpp_draft_tokens_total")  # never 0 where nothing drafted
    # afterwards: the same figures from the log alone
    rep = report.build(analyze.analyze(analyze.Inputs([str(srv.log_path)], []), AssemblySettings()).records)
    section = rep["context_shift"]
    assert (section["requests"], section["completed_requests"], section["discarded_tokens"]) == (2, 4, discarded)
    assert "Context shifts: requests that forgot part of their conversation" in report.to_text(rep)
    assert "speculative_decoding" not in rep


@pytest.mark.parametrize("sdist", [None, B11549], ids=["b11434", "b11549"])
def test_draft_acceptance_per_request_is_the_responses_draft_counts(tmp_path: Path, sdist: str | None) -> None:
    """The target model with and without the adapter, the draft model without it: the adapter's
    requests accept fewer draft tokens. Both builds log the line with `--spec-type draft-simple`."""
    model, lora = model_files()
    spec = ["-md", str(model), "--spec-type", "draft-simple", "--spec-draft-n-max", "8"]
    srv = LlamaServer(llama_server_binary(sdist), model, lora, tmp_path / "srv", n_parallel=1, extra=spec).start(120)
    with_lora = {"lora": [{"id": 0, "scale": 1.0}]}
    try:
        exp = start_exporter(srv, tmp_path)
        try:
            answers = [
                _complete(srv.url, 40, **(with_lora if i % 2 else {}), prompt=f"Count to {10 + i}:") for i in range(4)
            ]
            recs = sorted(wait_records(tmp_path / "events.jsonl", len(answers)), key=lambda r: r["start_us"])
            text = exp.metrics_text()
        finally:
            exp.stop()
    finally:
        srv.stop()
    by_lora: dict[str, list[float]] = {}
    for i, (rec, a) in enumerate(zip(recs, answers, strict=True)):
        t = a["timings"]
        assert rec["prefill_seconds"] * 1000 == pytest.approx(t["prompt_ms"], abs=0.0051)
        assert (rec["draft_tokens_generated"], rec["draft_tokens_accepted"]) == (t["draft_n"], t["draft_n_accepted"])
        assert rec["draft_acceptance"] == round(t["draft_n_accepted"] / t["draft_n"], 5)
        assert rec["lora"] == ("active" if i % 2 else "none")
        row = by_lora.setdefault(rec["lora"], [0, 0, 0])
        row[0] += 1
        row[1] += t["draft_n"]
        row[2] += t["draft_n_accepted"]
    assert by_lora["active"][2] < by_lora["active"][1]  # the adapter makes the target disagree with the draft
    for name, i in (
        ("llamacpp_draft_requests_total", 0),
        ("llamacpp_draft_tokens_total", 1),
        ("llamacpp_draft_tokens_accepted_total", 2),
    ):
        assert samples(text, name) == {(("lora", lo),): float(v[i]) for lo, v in by_lora.items()}, name
    rep = report.build(analyze.analyze(analyze.Inputs([str(srv.log_path)], []), AssemblySettings()).records)
    section = rep["speculative_decoding"]
    everything = section["by_lora"]["all"]
    assert (everything["requests"], everything["draft_tokens"], everything["accepted_tokens"]) == (
        4,
        by_lora["none"][1] + by_lora["active"][1],
        by_lora["none"][2] + by_lora["active"][2],
    )
    assert section["lowest_request_acceptance"] == min(r["draft_acceptance"] for r in recs)
