"""A command's output (``journalctl -f``, ``docker logs -f``) as the log, restarted with
backoff; the history a restarted command prints again is held back."""

from __future__ import annotations

import io
import logging
import os
import select
import subprocess
import threading
import time
from collections import deque
from dataclasses import dataclass
from typing import cast

from .lines import LineSink, LineSplitter, SourceStats

log = logging.getLogger(__name__)


class ReplayGuard:
    """A restarted log command (``journalctl -f``, ``docker logs -f``, ``tail -F``) prints
    history again. After a restart its lines are held until the replay is over (the output
    pauses, or the command exits), then only what follows the last lines already read is
    passed on. If those lines are not in the replay (a new process, a rotated journal), all
    of it is passed on, with a warning: it may then count some requests twice."""

    ANCHOR_LINES = 8
    MAX_HELD = 200_000

    def __init__(self, sink: LineSink, stats: SourceStats) -> None:
        self.sink = sink
        self.stats = stats
        self.recent: deque[str] = deque(maxlen=self.ANCHOR_LINES)
        self.held: list[str] | None = None

    def oversized_line(self) -> None:
        self.sink.oversized_line()

    def process_line(self, line: str) -> None:
        if self.held is not None:
            self.held.append(line)
            if len(self.held) >= self.MAX_HELD or self._caught_up():
                self.settle()
            return
        self.recent.append(line)
        self.sink.process_line(line)

    def _caught_up(self) -> bool:
        """The replay has just printed the last lines read before the restart: what follows
        is new (on a server that never pauses, waiting for a pause would count nothing)."""
        held, anchor = self.held, self.recent
        if not held or not anchor or held[-1] != anchor[-1]:
            return False
        n = min(len(anchor), len(held))
        return held[-n:] == list(anchor)[-n:] and (n == len(anchor) or n == len(held))

    def restarted(self) -> None:
        if self.recent:
            self.held = []

    @property
    def holding(self) -> bool:
        return self.held is not None

    def settle(self) -> None:
        held, self.held = self.held, None
        if held is None:
            return
        start = self._after_anchor(held)
        if start is None:
            if held:
                log.warning(
                    "the restarted log command printed %d lines and none of them is where it left off: "
                    "all are read (requests may be counted twice; prefer a command that prints no "
                    "history, e.g. journalctl -f -n 0, docker logs -f --tail 0)",
                    len(held),
                )
            start = 0
        self.stats.replayed(start)
        for line in held[start:]:
            self.recent.append(line)
            self.sink.process_line(line)

    def _after_anchor(self, held: list[str]) -> int | None:
        """Index after the last place where the held lines end with the last lines read (all
        of them, or as many as the replay's first lines allow)."""
        anchor = list(self.recent)
        last = anchor[-1] if anchor else None
        for end in range(len(held), 0, -1):
            if held[end - 1] != last:
                continue
            n = min(len(anchor), end)
            if held[end - n : end] == anchor[-n:]:
                return end
        return None


def follow_command(
    command: str,
    splitter: LineSplitter,
    stats: SourceStats,
    stop: threading.Event,
    max_backoff: float = 30.0,
    min_healthy_run: float = 60.0,
    replay_quiet: float = 0.5,
) -> None:
    """Run a command (``journalctl -f ...``, ``docker logs -f ...``) and follow its stdout and
    stderr; restart it with backoff when it exits. The backoff only resets after a run of
    ``min_healthy_run`` seconds: a command that prints its history and exits at once is not
    restarted every second. What a restart prints again is dropped (ReplayGuard)."""
    guard = splitter.filter_lines(lambda sink: ReplayGuard(sink, stats))
    backoff = 1.0
    while not stop.is_set():
        try:
            proc = subprocess.Popen(
                command,
                shell=True,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        except OSError as e:
            stats.read_error()
            log.error("cannot start log command: %s", e.strerror)
            stop.wait(backoff)
            backoff = min(backoff * 2, max_backoff)
            continue
        started = time.monotonic()
        log.info("following the output of the log command (pid %d)", proc.pid)
        assert proc.stdout is not None
        watcher = threading.Thread(target=_kill_on_stop, args=(proc, stop), daemon=True)
        watcher.start()
        stdout = cast(io.BufferedReader, proc.stdout)  # Popen's pipes are buffered readers
        while True:
            if guard.holding:
                ready, _, _ = select.select([proc.stdout], [], [], replay_quiet)
                if not ready:
                    guard.settle()  # the replay is over: the command now follows
                    splitter.handed()  # what it released goes on now, not at the next read
                    continue
            data = stdout.read1(1 << 16)
            if not data:
                break
            splitter.feed(data)
        # a line cut short by the command's end is printed whole again by the restarted
        # command's replay: never a line (nor the anchor the replay is matched against)
        splitter.drop()
        guard.settle()
        splitter.handed()
        rc = proc.wait()
        if stop.is_set():
            return
        stats.command_restart()
        if time.monotonic() - started >= min_healthy_run:
            backoff = 1.0
        log.warning("log command exited with status %s; restarting in %.0f s", rc, backoff)
        stop.wait(backoff)
        backoff = min(backoff * 2, max_backoff)
        guard.restarted()


def _kill_on_stop(proc: subprocess.Popen[bytes], stop: threading.Event) -> None:
    while proc.poll() is None:
        if stop.wait(0.5):
            try:
                os.killpg(proc.pid, 15)
            except OSError:
                pass
            return


@dataclass
class CommandSource:
    """A command's output (journalctl -f, docker logs -f), restarted with backoff."""

    command: str
    stats: SourceStats

    def run(self, splitter: LineSplitter, stop: threading.Event) -> None:
        follow_command(self.command, splitter, self.stats, stop)
