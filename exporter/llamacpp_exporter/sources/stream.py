"""Standard input (a pipe) as the log, read to its end."""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass
from typing import IO

from .lines import LineSplitter

log = logging.getLogger(__name__)


def follow_stream(stream: IO[bytes], splitter: LineSplitter, stop: threading.Event) -> None:
    """Standard input: read until EOF."""
    while not stop.is_set():
        data = stream.read1(1 << 16) if hasattr(stream, "read1") else stream.read(1 << 16)
        if not data:
            break
        splitter.feed(data)
    splitter.flush()


@dataclass
class StreamSource:
    """Standard input (a pipe), read to its end."""

    stream: IO[bytes]

    def run(self, splitter: LineSplitter, stop: threading.Event) -> None:
        follow_stream(self.stream, splitter, stop)
        log.info("standard input closed")
