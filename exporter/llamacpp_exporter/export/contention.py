"""Who slowed whom: seconds a slot decoded while another prefilled, small tasks that took a big
conversation's slot, and how each request's conversation was found (how much of the prefill
work and of its cost to the others has a name)."""

from __future__ import annotations

from typing import Final

from ..config import MetricsConfig
from ..records import RequestRecord
from .families import CounterValues, HistogramValues

# how a request's conversation was found (records.JoinSource), or none for an embedding task
CONVERSATION_SOURCES: Final = ("header", "lineage", "uncertain", "none")


class ContentionMetrics:
    def __init__(self, buckets: MetricsConfig) -> None:
        self.overlap = CounterValues(
            "llamacpp_decode_prefill_overlap_seconds",
            "Seconds during which this slot was decoding while another slot was prefilling.",
            ["model", "slot"],
            None,  # the slots the server announced (slots_known)
        )
        self.takeovers = CounterValues(
            "llamacpp_small_task_slot_takeovers",
            "Requests with a small prompt placed on a slot that held a big conversation (e.g. a health probe evicting it).",
            ["model"],
            (),
        )
        self.conversation_joins = CounterValues(
            "llamacpp_exporter_conversation_joins",
            "Requests by how their conversation was found: header (the X-Conversation-Id the request sent), lineage "
            "(it sent none: cache lineage), uncertain (the log cannot prove which request the task was, so no "
            "conversation is named), none (an embedding or rerank task).",
            ["model", "source"],
            (CONVERSATION_SOURCES,),
        )
        self.conversation_join_prefill = CounterValues(
            "llamacpp_exporter_conversation_join_prefill_seconds",
            "Prefill seconds of completed requests by how their conversation was found, as in "
            "llamacpp_exporter_conversation_joins_total: how much of the prefill work has a name.",
            ["model", "source"],
            (CONVERSATION_SOURCES,),
        )
        self.conversation_join_cost = CounterValues(
            "llamacpp_exporter_conversation_join_cost_to_others_seconds",
            "Seconds of other requests' decoding that a request's prefill overlapped, by how that request's "
            "conversation was found once the log settled it (uncertain: never proven): how much of the slowdown "
            "has a name.",
            ["model", "source"],
            (CONVERSATION_SOURCES,),
        )
        self.families: list[CounterValues | HistogramValues] = [
            self.overlap,
            self.takeovers,
            self.conversation_joins,
            self.conversation_join_prefill,
            self.conversation_join_cost,
        ]
        self._slots: dict[str, set[int]] = {}  # the slots each model's server announced

    def update(self, rec: RequestRecord) -> None:
        model = rec.model
        self.conversation_joins.add((model, rec.conversation_source or "none"))
        if rec.prefill_seconds:
            self.conversation_join_prefill.add((model, rec.conversation_source or "none"), rec.prefill_seconds)
        if rec.kind != "completion":
            return
        if rec.small_task_takeover:
            self.takeovers.add((model,))
        if rec.overlap_seconds and rec.slot in self._slots.get(model, ()):
            self.overlap.add((model, str(rec.slot)), rec.overlap_seconds)

    def slots_known(self, model: str, slot_ids: list[int]) -> None:
        self._slots.setdefault(model, set()).update(slot_ids)
        for i in slot_ids:
            key = (model, str(i))
            if key not in self.overlap.values:
                self.overlap.add(key, 0.0)

    def join_cost(self, model: str, source: str, seconds: float) -> None:
        self.conversation_join_cost.add((model, source), seconds)
