"""A server with many slots, from recorded real runs (b11434, the tiny model at a GPU's speed with
its adapter, `-np 4` and `-np 16`, 3 conversations a slot with ids and clients giving up; see
benchmarks/many_slots.py, which recorded them): every answered request's record equals its
response, no conversation is named wrong, and the work per log line that grows with the requests
in flight (the waiting records looking at every other slot's prefills) does not grow with them.
The work is counted, not timed: the benchmark prints the times."""

from __future__ import annotations

import gzip
import json
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry
from support import LOGS

from llamacpp_exporter.assemble import attribution, join
from llamacpp_exporter.assemble.finish import Finisher
from llamacpp_exporter.assemble.pseudonyms import Pseudonymizer
from llamacpp_exporter.assemble.timeline import PrefillTimeline
from llamacpp_exporter.offline.analyze import apply_proofs
from llamacpp_exporter.pipeline import Pipeline
from llamacpp_exporter.records import ConversationProof, RecordKey, RequestRecord

RUNS = {4: "b11434-lv4-np4-many-slots", 16: "b11434-lv4-np16-many-slots"}


def lines_of(slots: int) -> list[str]:
    with gzip.open(LOGS / f"{RUNS[slots]}.log.gz", "rt", errors="replace") as fh:
        return fh.read().splitlines()


def truths(slots: int) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (LOGS / f"{RUNS[slots]}.truth.jsonl").read_text().splitlines()]


def replay(lines: list[str], ps: Pseudonymizer) -> list[RequestRecord]:
    """In the live exporter's batches; late proofs applied to the records they name."""
    recs: list[RequestRecord] = []
    proofs: dict[RecordKey, ConversationProof] = {}
    pl = Pipeline(
        CollectorRegistry(),
        on_record=recs.append,
        on_proof=lambda p: proofs.__setitem__(p.key, p),
        clock=lambda: 0.0,
        pseudonymize=ps,
    )
    for i in range(0, len(lines), 512):
        pl.process_lines(lines[i : i + 512])
    pl.flush()
    apply_proofs(recs, proofs)
    return recs


@pytest.mark.parametrize("slots", sorted(RUNS))
def test_every_answered_request_is_exact_and_none_is_named_wrong(slots: int) -> None:
    ps = Pseudonymizer("many-slots")
    recs = replay(lines_of(slots), ps)
    named = uncertain = 0
    for t in truths(slots):
        cands = [
            r
            for r in recs
            if r.prefill_seconds is not None
            and r.decode_seconds is not None
            and abs(r.prefill_seconds * 1000 - t["prompt_ms"]) <= 0.0051
            and abs(r.decode_seconds * 1000 - t["predicted_ms"]) <= 0.0051
        ]
        assert len(cands) == 1, f"{len(cands)} records match response {t}"
        r = cands[0]
        assert (r.prompt_tokens, r.reused_tokens, r.generated_tokens) == (
            t["cache_n"] + t["prompt_n"],
            t["cache_n"],
            t["predicted_n"],
        ), t
        if r.conversation_source == "uncertain":
            uncertain += 1
        else:
            assert (r.conversation, r.conversation_source) == (ps("id:" + t["conv"]), "header"), t
            named += 1
    n = len(truths(slots))
    print(f"{slots} slots: {n} answered, all exact; {named} named right, {uncertain} uncertain, 0 wrong")
    assert named >= 0.9 * n


def counted(lines: list[str], calls: dict[str, tuple[type, str]], monkeypatch: pytest.MonkeyPatch) -> Counter[str]:
    """How often each method ran over the log's replay."""
    n: Counter[str] = Counter()
    for label, (cls, name) in calls.items():
        method: Callable[..., Any] = getattr(cls, name)

        def counting(*a: Any, _m: Callable[..., Any] = method, _l: str = label, **k: Any) -> Any:
            n[_l] += 1
            return _m(*a, **k)

        monkeypatch.setattr(cls, name, counting)
    replay(lines, Pseudonymizer("many-slots"))
    monkeypatch.undo()
    return n


def test_the_waiting_records_look_at_other_slots_no_more_often_a_line_with_four_times_the_slots(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A waiting record compares its decoding with every other slot's prefills (_around) when it
    looks again; it looks again only when what it waits for changed. Before, every waiting record
    did so at every slot-search or task line: at 16 slots 3.2 times a line against 0.04 at 4."""
    calls = {"around": (PrefillTimeline, "_around"), "looks": (Finisher, "_conversations_known")}
    per_line = {}
    for slots in sorted(RUNS):
        lines = lines_of(slots)
        per_line[slots] = {k: v / len(lines) for k, v in counted(lines, calls, monkeypatch).items()}
    print({s: {k: round(v, 3) for k, v in c.items()} for s, c in per_line.items()})
    assert per_line[16]["around"] <= 1.5 * per_line[4]["around"]


def test_the_join_looks_at_open_tasks_no_more_often_a_line_with_four_times_the_slots(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The join's pass over its open tasks looks again only at those whose candidates may have
    changed (HeaderJoin._stale). Before, it looked at every open task at each launch: at 16 slots
    0.121 looks a line against 0.014 at 4 (now 0.020)."""
    calls: dict[str, tuple[type, str]] = {"looks": (join.HeaderJoin, "_candidates")}
    per_line = {}
    for slots in sorted(RUNS):
        lines = lines_of(slots)
        per_line[slots] = counted(lines, calls, monkeypatch)["looks"] / len(lines)
    print({s: round(v, 3) for s, v in per_line.items()})
    assert per_line[16] <= 1.5 * per_line[4]


@pytest.mark.parametrize("log", [f"{RUNS[16]}.log.gz", *sorted(p.name for p in LOGS.glob("*.log"))])
def test_what_the_join_keeps_of_tasks_it_did_not_look_at_again_is_what_a_full_look_makes(
    log: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """After each pass, every open task the pass did not look at again has the candidates, name
    limits and rank bounds a look at it now would give (HeaderJoin._check_looks), and _by_time's
    kept name limits are those it would make, on every recorded log."""
    monkeypatch.setattr(join, "_CHECK_LOOKS", True)
    join.LOOK_FAILURES.clear()
    join.LOOKS_CHECKED.clear()
    path = LOGS / log
    opener: Callable[..., Any] = gzip.open if log.endswith(".gz") else open
    with opener(path, "rt", errors="replace") as fh:
        replay(fh.read().splitlines(), Pseudonymizer("check"))
    assert not join.LOOK_FAILURES, join.LOOK_FAILURES[:3]
    print(f"{log}: {len(join.LOOKS_CHECKED)} checks, {sum(join.LOOKS_CHECKED)} open tasks")
    if log.endswith(".gz"):  # many requests in flight: the checks saw them
        assert sum(join.LOOKS_CHECKED) > 1000


@pytest.mark.parametrize("log", [f"{RUNS[16]}.log.gz", *sorted(p.name for p in LOGS.glob("*.log"))])
def test_a_late_proof_looks_at_every_record_whose_conversation_it_can_prove(
    log: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A late proof's pass looks only at the waiting records (and costs) whose conversation can
    have become known or whose time is up (attribution.LateIndex); at every pass, each one it
    leaves out is one a look at every waiting record would leave waiting too, on every recorded
    log."""
    monkeypatch.setattr(attribution, "_CHECK_LATE", True)
    attribution.LATE_FAILURES.clear()
    attribution.LATE_CHECKED.clear()
    passes = attribution.LATE_CHECKED
    opener: Callable[..., Any] = gzip.open if log.endswith(".gz") else open
    with opener(LOGS / log, "rt", errors="replace") as fh:
        replay(fh.read().splitlines(), Pseudonymizer("check"))
    assert not attribution.LATE_FAILURES, attribution.LATE_FAILURES[:3]
    print(f"{log}: {len(passes)} passes, {sum(passes)} waiting records and costs")
    if log.endswith(".gz"):  # records went out before their proof: the checks saw them
        assert sum(passes) > 100


def test_the_fixtures_hold_no_prompt_text() -> None:
    for slots in RUNS:
        text = "\n".join(lines_of(slots))
        assert "quokkacanary" not in text and "/root/" not in text
        assert Path(LOGS / f"{RUNS[slots]}.truth.jsonl").stat().st_size > 0
