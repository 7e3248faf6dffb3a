"""What every log source shares: bytes cut into complete lines (a line longer than
``max_line_bytes`` is dropped and reported as oversized, so one runaway line cannot exhaust
memory), its counters, and the one interface a source offers (``LogSource.run``)."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Protocol, TypeVar

from prometheus_client import CollectorRegistry, Counter

log = logging.getLogger(__name__)


class SourceStats:
    """What the log source did: counted here, and as metrics on the registry if given."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.rotations = self.truncations = self.read_errors = self.command_restarts = self.replayed_lines = 0
        self.metrics = _SourceMetrics(registry) if registry is not None else None

    def rotation(self) -> None:
        self.rotations += 1
        if self.metrics is not None:
            self.metrics.log_rotations.inc()

    def truncation(self) -> None:
        self.truncations += 1
        if self.metrics is not None:
            self.metrics.log_truncations.inc()

    def read_error(self) -> None:
        self.read_errors += 1
        if self.metrics is not None:
            self.metrics.log_read_errors.inc()

    def command_restart(self) -> None:
        self.command_restarts += 1
        if self.metrics is not None:
            self.metrics.log_source_restarts.inc()

    def replayed(self, n: int) -> None:
        self.replayed_lines += n
        if self.metrics is not None and n:
            self.metrics.log_replayed.inc(n)


class _SourceMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        r = registry
        self.log_rotations = Counter(
            "llamacpp_exporter_log_rotations", "Log file rotations (file replaced) followed.", registry=r
        )
        self.log_truncations = Counter(
            "llamacpp_exporter_log_truncations",
            "Log file truncations (copytruncate, llama-server restart with --log-file) followed.",
            registry=r,
        )
        self.log_read_errors = Counter(
            "llamacpp_exporter_log_read_errors",
            "Errors reading the log source (missing file, failed command...).",
            registry=r,
        )
        self.log_source_restarts = Counter(
            "llamacpp_exporter_log_command_restarts",
            "Restarts of the --llama.log-command process after it exited.",
            registry=r,
        )
        self.log_replayed = Counter(
            "llamacpp_exporter_log_lines_replayed",
            "Lines a restarted --llama.log-command printed again (history) and that were not counted twice.",
            registry=r,
        )


class LineSink(Protocol):
    """Where the splitter's complete lines go, with a mark for each line dropped as too long
    (the pipeline is one; the app's queue batches and the replay guard stand between)."""

    def process_line(self, line: str) -> None: ...

    def oversized_line(self) -> None: ...


_Filter = TypeVar("_Filter", bound=LineSink)


class LineSplitter:
    """Bytes in, complete lines out; keeps the partial last line until its newline arrives."""

    def __init__(self, sink: LineSink, max_line_bytes: int) -> None:
        self.sink = sink
        self.max = max_line_bytes
        self.buf = bytearray()
        self.skipping = False  # inside an oversized line: drop until its newline

    def feed(self, data: bytes) -> None:
        if b"\0" in data:
            # a hole read as zeros: a writer without O_APPEND (llama-server's --log-file) goes on
            # at its old offset after a copytruncate. NUL is never part of a log line.
            data = data.replace(b"\0", b"")
        start = 0
        while True:
            nl = data.find(b"\n", start)
            if nl < 0:
                rest = data[start:]
                if self.skipping:
                    return
                if len(self.buf) + len(rest) > self.max:
                    self.buf.clear()
                    self.skipping = True
                    self.sink.oversized_line()
                    return
                self.buf += rest
                return
            chunk = data[start:nl]
            start = nl + 1
            if self.skipping:
                self.skipping = False
                continue
            if self.buf:
                self.buf += chunk
                chunk = bytes(self.buf)
                self.buf.clear()
            if len(chunk) > self.max:
                self.sink.oversized_line()
                continue
            self.sink.process_line(chunk.rstrip(b"\r").decode("utf-8", errors="replace"))

    def flush(self) -> None:
        """Emit a pending partial line (the file it came from is gone)."""
        if self.buf and not self.skipping:
            self.sink.process_line(bytes(self.buf).decode("utf-8", errors="replace"))
        self.buf.clear()
        self.skipping = False

    def drop(self) -> None:
        self.buf.clear()
        self.skipping = False

    def handed(self) -> None:
        """Lines emitted outside a feed (released by the replay guard) are to go on now."""

    def filter_lines(self, make: Callable[[LineSink], _Filter]) -> _Filter:
        """Put a filter between the split lines and where they go (the replay guard of a
        restarted command): ``make`` gets the current destination and returns the filter."""
        f = make(self.sink)
        self.sink = f
        return f


# ---------------------------------------------------------------- one interface for the sources
class LogSource(Protocol):
    """Where llama-server's log comes from: ``run`` feeds its bytes to the splitter until the
    input ends or ``stop`` is set."""

    def run(self, splitter: LineSplitter, stop: threading.Event) -> None: ...
