"""analyze keeps its records on disk (offline/store.py) and builds its report one record at a
time: the report must be the one the records in memory give, on every recorded log, with time
windows, with events files (their proofs and the records that stand for the log's), and the
records file it writes must read back as the same report."""

from __future__ import annotations

import json
import random
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from llamacpp_exporter.assemble.finish import AssemblySettings
from llamacpp_exporter.assemble.pseudonyms import Pseudonymizer
from llamacpp_exporter.export.concern import group_percentiles
from llamacpp_exporter.offline import analyze, report
from llamacpp_exporter.offline.store import BATCH, RecordStore, StoredValues
from llamacpp_exporter.pipeline import replay

LOGS = Path(__file__).parent / "fixtures" / "logs"
ALL_LOGS = sorted(p.relative_to(LOGS).as_posix() for p in [*LOGS.glob("*.log"), *LOGS.glob("builds/*.log")])
SETTINGS = AssemblySettings(min_prompt_tokens=1)
OPTS = analyze.Options(min_prompt_tokens=1)


def in_memory(result: analyze.Analysis, since: float | None = None, until: float | None = None) -> dict[str, Any]:
    """The report as analyze made it from its records in memory (the reference)."""
    windowed = since is not None or until is not None
    every = result.records  # one list: the window's records are the history's own objects
    clock = analyze.wall_clock(result.file_ends)
    dated = [(clock(r.epoch, r.start_us) if r.start_us is not None else None, r) for r in every]
    records, undated = analyze.within(dated, since, until)
    rep = report.build(
        records,
        gap_seconds=OPTS.gap_seconds,
        large_prefill_tokens=SETTINGS.big_conversation_tokens,
        conversations=None if windowed else result.conversations,
        top=OPTS.top,
        sources=dict(result.sources, since=since, until=until) if windowed else result.sources,
        history=every,
        join_costs=None if windowed else result.join_costs,
    )
    if windowed and undated:
        rep["unknown"].append(analyze.undated_unknown(undated))
    return dict(rep)


@pytest.mark.parametrize("log", ALL_LOGS)
def test_the_streamed_report_is_the_in_memory_one_on_every_recorded_log(log: str) -> None:
    result = analyze.analyze(analyze.Inputs([str(LOGS / log)], []), SETTINGS, Pseudonymizer("salt"))
    try:
        # the store follows conversations in the order sorted() gives the records in memory
        assert list(result.store.by_start()) == report._start_order(result.records)
        assert analyze.streamed_report(result, OPTS, SETTINGS, None, None) == in_memory(result)
        starts = sorted(t for t, _ in analyze.dated(result) if t is not None)
        if len(starts) >= 3:  # windows that cut conversations: their history begins before them
            third, two_thirds = starts[len(starts) // 3], starts[2 * len(starts) // 3]
            for since, until in ((third, None), (None, two_thirds), (third, two_thirds)):
                got = analyze.streamed_report(result, OPTS, SETTINGS, since, until)
                assert got == in_memory(result, since, until)
                assert 0 < got["requests"]["total"] + got["requests"]["embedding_tasks"] < len(starts)
    finally:
        result.close()


def _events_file_with_proofs(tmp_path: Path) -> tuple[Path, Path]:
    """A recorded log whose join proves conversations late, replayed by the pipeline into an
    events file (records and proof lines), with every third record's LoRA state changed (so
    that a record that stands for the log's shows) and a line that is neither."""
    log = LOGS / "lv4-np2-impatient-ids-starved.log"
    written = tmp_path / "written.jsonl"
    replay(str(log), CollectorRegistry(), SETTINGS, events_path=str(written), pseudonymize=Pseudonymizer("salt"))
    lines = written.read_text().splitlines()
    assert sum('"proof"' in ln for ln in lines) >= 5  # the case this test is about
    out = []
    for i, ln in enumerate(lines):
        obj = json.loads(ln)
        if "proof" not in obj and i % 3 == 0:
            obj["lora"] = "active"
        out.append(json.dumps(obj))
    out.insert(len(out) // 2, "not a record")
    events = tmp_path / "events.jsonl"
    events.write_text("\n".join(out) + "\n")
    return log, events


def test_events_files_with_proofs_give_the_records_the_lists_gave(tmp_path: Path) -> None:
    log, events = _events_file_with_proofs(tmp_path)
    listed, bad = analyze.read_events([str(events)])
    reclassified = [analyze._reclassified(r, SETTINGS) for r in listed]
    # an events file alone: its records, proofs applied
    alone = analyze.analyze(analyze.Inputs([], [str(events)]), SETTINGS)
    assert alone.records == reclassified
    assert (alone.sources["events_records"], alone.sources["events_lines_not_records"], bad) == (len(listed), 1, 1)
    assert sum(r.conversation_source == "uncertain" for r in listed) < sum(
        json.loads(ln).get("conversation_source") == "uncertain"
        for ln in events.read_text().splitlines()
        if ln.startswith("{") and '"proof"' not in ln
    )  # proofs named some
    # with the log: each log record, or the events record of its task in its place (its run number kept)
    log_only = analyze.analyze(analyze.Inputs([str(log)], []), SETTINGS, Pseudonymizer("salt")).records
    by_key = {e.key: e for e in reclassified}
    want = [replace(by_key[r.key], epoch=r.epoch) if r.key in by_key else r for r in log_only]
    both = analyze.analyze(analyze.Inputs([str(log)], [str(events)]), SETTINGS, Pseudonymizer("salt"))
    assert both.records == want
    assert both.sources["events_matched_to_log"] == sum(r.key in by_key for r in log_only) > 0
    assert sum(r.lora == "active" for r in both.records) > 0
    assert analyze.streamed_report(both, OPTS, SETTINGS, None, None) == in_memory(both)


def test_the_records_file_reads_back_as_the_same_report(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    log = str(LOGS / "lv4-np2-lora-events.log")
    out = tmp_path / "records.jsonl"
    assert analyze.main([log, "--records", str(out), "--format", "json", "--min-prompt-tokens", "1"]) == 0
    from_log = json.loads(capsys.readouterr().out)
    lines = out.read_text().splitlines()
    assert len(lines) == from_log["requests"]["total"] + from_log["requests"]["embedding_tasks"] > 0
    assert analyze.main(["--events", str(out), "--format", "json", "--min-prompt-tokens", "1"]) == 0
    read_back = json.loads(capsys.readouterr().out)
    # the same report, but for where it came from and the conversations' ranking (an events
    # file does not carry the cost to the others: ranked by prefill time)
    # and the advice on the unknown LoRA state, which no longer says to pass an events file
    for key in from_log:
        if key not in ("sources", "top_conversations", "findings", "unknown", "named"):
            assert read_back[key] == from_log[key], key
    # who is named: the same, but for the cost to the others, which needs the log
    assert read_back["named"] == dict(from_log["named"], cost_to_others_seconds=None)
    for key in ("findings", "unknown"):
        strip = [{k: v for k, v in x.items() if k not in ("action", "why")} for x in from_log[key]]
        assert [{k: v for k, v in x.items() if k not in ("action", "why")} for x in read_back[key]] == strip, key
    assert read_back["sources"]["events_records"] == len(lines)


def test_stored_percentiles_are_those_of_the_sorted_values() -> None:
    store = RecordStore()
    try:
        rng = random.Random(7)
        stored, listed = StoredValues(store), report.ValueLists()
        for i in range(3 * BATCH + 17):  # several batches, repeated values, a group of one, an empty one
            group = ("a", "b", "b", "c")[i % 4] if i else "one"
            v = round(rng.expovariate(1.0), 2) if group != "c" else 0.5
            stored.add(group, v)
            listed.add(group, v)
        for group in ("a", "b", "c", "one", "none"):
            assert group_percentiles(stored, group) == group_percentiles(listed, group), group
        assert group_percentiles(stored, "a")["count"] == (3 * BATCH + 17) // 4
    finally:
        store.close()


def test_a_temporary_directory_that_cannot_hold_the_records_is_a_clear_message(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # the store made in a directory that does not exist (as a full or vanished $TMPDIR): a
    # message and exit status 1, no traceback
    missing = str(tmp_path / "gone")
    monkeypatch.setattr(analyze, "RecordStore", lambda: RecordStore(directory=missing))
    assert analyze.main([str(LOGS / "lv4-np2-text.log"), "--no-progress"]) == 1
    err = capsys.readouterr().err
    assert "cannot keep the records in a temporary file" in err and "TMPDIR" in err
