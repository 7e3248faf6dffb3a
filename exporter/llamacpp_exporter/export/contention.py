"""Who slowed whom: seconds a slot decoded while another prefilled, small tasks that took a big
conversation's slot, and how each request's conversation was found (how much of the prefill
work and of its cost to the others has a name). Afterwards, the report's time per output token
with and without another slot's prefill (its histogram is latency.py's), the small-task
takeovers, how much has a name, and the conversations that cost the others most."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Final

from ..config import MetricsConfig
from ..records import RequestRecord, ended_unanswered
from .concern import (
    PERCENTILE_KEYS,
    ConcernReport,
    ReportInputs,
    ReportSettings,
    Table,
    cell,
    group_percentiles,
    percentile_row,
    ratio,
    secs,
)
from .families import CounterValues, HistogramValues
from .report_types import Report, Share, TopConversations

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


class ContentionReport(ConcernReport):
    def __init__(self, settings: ReportSettings) -> None:
        super().__init__(settings)
        self.size_unknown = self.takeovers = 0
        self.named = [0, 0]  # completed requests with a conversation, all
        self.named_prefill = [0.0, 0.0]
        self.conversations: dict[str, dict[str, Any]] = {}  # for an events file alone: what each computed
        self._last_takeover: tuple[int, int] | None = None  # (epoch, start_us) of the previous one

    def count(self, rec: RequestRecord) -> None:
        if rec.kind != "completion":
            return
        values = self.settings.values
        if not ended_unanswered(rec):
            named = rec.conversation_source in ("header", "lineage")
            self.named[0] += named
            self.named[1] += 1
            if rec.prefill_seconds:
                self.named_prefill[0] += rec.prefill_seconds if named else 0.0
                self.named_prefill[1] += rec.prefill_seconds
        v, cont = rec.time_per_output_token_seconds, rec.contention
        if v is not None and cont in ("prefill", "none"):  # an events file of another version may say more
            values.add("tpot:" + cont, v)
            if cont == "prefill":
                size = rec.overlapping_prefill_tokens
                if size is None:
                    self.size_unknown += 1
                elif size >= self.settings.large_prefill_tokens:
                    values.add("tpot:large", v)
        if rec.small_task_takeover:
            self.takeovers += 1
            if rec.prompt_tokens is not None:
                values.add("takeover:prompt_tokens", rec.prompt_tokens)
            if rec.slot_tokens_before is not None:
                values.add("takeover:slot_tokens_before", rec.slot_tokens_before)
        if rec.conversation is not None:
            row = self.conversations.setdefault(
                rec.conversation,
                {"conversation": rec.conversation, "requests": 0, "prompt_tokens": 0, "prefill_seconds": 0.0},
            )
            row["requests"] += 1
            row["prompt_tokens"] += rec.prompt_tokens or 0
            row["prefill_seconds"] += rec.prefill_seconds or 0.0

    def follow(self, rec: RequestRecord, in_report: bool) -> None:
        if in_report and rec.kind == "completion" and rec.small_task_takeover and rec.start_us is not None:
            # the period of small-task takeovers: between one and the next of the same server run
            last = self._last_takeover
            if last is not None and last[0] == rec.epoch:
                self.settings.values.add("takeover:interval_seconds", (rec.start_us - last[1]) / 1e6)
            self._last_takeover = (rec.epoch, rec.start_us)

    def result(self, given: ReportInputs) -> dict[str, Any]:
        values, costs = self.settings.values, given.join_costs
        return {
            "time_per_output_token_seconds": {
                "while_another_slot_prefilled": group_percentiles(values, "tpot:prefill"),
                "while_a_large_prefill_ran": group_percentiles(values, "tpot:large"),
                "no_concurrent_prefill": group_percentiles(values, "tpot:none"),
                "large_prefill_tokens": self.settings.large_prefill_tokens,
                "prefill_size_unknown": self.size_unknown,
            },
            "small_task_takeovers": self.takeovers,
            "small_task_takeover_details": {
                k: group_percentiles(values, "takeover:" + k)
                for k in ("prompt_tokens", "slot_tokens_before", "interval_seconds")
            },
            "top_conversations": self._top(given),
            "named": {
                "requests": {"named": self.named[0], "total": self.named[1]},
                "prefill_seconds": {"named": round(self.named_prefill[0], 6), "total": round(self.named_prefill[1], 6)},
                "cost_to_others_seconds": (
                    None if costs is None else {"named": round(costs[0], 6), "total": round(costs[1], 6)}
                ),
            },
        }

    def _top(self, given: ReportInputs) -> TopConversations:
        if given.conversations is not None:  # the pipeline's own costs: read from the log
            return {"by": "cost_to_others_seconds", "rows": given.conversations[: given.top]}
        ranked = sorted(self.conversations.values(), key=lambda x: (-x["prefill_seconds"], x["conversation"]))
        return {
            "by": "prefill_seconds",
            "note": "cost to other slots needs the log (the events file does not carry it)",
            "rows": ranked[: given.top],
        }

    @staticmethod
    def tables(rep: Report) -> list[Table]:
        tp = rep["time_per_output_token_seconds"]
        top = rep["top_conversations"]
        cols = ["conversation", "requests", "prompt_tokens", "prefill_seconds"]
        if top["by"] == "cost_to_others_seconds":
            cols += ["cost_to_others_seconds", "wasted_prompt_tokens", "last_miss_cause"]
        return [
            (
                "Time per output token (s)",
                ["decoding", "count", "p50", "p90", "p99", "max"],
                [
                    percentile_row("while another slot prefilled", tp["while_another_slot_prefilled"]),
                    percentile_row(
                        f"  of which a large one (>= {tp['large_prefill_tokens']} tokens)",
                        tp["while_a_large_prefill_ran"],
                    ),
                    percentile_row("no concurrent prefill", tp["no_concurrent_prefill"]),
                ],
                (
                    f"size of the concurrent prefill unknown for {tp['prefill_size_unknown']} requests; "
                    if tp["prefill_size_unknown"]
                    else ""
                )
                + f"small-task takeovers of a big conversation's slot: {rep['small_task_takeovers']}",
            ),
            (
                "Who is named: completed requests with a conversation",
                ["", "named", "of", "share"],
                [[name, cell(sh["named"]), cell(sh["total"]), _percent(sh)] for name, sh in named_shares(rep)],
                "named by the X-Conversation-Id they sent or by cache lineage; the rest the log cannot prove "
                "(see README: who slowed everyone down)",
            ),
            (
                "Top conversations by "
                + (
                    "their prefills' cost to the other slots (s)"
                    if top["by"] == "cost_to_others_seconds"
                    else "prefill time (s)"
                ),
                cols,
                [[cell(row.get(c)) for c in cols] for row in top["rows"]],
                top.get("note", "pseudonyms, never the ids clients sent"),
            ),
        ]

    @staticmethod
    def csv_rows(rep: Report) -> Iterable[list[Any]]:
        for name, pc in rep["time_per_output_token_seconds"].items():
            if not isinstance(pc, dict):
                yield ["time_per_output_token_seconds", "", "", name, "", "", pc]
                continue
            for k in PERCENTILE_KEYS:
                yield ["time_per_output_token_seconds", "", "", f"{name}_{k}", "", "", pc[k]]
        yield ["small_task_takeovers", "", "", "count", "", "", rep["small_task_takeovers"]]
        for name, share in named_shares(rep):
            yield ["named", "", "", name, share["named"], share["total"], ratio(share["named"], share["total"])]

    @staticmethod
    def comparison_rows(a: Report, b: Report) -> list[list[str]]:
        ta, tb = a["time_per_output_token_seconds"], b["time_per_output_token_seconds"]
        rows = [
            [f"time per output token p50 (s), {label}", secs(pa["p50"]), secs(pb["p50"])]
            for label, pa, pb in (
                (
                    "while another slot prefilled",
                    ta["while_another_slot_prefilled"],
                    tb["while_another_slot_prefilled"],
                ),
                ("no concurrent prefill", ta["no_concurrent_prefill"], tb["no_concurrent_prefill"]),
            )
        ]
        rows.append(["small-task takeovers", str(a["small_task_takeovers"]), str(b["small_task_takeovers"])])
        return rows


def named_shares(rep: Report) -> list[tuple[str, Share]]:
    named = rep.get("named")
    if named is None:
        return []
    out: list[tuple[str, Share]] = [("requests", named["requests"]), ("prefill seconds", named["prefill_seconds"])]
    cost = named["cost_to_others_seconds"]
    if cost is not None:
        out.append(("their prefills' cost to others (s)", cost))
    return out


def _percent(share: Share) -> str:
    r = ratio(share["named"], share["total"])
    return "-" if r is None else f"{100 * r:.0f}%"
