"""What llama-server's RAM prompt-cache lines say about the request being selected.

Between a slot's selection and its task's launch the server prints its cache lines (-lv 4):
the save of the slot's old state, the lookup's candidates, the restore, the update's evictions
and listing. They name no task: they belong to the selection that came just before, or to an
idle slot's save. This module keeps that context, feeds the entry mirror (cachemirror.py), and
collects on the Selection what the task launched next inherits.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final, Protocol

from .. import parse as p
from ..records import MIB, selection_path
from .cachemirror import CacheMirror, Source
from .draft import TaskDraft

# An entry this long or longer that a prompt contains whole is that prompt's own history: a
# short one (a chat template's first tokens, a one-line probe) could be anyone's prefix.
CONTAINED_MIN_TOKENS: Final = 32


class CacheSink(Protocol):
    def cache_state(self, entries: int, size_bytes: float, limit_bytes: float) -> None: ...
    def cache_saved(self) -> None: ...
    def cache_evicted(self, size_bytes: float) -> None: ...
    def cache_update_duration(self, seconds: float) -> None: ...


@dataclass(slots=True)
class Selection:
    """A slot chosen for the next task, and what the RAM cache did for it."""

    slot: int
    method: str  # lcp, lru, id (see records.selection_path)
    slot_tokens_before: int | None
    ram_consulted: bool = False
    candidates: list[p.CacheCandidate] | None = None
    compared: tuple[tuple[int, int], ...] | None = None  # (task, lcp) of candidates whose task is known
    best_f_sim: float | None = None
    restored_tokens: int | None = None  # -1: restored, but which entry is not known
    restored_source: Source | None = None  # (epoch, task) that computed the entry
    restored_f_keep: float | None = None
    restored_lcp: int | None = None
    f_keep: float | None = None  # of the LCP selection
    f_sim: float | None = None
    lora_cleared: bool = False
    # RAM-cache entries the prompt contains whole (lcp = the entry's length): the tasks that
    # computed them, and their lengths (see join.py, a prompt that holds an answer).
    contained: tuple[Source, ...] = ()
    contained_tokens: tuple[int, ...] = ()  # their lengths

    def hand_over(self, d: TaskDraft) -> None:
        """What the task launched on the slot inherits from its selection."""
        d.path = selection_path(self.method)
        d.slot_tokens_before = self.slot_tokens_before
        d.ram_consulted = self.ram_consulted
        d.ram_candidates = len(self.candidates or ())
        d.ram_best_f_sim = self.best_f_sim
        d.lora_cache_cleared = self.lora_cleared
        if self.restored_tokens is not None:
            d.ram_restored = True
            d.restored_tokens = self.restored_tokens if self.restored_tokens >= 0 else None
            d.entry_source = self.restored_source
            d.offered_tokens = self.restored_lcp
        if self.method == "lcp" and self.f_sim is not None:
            d.offered_f_sim = self.f_sim
        d.compared_entries = self.compared or ()


class PromptCacheLog:
    def __init__(
        self, sink: CacheSink, on_evicted: Callable[[Source], None], on_diagnostics: Callable[[], None]
    ) -> None:
        self.sink = sink
        self.mirror = CacheMirror(sink.cache_saved, on_evicted)
        self.on_diagnostics = on_diagnostics  # a cache line proves -lv 4
        self.selection: Selection | None = None  # the selection the lines belong to
        self.source: Source | None = None  # the content being saved
        # this process updates its RAM cache at LRU selections (-lv 4): one that does not is a
        # task that never uses it (llama-server caches prompts of completion tasks only; infill)
        self.in_use = False

    # ------------------------------------------------------------ context
    def selected(self, sel: Selection, source: Source | None) -> None:
        self.selection, self.source = sel, source

    def idle_slot_saving(self, source: Source | None) -> None:
        self.selection, self.source = None, source

    def launched(self, sel: Selection | None) -> None:
        self._resolve_candidates()
        if self.selection is sel:
            self.selection = None

    def _resolve_candidates(self) -> None:
        """Once the lookup's candidates are all listed and before the deque changes (a
        restore, an eviction, the update's listing), name the task behind each of them."""
        sel = self.selection
        if sel is None or not sel.candidates or sel.compared is not None:
            return
        sources = self.mirror.sources([c.n_tokens for c in sel.candidates])
        pairs = [(c, src) for c, src in zip(sel.candidates, sources or (), strict=False) if src is not None]
        sel.compared = tuple((src[1], c.lcp) for c, src in pairs)
        whole = [(c, src) for c, src in pairs if c.lcp == c.n_tokens >= CONTAINED_MIN_TOKENS]
        sel.contained = tuple(src for _, src in whole)
        sel.contained_tokens = tuple(c.n_tokens for c, _ in whole)

    def before(self, ev: object) -> None:
        """Any other line of the main loop ends a listing, and a save (its own removals are
        part of it). A request's HTTP thread logs in between at any time: those lines do not."""
        if type(ev) in _HTTP_THREAD_LINES:
            return
        m = self.mirror
        if m.listing and not isinstance(ev, p.CacheEntryListed):
            m.close_listing()
        if m.saving and type(ev) not in _PART_OF_SAVE:
            m.commit_save()

    # ------------------------------------------------------------ lines
    def update_started(self, ev: p.CacheUpdateStarted) -> None:
        self.in_use = True
        if self.selection is not None:
            self.selection.ram_consulted = True
            self.selection.candidates = []
        self.on_diagnostics()

    def prompt_saved(self, ev: p.PromptSaved) -> None:
        self.mirror.save_started(ev.n_tokens, self.source, ev.size_mib * MIB)
        sel = self.selection
        if sel is not None and sel.slot_tokens_before is None:
            sel.slot_tokens_before = ev.n_tokens

    def save_skipped(self, ev: p.PromptSaveSkipped) -> None:
        self.mirror.save_skipped()

    def candidate(self, ev: p.CacheCandidate) -> None:
        sel = self.selection
        if sel is None:
            return
        if sel.candidates is None:
            sel.candidates = []
        sel.candidates.append(ev)
        f = float(ev.f_sim)
        if sel.best_f_sim is None or f > sel.best_f_sim:
            sel.best_f_sim = f

    def restored(self, ev: p.CacheRestored) -> None:
        self._resolve_candidates()
        sel = self.selection
        if sel is None:
            return
        # the first candidate with the printed best values (the server needs strictly better)
        candidates = sel.candidates or []
        k = next((i for i, c in enumerate(candidates) if c.f_keep == ev.f_keep and c.f_sim == ev.f_sim), None)
        winner = candidates[k] if k is not None else None
        sel.restored_tokens = winner.n_tokens if winner else -1
        sel.restored_lcp = winner.lcp if winner else None
        if k is not None:
            source = self.mirror.restored([c.n_tokens for c in candidates], k)
            if source is None or isinstance(source, tuple):  # False: the mirror does not match
                sel.restored_source = source
        try:
            sel.restored_f_keep = float(ev.f_keep)
        except ValueError:
            sel.restored_f_keep = None

    def state(self, ev: p.CacheState) -> None:
        self._resolve_candidates()
        self.sink.cache_state(ev.n_prompts, ev.size_mib * MIB, ev.limit_mib * MIB)
        self.mirror.listing_started(ev.n_prompts, ev.size_mib * MIB, ev.limit_mib * MIB)

    def entry_listed(self, ev: p.CacheEntryListed) -> None:
        self.mirror.listed(ev.n_tokens, ev.size_mib * MIB, ev.checkpoints)

    def update_took(self, ev: p.CacheUpdateTook) -> None:
        self.sink.cache_update_duration(ev.ms / 1000.0)

    def evicted(self, ev: p.CacheEvicted) -> None:
        self._resolve_candidates()
        self.mirror.evicted(ev.making_room, ev.size_mib * MIB)
        self.sink.cache_evicted(ev.size_mib * MIB)

    def obsolete_removed(self, ev: p.ObsoleteEntryRemoved) -> None:
        self.mirror.obsolete_removed(ev.n_tokens)

    def handlers(self) -> dict[type, Callable[[Any], None]]:
        return {
            p.CacheUpdateStarted: self.update_started,
            p.PromptSaved: self.prompt_saved,
            p.PromptSaveSkipped: self.save_skipped,
            p.CacheCandidate: self.candidate,
            p.CacheRestored: self.restored,
            p.CacheState: self.state,
            p.CacheEntryListed: self.entry_listed,
            p.CacheUpdateTook: self.update_took,
            p.CacheEvicted: self.evicted,
            p.ObsoleteEntryRemoved: self.obsolete_removed,
        }


# Lines between "saving prompt" and the moment the entry is pushed (alloc's own removals)
_PART_OF_SAVE: Final = frozenset({p.PromptSaveSkipped, p.ObsoleteEntryRemoved, p.CacheEvicted})
# Lines a request's HTTP thread logs, at any moment, in the middle of the main loop's lines
_HTTP_THREAD_LINES: Final = frozenset({p.ConversationArrived, p.RequestParamsRead, p.TaskCancelled})
