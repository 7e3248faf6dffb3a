"""The investigation report of `analyze`: a ``ReportBuilder`` counts typed request records one at
a time (analyze streams them from its store, offline/store.py; ``build`` takes a list) into a
typed ``Report`` (report_types.py: the JSON output), rendered here as text, Markdown and CSV.

Every rate carries its numerator and denominator. Where the records cannot tell (LoRA state
without /slots or an events file, cache diagnostics below -lv 4), the report counts the requests
as unknown and says why; it never guesses. Small samples are flagged.
"""

from __future__ import annotations

import csv
import io
import textwrap
from collections import Counter, defaultdict
from collections.abc import Iterable
from typing import Any, Literal, Protocol, cast

from ..assemble.promptcache import MIB
from ..export.concern import ConcernReport
from ..export.concerns import CONCERNS
from ..records import (
    LARGER_CACHE_FACTORS,
    LORA_STATES,
    MISS_CAUSES,
    PATHS,
    RESTORE_RESULTS,
    RequestRecord,
    avoidable_prefill_seconds,
    ended_unanswered,
    evicted_miss,
    kept_by_larger_cache,
)
from .findings import findings
from .report_types import (
    CacheSizeCurve,
    MissTable,
    Percentiles,
    Rate,
    Report,
    Share,
    TopConversations,
    Unknown,
)

PercentileKey = Literal["count", "p50", "p90", "p99", "max"]
PERCENTILE_KEYS: tuple[PercentileKey, ...] = ("count", "p50", "p90", "p99", "max")
CurveKey = Literal[
    "evicted_misses", "prefill_seconds", "size_unknown", "no_byte_limit", "with_checkpoints", "limit_mib"
]
SMALL_SAMPLE = 30  # a rate over fewer requests than this is flagged
RATE_PATHS = ("ram", "slot", "pinned", "unknown", "all")
RATE_LORA = (*LORA_STATES, "all")
EXCLUSIONS = (
    "conversation_unknown",  # no conversation id and no cache lineage: its history is unknown
    "first_of_conversation",
    "after_server_restart",  # the server's caches were empty
    "prefix_changed",  # the conversation's history was summarised or rewritten
    "after_long_gap",
)
EXCLUSION_TEXT = {
    "conversation_unknown": "conversation unknown (no id, no cache lineage)",
    "first_of_conversation": "first request of its conversation",
    "after_server_restart": "first of its conversation after a server restart",
    "prefix_changed": "its conversation's history changed (summarised or rewritten: a prompt shorter than the "
    "previous one, or one that left the previous request's tokens early)",
    "after_long_gap": "after a pause longer than the gap",
}


def rate(num: int, den: int) -> Rate:
    return {
        "numerator": num,
        "denominator": den,
        "ratio": (num / den) if den else None,
        "small_sample": den < SMALL_SAMPLE,
    }


def percentiles(values: list[float]) -> Percentiles:
    if not values:
        return {"count": 0, "p50": None, "p90": None, "p99": None, "max": None, "small_sample": True}
    vs = sorted(values)

    def q(p: float) -> float:
        return vs[min(len(vs) - 1, int(p * len(vs)))]

    return {
        "count": len(vs),
        "p50": q(0.5),
        "p90": q(0.9),
        "p99": q(0.99),
        "max": vs[-1],
        "small_sample": len(vs) < SMALL_SAMPLE,
    }


class _MissTable:
    """Miss rate by selection path and LoRA state over the records with a cache outcome."""

    def __init__(self) -> None:
        self.num: Counter[Any] = Counter()
        self.den: Counter[Any] = Counter()

    def add(self, r: RequestRecord) -> None:
        if r.outcome is None:
            return
        for path in (r.path, "all"):
            for lora in (r.lora, "all"):
                self.den[path, lora] += 1
                self.num[path, lora] += r.outcome == "miss"

    def result(self) -> MissTable:
        return {p: {lo: rate(self.num[p, lo], self.den[p, lo]) for lo in RATE_LORA} for p in RATE_PATHS}


def _miss_table(records: Iterable[RequestRecord]) -> MissTable:
    table = _MissTable()
    for r in records:
        table.add(r)
    return table.result()


class _CouldHaveHit:
    """Follows every conversation through the records in start order (each server run in turn)
    and keeps the requests that could have hit the cache; counts how many each exclusion removed
    (each request under its first exclusion, in the order of EXCLUSIONS). Keeps one record per
    conversation (its previous request), never the records themselves."""

    def __init__(self, gap_seconds: float, keep: bool = False) -> None:
        self.gap_us = gap_seconds * 1_000_000
        self.previous: dict[str, RequestRecord] = {}  # conversation -> its previous request
        self.excluded: Counter[Any] = Counter()
        self.table = _MissTable()
        self.considered = 0
        self.kept: list[RequestRecord] | None = [] if keep else None

    def follow(self, r: RequestRecord, wanted: bool) -> None:
        conv = r.conversation
        prev = self.previous.get(conv) if conv is not None else None
        if conv is not None:
            self.previous[conv] = r
        if r.outcome is None or not wanted:
            return
        if conv is None:
            reason = "conversation_unknown"
        elif prev is None:
            reason = "first_of_conversation"
        elif prev.epoch != r.epoch:
            reason = "after_server_restart"
        elif _prefix_changed(r, prev):
            reason = "prefix_changed"
        elif prev.end_us is not None and r.start_us is not None and r.start_us - prev.end_us > self.gap_us:
            reason = "after_long_gap"
        else:
            self.considered += 1
            self.table.add(r)
            if self.kept is not None:
                self.kept.append(r)
            return
        self.excluded[reason] += 1


def _start_order(records: Iterable[RequestRecord]) -> list[RequestRecord]:
    return sorted(records, key=lambda r: (r.epoch, r.start_us or 0))


def could_have_hit(
    records: list[RequestRecord], gap_seconds: float, history: list[RequestRecord] | None = None
) -> tuple[list[RequestRecord], dict[str, int]]:
    """The records that could have hit the cache, and how many each exclusion removed. history:
    all the records, when `records` is a time window of them (a conversation may begin before it)."""
    follower = _CouldHaveHit(gap_seconds, keep=True)
    wanted = {id(r) for r in records}
    for r in _start_order(history or records):
        follower.follow(r, id(r) in wanted)
    assert follower.kept is not None
    return follower.kept, {k: follower.excluded[k] for k in EXCLUSIONS}


def _prefix_changed(r: RequestRecord, prev: RequestRecord) -> bool:
    """The request does not continue its conversation's previous one: its prompt is shorter
    than the previous prompt, or the server compared it with the previous request's own state
    (on the slot, its RAM-cache entry restored or only looked at) and it left those tokens
    before 90% of the previous prompt (a retry of the same prompt keeps all but the last token)."""
    prompt, before = r.prompt_tokens or 0, prev.prompt_tokens or 0
    if prompt < before:
        return True
    # the RAM-cache lookup compared it with the previous request's saved entry
    for task, lcp in r.compared_entries or ():
        if task == prev.task and lcp < 0.9 * before:
            return True
    reused = r.reused_tokens
    return (
        r.state_source_task is not None
        and r.state_source_task == prev.task
        and reused is not None
        and not r.forced_reprocess
        and not r.lora_cache_cleared
        and reused < 0.9 * before
    )


class _CacheSizeCurve:
    """Would a larger --cache-ram have helped: of the evicted misses, those whose entry a cache
    of each larger size would still have held, and the prefill seconds they cost."""

    def __init__(self) -> None:
        self.evicted = self.unknown = self.no_byte_limit = self.with_checkpoints = 0
        self.limits: set[float] = set()
        self.avoided = {f: 0 for f in LARGER_CACHE_FACTORS}
        self.seconds = {f: 0.0 for f in LARGER_CACHE_FACTORS}
        self.prefill_seconds = 0.0

    def add(self, r: RequestRecord) -> None:
        if not evicted_miss(r):
            return
        self.evicted += 1
        self.prefill_seconds += avoidable_prefill_seconds(r)
        if r.cache_limit_bytes == 0:
            self.no_byte_limit += 1  # --cache-ram -1: the token limit (the context size) evicted it
            return
        if kept_by_larger_cache(r, 1.0) is None:
            self.unknown += 1
            return
        self.limits.add(r.cache_limit_bytes or 0.0)
        self.with_checkpoints += bool(r.evicted_entry_checkpoints)
        for f in LARGER_CACHE_FACTORS:
            if kept_by_larger_cache(r, f):
                self.avoided[f] += 1
                self.seconds[f] += avoidable_prefill_seconds(r)

    def result(self) -> CacheSizeCurve:
        limit = next(iter(self.limits)) if len(self.limits) == 1 else None
        return {
            "evicted_misses": self.evicted,
            "prefill_seconds": round(self.prefill_seconds, 3),
            "size_unknown": self.unknown,
            "no_byte_limit": self.no_byte_limit,
            "with_checkpoints": self.with_checkpoints,
            "limit_mib": round(limit / MIB, 3) if limit else None,
            "points": [
                {
                    "factor": f,
                    "cache_ram_mib": round(f * limit / MIB) if limit else None,
                    "misses_avoided": self.avoided[f],
                    "prefill_seconds_avoided": round(self.seconds[f], 3),
                }
                for f in LARGER_CACHE_FACTORS
            ],
        }


class ValueLists:
    """Values to take percentiles of, by group, in memory (StoredValues in store.py keeps them
    on disk)."""

    def __init__(self) -> None:
        self.lists: defaultdict[str, list[float]] = defaultdict(list)

    def add(self, group: str, value: float) -> None:
        self.lists[group].append(value)

    def ranked(self, group: str, ranks: Iterable[int]) -> tuple[int, dict[int, float]]:
        vs = sorted(self.lists.get(group, ()))
        return len(vs), {k: vs[k] for k in ranks if 0 <= k < len(vs)}


class Values(Protocol):
    def add(self, group: str, value: float) -> None: ...

    def ranked(self, group: str, ranks: Iterable[int]) -> tuple[int, dict[int, float]]: ...


def _percentiles(values: Values, group: str) -> Percentiles:
    """As percentiles() of the group's values: the value at rank int(p * n) of the n sorted."""
    n, _ = values.ranked(group, ())
    if not n:
        return percentiles([])
    ranks = {p: min(n - 1, int(p * n)) for p in (0.5, 0.9, 0.99)}
    _, at = values.ranked(group, [*ranks.values(), n - 1])
    return {
        "count": n,
        "p50": at[ranks[0.5]],
        "p90": at[ranks[0.9]],
        "p99": at[ranks[0.99]],
        "max": at[n - 1],
        "small_sample": n < SMALL_SAMPLE,
    }


class ReportBuilder:
    """The report, one record at a time: ``count`` each record of the report (any order, the
    same order for the same report), ``follow`` every record of the history in start order
    (see _CouldHaveHit), then ``result``. What it keeps is counts, one record per conversation,
    and the values for percentiles in ``values`` (in memory, or on disk)."""

    def __init__(self, gap_seconds: float, large_prefill_tokens: int, values: Values) -> None:
        self.gap_seconds = gap_seconds
        self.large_prefill_tokens = large_prefill_tokens
        self.values = values
        self.embedding_tasks = 0
        self.total = self.finished = self.lora_known = self.diag = self.no_outcome = 0
        self.models: set[str] = set()
        self.epochs: set[int] = set()
        self.known = self.prompt_tokens = self.reused_tokens = 0
        self.by_lora: Counter[Any] = Counter()
        self.by_path: Counter[Any] = Counter()
        self.by_model: Counter[Any] = Counter()
        self.miss_table = _MissTable()
        self.causes: dict[str, dict[str, int]] = {lo: {c: 0 for c in MISS_CAUSES} for lo in RATE_LORA}
        self.restores: dict[str, dict[str, int]] = {lo: {res: 0 for res in RESTORE_RESULTS} for lo in RATE_LORA}
        self.large_unknown = self.large = self.takeovers = 0
        self.mismatch: Counter[Any] = Counter()
        self._last_takeover: tuple[int, int] | None = None  # (epoch, start_us) of the previous one
        self.conversations: dict[str, dict[str, Any]] = {}  # for an events file alone: what each computed
        self.chh = _CouldHaveHit(gap_seconds)
        self.curve = _CacheSizeCurve()
        self.named = [0, 0]  # completed requests with a conversation, all
        self.named_prefill = [0.0, 0.0]
        self.concerns: list[ConcernReport] = [report() for _, report in CONCERNS if report is not None]

    def count(self, r: RequestRecord) -> None:
        for concern in self.concerns:
            concern.count(r)
        if r.kind != "completion":
            # embedding and rerank tasks are no completion requests: counted apart, as the exporter does
            self.embedding_tasks += 1
            return
        self.total += 1
        model = r.model or ""
        self.models.add(model)
        self.by_model[model] += 1
        self.epochs.add(r.epoch)
        # the live exporter's rules, so that analyze and the exporter count alike: a request
        # without a timings block is cancelled; tokens count where both prompt and reused are known
        finished = not ended_unanswered(r)
        if finished:
            self.finished += 1
            named = r.conversation_source in ("header", "lineage")
            self.named[0] += named
            self.named[1] += 1
            if r.prefill_seconds:
                self.named_prefill[0] += r.prefill_seconds if named else 0.0
                self.named_prefill[1] += r.prefill_seconds
            self.diag += r.reuse_source == "log"
            self.no_outcome += r.outcome is None and r.reused_tokens is None
        if r.prompt_tokens is not None and r.reused_tokens is not None:
            self.known += 1
            self.prompt_tokens += r.prompt_tokens
            self.reused_tokens += r.reused_tokens
        self.lora_known += r.lora in ("none", "active")
        self.by_lora[r.lora] += 1
        self.by_path[r.path] += 1
        self.miss_table.add(r)
        self.curve.add(r)
        if r.outcome == "miss":
            c = r.miss_cause or "unknown"
            for lo in (r.lora, "all"):
                self.causes[lo][c] = self.causes[lo].get(c, 0) + 1
        if r.restore_result:
            for lo in (r.lora, "all"):
                self.restores[lo][r.restore_result] = self.restores[lo].get(r.restore_result, 0) + 1
        if r.prefill_seconds is not None:
            self.values.add("prefill:" + r.path, r.prefill_seconds)
            self.values.add("prefill:all", r.prefill_seconds)
        v, cont = r.time_per_output_token_seconds, r.contention
        if v is not None and cont in ("prefill", "none"):  # an events file of another version may say more
            self.values.add("tpot:" + cont, v)
            if cont == "prefill":
                size = r.overlapping_prefill_tokens
                if size is None:
                    self.large_unknown += 1
                elif size >= self.large_prefill_tokens:
                    self.values.add("tpot:large", v)
        self.large += (r.prefill_tokens or 0) >= self.large_prefill_tokens
        if r.lora_mismatch_reuse:
            self.mismatch[r.lora] += 1
        if r.small_task_takeover:
            self.takeovers += 1
            if r.prompt_tokens is not None:
                self.values.add("takeover:prompt_tokens", r.prompt_tokens)
            if r.slot_tokens_before is not None:
                self.values.add("takeover:slot_tokens_before", r.slot_tokens_before)
        conv = r.conversation
        if conv is not None:
            row = self.conversations.setdefault(
                conv, {"conversation": conv, "requests": 0, "prompt_tokens": 0, "prefill_seconds": 0.0}
            )
            row["requests"] += 1
            row["prompt_tokens"] += r.prompt_tokens or 0
            row["prefill_seconds"] += r.prefill_seconds or 0.0

    def follow(self, r: RequestRecord, in_report: bool) -> None:
        wanted = in_report and r.kind == "completion"
        self.chh.follow(r, wanted)
        if wanted and r.small_task_takeover and r.start_us is not None:
            # the period of small-task takeovers: between one and the next of the same server run
            last = self._last_takeover
            if last is not None and last[0] == r.epoch:
                self.values.add("takeover:interval_seconds", (r.start_us - last[1]) / 1e6)
            self._last_takeover = (r.epoch, r.start_us)

    def result(
        self,
        conversations: list[dict[str, Any]] | None = None,
        top: int = 10,
        sources: dict[str, Any] | None = None,
        join_costs: tuple[float, float] | None = None,
    ) -> Report:
        unknowns = self._unknowns(sources)
        excluded = {k: self.chh.excluded[k] for k in EXCLUSIONS}
        models = sorted(self.models)
        rep: Report = {
            "sources": sources or {},
            "findings": [],
            "requests": {
                "total": self.total,
                "finished": self.finished,
                "cancelled_or_failed": self.total - self.finished,
                "server_runs": len(self.epochs),
                "prompt_tokens": self.prompt_tokens,
                "reused_tokens": self.reused_tokens,
                "tokens_known_for": self.known,
                "reuse": rate(self.reused_tokens, self.prompt_tokens),
                "by_lora": {lo: self.by_lora[lo] for lo in LORA_STATES},
                "by_path": {p: self.by_path[p] for p in PATHS},
                "embedding_tasks": self.embedding_tasks,
                "by_model": {m: self.by_model[m] for m in models} if models != [""] else {},
            },
            "unknown": unknowns,
            "miss_rate": self.miss_table.result(),
            "could_have_hit": {
                "gap_seconds": self.gap_seconds,
                "excluded": excluded,
                "considered": self.chh.considered,
                "miss_rate": self.chh.table.result(),
            },
            "miss_causes": self.causes,
            "restores": self.restores,
            "cache_size_curve": self.curve.result(),
            "prefill_seconds": {p: _percentiles(self.values, "prefill:" + p) for p in RATE_PATHS},
            "large_prefills": {"min_tokens": self.large_prefill_tokens, "count": self.large},
            "time_per_output_token_seconds": {
                "while_another_slot_prefilled": _percentiles(self.values, "tpot:prefill"),
                "while_a_large_prefill_ran": _percentiles(self.values, "tpot:large"),
                "no_concurrent_prefill": _percentiles(self.values, "tpot:none"),
                "large_prefill_tokens": self.large_prefill_tokens,
                "prefill_size_unknown": self.large_unknown,
            },
            "small_task_takeovers": self.takeovers,
            "small_task_takeover_details": {
                k: _percentiles(self.values, "takeover:" + k)
                for k in ("prompt_tokens", "slot_tokens_before", "interval_seconds")
            },
            "lora_mismatch_reuse": {lo: self.mismatch[lo] for lo in LORA_STATES},
            "top_conversations": self._top(conversations, top),
            "named": {
                "requests": {"named": self.named[0], "total": self.named[1]},
                "prefill_seconds": {"named": round(self.named_prefill[0], 6), "total": round(self.named_prefill[1], 6)},
                "cost_to_others_seconds": (
                    None if join_costs is None else {"named": round(join_costs[0], 6), "total": round(join_costs[1], 6)}
                ),
            },
        }
        for concern in self.concerns:
            concern_section = concern.result()
            if concern_section is not None:
                cast(dict[str, Any], rep)[concern.key] = concern_section
        rep["findings"] = findings(rep)
        return rep

    def _unknowns(self, sources: dict[str, Any] | None) -> list[Unknown]:
        unknowns: list[Unknown] = []
        if not self.total:
            src = sources or {}
            unknowns.append(
                {
                    "what": "requests",
                    "requests": 0,
                    "why": f"no request found in the input ({src.get('log_lines', 0)} log lines read, "
                    f"{src.get('log_lines_unrecognized', 0)} unrecognized, {src.get('log_lines_unreadable', 0)} "
                    "not text): is it llama-server's log?",
                }
            )
        for problem in (sources or {}).get("files_not_read_to_the_end", []):
            unknowns.append(
                {"what": "input", "requests": 0, "why": f"read up to where it became unreadable: {problem}"}
            )
        if self.total and self.lora_known == 0:
            unknowns.append(
                {
                    "what": "LoRA state",
                    "requests": self.total,
                    "why": "the events files given hold no LoRA state: the exporter that wrote them did not see "
                    "these tasks in /slots"
                    if (sources or {}).get("events_files")
                    else "a log alone does not say which LoRA adapters a request used: pass the exporter's "
                    "events file (--events), recorded while it polled /slots",
                }
            )
        elif self.lora_known < self.total:
            unknowns.append(
                {
                    "what": "LoRA state",
                    "requests": self.total - self.lora_known,
                    "why": "/slots did not show these tasks while they ran (no events record, or a poll missed them)",
                }
            )
        if self.finished and self.diag < self.finished:
            unknowns.append(
                {
                    "what": "RAM-cache diagnostics (restores, discards, miss causes, reused tokens from the log)",
                    "requests": self.finished - self.diag,
                    "why": "llama-server logged these requests below -lv 4; start it with -lv 4",
                }
            )
        if self.no_outcome:
            unknowns.append(
                {
                    "what": "cache outcome",
                    "requests": self.no_outcome,
                    "why": "reused tokens unknown (below -lv 4 they come only from /slots while the task runs)",
                }
            )
        return unknowns

    def _top(self, conversations: list[dict[str, Any]] | None, top: int) -> TopConversations:
        if conversations is not None:  # the pipeline's own costs: read from the log
            return {"by": "cost_to_others_seconds", "rows": conversations[:top]}
        ranked = sorted(self.conversations.values(), key=lambda x: (-x["prefill_seconds"], x["conversation"]))
        return {
            "by": "prefill_seconds",
            "note": "cost to other slots needs the log (the events file does not carry it)",
            "rows": ranked[:top],
        }


def build(
    records: list[RequestRecord],
    *,
    gap_seconds: float = 1800.0,
    large_prefill_tokens: int = 1024,
    conversations: list[dict[str, Any]] | None = None,
    top: int = 10,
    sources: dict[str, Any] | None = None,
    history: list[RequestRecord] | None = None,
    join_costs: tuple[float, float] | None = None,
) -> Report:
    """The whole report from the records in memory (and, when the log was read, the pipeline's
    conversation costs). history: all the records, when `records` is a time window of them (a
    conversation may begin before it); analyze streams them from its store instead."""
    builder = ReportBuilder(gap_seconds, large_prefill_tokens, ValueLists())
    for r in records:
        builder.count(r)
    wanted = {id(r) for r in records}
    for r in _start_order(history if history else [r for r in records if r.kind == "completion"]):
        builder.follow(r, id(r) in wanted)
    return builder.result(conversations, top, sources, join_costs)


# ------------------------------------------------------------------ renderings
def fmt_rate(r: Rate) -> str:
    if not r["denominator"]:
        return "-"
    s = f"{100 * (r['ratio'] or 0.0):.0f}% ({r['numerator']}/{r['denominator']})"
    return s + " *" if r["small_sample"] else s


def _secs(v: float | None) -> str:
    return "-" if v is None else f"{v:.3f}"


def _tables(rep: Report) -> list[tuple[str, list[str], list[list[str]], str]]:
    """(title, header, rows, note) for every section: the text and Markdown forms share them."""
    rq = rep["requests"]
    out = []
    out.append(
        (
            "Requests",
            ["", "value"],
            [
                [
                    "requests (finished + cancelled/failed)",
                    f"{rq['total']} ({rq['finished']} + {rq['cancelled_or_failed']})",
                ],
                ["server runs in the log", str(rq["server_runs"])],
                *(
                    [["by model (a router's)", ", ".join(f"{m or '-'} {n}" for m, n in rq["by_model"].items())]]
                    if rq.get("by_model")
                    else []
                ),
                *(
                    [["embedding tasks (apart: no cache use)", str(rq["embedding_tasks"])]]
                    if rq.get("embedding_tasks")
                    else []
                ),
                ["prompt tokens", f"{rq['prompt_tokens']} (known for {rq['tokens_known_for']} requests)"],
                ["reused tokens", str(rq["reused_tokens"])],
                ["reused share of prompt tokens", fmt_rate(rq["reuse"])],
                ["by LoRA state", ", ".join(f"{k} {v}" for k, v in rq["by_lora"].items())],
                ["by selection path", ", ".join(f"{k} {v}" for k, v in rq["by_path"].items())],
            ],
            "",
        )
    )

    def miss_table(title: str, table: dict[str, Any], note: str) -> None:
        # paths and LoRA states without a request are left out of the table (not of the JSON)
        paths = [p for p in RATE_PATHS if p == "all" or table[p]["all"]["denominator"]]
        loras = [lo for lo in RATE_LORA if lo == "all" or table["all"][lo]["denominator"]]
        rows = [[p, *(fmt_rate(table[p][lo]) for lo in loras)] for p in paths]
        out.append((title, ["path", *(f"LoRA {lo}" if lo != "all" else "all" for lo in loras)], rows, note))

    miss_table(
        "Prompt-cache miss rate by slot-selection path and LoRA state",
        rep["miss_rate"],
        "miss: reused less than the miss ratio of the prompt; over the requests with a cache outcome; * small sample",
    )
    ch = rep["could_have_hit"]
    excluded = "\n".join(f"  excluded, {EXCLUSION_TEXT[k]}: {v}" for k, v in ch["excluded"].items())
    miss_table(
        "Miss rate of the requests that could have hit",
        ch["miss_rate"],
        f"{ch['considered']} requests considered (gap {ch['gap_seconds']:g} s)\n{excluded}",
    )
    seen = [lo for lo in RATE_LORA if lo == "all" or rq["by_lora"].get(lo)]
    heads = [f"LoRA {lo}" if lo != "all" else "all" for lo in seen]
    out.append(
        (
            "Miss causes",
            ["cause", *heads],
            [[c, *(str(rep["miss_causes"][lo].get(c, 0)) for lo in seen)] for c in MISS_CAUSES],
            "",
        )
    )
    out.append(
        (
            "RAM-cache restores",
            ["result", *heads],
            [[res, *(str(rep["restores"][lo].get(res, 0)) for lo in seen)] for res in RESTORE_RESULTS],
            "discarded_lora_wrongful: a restored entry discarded although it was computed under the request's LoRA",
        )
    )

    cc = rep.get("cache_size_curve")
    if cc is not None:
        out.append(_curve_table(cc))

    def pct_row(name: str, p: Percentiles) -> list[str]:
        return [name, str(p["count"]), *(_secs(p[k]) for k in ("p50", "p90", "p99", "max"))]

    out.append(
        (
            "Prefill duration (s)",
            ["path", "count", "p50", "p90", "p99", "max"],
            [pct_row(p, rep["prefill_seconds"][p]) for p in RATE_PATHS],
            f"large prefills (>= {rep['large_prefills']['min_tokens']} tokens computed): {rep['large_prefills']['count']}",
        )
    )
    tp = rep["time_per_output_token_seconds"]
    out.append(
        (
            "Time per output token (s)",
            ["decoding", "count", "p50", "p90", "p99", "max"],
            [
                pct_row("while another slot prefilled", tp["while_another_slot_prefilled"]),
                pct_row(
                    f"  of which a large one (>= {tp['large_prefill_tokens']} tokens)", tp["while_a_large_prefill_ran"]
                ),
                pct_row("no concurrent prefill", tp["no_concurrent_prefill"]),
            ],
            (
                f"size of the concurrent prefill unknown for {tp['prefill_size_unknown']} requests; "
                if tp["prefill_size_unknown"]
                else ""
            )
            + f"small-task takeovers of a big conversation's slot: {rep['small_task_takeovers']}",
        )
    )
    for _, concern in CONCERNS:
        section = cast(dict[str, Any], rep).get(concern.key) if concern is not None else None
        if concern is not None and section is not None:
            out.append(concern.table(section))
    out.append(
        (
            "Who is named: completed requests with a conversation",
            ["", "named", "of", "share"],
            [[name, cell(sh["named"]), cell(sh["total"]), _pct(sh)] for name, sh in _named_shares(rep)],
            "named by the X-Conversation-Id they sent or by cache lineage; the rest the log cannot prove "
            "(see README: who slowed everyone down)",
        )
    )
    top = rep["top_conversations"]
    cols = ["conversation", "requests", "prompt_tokens", "prefill_seconds"]
    if top["by"] == "cost_to_others_seconds":
        cols += ["cost_to_others_seconds", "wasted_prompt_tokens", "last_miss_cause"]
    out.append(
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
        )
    )
    return out


def _named_shares(rep: Report) -> list[tuple[str, Share]]:
    named = rep.get("named")
    if named is None:
        return []
    out: list[tuple[str, Share]] = [("requests", named["requests"]), ("prefill seconds", named["prefill_seconds"])]
    cost = named["cost_to_others_seconds"]
    if cost is not None:
        out.append(("their prefills' cost to others (s)", cost))
    return out


def _ratio(share: Share) -> float | None:
    return round(share["named"] / share["total"], 4) if share["total"] else None


def _pct(share: Share) -> str:
    r = _ratio(share)
    return "-" if r is None else f"{100 * r:.0f}%"


def _curve_table(cc: CacheSizeCurve) -> tuple[str, list[str], list[list[str]], str]:
    limit = cc["limit_mib"]
    rows = [
        [
            f"{pt['factor']:g}x" + (f" ({pt['cache_ram_mib']} MiB)" if pt["cache_ram_mib"] is not None else ""),
            f"{pt['misses_avoided']} of {cc['evicted_misses']}",
            f"{pt['prefill_seconds_avoided']:.3f}",
        ]
        for pt in cc["points"]
    ]
    today = f" (today {limit:g} MiB)" if limit is not None else ""
    notes = [
        f"{cc['evicted_misses']} misses of conversations whose RAM-cache entry had been evicted, "
        f"{cc['prefill_seconds']:.3f} s of prefill a restore would have saved; --cache-ram as a multiple of "
        f"the limit in force{today}.",
        "llama-server evicts the oldest entry first: a size keeps an entry when it holds the entry and every "
        "entry saved after it and still held, up to the conversation's return.",
        "The token limit (the context size) never evicts first while --cache-ram sets a byte limit: "
        "llama-server raises it to the limit divided by the bytes per token.",
    ]
    if cc.get("with_checkpoints"):
        notes.append(
            f"{cc['with_checkpoints']} of the entries carried context checkpoints (an SWA or hybrid model): a "
            "restored entry keeps its checkpoints and the next turn adds more (up to --ctx-checkpoints), so in a "
            "larger cache, which restores more, entries grow: these sizes are a floor and the curve is optimistic"
        )
    if cc["size_unknown"]:
        notes.append(f"size needed unknown for {cc['size_unknown']} (the entry was not followed from its eviction)")
    if cc["no_byte_limit"]:
        notes.append(
            f"{cc['no_byte_limit']} evicted with no byte limit (--cache-ram -1): the token limit, the context "
            "size, evicted them; a larger --cache-ram does not change it, a larger -c does"
        )
    return ("Would a larger --cache-ram help?", ["cache size", "evicted misses avoided", "prefill s avoided"],
            rows if cc["evicted_misses"] else [], "\n".join(notes))  # fmt: skip


def cell(v: Any, decimals: int = 3) -> str:
    """A table cell: '-' for unknown, floats to a fixed number of decimals."""
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:.{decimals}f}"
    return str(v)


def _unknown_lines(rep: Report) -> list[str]:
    return [
        f"unknown: {u['what']} for {u['requests']} requests: {u['why']}" if u["requests"] else f"note: {u['why']}"
        for u in rep["unknown"]
    ]


def _evidence(value: Any) -> str:
    if isinstance(value, dict) and "denominator" in value:
        return fmt_rate(cast(Rate, value))
    if isinstance(value, float):
        return f"{value:.3f}"
    if isinstance(value, list):
        return ", ".join(" ".join(_evidence(v) for v in x.values()) if isinstance(x, dict) else str(x) for x in value)
    if isinstance(value, dict):
        return ", ".join(f"{k} {v}" for k, v in value.items())
    return "-" if value is None else str(value)


def finding_lines(rep: Report) -> list[str]:
    """The findings in words: each with its evidence and what to do."""
    out = []
    for f in rep.get("findings", []):
        out.append(f"[{f['severity'].replace('_', ' ')}] {f['summary']}")
        out.append(
            "  evidence: " + "; ".join(f"{k.replace('_', ' ')} {_evidence(v)}" for k, v in f["evidence"].items())
        )
        out.append(f"  what to do: {f['action']}")
    return out or ["none: no finding passed its threshold"]


def to_text(rep: Report) -> str:
    lines = ["Findings", "========"]
    for line in finding_lines(rep):  # wrapped: a finding is a paragraph
        indent = "    " if line.startswith("  ") else "  "
        lines.extend(textwrap.wrap(line, width=100, subsequent_indent=indent, break_on_hyphens=False))
    lines.append("")
    for title, header, rows, note in _tables(rep):
        lines.append(title)
        lines.append("=" * len(title))
        widths = [max(len(str(x)) for x in col) for col in zip(header, *rows, strict=True)]
        for row in [header, *rows]:
            lines.append("  ".join(str(c).ljust(w) for c, w in zip(row, widths, strict=True)).rstrip())
        if note:
            lines.append(note)
        lines.append("")
    lines.extend(_unknown_lines(rep))
    return "\n".join(lines).rstrip() + "\n"


def to_markdown(rep: Report) -> str:
    lines = ["### Findings\n"]
    for line in finding_lines(rep):
        lines.append(f"  - {line.strip()}" if line.startswith("  ") else f"- {line}")
    lines.append("")
    for title, header, rows, note in _tables(rep):
        lines.append(f"### {title}\n")
        lines.append("| " + " | ".join(header) + " |")
        lines.append("|" + "|".join("---" for _ in header) + "|")
        for row in rows:
            lines.append("| " + " | ".join(c.replace("|", "\\|") for c in row) + " |")
        if note:
            lines.append("\n" + note.replace("\n  ", "\n- "))
        lines.append("")
    lines.extend(f"- {u}" for u in _unknown_lines(rep))
    return "\n".join(lines).rstrip() + "\n"


def csv_rows(rep: Report) -> Iterable[list[Any]]:
    """section, path, lora, name, numerator, denominator, value: one row per figure."""
    yield ["section", "path", "lora", "name", "numerator", "denominator", "value"]
    for f in rep.get("findings", []):
        yield ["finding", "", "", f["finding"], f["severity"], "", f["summary"]]
    rq = rep["requests"]
    for k in ("total", "finished", "cancelled_or_failed", "server_runs", "prompt_tokens", "reused_tokens"):
        yield ["requests", "", "", k, "", "", rq[k]]
    for section, table in (("miss_rate", rep["miss_rate"]), ("could_have_hit", rep["could_have_hit"]["miss_rate"])):
        for p in RATE_PATHS:
            for lo in RATE_LORA:
                r = table[p][lo]
                yield [section, p, lo, "miss", r["numerator"], r["denominator"], r["ratio"]]
    for k, v in rep["could_have_hit"]["excluded"].items():
        yield ["could_have_hit", "", "", f"excluded_{k}", "", "", v]
    for lo in RATE_LORA:
        for c, v in rep["miss_causes"][lo].items():
            yield ["miss_causes", "", lo, c, "", "", v]
        for res, v in rep["restores"][lo].items():
            yield ["restores", "", lo, res, "", "", v]
    for p in RATE_PATHS:
        for k in PERCENTILE_KEYS:
            yield ["prefill_seconds", p, "", k, "", "", rep["prefill_seconds"][p][k]]
    for name, pc in rep["time_per_output_token_seconds"].items():
        if not isinstance(pc, dict):
            yield ["time_per_output_token_seconds", "", "", name, "", "", pc]
            continue
        for k in ("count", "p50", "p90", "p99", "max"):
            yield ["time_per_output_token_seconds", "", "", f"{name}_{k}", "", "", pc[k]]
    cc = rep.get("cache_size_curve")
    if cc is not None:
        curve_keys: tuple[CurveKey, ...] = (
            "evicted_misses",
            "prefill_seconds",
            "size_unknown",
            "no_byte_limit",
            "with_checkpoints",
            "limit_mib",
        )
        for k in curve_keys:
            yield ["cache_size_curve", "", "", k, "", "", cc[k]]
        for pt in cc["points"]:
            name = f"{pt['factor']:g}x"
            yield ["cache_size_curve", "", "", f"{name}_misses_avoided", pt["misses_avoided"], cc["evicted_misses"], ""]
            yield ["cache_size_curve", "", "", f"{name}_prefill_seconds_avoided", "", "", pt["prefill_seconds_avoided"]]
    yield ["small_task_takeovers", "", "", "count", "", "", rep["small_task_takeovers"]]
    for name, share in _named_shares(rep):
        yield ["named", "", "", name, share["named"], share["total"], _ratio(share)]
    for _, concern in CONCERNS:
        concern_section = cast(dict[str, Any], rep).get(concern.key) if concern is not None else None
        if concern is not None and concern_section is not None:
            yield from concern.csv_rows(concern_section)
    for u in rep["unknown"]:
        yield ["unknown", "", "", u["what"], u["requests"], "", u["why"]]


def to_csv(rep: Report, set_name: str | None = None, header: bool = True) -> str:
    """One row per figure; with set_name (a comparison) a first column names the report."""
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    for i, row in enumerate(csv_rows(rep)):
        if i == 0 and not header:
            continue
        if set_name is not None:
            row = ["set" if i == 0 else set_name, *row]
        w.writerow(["" if v is None else v for v in row])
    return buf.getvalue()


# ------------------------------------------------------------------ two reports side by side
def comparison_rows(a: Report, b: Report) -> list[list[str]]:
    """The headline figures of two reports (two windows, or two log sets: before and after a
    fix), each with its counts."""
    rows = [["requests", str(a["requests"]["total"]), str(b["requests"]["total"])]]
    for title, ta, tb in (
        ("miss rate", a["miss_rate"], b["miss_rate"]),
        ("could-have-hit miss rate", a["could_have_hit"]["miss_rate"], b["could_have_hit"]["miss_rate"]),
    ):
        states = [lo for lo in LORA_STATES if ta["all"][lo]["denominator"] or tb["all"][lo]["denominator"]]
        for path in ("all", "ram", "slot"):
            for lo in [*states, "all"] if len(states) > 1 else ["all"]:
                ra, rb = ta[path][lo], tb[path][lo]
                if ra["denominator"] or rb["denominator"]:
                    rows.append([f"{title}, {path} paths, LoRA {lo}", fmt_rate(ra), fmt_rate(rb)])
    for res in ("discarded_lora_wrongful", "discarded_lora_unknown", "kept"):
        rows.append([f"RAM-cache restores {res}", str(a["restores"]["all"][res]), str(b["restores"]["all"][res])])
    for q in ("p50", "p90"):
        rows.append(
            [f"prefill duration {q} (s)", _secs(a["prefill_seconds"]["all"][q]), _secs(b["prefill_seconds"]["all"][q])]
        )
    for label, pa, pb in (
        (
            "while another slot prefilled",
            a["time_per_output_token_seconds"]["while_another_slot_prefilled"],
            b["time_per_output_token_seconds"]["while_another_slot_prefilled"],
        ),
        (
            "no concurrent prefill",
            a["time_per_output_token_seconds"]["no_concurrent_prefill"],
            b["time_per_output_token_seconds"]["no_concurrent_prefill"],
        ),
    ):
        rows.append([f"time per output token p50 (s), {label}", _secs(pa["p50"]), _secs(pb["p50"])])
    rows.append(["small-task takeovers", str(a["small_task_takeovers"]), str(b["small_task_takeovers"])])
    return rows


def comparison_text(a: Report, b: Report, names: tuple[str, str], markdown: bool) -> str:
    header = ["figure", *names]
    rows = comparison_rows(a, b)
    if markdown:
        lines = ["| " + " | ".join(header) + " |", "|---|---|---|"]
        lines += ["| " + " | ".join(r) + " |" for r in rows]
    else:
        widths = [max(len(x) for x in col) for col in zip(header, *rows, strict=True)]
        lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in [header, *rows]]
    lines.append("")
    lines.append("* small sample (fewer than 30 requests)")
    for n, rep in zip(names, (a, b), strict=True):
        lines.extend(f"{n}: [{f['severity'].replace('_', ' ')}] {f['summary']}" for f in rep.get("findings", []))
        lines.extend(f"{n}: {u}" for u in _unknown_lines(rep))
    return "\n".join(lines) + "\n"
