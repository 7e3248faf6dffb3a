"""The RAM prompt cache as llama-server holds it, rebuilt from its -lv 4 log.

The server keeps its entries in a deque: a save pushes at the back (after removing the entries
it contains and, to make room, the oldest), a restore takes the entry out, the update after it
pops the oldest while over the limit, then lists the entries in order. The lookup's candidate
lines list them in the same order. The mirror knows which task computed each entry, so that a
restore names the request whose state it brings back and an eviction the conversation that
lost its entry. Addresses are reused at once and lengths repeat: neither names an entry.

Would a larger cache have kept an evicted entry? llama-server evicts the oldest entry first
(server_prompt_cache in tools/server/server-task.cpp: alloc() makes room with states.pop_front()
while size() + new > limit_size, update() pops the front while size() > limit_size; a save is
states.push_back(), a restore states.erase()). An entry is never moved: the deque is in the order
of saving. So under a limit L an entry E stays as long as E plus every entry saved after it that
is still held fits in L, and entries saved after E are never evicted before it. The mirror keeps
each evicted entry as a ghost, still held by a larger cache until its conversation comes back,
and after each update the largest size E plus the younger entries and ghosts reached: the
smallest limit that would have kept E. Younger ghosts stay until their own conversation comes
back, as if that return had hit (it would have, with E kept); an entry restored in the real run
goes at its restore, as in the larger cache. The token limit never evicts first while there is
a byte limit: update() raises it to limit_size / (bytes per token), which the cached tokens reach
only when the bytes exceed limit_size.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final

Source = tuple[int, int]  # (epoch, task) that computed an entry

CURVE_MAX_FACTOR: Final = 4.0  # ghosts are followed up to four times the limit (the curve's range)
MAX_GHOSTS: Final = 1024  # evicted entries followed at once; the oldest beyond it become unknown
MAX_BEYOND: Final = 4096  # evicted entries known to need more than CURVE_MAX_FACTOR x the limit


@dataclass(slots=True)
class Entry:
    n_tokens: int
    source: Source | None
    size_bytes: float = 0.0  # exact once listed or evicted; the save line's (no checkpoints) before
    checkpoints: int = 0  # context checkpoints stored with it (from the listing)


@dataclass(slots=True)
class Ghost:
    """An evicted entry, as a larger cache would still hold it."""

    source: Source | None
    n_tokens: int
    size_bytes: float
    checkpoints: int
    needed_bytes: float = 0.0  # the smallest limit that would have kept it, so far


@dataclass(frozen=True, slots=True)
class EvictionNeed:
    """What a conversation's return learns of its evicted entry."""

    needed_bytes: float  # the smallest limit that would have kept the entry (at least, when beyond)
    limit_bytes: float  # the limit in force
    entry_tokens: int
    # context checkpoints of the entry (SWA, hybrid models): a restored entry keeps them and
    # the conversation's next entry adds its own (up to --ctx-checkpoints), so in a larger cache
    # that restores more, entries are larger than in this log: the size needed is then a floor
    checkpoints: int


class CacheMirror:
    def __init__(self, on_saved: Callable[[], None], on_evicted: Callable[[Source], None]) -> None:
        self.entries: list[Entry] = []
        self.on_saved = on_saved
        self.on_evicted = on_evicted
        self._pending: Entry | None = None  # "saving prompt" seen, not yet pushed
        self._listing: list[int] | None = None
        # a save or a listing is open (read at every line: plain flags, kept with the two above)
        self.saving = False
        self.listing = False
        self._removals_unplaced: list[int] = []  # lengths of obsolete removals not yet placed
        self._listed_sizes: list[tuple[float, int]] = []
        self.limit_bytes = 0.0  # from the last cache-state line; 0: no byte limit
        self._state_bytes = 0.0
        self.ghosts: list[Ghost] = []  # evicted entries a larger cache would hold, oldest first
        self._beyond: OrderedDict[Source, EvictionNeed] = OrderedDict()
        self._pushed = False  # an entry pushed since the last listing
        self._erased_bytes = 0.0  # held entries restored since that push

    # ------------------------------------------------------------ saves
    def save_started(self, n_tokens: int, source: Source | None, size_bytes: float = 0.0) -> None:
        self._pending, self.saving = Entry(n_tokens, source, size_bytes), True

    def save_skipped(self) -> None:
        self._pending, self.saving = None, False

    def commit_save(self) -> None:
        """The save's own removals are over: the entry is in the deque."""
        save, self._pending, self.saving = self._pending, None, False
        if save is not None:
            self.entries.append(save)
            self._pushed, self._erased_bytes = True, 0.0
            self.on_saved()

    # ------------------------------------------------------------ removals
    def evicted(self, making_room: bool, size_bytes: float = 0.0) -> None:
        if not making_room:
            self.commit_save()  # the update after a save: the new entry is in the deque
        if self.entries:
            e = self.entries.pop(0)
            self.ghosts.append(Ghost(e.source, e.n_tokens, size_bytes or e.size_bytes, e.checkpoints))
            if e.source is not None:
                self.on_evicted(e.source)

    def obsolete_removed(self, n_tokens: int) -> None:
        """An entry contained in the prompt being saved. The line gives only its length: with
        one entry of that length it goes at once; with several, the next list of the entries
        in order (the lookup's candidates or the listing) tells which one went."""
        same = [i for i, e in enumerate(self.entries) if e.n_tokens == n_tokens]
        if len(same) == 1:
            self._erase(same[0], after_push=False)  # a save's own removal, before its push
        elif same:
            self._removals_unplaced.append(n_tokens)

    def sources(self, candidate_lengths: list[int]) -> list[Source | None] | None:
        """Who computed each entry the lookup listed as candidates (in the deque's order), or
        None when the mirror cannot tell them apart (removals not placed, or lengths differ)."""
        if self._removals_unplaced or [e.n_tokens for e in self.entries] != candidate_lengths:
            return None
        return [e.source for e in self.entries]

    def restored(self, candidate_lengths: list[int], winner: int) -> Source | None | bool:
        """The lookup listed the entries (as candidates) and restored the winner-th: take it
        out. Its source, None if unknown; False if the mirror does not match the candidates."""
        if self._removals_unplaced:
            self._place_removals(candidate_lengths)
        if len(candidate_lengths) != len(self.entries) or self.entries[winner].n_tokens != candidate_lengths[winner]:
            return False
        return self._erase(winner).source

    def _erase(self, i: int, after_push: bool = True) -> Entry:
        e = self.entries.pop(i)
        if after_push and self._pushed:  # held when the last entry was pushed: that moment counted it
            self._erased_bytes += e.size_bytes
        return e

    # ------------------------------------------------------------ listings
    def listing_started(self, n_prompts: int, size_bytes: float = 0.0, limit_bytes: float = 0.0) -> None:
        self._listing, self._listed_sizes, self.listing = [], [], True
        self._state_bytes, self.limit_bytes = size_bytes, limit_bytes
        if n_prompts == 0:
            self.close_listing()

    def listed(self, n_tokens: int, size_bytes: float = 0.0, checkpoints: int = 0) -> None:
        if self._listing is not None:
            self._listing.append(n_tokens)
            self._listed_sizes.append((size_bytes, checkpoints))

    def close_listing(self) -> None:
        lengths, self._listing, self.listing = self._listing, None, False
        if lengths is None:
            return
        if not self._place_removals(lengths):
            # lines missed (joined mid-stream, a failed allocation): start again from the listing
            self.entries = [Entry(n, None) for n in lengths]
        for e, (size, checkpoints) in zip(self.entries, self._listed_sizes, strict=False):
            e.size_bytes, e.checkpoints = size, checkpoints  # the listing's sizes count the checkpoints
        self._measure_ghosts()

    # ------------------------------------------------------------ a larger cache
    def _measure_ghosts(self) -> None:
        """At an update's listing: the largest moment since the last one was the push (a
        restore after it freed its entry), when the held entries were today's plus the
        restored ones. Each ghost needed itself, the younger ghosts and those."""
        held = self._state_bytes + (self._erased_bytes if self._pushed else 0.0)
        self._pushed, self._erased_bytes = False, 0.0
        for g in reversed(self.ghosts):
            held += g.size_bytes
            if held > g.needed_bytes:
                g.needed_bytes = held
        cap = CURVE_MAX_FACTOR * self.limit_bytes
        while self.ghosts:
            oldest = self.ghosts[0]  # needs the most: the younger ones are part of what it needs
            if cap and oldest.needed_bytes > cap:  # beyond the curve: known to need more
                self.ghosts.pop(0)
                if oldest.source is not None:
                    self._beyond[oldest.source] = EvictionNeed(
                        oldest.needed_bytes, self.limit_bytes, oldest.n_tokens, oldest.checkpoints
                    )
                    if len(self._beyond) > MAX_BEYOND:
                        self._beyond.popitem(last=False)
            elif len(self.ghosts) > MAX_GHOSTS:  # too many to follow: what it needs stays unknown
                self.ghosts.pop(0)
            else:
                break

    def returned(self, source: Source) -> EvictionNeed | None:
        """The conversation of the entry `source` computed came back: what a larger cache needed
        to keep its entry; the ghost goes (its return would have restored it). None if the
        mirror did not follow it (another epoch, no listing since, too many ghosts)."""
        for i in range(len(self.ghosts) - 1, -1, -1):
            g = self.ghosts[i]
            if g.source == source:
                del self.ghosts[i]
                if not g.needed_bytes:  # no update listed since its eviction
                    return None
                return EvictionNeed(g.needed_bytes, self.limit_bytes, g.n_tokens, g.checkpoints)
        return self._beyond.pop(source, None)

    def _place_removals(self, lengths: list[int]) -> bool:
        """Drop the entries of unplaced removals so that the mirror reads as `lengths` (the
        server's own order). If more than one choice fits, the entries of those lengths
        forget who computed them (unknown, never a guess). False if nothing fits."""
        pending, self._removals_unplaced = self._removals_unplaced, []
        if not pending:
            return [e.n_tokens for e in self.entries] == lengths
        fits: list[tuple[int, ...]] = []

        def search(todo: list[int], dropped: tuple[int, ...]) -> None:
            if len(fits) > 1:
                return
            if not todo:
                if [e.n_tokens for i, e in enumerate(self.entries) if i not in dropped] == lengths:
                    fits.append(dropped)
                return
            for i, e in enumerate(self.entries):
                if i not in dropped and e.n_tokens == todo[0]:
                    search(todo[1:], (*dropped, i))

        if len(pending) <= 3:
            search(pending, ())
        if not fits:
            return False
        if len(fits) > 1:
            for e in self.entries:
                if e.n_tokens in pending:
                    e.source = None
        for i in sorted(fits[0], reverse=True):
            self._erase(i, after_push=False)
        return True
