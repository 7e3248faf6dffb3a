"""Live equals replay: the exporter following a recorded real log as llama-server writes it, or
started while the server runs (at the log's end, no saved position), writes the same records,
conversation and source included, as a replay of the finished file."""

from __future__ import annotations

import bisect
import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from realserver import ExporterProcess, free_port, wait_for
from support import LOGS

from llamacpp_exporter.assemble.pseudonyms import Pseudonymizer
from llamacpp_exporter.offline.analyze import read_events
from llamacpp_exporter.pipeline import Pipeline
from llamacpp_exporter.records import RequestRecord

pytestmark = pytest.mark.integration
SALT = "a-test-salt-of-enough-length"
# clients that give up while queued (with ids, without), a starved machine, a 21 s prefill
LOGS_TRIED = ["lv4-np2-impatient-ids", "lv4-np1-cancelled", "lv4-np2-starved", "lv4-np2-slow-machine", "lv4-np2-text"]
# and llama-server b11549's (no chat-format lines): clients with ids giving up, starved and not
LOGS_TRIED += ["b11549-lv4-np2-impatient-ids", "b11549-lv4-np2-impatient-ids-starved"]
# where the joint search names most at the window's close, long after the records went out
LOGS_TRIED += ["lv4-np2-impatient-ids-never-idle", "b11549-lv4-np4-pileups-starved"]


def replayed(lines: list[str]) -> list[dict[str, Any]]:
    """The records of the finished file, each with a conversation proven after it went out."""
    from prometheus_client import CollectorRegistry

    recs: list[RequestRecord] = []
    proofs: dict[tuple[Any, ...], tuple[str, str]] = {}
    pl = Pipeline(
        CollectorRegistry(),
        on_record=recs.append,
        on_proof=lambda p: proofs.__setitem__((p.key.slot, p.key.task, p.key.start_us), (p.conversation, p.source)),
        clock=lambda: 0.0,
        pseudonymize=Pseudonymizer(SALT),
    )
    for line in lines:
        pl.process_line(line, 0.0)
    pl.flush()
    out = [json.loads(json.dumps(r.to_event())) for r in recs]  # as the events file has them
    for r in out:
        if (k := (r["slot"], r["task"], r["start_us"])) in proofs:
            r["conversation"], r["conversation_source"] = proofs[k]
    return out


def key(r: dict[str, Any]) -> tuple[Any, ...]:
    return (r["slot"], r["task"], r["start_us"])


def follow(tmp_path: Path, lines: list[str], written_before: int, expect: int) -> list[dict[str, Any]]:
    """The events file of an exporter (defaults, no /slots) started once `written_before` lines
    of the log exist, the rest appended in chunks as a server writes them; read once it holds
    `expect` records (the last go out when the quiet log's time has passed their wait)."""
    log, events = tmp_path / "llama-server.log", tmp_path / "events.jsonl"
    salt = tmp_path / "salt"
    salt.write_text(SALT + "\n")
    log.write_text("".join(line + "\n" for line in lines[:written_before]))
    exp = ExporterProcess(
        ["--llama.url", f"http://127.0.0.1:{free_port()}", "--llama.log-path", str(log), "--no-llama.slots"]
        + ["--events.path", str(events), "--conversations.salt-file", str(salt)],
        tmp_path / "exporter",
    ).start()
    try:
        exp.wait_following()
        rest = lines[written_before:]
        for i in range(0, len(rest), 40):
            with open(log, "a") as fh:
                fh.write("".join(line + "\n" for line in rest[i : i + 40]))
            time.sleep(0.005)
        exp.wait_lines_processed(len(lines))
        wait_for(
            lambda: events.exists() and len(read_events([str(events)])[0]) >= expect,
            f"{expect} records in the events file",
            timeout=90,
        )
    finally:
        exp.stop()
    recs, bad = read_events([str(events)])
    assert bad == 0
    return [json.loads(json.dumps(r.to_event())) for r in recs]  # as the file holds them


@pytest.mark.parametrize("name", LOGS_TRIED)
def test_followed_live_the_records_are_those_of_a_replay(name: str, tmp_path: Path) -> None:
    lines = (LOGS / f"{name}.log").read_text(errors="replace").splitlines()
    want = {key(r): r for r in replayed(lines)}
    got = {key(r): r for r in follow(tmp_path, lines, 0, len(want))}
    named = sum(r["conversation_source"] == "header" for r in got.values())
    print(f"{name}: {len(got)} records live, {len(want)} replayed, {named} named by header")
    assert got.keys() == want.keys()
    differ = [(k, f, got[k][f], want[k][f]) for k in want for f in want[k] if got[k][f] != want[k][f]]
    assert not differ, differ[:5]


@pytest.mark.parametrize("name", ["lv4-np2-impatient-ids", "lv4-np2-starved"])
def test_started_while_the_server_runs_it_knows_what_a_replay_knows(name: str, tmp_path: Path) -> None:
    """Started at the log's end with no saved position (a new user's first start): the
    exporter reads the server run again from its start banner, counts none of those requests,
    and every request it counts has the replay's record."""
    lines = (LOGS / f"{name}.log").read_text(errors="replace").splitlines()
    cut = len(lines) * 2 // 5
    want = {key(r): r for r in replayed(lines)}
    # a record the replay finished before the exporter started is not counted live
    ended_before = {k for k, r in want.items() if r["end_us"] is not None and r["end_us"] <= _log_time(lines[cut - 1])}
    got = {key(r): r for r in follow(tmp_path, lines, cut, len(want) - len(ended_before))}
    stderr = (tmp_path / "exporter" / "exporter.stderr").read_text()
    assert "again first" in stderr
    print(f"{name}: {len(got)} records live, {len(want)} replayed, {len(ended_before)} ended before the start")
    assert got.keys() <= want.keys() and not (got.keys() & ended_before)
    assert want.keys() - ended_before - got.keys() == set()  # every later request is there ...
    differ = [(k, f, got[k][f], want[k][f]) for k in got for f in want[k] if got[k][f] != want[k][f]]
    assert not differ, differ[:5]  # ... with the replay's record
    assert sum(r["conversation_source"] == "header" for r in got.values()) > 0


def _log_time(line: str) -> int:
    """A text log line's timestamp in microseconds (m.ss.mmm.uuu)."""
    m, s, ms, us = line.split(" ", 1)[0].split(".")
    return ((int(m) * 60 + int(s)) * 1000 + int(ms)) * 1000 + int(us)


def test_records_wait_for_the_join_at_most_its_bound() -> None:
    """Freshness: a record's conversation is fixed, as proven or "uncertain", at the first line
    past JOIN_WAIT_US of log time after its request ended, or earlier; from then on it waits only
    for what else it is judged by (its LoRA, other slots' prefill timings). Tried on the
    recordings where proofs take longest (a 21 s prefill during which the server logs nothing;
    clients giving up while queued). A live exporter does not wait for that line: a quiet log
    lets the time pass (the tests above)."""
    from prometheus_client import CollectorRegistry

    from llamacpp_exporter.assemble.attribution import JOIN_WAIT_US

    for name in ("lv4-np2-slow-machine", "lv4-np2-impatient-ids", "lv4-np2-starved"):
        lines = (LOGS / f"{name}.log").read_text(errors="replace").splitlines()
        times = [_log_time(line) for line in lines if line[:1].isdigit()]
        pl = Pipeline(CollectorRegistry(), clock=lambda: 0.0)
        fin, clock = pl.assembler.finisher, pl.assembler.clock
        fixed: list[tuple[int, int]] = []  # (end, log time its conversation was fixed)
        fix = fin._fix_conversation

        def watched(
            d: Any,
            waited_enough: bool,
            fix: Callable[[Any, bool], None] = fix,
            fixed: list[tuple[int, int]] = fixed,
            clock: Any = clock,
        ) -> None:
            fix(d, waited_enough)
            if d.conversation is not None and not d.is_child:
                fixed.append((d.end_us, clock.now))

        fin._fix_conversation = watched  # type: ignore[method-assign]  # watched as it runs
        for line in lines[:-1]:  # the end of the input fixes what is left
            pl.process_line(line, 0.0)
        late = []
        for end, at in fixed:
            due = end + JOIN_WAIT_US
            i = bisect.bisect_left(times, due)
            if at > max(times[min(i, len(times) - 1)], due):
                late.append((end, at))
        waits = [(at - end) / 1e6 for end, at in fixed]
        print(f"{name}: {len(fixed)} conversations fixed, longest wait {max(waits):.2f} s of log time")
        assert len(fixed) > 10 and not late
