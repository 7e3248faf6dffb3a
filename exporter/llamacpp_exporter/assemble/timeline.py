"""When each slot was prefilling: recent prefill intervals per slot, in server time.

A prefill starts at its task's launch, moves to the first prompt batch ("new prompt"), ends at
"prompt done" or the release; the server's own timings then fix it exactly (prompt eval and
eval times, counted back from the eval line). Another slot's decoding is compared against these
intervals: how long it overlapped a prefill, and whose.

Where the server logs "new prompt" (TRACE: -lv 4), a launched task without that line has not
begun its prefill: llama-server starts a prompt's clock and logs the line in one step
(server-context.cpp, `update_prompt_start` then "new prompt", on the thread that also logs every
release), so such a prefill overlaps nothing before the last line read, and a task released
without it computed nothing. Below -lv 4 a prefill is taken from its launch, an upper bound.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Final, NamedTuple

MAX_PREFILL_HISTORY: Final = 32  # per slot: decodes never last longer than the last few prefills
MAX_OVERLAPPED_PREFILLS: Final = 8  # per record: the prefills that overlapped its decoding most


class Overlap(NamedTuple):
    """Another slot's prefill during a decoding: whose (its slot, task and launch, the key of
    its record) and the part of the decoding it overlapped, in server time."""

    slot: int
    task: int
    launched: int | None  # None: the timeline lost its launch
    lo: int
    hi: int


class Prefill:
    """One prefill of a slot. A plain class: one is made at each task, and compiled (mypyc) a
    dataclass's ``__init__`` runs in the interpreter."""

    __slots__ = ("start", "end", "task", "launched", "exact", "tokens", "begun")

    def __init__(
        self,
        start: int,
        end: int | None,  # None: running
        task: int,
        launched: int | None,  # its task's launch (the record's start_us); None where not seen
        exact: bool = False,  # fixed by the server's own timings (or the release)
        tokens: int | None = None,  # prompt tokens it computed (the server's timings), when known
        begun: bool = True,  # False: launched where "new prompt" is logged, and that line not read yet
    ) -> None:
        self.start = start
        self.end = end
        self.task = task
        self.launched = launched
        self.exact = exact
        self.tokens = tokens
        self.begun = begun


def _first_starting_at(pf: list[Prefill], at: int) -> int:
    """bisect.bisect_left(pf, at, key=start) of prefills in the order they start, written out:
    compiled, native steps instead of a module call with a key function called at each."""
    lo, hi = 0, len(pf)
    while lo < hi:
        mid = (lo + hi) // 2
        if pf[mid].start < at:
            lo = mid + 1
        else:
            hi = mid
    return lo


class PrefillTimeline:
    def __init__(self) -> None:
        self.slots: dict[int, list[Prefill]] = {}
        # per slot, its prefills not yet exact (usually none or the running one): what
        # settled_before looks at, for every waiting record at every task event
        self._inexact: dict[int, list[Prefill]] = {}
        # changes, per slot and in all: a waiting record looks again only at what changed
        # since it last looked (finish.py), not at every slot
        self.version = 0
        self.slot_version: dict[int, int] = {}
        # settled_before's answer at self.version: the earliest begun start among the inexact
        # prefills, and the earliest on another slot than that one
        self._earliest: tuple[int, int, int, int] | None = None  # version, slot, first, second

    def _touch(self, slot: int) -> None:
        self.version += 1
        self.slot_version[slot] = self.version

    def _settle(self, slot: int, p: Prefill) -> None:
        pending = self._inexact.get(slot)
        if pending and any(q is p for q in pending):
            pending[:] = [q for q in pending if q is not p]

    def _last(self, slot: int, task: int | None = None) -> Prefill | None:
        pf = self.slots.get(slot)
        if not pf or (task is not None and pf[-1].task != task):
            return None
        return pf[-1]

    def launched(self, slot: int, task: int, at: int, begin_logged: bool) -> None:
        """begin_logged: this server logs each prefill's first batch ("new prompt", -lv 4)."""
        self._touch(slot)
        pf = self.slots.setdefault(slot, [])
        new = Prefill(at, None, task, at, begun=not begin_logged)
        pf.append(new)
        self._inexact.setdefault(slot, []).append(new)
        if len(pf) > MAX_PREFILL_HISTORY:
            self._settle(slot, pf.pop(0))

    def first_batch(self, slot: int, task: int, at: int) -> None:
        """The prefill starts at its first batch (llama-server's t_start), not at the launch: a
        launched task can wait for another slot's prompt batch."""
        last = self._last(slot, task)
        if last is not None and last.end is None:
            self._touch(slot)
            last.start = at
            last.begun = True

    def ended(self, slot: int, at: int) -> None:
        last = self._last(slot)
        if last is not None and last.end is None:
            self._touch(slot)
            last.end = at
            last.begun = True  # its first batch line was lost: from the launch, as below -lv 4

    def timed(self, slot: int, task: int, start: int, end: int, tokens: int | None = None) -> None:
        """The server's timings fix the last prefill of the slot."""
        if self.slots.get(slot):
            self._touch(slot)
            self._settle(slot, self.slots[slot][-1])
            last = self.slots[slot][-1]
            launched = last.launched if last.task == task else None
            self.slots[slot][-1] = Prefill(start, end, task, launched, True, tokens)

    def released(self, slot: int, task: int, at: int) -> bool:
        """The task is over: its prefill is as exact as it gets. True if it was still open."""
        last = self._last(slot)
        if last is None:
            return False
        self._touch(slot)
        if last.task == task:
            last.exact = True
            self._settle(slot, last)
            if not last.begun:  # released before its first batch: it computed nothing
                last.start, last.begun = at, True
        if last.end is None:
            last.end = at
            return True
        return False

    def _around(self, slot: int, start: int, end: int) -> Iterator[tuple[int, Prefill]]:
        """Every other slot's prefills that may overlap [start, end), oldest first. A slot runs
        one task at a time, so its prefills are in order and do not overlap each other: read
        from the newest back, past the ones after `end`, until one ended before `start`."""
        for sid, pf in self.slots.items():
            if sid == slot:
                continue
            # the first that starts at or after `end` (a slot's prefills start in order), and
            # one not begun before it (only the last can be)
            i = _first_starting_at(pf, end)
            while i > 0 and (pf[i - 1].start >= end or not pf[i - 1].begun):
                i -= 1
            j = i
            while j > 0:
                last_end = pf[j - 1].end
                if last_end is not None and last_end <= start:
                    break
                j -= 1
            for p in pf[j:i]:
                yield sid, p

    def overlapping(self, slot: int, start: int, end: int) -> Iterator[Overlap]:
        """Every other slot's prefill between start and end."""
        for sid, p in self._around(slot, start, end):
            lo, hi = max(p.start, start), min(end if p.end is None else p.end, end)
            if hi > lo:
                yield Overlap(sid, p.task, p.launched, lo, hi)

    def largest_overlapping(self, slot: int, start: int, end: int) -> int | None:
        """The most prompt tokens computed by another slot's prefill between start and end: 0
        when none overlapped, None when one that did has no known size."""
        largest: int | None = 0
        for _, p in self._around(slot, start, end):
            if min(end if p.end is None else p.end, end) > max(p.start, start):
                if p.tokens is None:
                    return None
                largest = max(largest or 0, p.tokens)
        return largest

    def settled_before(self, slot: int, end: int) -> bool:
        """Every other slot's prefill that began before `end` is exact: an overlap computed now
        will not change. `end` is at or before the last line read: a prefill not begun by then
        begins after it."""
        e = self._earliest
        if e is None or e[0] != self.version:
            e = self._earliest = self._find_earliest()
        _, first_slot, first, second = e
        return (second if slot == first_slot else first) >= end

    def _find_earliest(self) -> tuple[int, int, int, int]:
        """The earliest start of a begun inexact prefill, its slot, and the earliest on any
        other slot: settled_before for every waiting record from one pass over the slots."""
        never = 1 << 62
        by_slot = [
            (min((p.start for p in pf if p.begun), default=never), sid) for sid, pf in self._inexact.items() if pf
        ]
        by_slot.sort()
        first, first_slot = by_slot[0] if by_slot else (never, -1)
        second = by_slot[1][0] if len(by_slot) > 1 else never
        return self.version, first_slot, first, second


def overlapped_prefills(overlaps: list[Overlap]) -> tuple[tuple[int, int, int, float], ...]:
    """(slot, task, launch, seconds) of the requests whose prefill overlapped a decoding, most
    first, at most MAX_OVERLAPPED_PREFILLS: the record's own account of who slowed it, which its
    trace links to. A prefill whose launch the timeline lost is left out (no record to name)."""
    by_task: dict[tuple[int, int, int], int] = {}
    for o in overlaps:
        if o.launched is not None:
            k = (o.slot, o.task, o.launched)
            by_task[k] = by_task.get(k, 0) + o.hi - o.lo
    most = sorted(by_task.items(), key=lambda kv: (-kv[1], kv[0]))[:MAX_OVERLAPPED_PREFILLS]
    return tuple((slot, task, launched, us / 1e6) for (slot, task, launched), us in most)


def union_us(spans: list[tuple[int, int]]) -> int:
    """Total length of the union of intervals."""
    total, cur_lo, cur_hi = 0, None, None
    for lo, hi in sorted(spans):
        if cur_hi is None or lo > cur_hi:
            if cur_hi is not None and cur_lo is not None:
                total += cur_hi - cur_lo
            cur_lo, cur_hi = lo, hi
        else:
            cur_hi = max(cur_hi, hi)
    if cur_hi is not None and cur_lo is not None:
        total += cur_hi - cur_lo
    return total
