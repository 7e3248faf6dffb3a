"""The prompt cache's outcome per request: tokens reused, hit/partial/miss and the miss's cause,
what a larger --cache-ram would have saved, and what became of each restored RAM-cache entry
(the LoRA comparison: wrongful discards, reuse across adapters). Afterwards, the report's miss
rates (of all requests, and of those that could have hit), miss causes, restores and the curve
of larger caches."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from typing import Any, Final, Literal

from ..config import MetricsConfig
from ..records import (
    LARGER_CACHE_FACTORS,
    LORA_STATES,
    MIB,
    MISS_CAUSES,
    OUTCOMES,
    RESTORE_RESULTS,
    RequestRecord,
    avoidable_prefill_seconds,
    ended_unanswered,
    evicted_miss,
    kept_by_larger_cache,
)
from .concern import (
    PATH_LORA,
    PATH_LORA_VALUES,
    RATE_LORA,
    RATE_PATHS,
    ConcernReport,
    ReportInputs,
    ReportSettings,
    Table,
    fmt_rate,
    rate,
)
from .families import CounterValues, HistogramValues
from .report_types import CacheSizeCurve, MissTable, Report, Unknown

# the larger caches the live capacity figures are for (analyze gives the whole curve)
LARGER_CACHE_LABELS: Final = {"2x": 2.0, "4x": 4.0}


class CacheOutcomeMetrics:
    def __init__(self, buckets: MetricsConfig) -> None:
        self.prompt_tokens = CounterValues(
            "llamacpp_prompt_tokens",
            "Prompt tokens of completed requests (reused plus computed), where known.",
            PATH_LORA,
            PATH_LORA_VALUES,
        )
        self.reused_tokens = CounterValues(
            "llamacpp_prompt_tokens_reused",
            "Prompt tokens reused from the slot or the RAM prompt cache, where known.",
            PATH_LORA,
            PATH_LORA_VALUES,
        )
        self.outcomes = CounterValues(
            "llamacpp_prompt_cache_outcomes",
            "Prompt-cache outcome of requests with at least cache.min_prompt_tokens prompt tokens: hit (reused >= hit ratio), partial, miss (reused < miss ratio).",
            [*PATH_LORA, "outcome"],
            (*PATH_LORA_VALUES, OUTCOMES),
        )
        self.misses = CounterValues(
            "llamacpp_prompt_cache_misses",
            "Prompt-cache misses by cause: lora_discard, forced_reprocess (SWA/hybrid memory), evicted (the conversation's RAM-cache entry was evicted before it came back), no_cache_entry, slot_prefix_mismatch, unknown (-lv 3).",
            [*PATH_LORA, "cause"],
            (*PATH_LORA_VALUES, MISS_CAUSES),
        )
        self.evicted_avoidable = CounterValues(
            "llamacpp_prompt_cache_evicted_misses_avoidable",
            'Misses of conversations whose RAM-cache entry had been evicted (misses_total{cause="evicted"}) that '
            "a --cache-ram this many times the one in force would have avoided: it would still have held the entry "
            "(llama-server evicts the oldest entry first).",
            ["model", "cache_ram"],
            (tuple(LARGER_CACHE_LABELS),),
        )
        self.evicted_avoidable_seconds = CounterValues(
            "llamacpp_prompt_cache_evicted_prefill_avoidable_seconds",
            "Prefill seconds of those misses a restore of the entry would have saved, by the same larger --cache-ram.",
            ["model", "cache_ram"],
            (tuple(LARGER_CACHE_LABELS),),
        )
        self.evicted_size_unknown = CounterValues(
            "llamacpp_prompt_cache_evicted_misses_size_unknown",
            "Misses of conversations whose RAM-cache entry had been evicted, for which the log cannot tell the "
            "cache size that would have kept it (the entry not followed from its eviction, or no byte limit).",
            ["model"],
            (),
        )
        self.restores = CounterValues(
            "llamacpp_prompt_cache_restores",
            "RAM prompt-cache entries restored into a slot, by what became of them. discarded_lora_wrongful: "
            "discarded for a LoRA change although computed under the request's LoRA configuration.",
            ["model", "lora", "result"],
            (LORA_STATES, RESTORE_RESULTS),
        )
        self.mismatch = CounterValues(
            "llamacpp_prompt_cache_lora_mismatch_reuse",
            "Restored RAM-cache entries computed under another LoRA configuration and reused anyway (wrong-output risk).",
            ["model", "lora"],
            (LORA_STATES,),
        )
        self.families: list[CounterValues | HistogramValues] = [
            self.prompt_tokens,
            self.reused_tokens,
            self.outcomes,
            self.misses,
            self.evicted_avoidable,
            self.evicted_avoidable_seconds,
            self.evicted_size_unknown,
            self.restores,
            self.mismatch,
        ]

    def update(self, rec: RequestRecord) -> None:
        if rec.kind != "completion":
            return
        model, lora = rec.model, rec.lora
        key = (model, rec.path, lora)
        if rec.prompt_tokens is not None and rec.reused_tokens is not None:
            self.prompt_tokens.add(key, rec.prompt_tokens)
            self.reused_tokens.add(key, rec.reused_tokens)
        if rec.outcome is not None:
            self.outcomes.add((*key, rec.outcome))
        if rec.outcome == "miss" and rec.miss_cause is not None:
            self.misses.add((*key, rec.miss_cause))
            if rec.miss_cause == "evicted":
                self._larger_cache(rec)
        if rec.restore_result is not None:
            self.restores.add((model, lora, rec.restore_result))
        if rec.lora_mismatch_reuse:
            self.mismatch.add((model, lora))

    def _larger_cache(self, rec: RequestRecord) -> None:
        if kept_by_larger_cache(rec, 1.0) is None:
            self.evicted_size_unknown.add((rec.model,))
            return
        saved = avoidable_prefill_seconds(rec)
        for label, factor in LARGER_CACHE_LABELS.items():
            if kept_by_larger_cache(rec, factor):
                self.evicted_avoidable.add((rec.model, label))
                self.evicted_avoidable_seconds.add((rec.model, label), saved)


# why a request could not have hit, each request under its first reason, in this order
EXCLUSIONS: Final = (
    "conversation_unknown",  # no conversation id and no cache lineage: its history is unknown
    "first_of_conversation",
    "after_server_restart",  # the server's caches were empty
    "prefix_changed",  # the conversation's history was summarised or rewritten
    "after_long_gap",
)
EXCLUSION_TEXT: Final = {
    "conversation_unknown": "conversation unknown (no id, no cache lineage)",
    "first_of_conversation": "first request of its conversation",
    "after_server_restart": "first of its conversation after a server restart",
    "prefix_changed": "its conversation's history changed (summarised or rewritten: a prompt shorter than the "
    "previous one, or one that left the previous request's tokens early)",
    "after_long_gap": "after a pause longer than the gap",
}
CurveFigure = Literal[
    "evicted_misses", "prefill_seconds", "size_unknown", "no_byte_limit", "with_checkpoints", "limit_mib"
]
CURVE_FIGURES: Final[tuple[CurveFigure, ...]] = (
    "evicted_misses",
    "prefill_seconds",
    "size_unknown",
    "no_byte_limit",
    "with_checkpoints",
    "limit_mib",
)


class MissRates:
    """Miss rate by selection path and LoRA state over the records with a cache outcome."""

    def __init__(self) -> None:
        self.num: Counter[tuple[str, str]] = Counter()
        self.den: Counter[tuple[str, str]] = Counter()

    def add(self, r: RequestRecord) -> None:
        if r.outcome is None:
            return
        for path in (r.path, "all"):
            for lora in (r.lora, "all"):
                self.den[path, lora] += 1
                self.num[path, lora] += r.outcome == "miss"

    def result(self) -> MissTable:
        return {p: {lo: rate(self.num[p, lo], self.den[p, lo]) for lo in RATE_LORA} for p in RATE_PATHS}


class CouldHaveHit:
    """Follows every conversation through the records in start order (each server run in turn)
    and keeps the requests that could have hit the cache; counts how many each exclusion removed
    (each request under its first exclusion, in the order of EXCLUSIONS). Keeps one record per
    conversation (its previous request), never the records themselves."""

    def __init__(self, gap_seconds: float, keep: bool = False) -> None:
        self.gap_us = gap_seconds * 1_000_000
        self.previous: dict[str, RequestRecord] = {}  # conversation -> its previous request
        self.excluded: Counter[str] = Counter()
        self.table = MissRates()
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


class CacheSizeCurveCount:
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


class CacheOutcomeReport(ConcernReport):
    def __init__(self, settings: ReportSettings) -> None:
        super().__init__(settings)
        self.finished = self.diagnosed = self.no_outcome = 0
        self.miss_rates = MissRates()
        self.could_have_hit = CouldHaveHit(settings.gap_seconds)
        self.curve = CacheSizeCurveCount()
        self.causes: dict[str, Counter[str]] = {lo: Counter() for lo in RATE_LORA}
        self.restores: dict[str, Counter[str]] = {lo: Counter() for lo in RATE_LORA}
        self.mismatch: Counter[str] = Counter()

    def count(self, rec: RequestRecord) -> None:
        if rec.kind != "completion":
            return
        if not ended_unanswered(rec):
            self.finished += 1
            self.diagnosed += rec.reuse_source == "log"
            self.no_outcome += rec.outcome is None and rec.reused_tokens is None
        self.miss_rates.add(rec)
        self.curve.add(rec)
        if rec.outcome == "miss":
            for lo in (rec.lora, "all"):
                self.causes[lo][rec.miss_cause or "unknown"] += 1
        if rec.restore_result:
            for lo in (rec.lora, "all"):
                self.restores[lo][rec.restore_result] += 1
        if rec.lora_mismatch_reuse:
            self.mismatch[rec.lora] += 1

    def follow(self, rec: RequestRecord, in_report: bool) -> None:
        self.could_have_hit.follow(rec, in_report and rec.kind == "completion")

    def result(self, given: ReportInputs) -> dict[str, Any]:
        chh = self.could_have_hit
        return {
            "miss_rate": self.miss_rates.result(),
            "could_have_hit": {
                "gap_seconds": self.settings.gap_seconds,
                "excluded": {k: chh.excluded[k] for k in EXCLUSIONS},
                "considered": chh.considered,
                "miss_rate": chh.table.result(),
            },
            "miss_causes": {lo: _by_name(self.causes[lo], MISS_CAUSES) for lo in RATE_LORA},
            "restores": {lo: _by_name(self.restores[lo], RESTORE_RESULTS) for lo in RATE_LORA},
            "cache_size_curve": self.curve.result(),
            "lora_mismatch_reuse": {lo: self.mismatch[lo] for lo in LORA_STATES},
        }

    def unknowns(self, given: ReportInputs) -> list[Unknown]:
        out: list[Unknown] = []
        if self.finished and self.diagnosed < self.finished:
            out.append(
                {
                    "what": "RAM-cache diagnostics (restores, discards, miss causes, reused tokens from the log)",
                    "requests": self.finished - self.diagnosed,
                    "why": "llama-server logged these requests below -lv 4; start it with -lv 4",
                }
            )
        if self.no_outcome:
            out.append(
                {
                    "what": "cache outcome",
                    "requests": self.no_outcome,
                    "why": "reused tokens unknown (below -lv 4 they come only from /slots while the task runs)",
                }
            )
        return out

    @staticmethod
    def tables(rep: Report) -> list[Table]:
        ch = rep["could_have_hit"]
        excluded = "\n".join(f"  excluded, {EXCLUSION_TEXT[k]}: {v}" for k, v in ch["excluded"].items())
        by_lora = rep["requests"]["by_lora"]
        seen = [lo for lo in RATE_LORA if lo == "all" or by_lora.get(lo)]
        heads = [f"LoRA {lo}" if lo != "all" else "all" for lo in seen]
        return [
            _miss_table(
                "Prompt-cache miss rate by slot-selection path and LoRA state",
                rep["miss_rate"],
                "miss: reused less than the miss ratio of the prompt; over the requests with a cache outcome; "
                "* small sample",
            ),
            _miss_table(
                "Miss rate of the requests that could have hit",
                ch["miss_rate"],
                f"{ch['considered']} requests considered (gap {ch['gap_seconds']:g} s)\n{excluded}",
            ),
            (
                "Miss causes",
                ["cause", *heads],
                [[c, *(str(rep["miss_causes"][lo].get(c, 0)) for lo in seen)] for c in MISS_CAUSES],
                "",
            ),
            (
                "RAM-cache restores",
                ["result", *heads],
                [[res, *(str(rep["restores"][lo].get(res, 0)) for lo in seen)] for res in RESTORE_RESULTS],
                "discarded_lora_wrongful: a restored entry discarded although it was computed under the request's LoRA",
            ),
            _curve_table(rep["cache_size_curve"]),
        ]

    @staticmethod
    def csv_rows(rep: Report) -> Iterable[list[Any]]:
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
        cc = rep["cache_size_curve"]
        for k in CURVE_FIGURES:
            yield ["cache_size_curve", "", "", k, "", "", cc[k]]
        for pt in cc["points"]:
            name = f"{pt['factor']:g}x"
            yield ["cache_size_curve", "", "", f"{name}_misses_avoided", pt["misses_avoided"], cc["evicted_misses"], ""]
            yield ["cache_size_curve", "", "", f"{name}_prefill_seconds_avoided", "", "", pt["prefill_seconds_avoided"]]

    @staticmethod
    def comparison_rows(a: Report, b: Report) -> list[list[str]]:
        rows = []
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
        return rows


def _by_name(counts: Counter[str], names: Iterable[str]) -> dict[str, int]:
    """Every name with its count, then any other (an events file of another version)."""
    out = {n: counts[n] for n in names}
    out.update((n, c) for n, c in counts.items() if n not in out)
    return out


def _miss_table(title: str, table: MissTable, note: str) -> Table:
    # paths and LoRA states without a request are left out of the table (not of the JSON)
    paths = [p for p in RATE_PATHS if p == "all" or table[p]["all"]["denominator"]]
    loras = [lo for lo in RATE_LORA if lo == "all" or table["all"][lo]["denominator"]]
    rows = [[p, *(fmt_rate(table[p][lo]) for lo in loras)] for p in paths]
    return (title, ["path", *(f"LoRA {lo}" if lo != "all" else "all" for lo in loras)], rows, note)


def _curve_table(cc: CacheSizeCurve) -> Table:
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
    rows_shown = rows if cc["evicted_misses"] else []
    return ("Would a larger --cache-ram help?", ["cache size", "evicted misses avoided", "prefill s avoided"],
            rows_shown, "\n".join(notes))  # fmt: skip
