"""The RAM prompt cache as llama-server holds it, rebuilt from its -lv 4 log.

The server keeps its entries in a deque: a save pushes at the back (after removing the entries
it contains and, to make room, the oldest), a restore takes the entry out, the update after it
pops the oldest while over the limit, then lists the entries in order. The lookup's candidate
lines list them in the same order. The mirror knows which task computed each entry, so that a
restore names the request whose state it brings back and an eviction the conversation that
lost its entry. Addresses are reused at once and lengths repeat: neither names an entry.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

Source = tuple[int, int]  # (epoch, task) that computed an entry


@dataclass(slots=True)
class Entry:
    n_tokens: int
    source: Source | None


class CacheMirror:
    def __init__(self, on_saved: Callable[[], None], on_evicted: Callable[[Source], None]) -> None:
        self.entries: list[Entry] = []
        self.on_saved = on_saved
        self.on_evicted = on_evicted
        self._pending: Entry | None = None  # "saving prompt" seen, not yet pushed
        self._listing: list[int] | None = None
        self._removals_unplaced: list[int] = []  # lengths of obsolete removals not yet placed

    # ------------------------------------------------------------ saves
    def save_started(self, n_tokens: int, source: Source | None) -> None:
        self._pending = Entry(n_tokens, source)

    def save_skipped(self) -> None:
        self._pending = None

    @property
    def saving(self) -> bool:
        return self._pending is not None

    def commit_save(self) -> None:
        """The save's own removals are over: the entry is in the deque."""
        save, self._pending = self._pending, None
        if save is not None:
            self.entries.append(save)
            self.on_saved()

    # ------------------------------------------------------------ removals
    def evicted(self, making_room: bool) -> None:
        if not making_room:
            self.commit_save()  # the update after a save: the new entry is in the deque
        if self.entries:
            e = self.entries.pop(0)
            if e.source is not None:
                self.on_evicted(e.source)

    def obsolete_removed(self, n_tokens: int) -> None:
        """An entry contained in the prompt being saved. The line gives only its length: with
        one entry of that length it goes at once; with several, the next list of the entries
        in order (the lookup's candidates or the listing) tells which one went."""
        same = [i for i, e in enumerate(self.entries) if e.n_tokens == n_tokens]
        if len(same) == 1:
            del self.entries[same[0]]
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
        return self.entries.pop(winner).source

    # ------------------------------------------------------------ listings
    def listing_started(self, n_prompts: int) -> None:
        self._listing = []
        if n_prompts == 0:
            self.close_listing()

    @property
    def listing(self) -> bool:
        return self._listing is not None

    def listed(self, n_tokens: int) -> None:
        if self._listing is not None:
            self._listing.append(n_tokens)

    def close_listing(self) -> None:
        lengths, self._listing = self._listing, None
        if lengths is None:
            return
        if not self._place_removals(lengths):
            # lines missed (joined mid-stream, a failed allocation): start again from the listing
            self.entries = [Entry(n, None) for n in lengths]

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
        self.entries = [e for i, e in enumerate(self.entries) if i not in fits[0]]
        return True
