"""A log rotated while the exporter was stopped: the rest of the saved file is read first, under
whatever name the rotation gave it (renamed, or copied and truncated; compressed since or not),
then the new file. The "server" is a recorded log written in three parts: before the stop,
while the exporter is down (into the file that is then rotated), and after the rotation."""

from __future__ import annotations

import gzip
import os
import shutil
from pathlib import Path

import pytest
from realserver import ExporterProcess, free_port
from support import LOGS, replay_records, wait_records

pytestmark = pytest.mark.integration


def _exporter(tmp_path: Path, log: Path) -> ExporterProcess:
    return ExporterProcess(
        ["--llama.url", f"http://127.0.0.1:{free_port()}", "--no-llama.slots", "--no-llama.metrics"]
        + ["--llama.log-path", str(log), "--llama.log-from-start"]
        + [
            "--llama.log-position-file",
            str(tmp_path / "position.json"),
            "--events.path",
            str(tmp_path / "events.jsonl"),
        ],
        tmp_path / "exporter",
    )


def _rotate(log: Path, how: str) -> None:
    rotated = log.with_name(log.name + ".1")
    if how.startswith("rename"):
        os.rename(log, rotated)
    else:  # copytruncate, as logrotate does for a writer that keeps its file open
        shutil.copyfile(log, rotated)
        with open(log, "r+b") as fh:
            fh.truncate(0)
    if how.endswith("gzip"):
        with open(rotated, "rb") as src, gzip.open(str(rotated) + ".gz", "wb") as dst:
            shutil.copyfileobj(src, dst)
        os.remove(rotated)


@pytest.mark.parametrize("how", ["rename", "rename+gzip", "copytruncate", "copytruncate+gzip"])
def test_every_request_is_counted_once_across_a_rotation_while_stopped(tmp_path: Path, how: str) -> None:
    raw = (LOGS / "lv4-np2-text.log").read_bytes().splitlines(keepends=True)
    expected, _ = replay_records([line.decode().rstrip("\n") for line in raw])
    k, m = len(raw) * 2 // 5, len(raw) * 7 // 10
    log = tmp_path / "llama-server.log"
    log.write_bytes(b"".join(raw[:k]))
    exp = _exporter(tmp_path, log).start()
    exp.wait_lines_processed(k)
    exp.stop()  # SIGTERM: an orderly stop, the position saved
    with open(log, "ab") as fh:  # the server goes on while the exporter is down
        fh.write(b"".join(raw[k:m]))
    _rotate(log, how)
    with open(log, "ab") as fh:
        fh.write(b"".join(raw[m:]))
    exp = _exporter(tmp_path, log).start()
    try:
        recs = wait_records(tmp_path / "events.jsonl", len(expected), timeout=30)
    finally:
        exp.stop()
    keys = [(r["epoch"], r["slot"], r["task"]) for r in recs]
    assert len(keys) == len(set(keys)), "a request was counted twice"
    assert sorted(keys) == sorted((r.epoch, r.slot, r.task) for r in expected)
    assert "rotated while the exporter was down" in exp.stderr_path.read_text()
