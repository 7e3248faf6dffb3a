"""analyze's findings (offline/findings.py): each one present where a recorded real run has it and
absent where another has not, and stated only past its threshold (else a small-sample note, or
nothing)."""

from __future__ import annotations

import copy
import json
import re
from pathlib import Path
from typing import Any, cast

import pytest

from llamacpp_exporter.assemble.finish import AssemblySettings
from llamacpp_exporter.assemble.pseudonyms import Pseudonymizer
from llamacpp_exporter.export.report_types import Report
from llamacpp_exporter.offline import analyze, findings, report

LOGS = Path(__file__).parent / "fixtures" / "logs"
SETTINGS = AssemblySettings(min_prompt_tokens=1)
T = findings.THRESHOLDS


def _report(name: str, events: bool = False) -> dict[str, Any]:
    inputs = analyze.Inputs([str(LOGS / f"{name}.log")], [str(LOGS / f"{name}.events.jsonl")] if events else [])
    result = analyze.analyze(inputs, SETTINGS, Pseudonymizer("salt"))
    try:
        return dict(analyze.streamed_report(result, analyze.Options(min_prompt_tokens=1), SETTINGS, None, None))
    finally:
        result.close()


@pytest.fixture(scope="module")
def reports() -> dict[str, dict[str, Any]]:
    names = [
        "lv4-np2-text",
        "lv3-np2-text",
        "lv4-np1-cache-thrashing",
        "lv4-np1-cache-full-healthy",
        "lv4-np2-starved",
        "lv4-np2-impatient-ids",
        "lv4-np2-contention",
    ]
    out = {n: _report(n) for n in names}
    out["lv4-np2-lora-events+events"] = _report("lv4-np2-lora-events", events=True)
    return out


def _kinds(rep: dict[str, Any]) -> dict[str, str]:
    return {f["finding"]: f["severity"] for f in rep["findings"]}


# (finding, recorded run where it is stated, its severity there, recorded runs where it is not)
CASES = [
    ("lora_restore_discard", "lv4-np2-lora-events+events", "critical", ["lv4-np2-text", "lv4-np1-cache-thrashing"]),
    ("lora_mismatch_reuse", "lv4-np2-lora-events+events", "critical", ["lv4-np2-text", "lv4-np2-starved"]),
    ("cache_too_small", "lv4-np1-cache-thrashing", "warning", ["lv4-np2-starved", "lv4-np1-cache-full-healthy"]),
    ("cache_size_not_the_cause", "lv4-np2-starved", "info", ["lv4-np1-cache-thrashing", "lv3-np2-text"]),
    ("small_task_takeover", "lv4-np2-lora-events+events", "warning", ["lv4-np2-text", "lv4-np1-cache-thrashing"]),
    ("small_task_takeover", "lv4-np2-starved", "small_sample", []),
    ("prefill_contention", "lv4-np2-contention", "warning", ["lv4-np2-text", "lv4-np2-starved"]),
    ("prefill_contention", "lv4-np2-impatient-ids", "warning", []),  # 1.7x over 11 requests and 29
    ("diagnostics_below_lv4", "lv3-np2-text", "info", ["lv4-np2-text"]),
    ("lora_state_unknown", "lv4-np2-text", "info", ["lv4-np2-lora-events+events"]),
]


@pytest.mark.parametrize(("finding", "present", "severity", "absent"), CASES)
def test_each_finding_on_recorded_real_runs(
    reports: dict[str, dict[str, Any]], finding: str, present: str, severity: str, absent: list[str]
) -> None:
    assert _kinds(reports[present]).get(finding) == severity, reports[present]["findings"]
    for name in absent:
        assert finding not in _kinds(reports[name]), (name, reports[name]["findings"])


def test_the_lora_restore_bug_is_told_with_its_counts_and_its_fix(reports: dict[str, dict[str, Any]]) -> None:
    rep = reports["lv4-np2-lora-events+events"]
    f = next(f for f in rep["findings"] if f["finding"] == "lora_restore_discard")
    assert f["evidence"]["discarded_lora_wrongful"] == rep["restores"]["all"]["discarded_lora_wrongful"] == 11
    lora = rep["could_have_hit"]["miss_rate"]["ram"]["active"]
    assert f"{lora['numerator']}/{lora['denominator']}" in f["summary"]
    assert "PR #30275" in f["action"] and "id_slot" in f["action"]
    assert rep["findings"][0] is f  # the most severe first


def test_prefill_contention_names_the_conversations_that_cost_most(reports: dict[str, dict[str, Any]]) -> None:
    rep = reports["lv4-np2-contention"]
    f = next(f for f in rep["findings"] if f["finding"] == "prefill_contention")
    top = rep["top_conversations"]["rows"][0]
    assert f["evidence"]["costliest_conversations"][0]["conversation"] == top["conversation"]
    assert top["conversation"] in f["summary"]
    tp = rep["time_per_output_token_seconds"]
    # judged on the large prefills (the long conversation's), enough of them here
    assert (
        f["evidence"]["while"] == "large_prefill" and tp["while_a_large_prefill_ran"]["count"] >= T.contention_requests
    )
    assert (
        f["evidence"]["slowdown"]
        == round(tp["while_a_large_prefill_ran"]["p50"] / tp["no_concurrent_prefill"]["p50"], 2)
        >= T.contention_slowdown
    )


def _with(rep: dict[str, Any], path: list[Any], value: Any) -> dict[str, Any]:
    out = copy.deepcopy(rep)
    node = out
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value
    return out


def _severity(rep: dict[str, Any], name: str) -> str | None:
    return _kinds({"findings": findings.findings(cast(Report, rep))}).get(name)


def test_each_threshold_is_where_a_finding_starts(reports: dict[str, dict[str, Any]]) -> None:
    base = reports["lv4-np2-text"]
    restores = base["restores"]["all"]

    def at(n: int) -> dict[str, Any]:
        return _with(base, ["restores", "all"], dict(restores, discarded_lora_wrongful=n))

    assert [_severity(at(n), "lora_restore_discard") for n in (0, T.lora_wrongful_discards - 1)] == [
        None,
        "small_sample",
    ]
    assert _severity(at(T.lora_wrongful_discards), "lora_restore_discard") == "critical"

    causes = dict.fromkeys(base["miss_causes"]["all"], 0)

    def evicted(n: int, other: int) -> dict[str, Any]:
        return _with(base, ["miss_causes", "all"], dict(causes, evicted=n, no_cache_entry=other))

    assert _severity(evicted(T.evicted_misses - 1, 0), "cache_too_small") == "small_sample"
    assert _severity(evicted(T.evicted_misses, 0), "cache_too_small") == "warning"
    # enough evictions, but a small share of the misses
    few = int(T.evicted_misses / T.evicted_share) + 10
    assert _severity(evicted(T.evicted_misses, few), "cache_too_small") == "small_sample"
    assert _severity(evicted(0, T.misses_without_eviction - 1), "cache_size_not_the_cause") is None
    assert _severity(evicted(0, T.misses_without_eviction), "cache_size_not_the_cause") == "info"

    def take(n: int) -> dict[str, Any]:
        return _with(base, ["small_task_takeovers"], n)

    assert [_severity(take(n), "small_task_takeover") for n in (0, T.small_task_takeovers - 1)] == [
        None,
        "small_sample",
    ]
    assert _severity(take(T.small_task_takeovers), "small_task_takeover") == "warning"

    def mism(n: int) -> dict[str, Any]:
        return _with(base, ["lora_mismatch_reuse"], {"none": n, "active": 0, "unknown": 0})

    assert _severity(mism(0), "lora_mismatch_reuse") is None
    assert _severity(mism(T.lora_mismatch_reuse), "lora_mismatch_reuse") == "critical"

    def tpot(busy_n: int, busy_p50: float | None, calm_n: int, calm_p50: float | None) -> dict[str, Any]:
        tp = dict(base["time_per_output_token_seconds"])
        tp["while_another_slot_prefilled"] = dict(tp["while_another_slot_prefilled"], count=busy_n, p50=busy_p50)
        tp["no_concurrent_prefill"] = dict(tp["no_concurrent_prefill"], count=calm_n, p50=calm_p50)
        return _with(base, ["time_per_output_token_seconds"], tp)

    n = T.contention_requests
    slow = T.contention_slowdown
    assert _severity(tpot(n, 0.01 * slow, n, 0.01), "prefill_contention") == "warning"
    assert _severity(tpot(n, 0.01 * slow * 0.99, n, 0.01), "prefill_contention") is None
    assert _severity(tpot(n - 1, 0.01 * slow, n, 0.01), "prefill_contention") == "small_sample"


def test_findings_in_every_format(reports: dict[str, dict[str, Any]], capsys: pytest.CaptureFixture[str]) -> None:
    name = LOGS / "lv4-np2-lora-events"
    argv = [f"{name}.log", "--events", f"{name}.events.jsonl", "--min-prompt-tokens", "1"]
    outs = {}
    for fmt in ("json", "text", "markdown", "csv"):
        assert analyze.main([*argv, "--format", fmt]) == 0
        outs[fmt] = capsys.readouterr().out
    structured = json.loads(outs["json"])["findings"]
    assert [f["finding"] for f in structured] == [
        f["finding"] for f in reports["lv4-np2-lora-events+events"]["findings"]
    ]
    assert all({"finding", "severity", "summary", "evidence", "action"} <= f.keys() for f in structured)
    for f in structured:
        first_words = f["summary"][:40]
        assert first_words in outs["markdown"]
        assert f["finding"] in outs["csv"]
    assert outs["text"].startswith("Findings\n========\n[critical] The LoRA restore bug")
    # a run with nothing to say says so
    assert report.finding_lines(cast(Report, {"findings": []})) == ["none: no finding passed its threshold"]


def test_no_finding_holds_a_placeholder_for_a_figure_it_does_not_have(reports: dict[str, dict[str, Any]]) -> None:
    rep = reports["lv4-np2-lora-events+events"]
    ram = rep["could_have_hit"]["miss_rate"]["ram"]
    assert ram["none"]["denominator"] and ram["active"]["denominator"]
    for state, other in (("none", "requests without LoRA"), ("active", "LoRA requests")):
        empty = dict(ram[state], numerator=0, denominator=0, ratio=None)
        changed = _with(rep, ["could_have_hit", "miss_rate", "ram", state], empty)
        changed["findings"] = findings.findings(cast(Report, changed))
        f = next(f for f in changed["findings"] if f["finding"] == "lora_restore_discard")
        assert " -" not in f["summary"], f["summary"]
        assert (other in f["summary"]) is False, f["summary"]
    for name, r in reports.items():
        for f in r["findings"]:
            assert not re.search(r"\s-[,.;)]", f["summary"]), (name, f["summary"])


def test_advice_already_followed_is_not_given(reports: dict[str, dict[str, Any]]) -> None:
    rep = reports["lv4-np2-text"]
    f = next(f for f in rep["findings"] if f["finding"] == "lora_state_unknown")
    assert "--events" in f["action"]  # a log alone: pass the events file
    given = _with(rep, ["sources", "events_files"], 1)
    f = next(f for f in findings.findings(cast(Report, given)) if f["finding"] == "lora_state_unknown")
    assert "--events" not in f["action"] and "/slots" in f["action"], f["action"]
