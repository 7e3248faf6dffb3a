"""The prompt cache's outcome per request: tokens reused, hit/partial/miss and the miss's cause,
what a larger --cache-ram would have saved, and what became of each restored RAM-cache entry
(the LoRA comparison: wrongful discards, reuse across adapters)."""

from __future__ import annotations

from typing import Final

from ..config import MetricsConfig
from ..records import (
    LORA_STATES,
    MISS_CAUSES,
    OUTCOMES,
    RESTORE_RESULTS,
    RequestRecord,
    avoidable_prefill_seconds,
    kept_by_larger_cache,
)
from .concern import PATH_LORA, PATH_LORA_VALUES
from .families import CounterValues, HistogramValues

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
