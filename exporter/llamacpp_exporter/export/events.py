"""The events file: one JSON line per request record (numbers and fixed words only), written
whole or not at all, bounded by rotation; and what a restarted exporter reads back from it."""

from __future__ import annotations

import json
import logging
import os
import time
from typing import Any

from prometheus_client import CollectorRegistry, Counter

from ..records import ConversationProof, RecordKey, RequestRecord

log = logging.getLogger(__name__)


class EventsFile:
    """Appends one JSON line per request record. Records hold numbers and fixed words only.
    A line is written whole or not at all: a write that fails part-way (a full disk, a file-size
    limit) is cut back, so the next line never joins a partial one; the record is counted.

    Bounded: a line that would take the file past ``max_bytes`` first rotates it (X -> X.1 ->
    ... -> X.<max_files>, the oldest deleted), so the files never hold much more than
    max_bytes x (max_files + 1). ``max_bytes`` 0: never rotated here (an outside logrotate,
    then SIGHUP).

    ``path`` "-": the lines go to standard output (for Promtail, Alloy or Vector), never rotated
    (the exporter's own log is on standard error)."""

    def __init__(self, path: str, registry: CollectorRegistry, max_bytes: int = 0, max_files: int = 0) -> None:
        self.path = path
        self.max_bytes = max_bytes
        self.max_files = max_files
        r = registry
        self.rotations = Counter(
            "llamacpp_exporter_events_rotations",
            "Times the events file reached --events.max-bytes and was rotated.",
            registry=r,
        )
        self.records_written = Counter(
            "llamacpp_exporter_events_written", "Request records appended to the events file.", registry=r
        )
        self.events_errors = Counter(
            "llamacpp_exporter_events_write_errors",
            "Request records (or proof lines) that could not be written to the events file.",
            registry=r,
        )
        self.stream = path == "-"
        self._fd: int | None = 1 if self.stream else None
        self._last_error_log = 0.0
        self.reopen_requested = False  # SIGHUP: the file was rotated; the next line opens it again

    def record(self, rec: RequestRecord) -> None:
        self._append(rec.to_event(), counted=True)

    def _append(self, obj: dict[str, Any], counted: bool) -> None:
        data = (json.dumps(obj, separators=(",", ":")) + "\n").encode()
        if self.stream:
            self._append_to_stream(data, counted)
            return
        end = None
        if self.reopen_requested and self._fd is not None:
            self.reopen_requested = False
            os.close(self._fd)
            self._fd = None
        try:
            if self._fd is None:
                self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o644)
            end = os.lseek(self._fd, 0, os.SEEK_END)
            if self.max_bytes and end and end + len(data) > self.max_bytes:
                self._rotate()
                end = 0
            view = memoryview(data)
            while view:
                n = os.write(self._fd, view)
                view = view[n:]
            if counted:
                self.records_written.inc()
        except OSError as e:
            self.events_errors.inc()
            if self._fd is not None:
                if end is not None:
                    try:
                        os.ftruncate(self._fd, end)  # no partial line left behind
                    except OSError:
                        pass
                os.close(self._fd)
                self._fd = None
            now = time.monotonic()
            if now - self._last_error_log > 60:
                self._last_error_log = now
                log.warning("cannot write events file %s: %s", self.path, e.strerror)

    def _append_to_stream(self, data: bytes, counted: bool) -> None:
        try:
            view = memoryview(data)
            while view:
                n = os.write(1, view)
                view = view[n:]
            if counted:
                self.records_written.inc()
        except OSError as e:  # a reader that went away: counted, and said once a minute
            self.events_errors.inc()
            now = time.monotonic()
            if now - self._last_error_log > 60:
                self._last_error_log = now
                log.warning("cannot write events to standard output: %s", e.strerror)

    def _rotate(self) -> None:
        """X.<n-1> -> X.<n>, ..., X -> X.1, then a new X. Renames only: the line being written
        waits a few system calls, never a copy. On failure (OSError) the caller counts it."""
        assert self._fd is not None
        os.close(self._fd)
        self._fd = None
        for i in range(self.max_files, 0, -1):
            older = f"{self.path}.{i - 1}" if i > 1 else self.path
            if os.path.exists(older):
                os.replace(older, f"{self.path}.{i}")  # X.<max_files> is replaced: the oldest goes
        if self.max_files == 0:
            os.unlink(self.path)
        self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o644)
        self.rotations.inc()

    def proven(self, rec: RequestRecord, proof: ConversationProof) -> None:
        """The conversation of a record written before it was proven: a line of its own,
        naming the record by its key (analyze applies it to the record)."""
        self._append(proof.to_event(), counted=False)

    def close(self) -> None:
        if self._fd is not None and not self.stream:
            os.close(self._fd)
            self._fd = None


def events_files(path: str) -> list[str]:
    """An events file and its rotated copies (X.1, X.2, ...), oldest first: the order they were
    written in."""
    out = [path] if os.path.exists(path) else []
    i = 1
    while os.path.exists(f"{path}.{i}"):
        out.append(f"{path}.{i}")
        i += 1
    return out[::-1]


def written_records(path: str, tail_bytes: int = 16 << 20) -> set[RecordKey]:
    """The records the events files hold (their last ``tail_bytes``, across a rotation), by
    key: what a restarted exporter must not write again."""
    out: set[RecordKey] = set()
    chunks: list[bytes] = []
    left = tail_bytes
    for name in reversed(events_files(path)):  # newest first, until tail_bytes are read
        try:
            with open(name, "rb") as fh:
                size = fh.seek(0, os.SEEK_END)
                fh.seek(max(0, size - left))
                chunks.append(fh.read())
        except OSError:
            continue
        left -= len(chunks[-1])
        if left <= 0:
            break
    for line in b"\n".join(reversed(chunks)).splitlines():
        try:
            obj = json.loads(line)
        except ValueError:
            continue  # the cut first line, or one that is not a record
        # the key's fields only: a whole record's check of every field took seconds at start-up
        if isinstance(obj, dict) and "proof" not in obj:
            slot, task = obj.get("slot"), obj.get("task")
            if isinstance(slot, int) and isinstance(task, int):
                out.add(RecordKey(obj.get("model", ""), slot, task, obj.get("start_us")))
    return out
