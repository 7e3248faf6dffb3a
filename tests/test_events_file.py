"""The events file under a full disk: a record is written whole or not at all, and counted
when it is not. The limit is a real one, the kernel's file-size limit (RLIMIT_FSIZE, EFBIG on
the write that crosses it), set in a process of its own."""

from __future__ import annotations

import json
import os
import select
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from realserver import free_port

pytestmark = pytest.mark.integration


def test_a_write_that_fails_part_way_leaves_no_partial_line(tmp_path: Path) -> None:
    path = tmp_path / "events.jsonl"
    script = textwrap.dedent(
        f"""
        import resource, signal
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # the write fails with EFBIG instead
        resource.setrlimit(resource.RLIMIT_FSIZE, (20_000, 20_000))
        from prometheus_client import CollectorRegistry
        from llamacpp_exporter.export.events import EventsFile
        from llamacpp_exporter.records import RequestRecord
        reg = CollectorRegistry()
        ev = EventsFile({str(path)!r}, reg)
        for i in range(100):
            ev.record(RequestRecord(epoch=0, slot=0, task=i, prompt_tokens=i))
        ev.close()
        print(reg.get_sample_value("llamacpp_exporter_events_written_total"),
              reg.get_sample_value("llamacpp_exporter_events_write_errors_total"))
        """
    )
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    written, errors = map(float, out.stdout.split())
    data = path.read_bytes()
    assert data.endswith(b"\n")
    lines = data.decode().splitlines()
    assert [json.loads(line)["task"] for line in lines] == list(range(len(lines)))  # every line whole
    assert len(lines) == written and written + errors == 100 and errors > 0


def test_the_events_file_rotates_at_its_size_and_keeps_its_count(tmp_path: Path) -> None:
    from prometheus_client import CollectorRegistry

    from llamacpp_exporter.export.events import EventsFile, events_files, written_records
    from llamacpp_exporter.records import RequestRecord

    path = tmp_path / "events.jsonl"
    reg = CollectorRegistry()
    max_bytes = 16384  # about a dozen records a file
    ev = EventsFile(str(path), reg, max_bytes=max_bytes, max_files=3)
    for i in range(200):
        ev.record(RequestRecord(epoch=0, slot=0, task=i, prompt_tokens=i, start_us=i))
    ev.close()
    names = events_files(str(path))
    assert [n.rsplit("/", 1)[1] for n in names] == [
        "events.jsonl.3",
        "events.jsonl.2",
        "events.jsonl.1",
        "events.jsonl",
    ]
    tasks = [json.loads(line)["task"] for n in names for line in open(n)]
    # the newest records, in order, each line whole; the oldest files are gone: bounded
    assert tasks == list(range(200 - len(tasks), 200)) and 20 < len(tasks) < 200
    assert all(0 < (tmp_path / n).stat().st_size <= max_bytes for n in names)
    rotations = reg.get_sample_value("llamacpp_exporter_events_rotations_total")
    assert rotations is not None and rotations > 3
    assert reg.get_sample_value("llamacpp_exporter_events_written_total") == 200
    # a restarted exporter knows what is written across the rotation, from the newest files
    line_bytes = len(open(names[-1]).readline())
    newest = {("", 0, t, t) for t in tasks[-30:]}  # more than the newest file holds
    assert len(newest) > len(open(names[-1]).readlines())
    assert newest <= written_records(str(path), tail_bytes=31 * line_bytes)


def test_max_bytes_zero_never_rotates_and_max_files_zero_keeps_no_copy(tmp_path: Path) -> None:
    from prometheus_client import CollectorRegistry

    from llamacpp_exporter.export.events import EventsFile, events_files
    from llamacpp_exporter.records import RequestRecord

    never, none_kept = tmp_path / "never.jsonl", tmp_path / "none.jsonl"
    a = EventsFile(str(never), CollectorRegistry(), max_bytes=0, max_files=3)
    b = EventsFile(str(none_kept), CollectorRegistry(), max_bytes=4096, max_files=0)
    for i in range(50):
        a.record(RequestRecord(epoch=0, slot=0, task=i))
        b.record(RequestRecord(epoch=0, slot=0, task=i))
    a.close()
    b.close()
    assert events_files(str(never)) == [str(never)] and len(never.read_text().splitlines()) == 50
    assert events_files(str(none_kept)) == [str(none_kept)] and none_kept.stat().st_size <= 4096


def test_events_path_dash_writes_the_records_to_standard_output_and_no_file(tmp_path: Path) -> None:
    log = Path(__file__).parent / "fixtures" / "logs" / "lv4-np2-text.log"
    truth = (log.parent / "lv4-np2-text.truth.jsonl").read_text().splitlines()
    proc = subprocess.Popen(
        [sys.executable, "-m", "llamacpp_exporter", "--events.path", "-", "--llama.log-path", str(log),
         "--llama.log-from-start", "--llama.url", f"http://127.0.0.1:{free_port()}",
         "--web.listen-address", f"127.0.0.1:{free_port()}"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=tmp_path,
    )  # fmt: skip
    try:
        out, deadline = b"", time.monotonic() + 30
        assert proc.stdout is not None
        while out.count(b"\n") < len(truth):
            ready, _, _ = select.select([proc.stdout], [], [], max(0.0, deadline - time.monotonic()))
            assert ready, f"{len(out.splitlines())} of {len(truth)} records on standard output in 30 s"
            chunk = os.read(proc.stdout.fileno(), 1 << 16)
            assert chunk, "standard output ended"
            out += chunk
        records = [json.loads(line) for line in out.splitlines()]
    finally:
        proc.terminate()
        proc.wait(10)
    assert all("task" in r and "prompt_tokens" in r for r in records)
    assert sorted(r["prompt_tokens"] for r in records) == sorted(
        json.loads(t)["prompt_n"] + json.loads(t)["cache_n"] for t in truth
    )
    assert list(tmp_path.iterdir()) == []  # no file named "-", no "-.log-position"


def test_a_proof_line_is_read_back_as_written_and_a_broken_one_is_refused(tmp_path: Path) -> None:
    from prometheus_client import CollectorRegistry

    from llamacpp_exporter.export.events import EventsFile
    from llamacpp_exporter.records import ConversationProof, RecordKey, RequestRecord

    path = tmp_path / "events.jsonl"
    ev = EventsFile(str(path), CollectorRegistry())
    rec = RequestRecord(epoch=2, slot=1, task=7, start_us=900, model="m")
    proof = ConversationProof(rec.key, rec.epoch, "c0ffee", "lineage")
    ev.proven(rec, proof)
    ev.close()
    (line,) = [json.loads(x) for x in open(path)]
    assert ConversationProof.from_event(line) == proof
    assert proof.key == RecordKey("m", 1, 7, 900)
    for broken in (
        {**line, "conversation_source": "uncertain"},  # a proof names what the log proved
        {**line, "task": "7"},
        {**line, "slot": True},
        {k: v for k, v in line.items() if k != "epoch"},
        {**line, "proof": "other"},
    ):
        assert ConversationProof.from_event(broken) is None
