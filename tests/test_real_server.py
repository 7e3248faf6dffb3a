"""Integration tests against a real llama-server (built from the PyPI sdist), a real model
and a real LoRA adapter. Every per-request number is checked against the server's own
response (`timings.cache_n`, `prompt_n`, `prompt_ms`, `predicted_n`, `predicted_ms`)."""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import pytest
from realserver import ExporterProcess, LlamaServer
from support import expected_from_truth, match, samples, start_exporter, wait_records
from workload import CANARY, Truth, chat_workload, seed_scenario

from llamacpp_exporter.assemble.finish import AssemblySettings
from llamacpp_exporter.offline import analyze, report

pytestmark = pytest.mark.real_server


@dataclass
class Run:
    truths: list[Truth]
    records: list[dict[str, Any]]
    metrics: str
    server_log: str
    exporter_log: str


def run_workload(
    parts: tuple[Path, Path, Path], workdir: Path, workload: Callable[..., Any], **server_options: Any
) -> Run:
    """Start a real llama-server and the exporter, run the workload, collect everything."""
    srv = LlamaServer(*parts, workdir=workdir, **server_options).start()
    exp = None
    try:
        exp = start_exporter(srv, workdir)
        truths = workload(srv.url)
        recs = wait_records(workdir / "events.jsonl", len(truths))
        text = exp.metrics_text()
    finally:
        if exp:
            exp.stop()
        srv.stop()
    return Run(truths, recs, text, srv.log_path.read_text(errors="replace"), exp.stderr_path.read_text())


def log_restores(log_text: str, task: int, slot: int) -> tuple[bool, bool]:
    """Independent reading of the log: did the selection that led to `task` restore a RAM
    entry (`found better prompt`) and clear it for a LoRA change?"""
    lines = log_text.splitlines()
    launch = next(i for i, ln in enumerate(lines) if re.search(rf"id +{slot} \| task {task} \| processing task", ln))
    start = max(i for i in range(launch) if re.search(rf"id +{slot} \| task -?\d+ \| selected slot by", lines[i]))
    block = lines[start:launch]
    restored = any("found better prompt" in ln for ln in block)
    cleared = any(re.search(rf"id +{slot} \| .*clearing cache for lora change", ln) for ln in block)
    return restored, cleared


def assert_no_text(workdir: Path, *texts: str) -> None:
    for p in workdir.iterdir():
        if p.name.startswith("llama-server"):
            continue  # the server's own log is not ours
        assert CANARY not in p.read_text(errors="replace"), p
    for t in texts:
        assert CANARY not in t


def test_seed_scenario_gives_exactly_one_wrongful_lora_discard(parts: tuple[Path, Path, Path], tmp_path: Path) -> None:
    run = run_workload(parts, tmp_path, seed_scenario, n_parallel=1, ctx=4096, cache_ram=256)
    truths, recs, text = run.truths, run.records, run.metrics
    assert truths[2].cache_n == 0  # the seed's symptom, as the server reports it
    pairs = match(recs, truths)
    for t, r in pairs:
        assert r["prompt_tokens"] == t.prompt_n + t.cache_n
        assert r["reused_tokens"] == t.cache_n
        assert r["lora"] == t.lora
    third = pairs[2][1]
    assert third["ram_restored"] and third["restore_result"] == "discarded_lora_wrongful"
    restores = samples(text, "llamacpp_prompt_cache_restores_total")
    assert restores[(("lora", "active"), ("result", "discarded_lora_wrongful"))] == 1
    assert sum(restores.values()) == 1
    assert samples(text, "llamacpp_exporter_cache_diagnostics_available")[()] == 1
    assert_no_text(tmp_path, text)


def check_chat_records(pairs: list[tuple[Truth, dict[str, Any]]], log_text: str, truths: list[Truth]) -> dict[str, int]:
    by_conv: dict[str, dict[int, Truth]] = {}
    for t in truths:
        by_conv.setdefault(t.conv, {})[t.turn] = t
    seen = {"wrongful": 0, "correct": 0, "kept": 0, "mismatch": 0}
    for t, r in pairs:
        assert r["prompt_tokens"] == t.prompt_n + t.cache_n, (t, r)
        assert r["reused_tokens"] == t.cache_n, (t, r)
        assert r["reuse_source"] == "log"
        assert r["lora"] == t.lora, (t, r)
        assert r["prefill_tokens"] == t.prompt_n
        assert r["generated_tokens"] == t.predicted_n
        restored, cleared = log_restores(log_text, r["task"], r["slot"])
        assert r["ram_restored"] == restored, (t, r)
        if not restored:
            assert r["restore_result"] is None
            continue
        # Conversations have distinct prefixes, so a restored entry is the conversation's
        # previous turn, computed under that turn's LoRA configuration.
        prev = by_conv[t.conv].get(t.turn - 1)
        assert prev is not None, f"first turn restored another conversation's entry: {t}"
        same = prev.lora == t.lora
        if cleared:
            expected = "discarded_lora_wrongful" if same else "discarded_lora_correct"
            assert r["restore_result"] == expected, (t, r)
            seen["wrongful" if same else "correct"] += 1
        elif r["restore_result"] == "kept":
            assert r["lora_mismatch_reuse"] == (not same), (t, r)
            seen["kept"] += 1
            seen["mismatch"] += int(not same)
        else:
            assert r["restore_result"] == "reprocessed" and t.cache_n == 0, (t, r)
    return seen


def test_concurrent_lora_chat_workload_matches_every_response(parts: tuple[Path, Path, Path], tmp_path: Path) -> None:
    run = run_workload(parts, tmp_path, lambda url: chat_workload(url, turns=4), n_parallel=2)
    truths, text = run.truths, run.metrics
    pairs = match(run.records, truths)
    seen = check_chat_records(pairs, run.server_log, truths)
    print("restores seen:", seen)
    assert seen["kept"] > 0
    # aggregate metrics agree with the records
    req = samples(text, "llamacpp_requests_total")
    assert sum(req.values()) == len(truths)
    reused = samples(text, "llamacpp_prompt_tokens_reused_total")
    assert sum(reused.values()) == sum(t.cache_n for t in truths)
    prompt = samples(text, "llamacpp_prompt_tokens_total")
    assert sum(prompt.values()) == sum(t.cache_n + t.prompt_n for t in truths)
    server_cached = samples(text, "llamacpp_server_prompt_tokens_cached_total")
    assert server_cached, "llama-server's own /metrics is re-exported"
    assert samples(text, "llamacpp_up")[(("endpoint", "slots"),)] == 1
    assert_no_text(tmp_path, text)
    # analyze, afterwards, over the server's log and the exporter's events file: the miss rate
    # by LoRA state and its denominators equal what the responses give
    settings = AssemblySettings(min_prompt_tokens=1)
    log = tmp_path / "server-log-copy.log"
    log.write_text(run.server_log)
    result = analyze.analyze(analyze.Inputs([str(log)], [str(tmp_path / "events.jsonl")]), settings)
    rep = report.build(result.records, conversations=result.conversations)
    # a request whose conversation the log cannot prove counts as "conversation unknown"
    unproven = {id(t) for t, r in pairs if r["conversation"] is None}
    want = expected_from_truth([dict(asdict(t), conv=None if id(t) in unproven else t.conv) for t in truths], settings)
    assert set(want["by_lora"]) == {"active", "none"}
    for lora, (misses, total) in want["by_lora"].items():
        got = rep["miss_rate"]["all"][lora]
        assert (got["numerator"], got["denominator"]) == (misses, total), lora
    chh = rep["could_have_hit"]
    assert chh["excluded"]["first_of_conversation"] == want["first_of_conversation"]
    assert chh["excluded"]["conversation_unknown"] == want["conversation_unknown"]
    print(f"analyze: could have hit {chh['considered']} of {len(truths)}, excluded {chh['excluded']}")
    assert (chh["miss_rate"]["all"]["all"]["numerator"], chh["considered"]) == (
        want["chh_misses"],
        want["chh_considered"],
    )


def test_default_verbosity_keeps_prefill_and_decode_exact(parts: tuple[Path, Path, Path], tmp_path: Path) -> None:
    run = run_workload(parts, tmp_path, lambda url: chat_workload(url, turns=3, seed=13), n_parallel=2, verbosity=3)
    truths, text, stderr = run.truths, run.metrics, run.exporter_log
    pairs = match(run.records, truths)
    from_slots = 0
    for t, r in pairs:
        assert r["prefill_tokens"] == t.prompt_n
        assert abs(r["prefill_seconds"] * 1000 - t.prompt_ms) <= 0.0051
        assert r["generated_tokens"] == t.predicted_n
        assert abs(r["decode_seconds"] * 1000 - t.predicted_ms) <= 0.0051
        assert r["lora"] == t.lora
        assert r["restore_result"] is None and not r["ram_restored"]  # not visible at -lv 3: never guessed
        if r["reuse_source"] == "slots":
            from_slots += 1
            assert r["reused_tokens"] == t.cache_n and r["prompt_tokens"] == t.cache_n + t.prompt_n
        else:
            assert r["reused_tokens"] is None and r["prompt_tokens"] is None
    print(f"reuse read from /slots for {from_slots} of {len(pairs)} requests")
    assert from_slots > 0
    assert samples(text, "llamacpp_exporter_cache_diagnostics_available")[()] == 0
    assert samples(text, "llamacpp_exporter_server_log_verbosity")[()] == 3
    assert "-lv 4" in stderr
    assert_no_text(tmp_path, text)


def test_jsonl_log_format(parts: tuple[Path, Path, Path], tmp_path: Path) -> None:
    run = run_workload(
        parts, tmp_path, lambda url: chat_workload(url, n_convs=4, turns=3, seed=17, long_system=(0,)), jsonl=True
    )
    truths, text = run.truths, run.metrics
    assert run.server_log.lstrip().startswith("{")
    pairs = match(run.records, truths)
    for t, r in pairs:
        assert r["prompt_tokens"] == t.prompt_n + t.cache_n
        assert r["reused_tokens"] == t.cache_n
        assert r["lora"] == t.lora
    lines = samples(text, "llamacpp_exporter_log_lines_total")
    assert lines[(("result", "unrecognized"),)] == 0
    assert_no_text(tmp_path, text)


def test_server_restart_with_log_file_truncation_starts_a_new_epoch(
    parts: tuple[Path, Path, Path], tmp_path: Path
) -> None:
    """llama-server's --log-file is truncated at every start: the exporter, following it from
    its end, reads the new process's log from the start and joins nothing across the restart."""
    srv = LlamaServer(*parts, workdir=tmp_path, n_parallel=1, ctx=4096, cache_ram=256, log_file=True).start()
    exp = None
    try:
        exp = ExporterProcess(
            [
                "--llama.url",
                srv.url,
                "--llama.log-path",
                str(srv.log_path),
                "--events.path",
                str(tmp_path / "events.jsonl"),
                "--llama.poll-interval",
                "0.5",
            ],
            tmp_path,
        ).start()
        first = seed_scenario(srv.url)
        wait_records(tmp_path / "events.jsonl", 3)
        srv.stop()
        srv.start()
        second = seed_scenario(srv.url)
        recs = wait_records(tmp_path / "events.jsonl", 6)
        text = exp.metrics_text()
    finally:
        if exp:
            exp.stop()
        srv.stop()
    assert [r["epoch"] for r in recs] == [0, 0, 0, 1, 1, 1]
    assert recs[3]["task"] < recs[2]["task"]  # task ids restart with the process
    for t, r in match(recs[3:], second):
        assert r["prompt_tokens"] == t.prompt_n + t.cache_n and r["reused_tokens"] == t.cache_n
    assert len(first) == 3
    assert samples(text, "llamacpp_exporter_server_restarts_total")[()] == 1
    assert samples(text, "llamacpp_exporter_log_truncations_total")[()] >= 1
    assert recs[5]["restore_result"] == "discarded_lora_wrongful"
