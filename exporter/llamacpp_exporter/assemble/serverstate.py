"""What the log says about the server process itself: its verbosity (are the -lv 4 cache
diagnostics there?), DEBUG logging (prompt text in its log), its slots, its build."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Protocol

from .. import parse as p
from ..records import MAX_SLOTS


class ServerSink(Protocol):
    def diagnostics(self, available: bool, verbosity: int | None) -> None: ...
    def slots_known(self, slot_ids: list[int]) -> None: ...
    def debug_logging_seen(self) -> None: ...
    def debug_logging_ended(self) -> None: ...
    def server_build(self, number: int, commit: str) -> None: ...
    def server_listening(self, url: str) -> None: ...


class ServerState:
    def __init__(self, sink: ServerSink, on_change: Callable[[], None]) -> None:
        self.sink = sink
        self.on_change = on_change  # verbosity, diagnostics or the number of slots changed
        self.verbosity: int | None = None
        self.diagnostics: bool | None = None  # -lv 4 cache lines seen (True) or a task without them
        self.known_slots: set[int] = set()
        self.n_slots: int | None = None  # from the start banner
        self._debug_warned = False

    @property
    def debug_logging(self) -> bool:
        """The log shows DEBUG lines (-lv 5): client text may follow them."""
        return self._debug_warned

    @property
    def lineage_only(self) -> bool:
        """Below -lv 4 no request shows its conversation id: only cache lineage can group them."""
        return (self.verbosity is not None and self.verbosity < 4) or self.diagnostics is False

    def set_diagnostics(self, available: bool) -> None:
        if self.diagnostics != available:
            self.diagnostics = available
            self.sink.diagnostics(available, self.verbosity)
            self.on_change()

    def verbosity_read(self, ev: p.Verbosity) -> None:
        changed = self.verbosity is not None and self.verbosity != ev.level
        self.verbosity = ev.level
        self.on_change()
        if changed and self.diagnostics == (ev.level >= 4):
            self.sink.diagnostics(ev.level >= 4, ev.level)  # restarted at another level: the gauge follows
        self.set_diagnostics(ev.level >= 4)
        if ev.level >= 5:
            self.debug_seen(p.DebugLine())

    def debug_seen(self, ev: p.DebugLine) -> None:
        if not self._debug_warned:
            self._debug_warned = True
            self.sink.debug_logging_seen()

    def run_started(self) -> None:
        """A new server run (a restart): whether it logs DEBUG lines is its own, told by its
        banner's verbosity or its first DEBUG line, so a restart at -lv 4 ends the warning."""
        if self._debug_warned:
            self._debug_warned = False
            self.sink.debug_logging_ended()

    def build(self, ev: p.ServerBuild) -> None:
        self.sink.server_build(ev.number, ev.commit)

    def listening(self, ev: p.ServerListening) -> None:
        self.sink.server_listening(ev.url)

    def slots_initialized(self, ev: p.SlotsInitialized) -> None:
        self.n_slots = min(ev.n_slots, MAX_SLOTS)
        self.announce_slots(range(ev.n_slots))
        self.on_change()

    def announce_slots(self, ids: Iterable[int]) -> None:
        # bounded by what the server has (its start banner's n_slots, else a hard cap): each
        # slot id becomes a label value
        limit = self.n_slots if self.n_slots is not None else MAX_SLOTS
        new = [i for i in ids if i not in self.known_slots and 0 <= i < limit]
        if new:
            self.known_slots.update(new)
            self.sink.slots_known(sorted(new))
            self.on_change()

    def slots(self) -> int | None:
        """How many slots the server has, as far as the log and /slots tell."""
        if self.n_slots is not None:
            return max(self.n_slots, len(self.known_slots))
        return len(self.known_slots) or None
