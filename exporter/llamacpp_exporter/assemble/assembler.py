"""Assembler: typed log events and /slots snapshots in, one record per request out.

Pure state machine: no I/O, no clock, no threads. The pipeline feeds it in log order
(snapshots are interleaved in the order they were taken), so replaying a recorded log
gives the same records as the live run. It dispatches each event to the part that knows
about it (promptcache, attribution, the prefill timeline), keeps the epochs (one per server
process) and the tasks on their slots, and hands each released task to the finisher.

State is bounded: per slot, the running task and a few recent prefill intervals; the
RAM-cache entries the server itself holds; capped maps of task -> LoRA and conversation.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final, Protocol

from .. import parse as p
from ..records import LoraAdapters, RequestRecord, SlotsSnapshot, TaskKind
from .attribution import Attribution, AttributionSink, held_states, lineage_parent
from .draft import TaskDraft
from .finish import AssemblySettings, Finisher
from .logclock import EPOCH_BACKWARDS_US, LogClock
from .lora import LoraTracker
from .promptcache import CacheSink, PromptCacheLog, Selection
from .pseudonyms import Pseudonymizer
from .serverstate import ServerSink, ServerState
from .timeline import PrefillTimeline

__all__ = ["Assembler", "Sink"]

QUIET_MARGIN_US: Final = 1_000_000


class Sink(CacheSink, ServerSink, AttributionSink, Protocol):
    """The assembler's outbound side, one interface: the facts read straight from lines (each
    part sees its own share of it), the few the assembler reports itself, each finished
    record, and the /slots polls it asks for."""

    def prefill_in_progress(self, slot: int, tokens: int) -> None: ...
    def server_restart(self) -> None: ...
    def out_of_order_lines(self, n: int) -> None: ...
    def tokens_accounted(self, computed: int | None, cached: int | None, generated: int | None) -> None: ...
    def record(self, record: RequestRecord) -> None: ...
    def slots_poll(self, until_prefill_started: bool) -> None: ...


@dataclass(slots=True)
class _Slot:
    tokens: int | None = None  # tokens the slot holds, as far as the log tells
    last_task: int | None = None
    selection: Selection | None = None
    draft: TaskDraft | None = None  # the task running on it
    sampler_set: bool = False  # "sampler chain" since its last launch: the next task samples


class Assembler:
    def __init__(
        self,
        sink: Sink,
        settings: AssemblySettings | None = None,
        *,
        slots_polled: bool = False,
        pseudonymize: Callable[[str], str] | None = None,
        model: str = "",
    ) -> None:
        self.sink = sink
        self.model = model  # a router's child: the model it serves ("" for a plain server)
        # the lines read again at the exporter's start (catch_up): their requests were counted
        # by the exporter that ran then, and they ask for no /slots poll
        self.catching_up = False
        self.caught_up_at: tuple[int, int] | None = None  # (epoch, log time) the catch-up ended at
        self.epoch = 0
        self.server = ServerState(sink, self._server_changed)
        self.clock = LogClock()
        self.lora = LoraTracker()
        self.attribution = Attribution(
            sink, pseudonymize or Pseudonymizer(), lambda: self.clock.now, self._all_idle, model
        )
        self.finisher = Finisher(sink, settings or AssemblySettings(), self.lora, self.attribution, slots_polled, model)
        self._choices: dict[int, int] = {}  # parent task -> choices of its n > 1 request
        # child tasks launched since the last other launch: an n > 1 request launches its
        # children, then its parent, in one go (launch_slots_with_parent_task), at any verbosity
        self._children_launched = 0
        self._own_handlers: dict[type, Callable[[Any], None]] = {  # the cache's and the join's: per epoch
            p.ServerStarting: self._on_server_starting,
            p.Verbosity: self.server.verbosity_read,
            p.SlotsInitialized: self.server.slots_initialized,
            p.ServerBuild: self.server.build,
            p.ServerListening: self.server.listening,
            p.DebugLine: self.server.debug_seen,
            p.SlotSelected: self._on_slot_selected,
            p.IdleSlotSaving: self._on_idle_slot_saving,
            p.LoraCacheCleared: self._on_lora_cleared,
            p.SlotPromptCleared: self._on_slot_prompt_cleared,
            p.SamplerChainSet: self._on_sampler_set,
            p.ChildTasksLaunched: self._on_child_tasks,
            p.GlobalLoraScale: self._on_global_lora_scale,
            p.TaskLaunched: self._on_task_launched,
            p.NewPrompt: self._on_new_prompt,
            p.CachedTokens: self._on_cached_tokens,
            p.FullReprocessForced: self._on_forced_reprocess,
            p.PrefillFinished: self._on_prefill_finished,
            p.PromptTiming: self._on_prompt_timing,
            p.EvalTiming: self._on_eval_timing,
            p.DraftAcceptance: self._on_draft_acceptance,
            p.ContextShift: self._on_context_shift,
            p.TaskReleased: self._on_released,
            p.TaskCancelled: self._on_cancelled,
            p.TaskFailed: self._on_failed,
        }
        self._reset_epoch_state()

    # ------------------------------------------------------------ epochs
    def _reset_epoch_state(self) -> None:
        self._slots: dict[int, _Slot] = {}
        # this run logs "new prompt" (-lv 4, in a wording we read): a task launched without it
        # has not begun its prefill. A run that rewords the line keeps prefills from the launch.
        self._first_batches_logged = False
        self._sampler_lines = False  # this run logs "sampler chain" (TRACE) at each completion's launch
        self.cache = PromptCacheLog(
            self.sink, self.attribution.entry_evicted, lambda: self.server.set_diagnostics(True)
        )
        self.prefills = PrefillTimeline()
        self.finisher.new_epoch(self.prefills, self.cache.mirror.returned)
        self.clock.new_epoch()
        self._epoch_lines = 0
        self.attribution.new_epoch(self.epoch, len(self.server.known_slots) or None)
        att = self.attribution
        self._handlers: dict[type, Callable[[Any], None]] = {
            **self._own_handlers,
            **self.cache.handlers(),
            p.ConversationArrived: att.arrival,
            p.RequestParamsRead: att.params_read,
            p.SlotBusy: att.slot_busy,
            p.AllSlotsIdle: att.all_slots_idle,
            p.TaskLaunchFailed: self._on_launch_failed,
        }

    def _new_epoch(self) -> None:
        self._release_running()
        self.finisher.finish_all()
        self.epoch += 1
        self.lora.new_process()
        self._children_launched = 0
        self._reset_epoch_state()
        self.server.run_started()
        self.sink.server_restart()

    def catch_up(self, started: bool) -> None:
        """The lines between ``catch_up(True)`` and ``catch_up(False)`` were written before the
        exporter started (the server run so far): they build the state as a replay would, but
        ask for no /slots poll, and their records are replayed (see ``replayed``)."""
        if started:
            self.catching_up = True
        elif self.catching_up:
            self.catching_up = False
            self.caught_up_at = (self.epoch, self.clock.now)

    def replayed(self, record: RequestRecord) -> bool:
        """A request that ended before the exporter started, read again to catch up."""
        if self.catching_up:
            return True
        q = self.caught_up_at
        return q is not None and (record.epoch, record.end_us or 0) <= q

    def flush(self, running: bool = True) -> None:
        """End of input (replay) or shutdown: emit every record still waiting, and with
        ``running`` the tasks still running, as cancelled (without: a restarted exporter that
        reads on from its saved position catches up and sees them end)."""
        if self.clock.held:
            self._release_held()  # too few to prove a restart
        self.cache.mirror.close_listing()
        if running:
            self._release_running()
        self.finisher.finish_all()

    # ------------------------------------------------------------ inputs
    def feed(self, line: p.ParsedLine, now_us: int) -> None:
        clock, ts = self.clock, line.ts_us
        if ts is not None and clock.last_ts is not None and ts < clock.last_ts - EPOCH_BACKWARDS_US:
            self._went_back(line, ts, now_us)
            return
        if clock.held and ts is not None:
            self._release_held()
        self._feed(line, now_us, checked=True)

    def _went_back(self, line: p.ParsedLine, ts: int, now_us: int) -> None:
        """A line from the past: a stray, or the first lines of a restart."""
        clock = self.clock
        if not isinstance(line.event, p.ServerStarting) and clock.after_stray_ahead(ts):
            clock.forget_stray(ts)  # the line before was the stray: it counted at its time
            self.sink.out_of_order_lines(1)
            self._feed(line, now_us, checked=True)
            return
        # at -lv 5 a client's text can hold whole log lines (see Pipeline): a start banner
        # from the past is then a restart only once the lines after it confirm it
        banner_ends = not self.server.debug_logging
        if not clock.hold(line, now_us, banner_ends=banner_ends):
            return
        held = clock.take_held()
        self._new_epoch()
        for h, n in held:
            self._feed(h, n)
        if banner_ends and isinstance(line.event, p.ServerStarting):
            self._feed(line, now_us)  # not held: it ended the wait at once

    def _release_held(self) -> None:
        """Time came back: the held lines were strays. They count, at the current time; not
        when the log holds DEBUG lines, where a line out of sequence may be a client's text."""
        held = self.clock.take_held()
        self.sink.out_of_order_lines(len(held))
        if self.server.debug_logging:
            return
        for h, n in held:
            self._feed(p.ParsedLine(None, h.event), n)

    def _feed(self, line: p.ParsedLine, now_us: int, checked: bool = False) -> None:
        """checked: feed() has already seen that this line's time did not go back."""
        ev, ts, clock = line.event, line.ts_us, self.clock
        if not checked and clock.went_back(ts):
            self._new_epoch()
        # clock.advance, written out: this runs for every line
        clock.read_us = now_us
        if ts is not None:
            clock.prev_ts = clock.last_ts
            clock.last_ts = clock.now = ts
        elif clock.last_ts is None:
            clock.advance(None, now_us)
        mirror = self.cache.mirror
        if mirror.listing or mirror.saving:
            self.cache.before(ev)
        kind = type(ev)
        handler = self._handlers.get(kind)
        if handler is not None:
            handler(ev)
        self._epoch_lines += 1
        fin = self.finisher
        if fin.pending and (kind in _UNBLOCKING or clock.now > fin.next_deadline):
            fin.try_finish(clock.now)
        att = self.attribution
        if att.late or att.late_costs:
            att.maybe_prove_late()

    def quiet(self, now_us: int) -> None:
        """No line since the last one was read (now_us: the reader's clock): as if a line had
        come at the server time that has passed since, for the records waiting on the join."""
        fin = self.finisher
        if not fin.pending or self.clock.last_ts is None:
            return
        # less a margin: a line the server stamped before now may still be on its way to us
        server_now = self.clock.now + max(0, now_us - self.clock.read_us - QUIET_MARGIN_US)
        if server_now > fin.next_deadline:
            fin.try_finish(server_now)

    def feed_snapshot(self, snap: SlotsSnapshot) -> None:
        self.finisher.slots_seen()
        self.server.announce_slots(s.id for s in snap.slots)
        for s in snap.slots:
            if s.id_task is None:
                continue
            if s.lora is not None:
                self.lora.task_seen((self.epoch, s.id_task), s.lora)
            slot = self._slots.get(s.id)
            d = slot.draft if slot else None
            if d is None or d.task != s.id_task:
                continue
            d.seen_in_slots(s)
        if self.finisher.pending:
            self.finisher.try_finish(self.clock.now, at_line=False)

    def feed_adapters(self, adapters: LoraAdapters) -> None:
        self.lora.polled(adapters.scales, self.catching_up)

    # ------------------------------------------------------------ server and slots
    def _slot(self, sid: int) -> _Slot:
        s = self._slots.get(sid)
        if s is None:
            s = self._slots[sid] = _Slot()
        return s

    def _all_idle(self) -> bool:
        return not any(sl.draft is not None for sl in self._slots.values())

    def _server_changed(self) -> None:
        self.attribution.server_changed(self.server.lineage_only, self.server.slots())

    def _on_server_starting(self, ev: p.ServerStarting) -> None:
        # With timestamps on, the jump back to ~0 already started the new epoch and this
        # epoch has no lines yet; with timestamps off this line is the only marker.
        if self._epoch_lines:
            self._new_epoch()
        self.attribution.join.start_of_process()  # every request of this process will be seen

    def _on_slot_selected(self, ev: p.SlotSelected) -> None:
        s = self._slot(ev.slot)
        self.attribution.join.slot_selected(ev.slot, ev.method == "id", self.clock.now)
        sel = Selection(ev.slot, ev.method, s.tokens, f_keep=ev.f_keep, f_sim=ev.f_sim)
        s.selection = sel
        self.cache.selected(sel, (self.epoch, s.last_task) if s.last_task is not None else None)

    def _on_idle_slot_saving(self, ev: p.IdleSlotSaving) -> None:
        s = self._slot(ev.slot)
        self.cache.idle_slot_saving((self.epoch, s.last_task) if s.last_task is not None else None)

    def _on_lora_cleared(self, ev: p.LoraCacheCleared) -> None:
        s = self._slot(ev.slot)
        if s.selection is not None:
            s.selection.lora_cleared = True
        s.tokens = 0

    def _on_slot_prompt_cleared(self, ev: p.SlotPromptCleared) -> None:
        self._slot(ev.slot).tokens = 0

    # ------------------------------------------------------------ a task's life on its slot
    def _on_sampler_set(self, ev: p.SamplerChainSet) -> None:
        self._slot(ev.slot).sampler_set = True
        self._sampler_lines = True

    def _on_child_tasks(self, ev: p.ChildTasksLaunched) -> None:
        self._choices[ev.parent_task] = ev.n_children + 1
        if len(self._choices) > 64:  # its tasks launch right after this line
            del self._choices[next(iter(self._choices))]

    def _on_global_lora_scale(self, ev: p.GlobalLoraScale) -> None:
        self.lora.global_scale_set(ev.adapter, ev.scale)

    def _on_launch_failed(self, ev: p.TaskLaunchFailed) -> None:
        self._children_launched = 0  # its parent is not launched
        self.attribution.launch_failed(ev)

    def _task_kind(self, s: _Slot) -> TaskKind:
        """A task that samples logs "sampler chain" (TRACE) just before its launch; one that
        does not is an embedding or rerank task (server-context.cpp launch_slot_with_task,
        need_sampling). Only a log that has shown the line, or said it logs at -lv 4, tells:
        below -lv 4 it is never there, and every task is taken for a completion."""
        sampled, s.sampler_set = s.sampler_set, False
        trace = self._sampler_lines or (self.server.verbosity or 0) >= 4
        return "embedding" if trace and not sampled else "completion"

    def _on_task_launched(self, ev: p.TaskLaunched) -> None:
        s = self._slot(ev.slot)
        if s.draft is not None and s.draft.task != ev.task:
            # the previous task never printed its release (we joined mid-stream): emit it
            self._release(s, s.draft, cancelled=True)
        sel, s.selection = s.selection, None
        self.cache.launched(sel)
        kind = self._task_kind(s)
        if ev.is_child:
            self._children_launched += 1
            choices = 1
        else:
            choices = self._choices.pop(ev.task, 0) or self._children_launched + 1
            self._children_launched = 0
        d = TaskDraft(
            epoch=self.epoch,
            slot=ev.slot,
            task=ev.task,
            start_us=self.clock.now,
            is_child=ev.is_child,
            kind=kind,
            choices=choices,
        )
        if sel is not None:
            sel.hand_over(d)
            # an LRU selection without a RAM-cache update where the server updates it at every
            # one: a task that does not use the RAM cache (infill), kept out of its figures
            d.ram_unused = sel.method == "lru" and not sel.ram_consulted and self.cache.in_use
        # whose state the prompt was compared with: the restored entry's task, else the slot's
        d.state_source_task = (d.entry_source[1] if d.entry_source else None) if d.ram_restored else s.last_task
        if kind != "completion":
            self.attribution.foreign_launched(ev.task)
        elif not ev.is_child:
            self.attribution.launched(
                ev.task, lineage_parent(sel, self.epoch, s.last_task), held_states(sel, self.epoch, s.last_task)
            )
        s.draft = d
        s.last_task = ev.task
        self.lora.launched((self.epoch, ev.task))
        if not ev.is_child:  # a child copies its parent's prompt state: no prefill of its own
            self.prefills.launched(ev.slot, ev.task, self.clock.now, self._first_batches_logged)
        if not self.catching_up:
            # the LoRA always comes from /slots; the reused tokens only when the log lacks them
            self.sink.slots_poll(self.server.diagnostics is not True)

    def _draft(self, slot: int, task: int) -> TaskDraft | None:
        s = self._slots.get(slot)
        if s is None or s.draft is None or s.draft.task != task:
            return None
        return s.draft

    def _on_new_prompt(self, ev: p.NewPrompt) -> None:
        self.attribution.join.batch_line()
        d = self._draft(ev.slot, ev.task)
        if d is not None:
            d.prompt_tokens = ev.n_tokens
            self.server.set_diagnostics(True)
            # the prefill starts here (llama-server's t_start), not at the launch: a launched
            # task can wait for another slot's prompt batch before its own first batch
            self.prefills.first_batch(ev.slot, ev.task, self.clock.now)
        self._first_batches_logged = True

    def _on_cached_tokens(self, ev: p.CachedTokens) -> None:
        self.attribution.join.batch_line()
        d = self._draft(ev.slot, ev.task)
        if d is None or d.reuse_source == "log":
            return
        d.reused_tokens = ev.n_tokens
        d.reuse_source = "log"
        if d.prompt_tokens is not None:
            self.sink.prefill_in_progress(ev.slot, max(d.prompt_tokens - ev.n_tokens, 0))

    def _on_forced_reprocess(self, ev: p.FullReprocessForced) -> None:
        d = self._draft(ev.slot, ev.task)
        if d is not None:
            d.forced_reprocess = True

    def _on_prefill_finished(self, ev: p.PrefillFinished) -> None:
        self.attribution.join.batch_line()
        d = self._slot(ev.slot).draft
        if d is not None and d.prompt_tokens is not None:
            self.attribution.answers.sampling(d.task, d.prompt_tokens, self.clock.now)
        if ev.slot in self.prefills.slots:
            self.prefills.ended(ev.slot, self.clock.now)
            self.sink.prefill_in_progress(ev.slot, 0)

    def _on_prompt_timing(self, ev: p.PromptTiming) -> None:
        self.attribution.join.batch_line()
        d = self._draft(ev.slot, ev.task)
        if d is not None:
            d.prefill_seconds = ev.ms / 1000.0
            d.prefill_tokens = ev.n_tokens

    def _on_eval_timing(self, ev: p.EvalTiming) -> None:
        self.attribution.join.batch_line()
        d = self._draft(ev.slot, ev.task)
        if d is None:
            return
        d.generated_tokens = ev.n_tokens
        d.kind = "completion"  # it decoded: whatever its launch looked like
        d.decode_seconds = ev.ms / 1000.0
        if ev.n_tokens >= 2:
            d.time_per_output_token_seconds = ev.ms_per_token / 1000.0
        # exact intervals from the server's own timings, ending at this line
        d.decode_start_us = self.clock.now - int(ev.ms * 1000)
        d.decode_end_us = self.clock.now
        if d.prefill_seconds is not None and not d.is_child:
            prefill_start = d.decode_start_us - int(d.prefill_seconds * 1_000_000)
            self.prefills.timed(ev.slot, d.task, prefill_start, d.decode_start_us, d.prefill_tokens)
            self.sink.prefill_in_progress(ev.slot, 0)

    def _on_draft_acceptance(self, ev: p.DraftAcceptance) -> None:
        d = self._draft(ev.slot, ev.task)
        if d is not None:
            d.draft_tokens_generated, d.draft_tokens_accepted = ev.generated, ev.accepted

    def _on_context_shift(self, ev: p.ContextShift) -> None:
        d = self._draft(ev.slot, ev.task)
        if d is not None:
            d.context_shifts += 1
            d.context_shift_discarded_tokens += ev.discarded

    def _on_released(self, ev: p.TaskReleased) -> None:
        self.attribution.join.released(ev.slot, self.clock.now)
        s = self._slot(ev.slot)
        d = s.draft
        s.tokens = ev.n_tokens
        answered = d is not None and d.task == ev.task and d.generated_tokens is not None and not d.cancelled
        self.attribution.answers.ended(ev.task, ev.n_tokens, d.decode_end_us if answered and d else None)
        if d is not None and d.task == ev.task:
            d.truncated = ev.truncated
            # cancelled or failed only by a line that says so (a running task's cancel line, logged
            # before the cancel is posted, or its error line, both before its release): a release
            # without timings and without either is an ending the log does not show (records'
            # finish_reason "unknown"), never taken for a failure of the server
            self._release(s, d, cancelled=False)

    def _release(self, s: _Slot, d: TaskDraft, cancelled: bool) -> None:
        d.end_us = self.clock.now
        s.draft = None
        d.cancelled = d.cancelled or cancelled
        if self.prefills.released(d.slot, d.task, self.clock.now):
            self.sink.prefill_in_progress(d.slot, 0)
        if d.prompt_tokens is None and d.reused_tokens is not None and d.prefill_tokens is not None:
            # -lv 3 with /slots: the prompt is what was reused plus what was computed
            d.prompt_tokens = d.reused_tokens + d.prefill_tokens
        if d.reuse_source != "log" and not d.cancelled and self.server.verbosity is None:
            self.server.set_diagnostics(False)  # a whole task without its TRACE lines: -lv 3
        if not self.catching_up:
            self.sink.slots_poll(False)  # capture params.lora right after the task, if missed
            computed = d.prefill_tokens
            if computed is None and d.kind != "completion" and d.prompt_tokens is not None:
                computed = d.prompt_tokens - (d.reused_tokens or 0)  # an embedding prints no timings
            self.sink.tokens_accounted(computed, d.reused_tokens, d.generated_tokens)
        if d.is_child:
            return  # another choice of its parent's request: the parent's record is the request
        self.finisher.add(d)

    def _release_running(self) -> None:
        for s in self._slots.values():
            if s.draft is not None:
                self._release(s, s.draft, cancelled=True)

    def _on_cancelled(self, ev: p.TaskCancelled) -> None:
        for s in self._slots.values():
            if s.draft is not None and s.draft.task == ev.task:
                s.draft.cancelled = True
                return
        # never launched: a completion cancelled while queued, or a /slots or /metrics request
        self.attribution.join.cancelled(ev.task)

    def _on_failed(self, ev: p.TaskFailed) -> None:
        for s in self._slots.values():
            if s.draft is not None and s.draft.task == ev.task:
                s.draft.failed = True


# Events after which a waiting record may be complete: a prefill ended, a task launched or was
# cancelled (the join), a task ended. Checking only then keeps the hot path short.
_UNBLOCKING: Final = frozenset(
    {
        p.TaskLaunched,
        p.TaskReleased,
        p.PrefillFinished,
        p.EvalTiming,
        p.TaskCancelled,
        p.ServerStarting,
        p.SlotBusy,
        p.AllSlotsIdle,
        p.RequestParamsRead,
        p.ConversationArrived,
        p.TaskLaunchFailed,
    }
)
