"""When a released task becomes a record, and what is derived for it then.

A task is released with its own facts; a few things it is judged by arrive later: its LoRA list
(the next /slots poll), the conversations of its own request and of the prefills that overlapped
its decoding (the join), and the exact end of those prefills (their timings). It waits here,
bounded in number and in server time, then it is classified (classify.py) and emitted as a
frozen RequestRecord. What could not be proven by then stays unknown, never guessed.
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Iterable
from dataclasses import dataclass, fields
from typing import Final, Protocol

from ..config import CacheConfig, Config, ContentionConfig, TakeoverConfig
from ..records import Contention, RequestRecord
from . import classify, lora
from .attribution import JOIN_WAIT_US, Attribution
from .cachemirror import EvictionNeed, Source
from .draft import TaskDraft
from .lora import LoraTracker
from .timeline import Overlap, PrefillTimeline, overlapped_prefills, union_us

MAX_PENDING: Final = 256

# A record is its draft's facts, under the same names, plus the verdict derived here (the
# record's other fields). The list is made from the two classes, never written out.
FACTS_FROM_DRAFT: Final = tuple(
    f.name
    for f in fields(RequestRecord)
    if f.name in {g.name for g in fields(TaskDraft)} and f.name != "conversation"  # the draft's is (name, source)
)
_draft_facts: Final = operator.attrgetter(*FACTS_FROM_DRAFT)  # in C, at once


@dataclass(frozen=True, slots=True)
class AssemblySettings:
    """The settings the assembler judges by; their defaults are the configuration's."""

    min_prompt_tokens: int = CacheConfig.min_prompt_tokens
    hit_ratio: float = CacheConfig.hit_ratio
    miss_ratio: float = CacheConfig.miss_ratio
    contention_fraction: float = ContentionConfig.fraction
    small_task_tokens: int = TakeoverConfig.small_task_tokens
    big_conversation_tokens: int = TakeoverConfig.big_conversation_tokens
    # how long (server log time) a finished record may wait for /slots or for another
    # slot's prefill to end before it is emitted with what is known
    max_wait_us: int = 600_000_000

    @classmethod
    def from_config(cls, cfg: Config) -> AssemblySettings:
        """Each setting from the configuration key CONFIG_KEYS names."""
        return cls(**{name: getattr(getattr(cfg, section), key) for name, (section, key) in CONFIG_KEYS.items()})


# The settings read from the configuration: (section, key), whose declaration in config.py is
# also the default above. max_wait_us is the assembler's own.
CONFIG_KEYS: Final = {
    "min_prompt_tokens": ("cache", "min_prompt_tokens"),
    "hit_ratio": ("cache", "hit_ratio"),
    "miss_ratio": ("cache", "miss_ratio"),
    "contention_fraction": ("contention", "fraction"),
    "small_task_tokens": ("takeover", "small_task_tokens"),
    "big_conversation_tokens": ("takeover", "big_conversation_tokens"),
}


class RecordSink(Protocol):
    """Where a finished record leaves the assembly (assembler.Sink holds it too)."""

    def record(self, record: RequestRecord) -> None: ...


class Finisher:
    def __init__(
        self,
        sink: RecordSink,
        settings: AssemblySettings,
        lora_tracker: LoraTracker,
        attribution: Attribution,
        slots_polled: bool,
        model: str = "",  # a router's child: the model it serves
    ) -> None:
        self.sink = sink
        self.settings = settings
        self.lora = lora_tracker
        self.attribution = attribution
        self.slots_polled = slots_polled
        self.pending: list[TaskDraft] = []
        self.prefills = PrefillTimeline()  # the current epoch's (new_epoch)
        # what a larger RAM cache needed to keep an evicted entry: the current epoch's mirror's
        self.eviction_need: Callable[[Source], EvictionNeed | None] = lambda source: None
        self.snapshot_seq = 0  # /slots snapshots seen (slots_polled)
        self.next_deadline = 1 << 62  # the earliest log time a waiting record stops waiting for the join
        self.model = model
        # what the last look at the waiting records depended on, and the log time up to which
        # waiting alone changes none of its verdicts: a line that changes neither (most lines on
        # a server with many slots: a slot busy, a cache entry listed) does not look again
        self._looked: tuple[int, ...] | None = None
        self._still_until = 0
        self._epochs = 0

    def new_epoch(self, prefills: PrefillTimeline, eviction_need: Callable[[Source], EvictionNeed | None]) -> None:
        """A new server process: its prefill timeline and its RAM cache's mirror."""
        self.prefills = prefills
        self.eviction_need = eviction_need
        self._epochs += 1
        self._looked = None

    def slots_seen(self) -> None:
        """A /slots snapshot came: a record that waits for the poll after its release counts them."""
        self.snapshot_seq += 1

    def add(self, d: TaskDraft) -> None:
        d.released_seq = self.snapshot_seq
        self._looked = None
        self.pending.append(d)
        self.next_deadline = min(self.next_deadline, (d.end_us or 0) + JOIN_WAIT_US)
        if len(self.pending) > MAX_PENDING:
            self._finish(self.pending[0])

    # ------------------------------------------------------------ waiting
    def _lora_resolved(self, d: TaskDraft) -> bool:
        if d.lora_request is not None or not self.slots_polled:
            return True
        # a /slots poll taken after the release that did not show the task: give up
        return d.released_seq is not None and self.snapshot_seq > d.released_seq + 1

    def _conversations_known(self, d: TaskDraft) -> bool:
        """Its own conversation, and those of the prefills its decoding overlapped (they are
        charged the cost), are proven or found uncertain.

        A task once proven stays proven, and which prefills overlapped a decoding changes only
        with their slots' timelines: while one task it waited for is still not proven and its
        slot unchanged, the record still waits, without a look at every other slot."""
        att = self.attribution
        if d.epoch != att.epoch:
            return True
        if d.waiting_on:
            versions = self.prefills.slot_version
            for task, slot, version in d.waiting_on:
                if (slot < 0 or versions.get(slot) == version) and att.conversation(d.epoch, task) is None:
                    return False
        waiting = []
        if not d.outside_join and att.conversation(d.epoch, d.task) is None:
            waiting.append((d.task, -1, 0))
        versions = self.prefills.slot_version
        for o in self._overlapping(d):
            if att.conversation(att.epoch, o.task) is None:
                waiting.append((o.task, o.slot, versions.get(o.slot, 0)))
        d.waiting_on = tuple(waiting)
        return not waiting

    def _overlap_resolved(self, d: TaskDraft) -> bool:
        if d.decode_start_us is None or d.end_us is None:
            return True
        return self.prefills.settled_before(d.slot, d.end_us)

    def try_finish(self, now: int, at_line: bool = True) -> None:
        """at_line: called for a log line (the conversations are fixed only then, so that a
        record says the same whether /slots let it go out now or a replay did earlier)."""
        looked = self._depends_on() if at_line else None
        if looked is not None and looked == self._looked and now <= self._still_until:
            return  # nothing a verdict depends on changed since the last look
        deadline = still_until = 1 << 62
        max_wait = self.settings.max_wait_us
        for d in list(self.pending):
            waited = now - (d.end_us or now)
            if at_line and d.conversation is None:
                self._fix_conversation(d, waited > JOIN_WAIT_US)
            if waited > max_wait or (
                d.conversation is not None and self._lora_resolved(d) and self._overlap_resolved(d)
            ):
                self._finish(d)
                continue
            if d.conversation is None:
                deadline = min(deadline, (d.end_us or now) + JOIN_WAIT_US)
            if d.end_us:  # past these times, waiting alone changes its verdict
                still_until = min(still_until, d.end_us + (JOIN_WAIT_US if d.conversation is None else max_wait))
        self.next_deadline = deadline
        # a look that changed what it depends on (a record that went out) is no reference
        self._looked = looked if looked is not None and looked == self._depends_on() else None
        self._still_until = still_until

    def _depends_on(self) -> tuple[int, ...]:
        """What the verdicts on the waiting records depend on, besides the log time: the join's
        results (a task once proven stays proven), the slots' prefills, the /slots polls."""
        att = self.attribution
        return (
            self._epochs,
            att.epoch,
            int(att.lineage_only),
            att.join.version,
            self.prefills.version,
            self.snapshot_seq,
            len(self.pending),
        )

    def _fix_conversation(self, d: TaskDraft, waited_enough: bool) -> None:
        att = self.attribution
        if d.outside_join:
            d.conversation, d.conversation_proven = (None, None), True
        elif self._conversations_known(d):
            d.conversation, d.conversation_proven = att.conversation_now(d.epoch, d.task), True
        elif waited_enough:
            d.conversation = att.conversation_now(d.epoch, d.task) if d.epoch == att.epoch else (None, "uncertain")

    def finish_all(self) -> None:
        for d in list(self.pending):
            self._finish(d)
        self.next_deadline = 1 << 62

    def _overlapping(self, d: TaskDraft) -> Iterable[Overlap]:
        """Every other slot's prefill during this task's decoding."""
        start, end = d.decode_start_us, d.decode_end_us
        if start is None or end is None or not d.decode_seconds:
            return ()
        return self.prefills.overlapping(d.slot, start, end)

    # ------------------------------------------------------------ the record
    def _finish(self, d: TaskDraft) -> None:
        self.pending.remove(d)
        st = self.settings
        if d.conversation is None:  # the end of the input, or it waited max_wait_us
            known = d.outside_join or self._conversations_known(d)
            self._fix_conversation(d, True)
            d.conversation_proven = bool(known)
        assert d.conversation is not None
        conv, conv_source = d.conversation
        request = d.lora_request if d.lora_request is not None else self.lora.of_task((d.epoch, d.task))
        lora_config = self.lora.config_of((d.epoch, d.task), request)
        entry_lora_config = self.lora.config_of(d.entry_source, self.lora.of_task(d.entry_source))
        restore_result, mismatch = None, False
        if d.ram_restored:  # what became of a restored entry
            restore_result, mismatch = classify.restore_result(
                lora_cache_cleared=d.lora_cache_cleared,
                forced_reprocess=d.forced_reprocess,
                reused_tokens=d.reused_tokens,
                reuse_known=d.reuse_source is not None,
                lora_config=lora_config,
                entry_lora_config=entry_lora_config,
            )
        # prompt tokens the slot or the RAM cache offered but that were computed again
        offered = classify.offered_tokens(d.offered_tokens, d.offered_f_sim, d.prompt_tokens)
        wasted = max(0, offered - d.reused_tokens) if offered is not None and d.reused_tokens is not None else None
        # consumed at the conversation's first return after its entry's eviction, whatever came of it
        evicted_source = (
            self.attribution.came_back_after_eviction(conv, d.start_us)
            if conv is not None and conv_source == "header"
            else None
        )
        evicted = evicted_source is not None
        need = self.eviction_need(evicted_source) if evicted_source is not None else None
        outcome = miss_cause = None
        takeover = False
        if d.prompt_tokens and d.reused_tokens is not None and d.kind == "completion" and not d.ram_unused:
            outcome = classify.outcome(
                d.prompt_tokens, d.reused_tokens, st.min_prompt_tokens, st.hit_ratio, st.miss_ratio
            )
            if classify.is_miss(d.prompt_tokens, d.reused_tokens, st.miss_ratio):
                miss_cause = classify.miss_cause(
                    restore_result=restore_result,
                    lora_cache_cleared=d.lora_cache_cleared,
                    forced_reprocess=d.forced_reprocess,
                    offered_enough=(offered or 0) >= st.miss_ratio * d.prompt_tokens,
                    ram_consulted=d.ram_consulted,
                    ram_restored=d.ram_restored,
                    path=d.path,
                    conversation_evicted=evicted,
                )
            takeover = classify.small_task_takeover(
                d.prompt_tokens, d.slot_tokens_before, st.small_task_tokens, st.big_conversation_tokens
            )
        # other slots' prefills during this request's decoding, charged to their conversations
        overlap, slowed_by, largest = 0.0, None, None
        overlapped: tuple[tuple[int, int, int, float], ...] = ()
        contention: Contention | None = None
        if d.decode_start_us is not None and d.decode_end_us is not None and d.decode_seconds:
            overlaps = list(self._overlapping(d))
            slowed_by = self.attribution.charge(overlaps)
            overlap = union_us([(o.lo, o.hi) for o in overlaps]) / 1e6
            overlapped = overlapped_prefills(overlaps)
            contention = "prefill" if overlap / d.decode_seconds > st.contention_fraction else "none"
            largest = self.prefills.largest_overlapping(d.slot, d.decode_start_us, d.decode_end_us)
        queue_us = None
        if not d.outside_join and d.epoch == self.attribution.epoch:
            queue_us = self.attribution.join.queue_us(d.task)
        rec = RequestRecord(
            **dict(zip(FACTS_FROM_DRAFT, _draft_facts(d), strict=True)),
            # the verdict
            model=self.model,
            lora=lora.state(lora_config),
            lora_config=lora_config,
            restored_entry_lora_config=entry_lora_config,
            restore_result=restore_result,
            lora_mismatch_reuse=mismatch,
            outcome=outcome,
            miss_cause=miss_cause,
            cache_size_needed_bytes=need.needed_bytes if need else None,
            cache_limit_bytes=need.limit_bytes if need else None,
            evicted_entry_tokens=need.entry_tokens if need else None,
            evicted_entry_checkpoints=need.checkpoints if need else None,
            small_task_takeover=takeover,
            overlap_seconds=overlap,
            contention=contention,
            overlapping_prefill_tokens=largest,
            overlapped_prefills=overlapped,
            conversation=conv,
            conversation_source=conv_source,
            wasted_prompt_tokens=wasted,
            slowed_by_conversation=slowed_by,
            queue_seconds=queue_us / 1e6 if queue_us is not None else None,
            draft_acceptance=(
                round(d.draft_tokens_accepted / d.draft_tokens_generated, 5)
                if d.draft_tokens_accepted is not None and d.draft_tokens_generated
                else None
            ),
        )
        self.sink.record(rec)
        if not d.outside_join:
            self.attribution.went_out(rec, d.conversation_proven)
