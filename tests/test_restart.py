"""The exporter restarted while llama-server keeps writing its log: with a saved position it
reads on where it stopped, nothing counted twice, nothing skipped."""

from __future__ import annotations

import json
import signal
import subprocess
from functools import partial
from pathlib import Path
from typing import Any

import pytest
from realserver import ExporterProcess, free_port, wait_for

pytestmark = pytest.mark.integration

LOG = Path(__file__).parent / "fixtures" / "logs" / "lv4-np2-text.log"


def proc(exp: ExporterProcess) -> subprocess.Popen[Any]:
    assert exp.proc is not None, "the exporter was started"
    return exp.proc


def _saved_past(position: Path, before: int) -> bool:
    return position.exists() and json.loads(position.read_text())["offset"] > before


def _setup(tmp_path: Path) -> tuple[list[str], Path, Path, list[str]]:
    """The recorded log's lines, an empty log the test writes them into, the events file, and
    the exporter's arguments (no llama-server to poll)."""
    log, events = tmp_path / "llama.log", tmp_path / "events.jsonl"
    log.write_text("")
    args = ["--llama.url", f"http://127.0.0.1:{free_port()}", "--llama.log-path", str(log)]
    args += ["--events.path", str(events), "--no-llama.slots"]
    return LOG.read_text().splitlines(keepends=True), log, events, args


def tasks(events: Path) -> list[tuple[int, int]]:
    # proof lines (a conversation proven after its record) name a record written before
    return [(r["epoch"], r["task"]) for r in map(json.loads, events.read_text().splitlines()) if "proof" not in r]


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL], ids=["stopped", "killed"])
def test_a_restarted_exporter_reads_on_where_it_stopped(tmp_path: Path, sig: signal.Signals) -> None:
    lines, log, events, args = _setup(tmp_path)

    def write(part: list[str]) -> None:
        with open(log, "a") as fh:
            fh.writelines(part)

    third = len(lines) // 3
    position = tmp_path / "events.jsonl.log-position"
    exp = ExporterProcess(args, tmp_path / "a").start()
    exp.wait_following()
    write(lines[:third])
    exp.wait_lines_processed(third)
    # records went out, so a position is saved with them (the pipeline saves it right after
    # the lines it follows; until then a restart finds no position and starts at the end)
    wait_for(position.exists, "the saved log position")
    proc(exp).send_signal(sig)
    proc(exp).wait(10)
    write(lines[third : 2 * third])  # written while the exporter is down
    offset = json.loads(position.read_text())["offset"]
    exp = ExporterProcess(args, tmp_path / "b").start()
    exp.wait_following()
    write(lines[2 * third :])
    exp.wait_lines_processed(LOG.read_bytes()[offset:].count(b"\n"))
    exp.stop()
    got = tasks(events)
    assert len(got) == len(set(got)), "a request was counted twice"
    lost = 32 - len(got)
    print(f"{sig.name}: {len(got)} of 32 requests recorded once, {lost} lost, 0 twice")
    # an orderly stop flushes the records in flight; after a kill they are read again (the run
    # from its start banner) and, not being in the events file, written then
    assert lost == 0
    assert "the saved position" in (tmp_path / "b" / "exporter.stderr").read_text()
    # the position file holds a digest of the log's bytes, never the bytes (they may be prompt text)
    saved = json.loads((tmp_path / "events.jsonl.log-position").read_text())
    assert len(saved["sig"]) == 64 and bytes.fromhex(saved["sig"]) not in LOG.read_bytes()


def _killed_between_parts(tmp_path: Path, lines: list[str], log: Path, args: list[str], parts: int) -> ExporterProcess:
    """The log written in ``parts`` parts, one exporter each, every one but the last killed
    (SIGKILL: whatever was in flight, at any moment) once it saved a position in its part.
    Returns the last exporter, still running."""
    cuts = [len(lines) * i // parts for i in range(parts + 1)]
    position = tmp_path / "events.jsonl.log-position"
    for run in range(parts):
        exp = ExporterProcess(args, tmp_path / f"run{run}").start()
        exp.wait_following()
        with open(log, "a") as fh:
            fh.writelines(lines[cuts[run] : cuts[run + 1]])
        # every line so far: a restarted exporter reads the run again from its start banner
        exp.wait_lines_processed(cuts[run + 1])
        before = len("".join(lines[: cuts[run]]).encode())
        wait_for(
            partial(_saved_past, position, before),
            "a position saved in this run",
        )
        if run < parts - 1:
            proc(exp).send_signal(signal.SIGKILL)
            proc(exp).wait(10)
    return exp


def test_killed_three_times_while_the_log_is_written_every_request_is_counted_once(tmp_path: Path) -> None:
    lines, log, events, args = _setup(tmp_path)
    _killed_between_parts(tmp_path, lines, log, args, parts=4).stop()
    got = tasks(events)
    print(f"killed 3 times: {len(got)} records for 32 requests, {len(set(got))} distinct")
    assert len(got) == len(set(got)) == 32


def test_sighup_reopens_the_events_file_and_stops_nothing(tmp_path: Path) -> None:
    lines, log, events, args = _setup(tmp_path)
    exp = ExporterProcess(args, tmp_path / "a").start()
    exp.wait_following()
    half = len(lines) // 2
    with open(log, "a") as fh:
        fh.writelines(lines[:half])
    wait_for(lambda: events.exists() and tasks(events), "records")
    events.rename(tmp_path / "events.jsonl.1")  # our own output rotated, then SIGHUP
    proc(exp).send_signal(signal.SIGHUP)
    # as logrotate's postrotate: records written before the signal is handled go to the renamed
    # file; the second half is written once the exporter says it has handled it
    wait_for(lambda: "SIGHUP" in exp.stderr_path.read_text(), "the exporter handling SIGHUP")
    with open(log, "a") as fh:
        fh.writelines(lines[half:])
    wait_for(lambda: events.exists() and tasks(events), "records in the new events file")
    assert proc(exp).poll() is None, "SIGHUP stopped the exporter"
    exp.stop()
    got = tasks(tmp_path / "events.jsonl.1") + tasks(events)
    assert len(got) == len(set(got)) == 32


def test_killed_while_its_events_file_rotates_every_request_is_written_once_and_analyze_reads_the_set(
    tmp_path: Path,
) -> None:
    """The events file bounded to 4 KiB a file (a few records each), the exporter killed twice:
    every request is in the rotated set once, and analyze --events reads the whole set."""
    import subprocess
    import sys

    from llamacpp_exporter.export.events import events_files

    lines, log, events, args = _setup(tmp_path)
    args += ["--events.max-bytes", "4096", "--events.max-files", "1000"]
    exp = _killed_between_parts(tmp_path, lines, log, args, parts=3)
    rotations = next(
        float(line.rsplit(" ", 1)[1])
        for line in exp.metrics_text().splitlines()
        if line.startswith("llamacpp_exporter_events_rotations_total ")
    )
    exp.stop()
    files = [Path(n) for n in events_files(str(events))]
    got = [t for f in files for t in tasks(f)]
    print(f"{len(files)} events files, {len(got)} records for 32 requests, {rotations:.0f} rotations in the last run")
    assert len(files) >= 5 and all(f.stat().st_size <= 4096 for f in files)
    assert len(got) == len(set(got)) == 32

    def analyzed(*extra: str) -> dict[str, Any]:
        out = subprocess.run(
            [sys.executable, "-m", "llamacpp_exporter", "analyze", "--format", "json", "--no-progress", *extra],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert out.returncode == 0, out.stderr
        status: dict[str, Any] = json.loads(out.stdout)
        return status

    from_events = analyzed("--events", str(events))
    from_log = analyzed(str(LOG))
    assert from_events["sources"]["events_files"] == len(files) and from_events["sources"]["events_records"] == 32
    assert from_events["requests"] == from_log["requests"]
    assert from_events["miss_rate"] == from_log["miss_rate"]
