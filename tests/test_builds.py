"""Older llama.cpp builds. Short real logs of the same workload (the LoRA restore scenario
twice, one slot), recorded once per build by tests/setup/record_build_fixtures.py, as text and
JSONL at -lv 3 and -lv 4, with each response's timings. What the exporter gets right on each
build, and what it reports as unavailable."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest
from support import replay_records, value

from llamacpp_exporter.parse import TESTED_BUILDS

BUILDS = Path(__file__).parent / "fixtures" / "logs" / "builds"
LOGS = sorted(BUILDS.glob("*.log"))


def test_every_tested_build_has_its_four_logs() -> None:
    names = {p.stem for p in LOGS}
    for b in TESTED_BUILDS:
        for lv in (3, 4):
            for fmt in ("text", "jsonl"):
                assert f"b{b}-lv{lv}-{fmt}" in names


@pytest.mark.parametrize("path", LOGS, ids=lambda p: p.stem)
def test_what_each_build_gets_right_and_what_it_reports_unavailable(
    path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    recs, pl = replay_records(path.read_text(errors="replace").splitlines())
    truth = [json.loads(x) for x in path.with_suffix(".truth.jsonl").read_text().splitlines()]

    def lines(result: str) -> float:
        return value(pl.registry, "llamacpp_exporter_log_lines_total", {"result": result})

    assert lines("unrecognized") == 0 and lines("unreadable") == 0
    recs.sort(key=lambda r: r.task)
    assert len(recs) == len(truth)
    lv4 = "-lv4-" in path.name
    for r, t in zip(recs, truth, strict=True):
        # exact on every build and level: what was computed and how long it took
        assert r.prefill_tokens == t["prompt_n"] and r.generated_tokens == t["predicted_n"]
        assert r.prefill_seconds == pytest.approx(t["prompt_ms"] / 1000, abs=1e-5)
        if lv4:  # the cache diagnosis: prompt and reused tokens exact
            assert (r.prompt_tokens, r.reused_tokens) == (t["cache_n"] + t["prompt_n"], t["cache_n"])
        else:  # -lv 3 without /slots: unknown, never guessed
            assert r.reused_tokens is None and r.outcome is None and r.restore_result is None
    diag = value(pl.registry, "llamacpp_exporter_cache_diagnostics_available")
    assert diag == (1 if lv4 else 0)
    restores = [r.restore_result for r in recs if r.restore_result]
    if lv4:  # the LoRA discard of the scenario, each time (which LoRA: unknown without /slots)
        assert restores.count("discarded_lora_unknown") == 2 and "kept" in restores
    # these builds carry no build number (and -lv 3 does not print the build line at all)
    assert ("built without version information" in caplog.text) == lv4
    print(
        f"{path.stem}: {len(recs)}/{len(truth)} requests, prefill and decode exact"
        + (", prompt and reused tokens exact, restores " + ",".join(restores) if lv4 else ", reuse unavailable")
    )


def test_an_untested_build_is_named_once_in_a_warning(caplog: pytest.LogCaptureFixture) -> None:
    """Invented: the build line of an official image (build number and commit)."""
    line = "0.00.004.533 I cmn  common_param: common_params_print_info: build 9999 (abc1234) with GNU 12.2.0 for Linux"
    caplog.set_level(logging.INFO)
    _, pl = replay_records([line, line])
    assert caplog.text.count("build 9999 (abc1234) is not one the exporter is tested with") == 1
    assert value(pl.registry, "llamacpp_exporter_server_build_info", {"build": "9999", "commit": "abc1234"}) == 1
