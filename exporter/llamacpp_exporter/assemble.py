"""Assembler: typed log events and /slots snapshots in, one record per request out.

Pure state machine: no I/O, no clock, no threads. The pipeline feeds it in log order
(snapshots are interleaved in the order they were taken), so replaying a recorded log
gives the same records as the live run.

State is bounded: per slot, the running task and a few recent prefill intervals; the
RAM-cache entries the server itself holds; a capped map of task -> LoRA request.
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from . import classify
from . import parse as p
from .cachemirror import CacheMirror
from .conversations import Pseudonymizer
from .join import HEADER, NONE, UNCERTAIN, HeaderJoin
from .records import MAX_SLOTS, LoraAdapters, RequestRecord, SlotsSnapshot, selection_path
from .timeline import PrefillTimeline, union_us

log = logging.getLogger(__name__)

MAX_TASK_LORA = 4096
JOIN_MAX_WAIT_US = 60_000_000  # a record whose conversation is not proven by then says "uncertain"
# A continuation keeps the whole state it continues (f_keep 1.000 in every recorded turn); two
# conversations that merely share a system prompt keep less of each other.
LINEAGE_MIN_F_KEEP = 0.9
MAX_PENDING = 256
MAX_EVICTED = 4096  # conversations whose RAM-cache entry was evicted, not yet back
EPOCH_BACKWARDS_US = 1_000  # timestamps are taken at queue time and never go back within a process
RESTART_CONFIRM_LINES = 3  # lines in the earlier time (or the start banner) that make a restart


@dataclass(frozen=True, slots=True)
class AssemblySettings:
    min_prompt_tokens: int = 1024
    hit_ratio: float = 0.9
    miss_ratio: float = 0.1
    contention_fraction: float = 0.1
    small_task_tokens: int = 256
    big_conversation_tokens: int = 1024
    # how long (server log time) a finished record may wait for /slots or for another
    # slot's prefill to end before it is emitted with what is known
    max_wait_us: int = 600_000_000


class Sink(Protocol):
    def request(self, record: RequestRecord) -> None: ...
    def cache_state(self, entries: int, size_bytes: float, limit_bytes: float) -> None: ...
    def cache_saved(self) -> None: ...
    def cache_evicted(self, size_bytes: float) -> None: ...
    def cache_update_duration(self, seconds: float) -> None: ...
    def prefill_in_progress(self, slot: int, tokens: int) -> None: ...
    def server_restart(self) -> None: ...
    def out_of_order_lines(self, n: int) -> None: ...
    def server_build(self, number: int, commit: str) -> None: ...
    def diagnostics(self, available: bool, verbosity: int | None) -> None: ...
    def slots_known(self, slot_ids: list[int]) -> None: ...
    def debug_logging_seen(self) -> None: ...
    def conversation_cost(self, conversation: str, seconds: float) -> None: ...
    def conversation_arrival_dropped(self) -> None: ...


@dataclass(slots=True)
class _Selection:
    slot: int
    method: str
    slot_tokens_before: int | None
    ram_consulted: bool = False
    candidates: list[p.CacheCandidate] | None = None
    best_f_sim: float | None = None
    restored_tokens: int | None = None
    restored_source: tuple[int, int] | None = None  # (epoch, task) that computed the entry
    restored_known: bool = False
    restored_f_keep: float | None = None
    restored_lcp: int | None = None
    f_keep: float | None = None  # of the LCP selection
    f_sim: float | None = None
    lora_cleared: bool = False


@dataclass(slots=True)
class _Slot:
    tokens: int | None = None  # tokens the slot holds, as far as the log tells
    last_task: int | None = None
    selection: _Selection | None = None
    record: RequestRecord | None = None


class Assembler:
    def __init__(
        self,
        sink: Sink,
        settings: AssemblySettings | None = None,
        *,
        slots_polled: bool = False,
        request_poll: Callable[[], None] | None = None,
        pseudonymize: Callable[[str], str] | None = None,
    ) -> None:
        self.sink = sink
        self.settings = settings or AssemblySettings()
        self.slots_polled = slots_polled
        self.request_poll = request_poll
        self.epoch = 0
        self.verbosity: int | None = None
        self._diag: bool | None = None
        self._debug_warned = False
        self._known_slots: set[int] = set()
        self._n_slots: int | None = None
        self._global_lora: tuple[tuple[int, float], ...] | None = None
        self._task_lora: OrderedDict[tuple[int, int], tuple[tuple[int, float], ...]] = OrderedDict()
        self._snapshot_seq = 0
        self.pseudonymize = pseudonymize or Pseudonymizer()
        # task -> (conversation or None, source), once final; and the task whose state it
        # continued (lineage), for requests without an id
        self._task_conv: OrderedDict[tuple[int, int], tuple[str | None, str]] = OrderedDict()
        self._lineage_parent: OrderedDict[tuple[int, int], tuple[int, int] | None] = OrderedDict()
        self._dropped_seen = 0
        self._held: list[tuple[p.ParsedLine, int]] = []  # lines whose time went back, see feed
        # conversation -> server time its RAM-cache entry was evicted (pushed out to make room),
        # until its next request: a miss then is thrashing, not a full cache doing its job
        self._evicted_convs: OrderedDict[str, int] = OrderedDict()
        self._evicted_unresolved: list[tuple[tuple[int, int], int]] = []
        self._reset_epoch_state()

    # ------------------------------------------------------------ epoch
    def _reset_epoch_state(self) -> None:
        self._slots: dict[int, _Slot] = {}
        self._pending: list[RequestRecord] = []
        self.cache = CacheMirror(self.sink.cache_saved, self._entry_evicted)
        self.prefills = PrefillTimeline()
        self._cache_ctx: _Selection | None = None  # selection the srv cache lines belong to
        self._cache_ctx_source: tuple[int, int] | None = None  # content being saved
        self._last_ts: int | None = None
        self._now = 0
        self._epoch_lines = 0
        self.join = HeaderJoin()  # aligned at the start banner, or after an idle spell
        if self._known_slots:
            self.join.n_slots = len(self._known_slots)

    def _new_epoch(self) -> None:
        self._finalize_all()
        now = self._now
        self._reset_epoch_state()
        self._now = now
        self.epoch += 1
        self.sink.server_restart()

    def flush(self) -> None:
        """End of input (replay) or shutdown: emit every record still waiting."""
        if self._held:
            self._release_held()  # too few to prove a restart
        self.cache.close_listing()
        self._finalize_all()

    # ------------------------------------------------------------ inputs
    def feed(self, line: p.ParsedLine, now_us: int) -> None:
        ts = line.ts_us
        if ts is not None and self._last_ts is not None:
            if ts < self._last_ts - EPOCH_BACKWARDS_US:
                # time went back: a restart, or one stray line (another process writing to the
                # same file, a replayed line). A restart shows its start banner or keeps going
                # in the new time; until then the line is held.
                if not isinstance(line.event, p.ServerStarting):
                    self._held.append((line, now_us))
                    if len(self._held) < RESTART_CONFIRM_LINES:
                        return
                held, self._held = self._held, []
                self._new_epoch()
                self._last_ts = None
                for h, n in held:
                    self._feed(h, n)
                if isinstance(line.event, p.ServerStarting):
                    self._feed(line, now_us)
                return
            if self._held:
                self._release_held()
        self._feed(line, now_us)

    def _release_held(self) -> None:
        """Time came back: the held lines were strays. They count, at the current time."""
        held, self._held = self._held, []
        self.sink.out_of_order_lines(len(held))
        for h, n in held:
            self._feed(p.ParsedLine(None, h.event), n)

    def _feed(self, line: p.ParsedLine, now_us: int) -> None:
        ev = line.event
        ts = line.ts_us
        if ts is not None:
            if self._last_ts is not None and ts < self._last_ts - EPOCH_BACKWARDS_US:
                self._new_epoch()
            self._last_ts = ts
            self._now = ts
        elif self._last_ts is None:
            # no timestamps in this log (--no-log-prefix): the time we read the line is the
            # best there is. With timestamps on, a line without one is a continuation line
            # and keeps the time of the line it continues.
            self._now = max(self._now, now_us)
        cache = self.cache
        if cache.listing and not isinstance(ev, p.CacheEntryListed):
            cache.close_listing()
        if cache.saving and type(ev) not in _PART_OF_SAVE:
            cache.commit_save()
        handler = _HANDLERS.get(type(ev))
        if handler is not None:
            handler(self, ev)
        self._epoch_lines += 1
        if self._pending and type(ev) in _UNBLOCKING:
            self._try_finalize()

    def feed_snapshot(self, snap: SlotsSnapshot) -> None:
        self._snapshot_seq += 1
        self._announce_slots(s.id for s in snap.slots)
        for s in snap.slots:
            if s.id_task is None:
                continue
            key = (self.epoch, s.id_task)
            if s.lora is not None:
                self._task_lora[key] = s.lora
                self._task_lora.move_to_end(key)
                if len(self._task_lora) > MAX_TASK_LORA:
                    self._task_lora.popitem(last=False)
            slot = self._slots.get(s.id)
            rec = slot.record if slot else None
            if rec is None or rec.task != s.id_task:
                continue
            if s.lora is not None:
                rec._lora_request = s.lora
            # n_prompt_tokens_cache is set when the prompt starts; trust it once the
            # slot has processed prompt tokens or decoded, else it may still be stale.
            if (
                s.is_processing
                and rec.reuse_source is None
                and s.n_prompt_tokens_cache is not None
                and ((s.n_prompt_tokens_processed or 0) > 0 or (s.n_decoded or 0) > 0)
            ):
                rec.reused_tokens = s.n_prompt_tokens_cache
                rec.reuse_source = "slots"
        if self._pending:
            self._try_finalize()

    def feed_adapters(self, adapters: LoraAdapters) -> None:
        self._global_lora = adapters.scales

    # ------------------------------------------------------------ helpers
    def _slot(self, sid: int) -> _Slot:
        s = self._slots.get(sid)
        if s is None:
            s = self._slots[sid] = _Slot()
        return s

    def _set_diag(self, available: bool) -> None:
        if self._diag != available:
            self._diag = available
            self.sink.diagnostics(available, self.verbosity)

    def lora_config(self, request: tuple[tuple[int, float], ...] | None) -> str | None:
        """Effective adapter configuration, as llama-server compares it (are_lora_equal).

        A non-empty request list replaces the global scales (unlisted adapters get 0);
        an empty one leaves the global list in force.
        """
        if request is None:
            return None
        scales: dict[int, float]
        if request:
            scales = {i: s for i, s in request}
        elif self._global_lora is not None:
            scales = dict(self._global_lora)
        else:
            return "global"
        active = [f"{i}:{s:g}" for i, s in sorted(scales.items()) if s != 0.0]
        return ",".join(active) if active else "none"

    # ------------------------------------------------------------ RAM-cache entries
    def _entry_evicted(self, source: tuple[int, int]) -> None:
        self._evicted_unresolved.append((source, self._now))
        self._resolve_evicted()

    def _resolve_evicted(self) -> None:
        still = []
        for source, at in self._evicted_unresolved:
            conv = self._conversation(*source)
            if conv is None:
                if self._now - at < JOIN_MAX_WAIT_US:
                    still.append((source, at))
                continue
            if conv[0] is not None and conv[1] == "header":
                self._evicted_convs[conv[0]] = at
                self._evicted_convs.move_to_end(conv[0])
                if len(self._evicted_convs) > MAX_EVICTED:
                    self._evicted_convs.popitem(last=False)
        self._evicted_unresolved = still

    # ------------------------------------------------------------ event handlers
    def _on_server_starting(self, ev: p.ServerStarting) -> None:
        # With timestamps on, the jump back to ~0 already started the new epoch and this
        # epoch has no lines yet; with timestamps off this line is the only marker.
        if self._epoch_lines:
            self._new_epoch()
        self.join.start_of_process()  # every request of this process will be seen

    def _on_server_build(self, ev: p.ServerBuild) -> None:
        self.sink.server_build(ev.number, ev.commit)

    def _on_slots_initialized(self, ev: p.SlotsInitialized) -> None:
        self._n_slots = min(ev.n_slots, MAX_SLOTS)
        self._announce_slots(range(ev.n_slots))
        self.join.n_slots = ev.n_slots

    def _announce_slots(self, ids) -> None:
        # bounded by what the server has (its start banner's n_slots, else a hard cap): each
        # slot id becomes a label value
        limit = self._n_slots if self._n_slots is not None else MAX_SLOTS
        new = [i for i in ids if i not in self._known_slots and 0 <= i < limit]
        if new:
            self._known_slots.update(new)
            self.sink.slots_known(sorted(new))
            self.join.n_slots = max(self.join.n_slots or 0, len(self._known_slots))

    def _on_verbosity(self, ev: p.Verbosity) -> None:
        self.verbosity = ev.level
        self._set_diag(ev.level >= 4)
        if ev.level >= 5:
            self._on_debug(p.DebugLine())

    def _on_debug(self, ev: p.DebugLine) -> None:
        if not self._debug_warned:
            self._debug_warned = True
            self.sink.debug_logging_seen()

    def _on_conversation_arrived(self, ev: p.ConversationArrived) -> None:
        # pseudonymised at once: the raw header value is not kept
        name = self.pseudonymize("id:" + ev.raw_id) if ev.raw_id else ""
        self.join.arrival(name, self._now, self._all_idle())
        self._count_dropped()

    def _on_params_read(self, ev: p.RequestParamsRead) -> None:
        self.join.params_read(self._now)

    def _on_slot_busy(self, ev: p.SlotBusy) -> None:
        self.join.slot_busy(ev.slot)

    def _all_idle(self) -> bool:
        return not any(sl.record is not None for sl in self._slots.values())

    def _count_dropped(self) -> None:
        n = self.join.dropped_arrivals
        while self._dropped_seen < n:
            self._dropped_seen += 1
            self.sink.conversation_arrival_dropped()

    def _on_slot_selected(self, ev: p.SlotSelected) -> None:
        s = self._slot(ev.slot)
        self.join.slot_selected(ev.slot, ev.method == "id")
        sel = _Selection(ev.slot, ev.method, s.tokens, f_keep=ev.f_keep, f_sim=ev.f_sim)
        s.selection = sel
        self._cache_ctx = sel
        self._cache_ctx_source = (self.epoch, s.last_task) if s.last_task is not None else None

    def _on_idle_slot_saving(self, ev: p.IdleSlotSaving) -> None:
        s = self._slot(ev.slot)
        self._cache_ctx = None
        self._cache_ctx_source = (self.epoch, s.last_task) if s.last_task is not None else None

    def _on_cache_update_started(self, ev: p.CacheUpdateStarted) -> None:
        if self._cache_ctx is not None:
            self._cache_ctx.ram_consulted = True
            self._cache_ctx.candidates = []
        self._set_diag(True)

    def _on_prompt_saved(self, ev: p.PromptSaved) -> None:
        self.cache.save_started(ev.n_tokens, self._cache_ctx_source)
        sel = self._cache_ctx
        if sel is not None and sel.slot_tokens_before is None:
            sel.slot_tokens_before = ev.n_tokens

    def _on_prompt_save_skipped(self, ev: p.PromptSaveSkipped) -> None:
        self.cache.save_skipped()

    def _on_candidate(self, ev: p.CacheCandidate) -> None:
        sel = self._cache_ctx
        if sel is None:
            return
        if sel.candidates is None:
            sel.candidates = []
        sel.candidates.append(ev)
        f = float(ev.f_sim)
        if sel.best_f_sim is None or f > sel.best_f_sim:
            sel.best_f_sim = f

    def _on_restored(self, ev: p.CacheRestored) -> None:
        sel = self._cache_ctx
        if sel is None:
            return
        # the first candidate with the printed best values (the server needs strictly better)
        candidates = sel.candidates or []
        k = next((i for i, c in enumerate(candidates) if c.f_keep == ev.f_keep and c.f_sim == ev.f_sim), None)
        winner = candidates[k] if k is not None else None
        sel.restored_tokens = winner.n_tokens if winner else -1
        sel.restored_lcp = winner.lcp if winner else None
        if k is not None:
            source = self.cache.restored([c.n_tokens for c in candidates], k)
            if source is not False:
                sel.restored_source = source  # type: ignore[assignment]
                sel.restored_known = True
        try:
            sel.restored_f_keep = float(ev.f_keep)
        except ValueError:
            sel.restored_f_keep = None

    def _on_cache_state(self, ev: p.CacheState) -> None:
        self.sink.cache_state(ev.n_prompts, ev.size_mib * 1048576.0, ev.limit_mib * 1048576.0)
        self.cache.listing_started(ev.n_prompts)

    def _on_cache_entry(self, ev: p.CacheEntryListed) -> None:
        self.cache.listed(ev.n_tokens)

    def _on_cache_update_took(self, ev: p.CacheUpdateTook) -> None:
        self.sink.cache_update_duration(ev.ms / 1000.0)

    def _on_cache_evicted(self, ev: p.CacheEvicted) -> None:
        self.cache.evicted(ev.making_room)
        self.sink.cache_evicted(ev.size_mib * 1048576.0)

    def _on_obsolete_removed(self, ev: p.ObsoleteEntryRemoved) -> None:
        self.cache.obsolete_removed(ev.n_tokens)

    def _on_lora_cleared(self, ev: p.LoraCacheCleared) -> None:
        s = self._slot(ev.slot)
        if s.selection is not None:
            s.selection.lora_cleared = True
        s.tokens = 0

    def _on_slot_prompt_cleared(self, ev: p.SlotPromptCleared) -> None:
        self._slot(ev.slot).tokens = 0

    def _on_task_launched(self, ev: p.TaskLaunched) -> None:
        s = self._slot(ev.slot)
        if s.record is not None and s.record.task != ev.task:
            # the previous task never printed its release (we joined mid-stream): emit it
            self._release(s, s.record, cancelled=True)
        sel = s.selection
        s.selection = None
        if self._cache_ctx is sel:
            self._cache_ctx = None
        rec = RequestRecord(epoch=self.epoch, slot=ev.slot, task=ev.task, start_us=self._now)
        rec._prefill_start_us = self._now
        rec._is_child = ev.is_child
        if sel is not None:
            rec.path = selection_path(sel.method)
            rec.slot_tokens_before = sel.slot_tokens_before
            rec.ram_consulted = sel.ram_consulted
            rec.ram_candidates = len(sel.candidates or ())
            rec.ram_best_f_sim = sel.best_f_sim
            rec.lora_cache_cleared = sel.lora_cleared
            if sel.restored_tokens is not None:
                rec.ram_restored = True
                rec.restored_tokens = sel.restored_tokens if sel.restored_tokens >= 0 else None
                rec._entry_source = sel.restored_source
                rec._offered_tokens = sel.restored_lcp
            if sel.method == "lcp" and sel.f_sim is not None:
                rec._offered_f_sim = sel.f_sim
        if not ev.is_child:
            self.join.launched(ev.task, self._now, self._all_idle())
            self._count_dropped()
            self._remember_lineage(rec, s, sel)
        s.record = rec
        s.last_task = ev.task
        self.prefills.launched(ev.slot, ev.task, self._now)
        if self.request_poll is not None:
            self.request_poll()

    def _remember_lineage(self, rec: RequestRecord, s: _Slot, sel: _Selection | None) -> None:
        """The state this task continues, for when its request turns out to carry no id: the
        slot's previous task (selected by LCP, f_keep >= LINEAGE_MIN_F_KEEP) or the task that
        computed the RAM-cache entry it restored. A pinned request (id_slot) is not a
        continuation by itself: the log does not say how much of the slot it kept."""
        parent = None
        if sel is not None:
            if sel.method == "lcp" and (sel.f_keep or 0.0) >= LINEAGE_MIN_F_KEEP and s.last_task is not None:
                parent = (self.epoch, s.last_task)
            elif sel.restored_source is not None and (sel.restored_f_keep or 0.0) >= LINEAGE_MIN_F_KEEP:
                parent = sel.restored_source
        key = (rec.epoch, rec.task)
        self._lineage_parent[key] = parent
        if len(self._lineage_parent) > MAX_TASK_LORA:
            self._lineage_parent.popitem(last=False)

    def _conversation(self, epoch: int, task: int, give_up: bool = False) -> tuple[str | None, str] | None:
        """(pseudonym or None, source) of a task once the log proves it, else None.

        header: the request's X-Conversation-Id. lineage: it sent none, so the conversation
        is that of the state it continued, if that state's conversation was itself found by
        lineage (an id-less request is never merged into a conversation that has an id), else
        a new one. uncertain: the log cannot tell which request the task was."""
        key = (epoch, task)
        known = self._task_conv.get(key)
        if known is not None:
            return known
        if self.verbosity is not None and self.verbosity < 4 or self._diag is False:
            res: tuple[str, str] | None = (NONE, "")  # below -lv 4 no request shows its id: lineage only
        else:
            res = self.join.result(task) if epoch == self.epoch else (UNCERTAIN, "")
            if res is None and not self.join.pending(task):
                res = (UNCERTAIN, "")  # a child task, or one the join never saw launch
        if res is None:
            if not give_up:
                return None
            res = self.join.give_up(task)
        source, name = res
        if source == HEADER:
            out: tuple[str | None, str] = (name, "header")
        elif source == UNCERTAIN:
            out = (None, "uncertain")
        else:
            conv = None
            parent = self._lineage_parent.get(key)
            if parent is not None:
                pc = self._conversation(*parent)
                if pc is None and not give_up:
                    return None
                if pc is not None and pc[1] == "lineage":
                    conv = pc[0]
            out = (conv or self.pseudonymize(f"lineage:{epoch}:{task}"), "lineage")
        self._task_conv[key] = out
        if len(self._task_conv) > MAX_TASK_LORA:
            self._task_conv.popitem(last=False)
        return out

    def _record(self, slot: int, task: int) -> RequestRecord | None:
        s = self._slots.get(slot)
        if s is None or s.record is None or s.record.task != task:
            return None
        return s.record

    def _on_new_prompt(self, ev: p.NewPrompt) -> None:
        rec = self._record(ev.slot, ev.task)
        if rec is not None:
            rec.prompt_tokens = ev.n_tokens
            self._set_diag(True)
            # the prefill starts here (llama-server's t_start), not at the launch: a launched
            # task can wait for another slot's prompt batch before its own first batch
            self.prefills.first_batch(ev.slot, ev.task, self._now)

    def _on_cached_tokens(self, ev: p.CachedTokens) -> None:
        rec = self._record(ev.slot, ev.task)
        if rec is None or rec.reuse_source == "log":
            return
        rec.reused_tokens = ev.n_tokens
        rec.reuse_source = "log"
        if rec.prompt_tokens is not None:
            self.sink.prefill_in_progress(ev.slot, max(rec.prompt_tokens - ev.n_tokens, 0))

    def _on_forced_reprocess(self, ev: p.FullReprocessForced) -> None:
        rec = self._record(ev.slot, ev.task)
        if rec is not None:
            rec.forced_reprocess = True

    def _end_prefill(self, slot: int, at_us: int) -> None:
        if slot not in self.prefills.slots:
            return
        self.prefills.ended(slot, at_us)
        self.sink.prefill_in_progress(slot, 0)

    def _on_prefill_finished(self, ev: p.PrefillFinished) -> None:
        rec = self._record(ev.slot, ev.task)
        if rec is not None:
            rec._prefill_end_us = self._now
        self._end_prefill(ev.slot, self._now)

    def _on_prompt_timing(self, ev: p.PromptTiming) -> None:
        rec = self._record(ev.slot, ev.task)
        if rec is not None:
            rec.prefill_seconds = ev.ms / 1000.0
            rec.prefill_tokens = ev.n_tokens

    def _on_eval_timing(self, ev: p.EvalTiming) -> None:
        rec = self._record(ev.slot, ev.task)
        if rec is None:
            return
        rec.generated_tokens = ev.n_tokens
        rec.decode_seconds = ev.ms / 1000.0
        if ev.n_tokens >= 2:
            rec.time_per_output_token_seconds = ev.ms_per_token / 1000.0
        # exact intervals from the server's own timings, ending at this line
        decode_start = self._now - int(ev.ms * 1000)
        rec._decode_start_us = decode_start
        rec._decode_end_us = self._now
        if rec.prefill_seconds is not None:
            prefill_start = decode_start - int(rec.prefill_seconds * 1_000_000)
            self.prefills.timed(ev.slot, rec.task, prefill_start, decode_start)
            self.sink.prefill_in_progress(ev.slot, 0)

    def _on_released(self, ev: p.TaskReleased) -> None:
        self.join.released(ev.slot, self._now)
        s = self._slot(ev.slot)
        rec = s.record
        s.tokens = ev.n_tokens
        if rec is None or rec.task != ev.task:
            return
        self._release(s, rec, cancelled=rec.generated_tokens is None)

    def _release(self, s: _Slot, rec: RequestRecord, cancelled: bool) -> None:
        rec.end_us = self._now
        s.record = None
        rec.cancelled = rec.cancelled or cancelled
        rec._released_seq = self._snapshot_seq
        if self.prefills.released(rec.slot, rec.task, self._now):
            self.sink.prefill_in_progress(rec.slot, 0)
        self._pending.append(rec)
        if rec.prompt_tokens is None and rec.reused_tokens is not None and rec.prefill_tokens is not None:
            # -lv 3 with /slots: the prompt is what was reused plus what was computed
            rec.prompt_tokens = rec.reused_tokens + rec.prefill_tokens
        if rec.reuse_source != "log" and not rec.cancelled and self.verbosity is None:
            self._set_diag(False)  # a whole task without its TRACE lines: -lv 3
        if self.request_poll is not None:
            self.request_poll()  # capture params.lora right after the task, if missed
        if len(self._pending) > MAX_PENDING:
            self._finalize(self._pending[0])

    def _on_cancelled(self, ev: p.TaskCancelled) -> None:
        for s in self._slots.values():
            if s.record is not None and s.record.task == ev.task:
                s.record.cancelled = True
                return
        # never launched: a completion cancelled while queued, or a /slots or /metrics request
        self.join.cancelled(ev.task)

    def _on_launch_failed(self, ev: p.TaskLaunchFailed) -> None:
        self.join.launched(ev.task, self._now, self._all_idle())

    def _on_failed(self, ev: p.TaskFailed) -> None:
        for s in self._slots.values():
            if s.record is not None and s.record.task == ev.task:
                s.record.failed = True

    # ------------------------------------------------------------ finalization
    def _lora_resolved(self, rec: RequestRecord) -> bool:
        if rec._lora_request is not None or not self.slots_polled:
            return True
        # a /slots poll taken after the release that did not show the task: give up
        return rec._released_seq is not None and self._snapshot_seq > rec._released_seq + 1

    def _conversations_known(self, rec: RequestRecord) -> bool:
        """Its own conversation, and those of the prefills its decoding overlapped (they are
        charged the cost), are proven or found uncertain."""
        if rec.epoch != self.epoch:
            return True
        if not rec._is_child and self._conversation(rec.epoch, rec.task) is None:
            return False
        return all(self._conversation(self.epoch, task) is not None for task, _, _ in self._overlapping(rec))

    def _overlap_resolved(self, rec: RequestRecord) -> bool:
        if rec._decode_start_us is None or rec.end_us is None:
            return True
        return self.prefills.settled_before(rec.slot, rec.end_us)

    def _try_finalize(self) -> None:
        now = self._now
        for rec in list(self._pending):
            waited = now - (rec.end_us or now)
            if (
                waited > self.settings.max_wait_us
                or (waited > JOIN_MAX_WAIT_US and self._lora_resolved(rec) and self._overlap_resolved(rec))
                or (self._lora_resolved(rec) and self._overlap_resolved(rec) and self._conversations_known(rec))
            ):
                self._finalize(rec)

    def _finalize_all(self) -> None:
        for s in self._slots.values():
            if s.record is not None:
                self._release(s, s.record, cancelled=True)
        for rec in list(self._pending):
            self._finalize(rec)

    def _finalize(self, rec: RequestRecord) -> None:
        self._pending.remove(rec)
        if not rec._is_child:
            rec.conversation, rec.conversation_source = self._conversation(rec.epoch, rec.task, give_up=True)  # type: ignore[misc]
        st = self.settings
        # LoRA
        if rec._lora_request is None:
            key = (rec.epoch, rec.task)
            rec._lora_request = self._task_lora.get(key)
        req = rec._lora_request
        if req is not None:
            rec.lora = "active" if any(sc != 0.0 for _, sc in req) else "none"
            rec.lora_config = self.lora_config(req)
        if rec._entry_source is not None:
            src = self._task_lora.get(rec._entry_source)
            rec.restored_entry_lora_config = self.lora_config(src)
        # what became of a restored entry
        if rec.ram_restored:
            rec.restore_result, rec.lora_mismatch_reuse = classify.restore_result(
                lora_cache_cleared=rec.lora_cache_cleared,
                forced_reprocess=rec.forced_reprocess,
                reused_tokens=rec.reused_tokens,
                reuse_known=rec.reuse_source is not None,
                lora_config=rec.lora_config,
                entry_lora_config=rec.restored_entry_lora_config,
            )
        # prompt tokens the slot or the RAM cache offered but that were computed again
        offered = classify.offered_tokens(rec._offered_tokens, rec._offered_f_sim, rec.prompt_tokens)
        if offered is not None and rec.reused_tokens is not None:
            rec.wasted_prompt_tokens = max(0, offered - rec.reused_tokens)
        if rec.prompt_tokens is not None and rec.reused_tokens is not None and rec.prompt_tokens > 0:
            rec.outcome = classify.outcome(
                rec.prompt_tokens, rec.reused_tokens, st.min_prompt_tokens, st.hit_ratio, st.miss_ratio
            )
            if classify.is_miss(rec.prompt_tokens, rec.reused_tokens, st.miss_ratio):
                rec.miss_cause = classify.miss_cause(
                    restore_result=rec.restore_result,
                    lora_cache_cleared=rec.lora_cache_cleared,
                    forced_reprocess=rec.forced_reprocess,
                    offered_enough=(offered or 0) >= st.miss_ratio * rec.prompt_tokens,
                    ram_consulted=rec.ram_consulted,
                    ram_restored=rec.ram_restored,
                    path=rec.path,
                )
            rec.small_task_takeover = classify.small_task_takeover(
                rec.prompt_tokens, rec.slot_tokens_before, st.small_task_tokens, st.big_conversation_tokens
            )
        if rec.conversation_source == "header":
            self._consume_eviction(rec)
        # overlap of other slots' prefills with this request's decoding
        if rec._decode_start_us is not None and rec._decode_end_us is not None and rec.decode_seconds:
            rec.overlap_seconds = self._overlap(rec) / 1e6
            frac = rec.overlap_seconds / rec.decode_seconds
            rec.contention = "prefill" if frac > st.contention_fraction else "none"
        self.sink.request(rec)

    def _consume_eviction(self, rec: RequestRecord) -> None:
        """A request of a conversation whose RAM-cache entry was evicted before it started:
        if it found no entry, the cache threw out what was needed again (cause "evicted").
        Only a conversation id proves the two belong together; without one the miss stays
        no_cache_entry (evicted or never saved: the log cannot tell)."""
        if self._evicted_unresolved:
            self._resolve_evicted()
        conv = rec.conversation
        at = self._evicted_convs.get(conv) if conv is not None else None
        if at is None or at >= rec.start_us:
            return
        del self._evicted_convs[conv]
        if rec.miss_cause == "no_cache_entry":
            rec.miss_cause = "evicted"

    def _overlapping(self, rec: RequestRecord):
        """(task, from, to) for every other slot's prefill during this record's decoding."""
        start, end = rec._decode_start_us, rec._decode_end_us
        if start is None or end is None or not rec.decode_seconds:
            return
        yield from self.prefills.overlapping(rec.slot, start, end)

    def _overlap(self, rec: RequestRecord) -> int:
        """Microseconds of the decoding during which another slot was prefilling (union), and
        each prefilling conversation's share, charged to it as cost to the others."""
        spans: list[tuple[int, int]] = []
        by_conv: dict[str, int] = {}
        for task, lo, hi in self._overlapping(rec):
            spans.append((lo, hi))
            known = self._conversation(self.epoch, task)
            if known is not None and known[0] is not None:
                by_conv[known[0]] = by_conv.get(known[0], 0) + hi - lo
        for conv, us in by_conv.items():
            self.sink.conversation_cost(conv, us / 1e6)
        if by_conv:
            rec.slowed_by_conversation = max(by_conv, key=lambda c: by_conv[c])
        return union_us(spans)


# Lines between "saving prompt" and the moment the entry is pushed (alloc's own removals)
_PART_OF_SAVE = frozenset({p.PromptSaveSkipped, p.ObsoleteEntryRemoved, p.CacheEvicted})

# Events after which a waiting record may be complete: a prefill ended, a task launched or was
# cancelled (the join), a task ended. Checking only then keeps the hot path short.
_UNBLOCKING = frozenset(
    {
        p.TaskLaunched,
        p.TaskReleased,
        p.PrefillFinished,
        p.EvalTiming,
        p.TaskCancelled,
        p.ServerStarting,
        p.SlotBusy,
        p.ConversationArrived,
        p.TaskLaunchFailed,
    }
)

_HANDLERS: dict[type, Callable[[Assembler, object], None]] = {
    p.ServerStarting: Assembler._on_server_starting,
    p.Verbosity: Assembler._on_verbosity,
    p.SlotsInitialized: Assembler._on_slots_initialized,
    p.ServerBuild: Assembler._on_server_build,
    p.DebugLine: Assembler._on_debug,
    p.SlotSelected: Assembler._on_slot_selected,
    p.ConversationArrived: Assembler._on_conversation_arrived,
    p.RequestParamsRead: Assembler._on_params_read,
    p.SlotBusy: Assembler._on_slot_busy,
    p.TaskLaunchFailed: Assembler._on_launch_failed,
    p.IdleSlotSaving: Assembler._on_idle_slot_saving,
    p.CacheUpdateStarted: Assembler._on_cache_update_started,
    p.PromptSaved: Assembler._on_prompt_saved,
    p.PromptSaveSkipped: Assembler._on_prompt_save_skipped,
    p.CacheCandidate: Assembler._on_candidate,
    p.CacheRestored: Assembler._on_restored,
    p.CacheState: Assembler._on_cache_state,
    p.CacheEntryListed: Assembler._on_cache_entry,
    p.CacheUpdateTook: Assembler._on_cache_update_took,
    p.CacheEvicted: Assembler._on_cache_evicted,
    p.ObsoleteEntryRemoved: Assembler._on_obsolete_removed,
    p.LoraCacheCleared: Assembler._on_lora_cleared,
    p.SlotPromptCleared: Assembler._on_slot_prompt_cleared,
    p.TaskLaunched: Assembler._on_task_launched,
    p.NewPrompt: Assembler._on_new_prompt,
    p.CachedTokens: Assembler._on_cached_tokens,
    p.FullReprocessForced: Assembler._on_forced_reprocess,
    p.PrefillFinished: Assembler._on_prefill_finished,
    p.PromptTiming: Assembler._on_prompt_timing,
    p.EvalTiming: Assembler._on_eval_timing,
    p.TaskReleased: Assembler._on_released,
    p.TaskCancelled: Assembler._on_cancelled,
    p.TaskFailed: Assembler._on_failed,
}  # type: ignore[dict-item]
