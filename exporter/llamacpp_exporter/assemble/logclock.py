"""Server time as the log tells it, and when it went back.

llama-server stamps each line with the time since its start. Time going back means a new
process (a restart: a new epoch), or one stray line (another process writing to the same file,
a line printed again). A restart shows its start banner or keeps going in the new time, so a
line from the past is held until RESTART_CONFIRM_LINES of them make a restart, or time comes
back and they were strays. A stray can also be ahead: one line far in the future, then time
back where it was before it; that line was the stray.
"""

from __future__ import annotations

from typing import Final

from .. import parse as p

EPOCH_BACKWARDS_US: Final = 1_000  # timestamps are taken at queue time and never go back within a process
RESTART_CONFIRM_LINES: Final = 3  # lines in the earlier time (or the start banner) that make a restart


class LogClock:
    def __init__(self) -> None:
        self.last_ts: int | None = None  # the last timestamp of this process; None: none yet
        self.prev_ts: int | None = None  # the one before it
        self.now = 0  # server time of the line being read, in microseconds
        self.read_us = 0  # when it was read (the reader's clock)
        self.held: list[tuple[p.ParsedLine, int]] = []

    def new_epoch(self) -> None:
        """A new server process: its timestamps start afresh."""
        self.last_ts = None

    def went_back(self, ts: int | None) -> bool:
        return ts is not None and self.last_ts is not None and ts < self.last_ts - EPOCH_BACKWARDS_US

    def after_stray_ahead(self, ts: int) -> bool:
        """Time went back, but not before the line preceding the last one: the last line was
        ahead of its time (a stray), not this one behind."""
        return not self.held and self.prev_ts is not None and ts >= self.prev_ts - EPOCH_BACKWARDS_US

    def forget_stray(self, ts: int) -> None:
        self.last_ts = self.now = ts

    def hold(self, line: p.ParsedLine, now_us: int, banner_ends: bool = True) -> bool:
        """Hold a line from the past. True once the held lines (or, with ``banner_ends``, a
        start banner) make a restart."""
        if banner_ends and isinstance(line.event, p.ServerStarting):
            return True
        self.held.append((line, now_us))
        return len(self.held) >= RESTART_CONFIRM_LINES

    def take_held(self) -> list[tuple[p.ParsedLine, int]]:
        held, self.held = self.held, []
        return held

    def advance(self, ts: int | None, now_us: int) -> None:
        self.read_us = now_us
        if ts is not None:
            self.prev_ts = self.last_ts
            self.last_ts = self.now = ts
        elif self.last_ts is None:
            # no timestamps in this log (--no-log-prefix): the time we read the line is the
            # best there is. With timestamps on, a line without one is a continuation line
            # and keeps the time of the line it continues.
            self.now = max(self.now, now_us)
