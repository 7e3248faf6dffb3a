"""Prometheus metrics of what the log says: per finished request (RequestMetrics) and per line
(LogMetrics: the RAM cache's own figures, the server's build and verbosity, the pipeline's
counts). The poller, the log source and the events file own their self-metrics.

Every metric lives on a registry passed in, never the global one. Label values come
from fixed sets (records.py) or slot ids the server announced, so cardinality is bounded.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Final

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from ..config import MetricsConfig
from ..records import (
    CONTENTION,
    FINISH_REASONS,
    LORA_STATES,
    MISS_CAUSES,
    OUTCOMES,
    PATHS,
    RESTORE_RESULTS,
    RequestRecord,
    avoidable_prefill_seconds,
    ended_unanswered,
    finish_reason,
    kept_by_larger_cache,
)
from .concern import ConcernMetrics
from .concerns import CONCERNS
from .conversations import ConversationCosts
from .exposition import Encoding, render_families
from .families import CounterValues, FamiliesCollector, GaugeValues, HistogramValues

# the larger caches the live capacity figures are for (analyze gives the whole curve)
LARGER_CACHE_LABELS: Final = {"2x": 2.0, "4x": 4.0}

PREFILL_TOKENS_BUCKETS: Final = tuple(float(2**i) for i in range(18))  # 1 .. 131072
CACHE_UPDATE_BUCKETS: Final = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5)
LOG_LINE_RESULTS: Final = ("parsed", "ignored", "unrecognized", "unreadable", "oversized")
# (logger, function) pairs of unrecognized lines kept apart; past this many a new pair counts as
# (logger, "other"): function names come from the log, and a label's values must stay few
MAX_UNRECOGNIZED_KINDS: Final = 64
# what the log accounts for, in the order of llamacpp_exporter_log_tokens_total's kinds
LOG_TOKEN_KINDS: Final = ("prompt_computed", "prompt_cached", "generated")
# how a request's conversation was found (records.JoinSource), or none for an embedding task
CONVERSATION_SOURCES: Final = ("header", "lineage", "uncertain", "none")


class RequestMetrics(FamiliesCollector):
    """One finished request record -> counters and histograms by path, LoRA state and outcome.

    Plain numbers, turned into metric families at scrape time: a record's dozen updates cost
    no locks, and a scrape builds its samples without prometheus_client's per-child machinery.
    """

    def __init__(self, registry: CollectorRegistry, buckets: MetricsConfig | None = None) -> None:
        b = buckets or MetricsConfig()
        families: list[CounterValues | HistogramValues] = []

        def counter(name: str, doc: str, labels: list[str], space: Sequence[Sequence[str]] | None) -> CounterValues:
            families.append(f := CounterValues(name, doc, labels, space))
            return f

        def histogram(
            name: str, doc: str, labels: list[str], bounds: Sequence[float], space: Sequence[Sequence[str]]
        ) -> HistogramValues:
            families.append(f := HistogramValues(name, doc, labels, bounds, space))
            return f

        # each family with its labels and the values they take, in the order of the exposition
        pl, pl_space = ["model", "path", "lora"], (PATHS, LORA_STATES)
        self.requests = counter(
            "llamacpp_requests", "Requests (tasks) completed, by slot-selection path and LoRA state.", pl, pl_space
        )
        self.cancelled = counter(
            "llamacpp_requests_cancelled",
            "Requests that ended without a timings block (cancelled or failed).",
            pl,
            pl_space,
        )
        self.finished = counter(
            "llamacpp_requests_finished",
            "Requests (tasks) that ended on a slot, by how, where the log states it: stop (an end of sequence, a stop "
            "word or the token limit), truncated (the context filled up), cancelled (the client went away while it "
            "ran), failed (an error), unknown (no timings and no cancel or error line: the log does not show how "
            "it ended, e.g. a build that stopped logging its timings; never counted as a failure).",
            ["model", "reason"],
            (FINISH_REASONS,),
        )
        self.not_started = counter(
            "llamacpp_requests_never_started",
            "Requests that arrived (their conv_id line, -lv 4) and never started on a slot: their client gave up "
            "while they were queued, or llama-server rejected them first. Counted once the server idles and the "
            "log accounts for every arrival (never on a server that is never idle).",
            ["model"],
            (),
        )
        self.prompt_tokens = counter(
            "llamacpp_prompt_tokens",
            "Prompt tokens of completed requests (reused plus computed), where known.",
            pl,
            pl_space,
        )
        self.reused_tokens = counter(
            "llamacpp_prompt_tokens_reused",
            "Prompt tokens reused from the slot or the RAM prompt cache, where known.",
            pl,
            pl_space,
        )
        self.outcomes = counter(
            "llamacpp_prompt_cache_outcomes",
            "Prompt-cache outcome of requests with at least cache.min_prompt_tokens prompt tokens: hit (reused >= hit ratio), partial, miss (reused < miss ratio).",
            [*pl, "outcome"],
            (*pl_space, OUTCOMES),
        )
        self.misses = counter(
            "llamacpp_prompt_cache_misses",
            "Prompt-cache misses by cause: lora_discard, forced_reprocess (SWA/hybrid memory), evicted (the conversation's RAM-cache entry was evicted before it came back), no_cache_entry, slot_prefix_mismatch, unknown (-lv 3).",
            [*pl, "cause"],
            (*pl_space, MISS_CAUSES),
        )
        self.evicted_avoidable = counter(
            "llamacpp_prompt_cache_evicted_misses_avoidable",
            'Misses of conversations whose RAM-cache entry had been evicted (misses_total{cause="evicted"}) that '
            "a --cache-ram this many times the one in force would have avoided: it would still have held the entry "
            "(llama-server evicts the oldest entry first).",
            ["model", "cache_ram"],
            (tuple(LARGER_CACHE_LABELS),),
        )
        self.evicted_avoidable_seconds = counter(
            "llamacpp_prompt_cache_evicted_prefill_avoidable_seconds",
            "Prefill seconds of those misses a restore of the entry would have saved, by the same larger --cache-ram.",
            ["model", "cache_ram"],
            (tuple(LARGER_CACHE_LABELS),),
        )
        self.evicted_size_unknown = counter(
            "llamacpp_prompt_cache_evicted_misses_size_unknown",
            "Misses of conversations whose RAM-cache entry had been evicted, for which the log cannot tell the "
            "cache size that would have kept it (the entry not followed from its eviction, or no byte limit).",
            ["model"],
            (),
        )
        self.restores = counter(
            "llamacpp_prompt_cache_restores",
            "RAM prompt-cache entries restored into a slot, by what became of them. discarded_lora_wrongful: "
            "discarded for a LoRA change although computed under the request's LoRA configuration.",
            ["model", "lora", "result"],
            (LORA_STATES, RESTORE_RESULTS),
        )
        self.mismatch = counter(
            "llamacpp_prompt_cache_lora_mismatch_reuse",
            "Restored RAM-cache entries computed under another LoRA configuration and reused anyway (wrong-output risk).",
            ["model", "lora"],
            (LORA_STATES,),
        )
        self.prefill_seconds = histogram(
            "llamacpp_prefill_duration_seconds",
            "Prefill time of a request (slot start to first token, llama-server's prompt eval time).",
            pl,
            b.prefill_duration_buckets,
            pl_space,
        )
        self.prefill_tokens = histogram(
            "llamacpp_prefill_tokens",
            "Prompt tokens computed (not reused) by a request's prefill.",
            pl,
            PREFILL_TOKENS_BUCKETS,
            pl_space,
        )
        self.tpot = histogram(
            "llamacpp_time_per_output_token_seconds",
            "Mean decode time per output token of a request; contention=prefill when other slots prefilled during more than the configured fraction of its decoding.",
            ["model", "contention"],
            b.time_per_output_token_buckets,
            (CONTENTION,),
        )
        self.queue = histogram(
            "llamacpp_request_queue_seconds",
            "Time a request waited from its arrival (its conv_id line, -lv 4) to its launch on a slot: for a free "
            "slot, tokenizing; on a busy server, waiting for one. Observed where the log pins the arrival "
            "to within 25 ms (else counted in llamacpp_request_latency_unknown_total).",
            ["model"],
            b.latency_buckets,
            (),
        )
        self.ttft = histogram(
            "llamacpp_time_to_first_token_seconds",
            "Time to first token of a request: its queue time plus its prefill (llama-server's prompt eval time).",
            ["model"],
            b.latency_buckets,
            (),
        )
        self.e2e = histogram(
            "llamacpp_request_duration_seconds",
            "End-to-end time of a request in llama-server: from its arrival to its slot's release (queue, "
            "prefill and generation).",
            ["model"],
            b.latency_buckets,
            (),
        )
        self.latency_unknown = counter(
            "llamacpp_request_latency_unknown",
            "Completed requests whose queue time, time to first token and end-to-end time are not observed: the log "
            "does not pin their arrival (below -lv 4, or several requests arrived at once and the task ids do not "
            "tell which was which).",
            ["model"],
            (),
        )
        self.overlap = counter(
            "llamacpp_decode_prefill_overlap_seconds",
            "Seconds during which this slot was decoding while another slot was prefilling.",
            ["model", "slot"],
            None,  # the slots the server announced (slots_known)
        )
        self.takeovers = counter(
            "llamacpp_small_task_slot_takeovers",
            "Requests with a small prompt placed on a slot that held a big conversation (e.g. a health probe evicting it).",
            ["model"],
            (),
        )
        self.conversation_joins = counter(
            "llamacpp_exporter_conversation_joins",
            "Requests by how their conversation was found: header (the X-Conversation-Id the request sent), lineage "
            "(it sent none: cache lineage), uncertain (the log cannot prove which request the task was, so no "
            "conversation is named), none (an embedding or rerank task).",
            ["model", "source"],
            (CONVERSATION_SOURCES,),
        )
        self.conversation_join_prefill = counter(
            "llamacpp_exporter_conversation_join_prefill_seconds",
            "Prefill seconds of completed requests by how their conversation was found, as in "
            "llamacpp_exporter_conversation_joins_total: how much of the prefill work has a name.",
            ["model", "source"],
            (CONVERSATION_SOURCES,),
        )
        self.conversation_join_cost = counter(
            "llamacpp_exporter_conversation_join_cost_to_others_seconds",
            "Seconds of other requests' decoding that a request's prefill overlapped, by how that request's "
            "conversation was found once the log settled it (uncertain: never proven): how much of the slowdown "
            "has a name.",
            ["model", "source"],
            (CONVERSATION_SOURCES,),
        )
        self.choices = counter(
            "llamacpp_request_choices",
            "Choices generated by completed requests: 1 each, n for a request with n > 1 (its child tasks are "
            "its other choices, not requests of their own).",
            ["model"],
            (),
        )
        self.embedding_tasks = counter(
            "llamacpp_embedding_tasks",
            "Embedding or rerank tasks (one per input) that ended: they evaluate a prompt and sample nothing, and "
            "never use the RAM prompt cache (told apart at -lv 4).",
            ["model"],
            (),
        )
        self.embedding_tokens = counter(
            "llamacpp_embedding_prompt_tokens",
            "Prompt tokens evaluated by embedding or rerank tasks.",
            ["model"],
            (),
        )
        # the concerns built one module each (concerns.py), after the families above
        self.concerns: list[ConcernMetrics] = [live(b) for live, _ in CONCERNS]
        for c in self.concerns:
            families.extend(c.families)
        super().__init__(families)
        self._slots: dict[str, set[int]] = {}
        self.models: set[str] = set()
        self.model_known("")
        registry.register(self)

    def model_known(self, model: str) -> None:
        """Every series of a model exists from the moment it is known (a plain server's, "",
        from the start), so rate() and dashboards see zeros, not gaps."""
        if model in self.models:
            return
        self.models.add(model)
        for f in self.families:
            f.known(model)

    def forget_model(self, model: str) -> None:
        """A router's log: its own name, "", serves no request. Its zero series go (only
        while they are all zero)."""
        if model not in self.models:
            return
        for m in self.families:
            store = m.values if isinstance(m, CounterValues) else m.children
            keys = [k for k in store if k and k[0] == model]
            if isinstance(m, CounterValues) and any(m.values[k] for k in keys):
                return
        for m in self.families:
            store = m.values if isinstance(m, CounterValues) else m.children
            for k in [k for k in store if k and k[0] == model]:
                del store[k]
        self.models.discard(model)

    def slots_known(self, model: str, slot_ids: list[int]) -> None:
        self._slots.setdefault(model, set()).update(slot_ids)
        for i in slot_ids:
            key = (model, str(i))
            if key not in self.overlap.values:
                self.overlap.add(key, 0.0)

    def record(self, rec: RequestRecord) -> None:
        model = rec.model
        if model not in self.models:
            self.model_known(model)
        for c in self.concerns:
            c.update(rec)
        self.conversation_joins.add((model, rec.conversation_source or "none"))
        if rec.prefill_seconds:
            self.conversation_join_prefill.add((model, rec.conversation_source or "none"), rec.prefill_seconds)
        if rec.kind != "completion":
            self.embedding_tasks.add((model,))
            if rec.prompt_tokens is not None:
                self.embedding_tokens.add((model,), rec.prompt_tokens)
            return
        key = (model, rec.path, rec.lora)
        lora = rec.lora
        exemplar = {"slot": str(rec.slot), "task": str(rec.task)}
        if rec.conversation:
            exemplar["conversation"] = rec.conversation
        self.finished.add((model, finish_reason(rec)))
        if ended_unanswered(rec):
            self.cancelled.add(key)
        else:
            self.requests.add(key)
            self.choices.add((model,), rec.choices)
            self._latency(rec, exemplar)
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
        if rec.small_task_takeover:
            self.takeovers.add((model,))
        if rec.prefill_seconds is not None:
            self.prefill_seconds.observe(key, rec.prefill_seconds, exemplar)
        if rec.prefill_tokens is not None:
            self.prefill_tokens.observe(key, rec.prefill_tokens, exemplar)
        if rec.time_per_output_token_seconds is not None and rec.contention is not None:
            self.tpot.observe((model, rec.contention), rec.time_per_output_token_seconds, exemplar)
        if rec.overlap_seconds and rec.slot in self._slots.get(model, ()):
            self.overlap.add((model, str(rec.slot)), rec.overlap_seconds)

    def never_started(self, model: str) -> None:
        self.not_started.add((model,))

    def join_cost(self, model: str, source: str, seconds: float) -> None:
        self.conversation_join_cost.add((model, source), seconds)

    def _larger_cache(self, rec: RequestRecord) -> None:
        if kept_by_larger_cache(rec, 1.0) is None:
            self.evicted_size_unknown.add((rec.model,))
            return
        saved = avoidable_prefill_seconds(rec)
        for label, factor in LARGER_CACHE_LABELS.items():
            if kept_by_larger_cache(rec, factor):
                self.evicted_avoidable.add((rec.model, label))
                self.evicted_avoidable_seconds.add((rec.model, label), saved)

    def _latency(self, rec: RequestRecord, exemplar: dict[str, str]) -> None:
        key = (rec.model,)
        q = rec.queue_seconds
        if q is None or rec.prefill_seconds is None or rec.start_us is None or rec.end_us is None:
            self.latency_unknown.add(key)
            return
        self.queue.observe(key, q, exemplar)
        self.ttft.observe(key, q + rec.prefill_seconds, exemplar)
        self.e2e.observe(key, q + (rec.end_us - rec.start_us) / 1e6, exemplar)


@dataclass(slots=True)
class _CacheSeries:
    """One model's RAM-cache counters (prometheus_client's children of the families below)."""

    saves: Counter
    evictions: Counter
    evicted_bytes: Counter
    update: Histogram


class LogMetrics:
    """Facts read straight from log lines, no assembly needed (the assembler passes them on),
    and the pipeline's own counts of what it read. Facts of a server process carry its model:
    a router's children each have their own cache, slots, build and restarts ("" for a plain
    server)."""

    def __init__(self, registry: CollectorRegistry) -> None:
        r = registry
        m = ["model"]
        # set at every cache state line: plain numbers (see in_progress below)
        self.cache_entries = GaugeValues(
            "llamacpp_prompt_cache_entries", "Entries in the RAM prompt cache (last cache state line).", m
        )
        self.cache_bytes = GaugeValues(
            "llamacpp_prompt_cache_bytes", "Size of the RAM prompt cache in bytes (last cache state line).", m
        )
        self.cache_limit = GaugeValues(
            "llamacpp_prompt_cache_limit_bytes", "Size limit of the RAM prompt cache in bytes (--cache-ram).", m
        )
        registry.register(FamiliesCollector([self.cache_entries, self.cache_bytes, self.cache_limit]))
        self.cache_saves = Counter(
            "llamacpp_prompt_cache_saves", "Slot prompts saved into the RAM prompt cache.", m, registry=r
        )
        self.cache_evictions = Counter(
            "llamacpp_prompt_cache_evictions", "Entries evicted from the RAM prompt cache.", m, registry=r
        )
        self.cache_evicted_bytes = Counter(
            "llamacpp_prompt_cache_evicted_bytes", "Bytes evicted from the RAM prompt cache.", m, registry=r
        )
        self.cache_update = Histogram(
            "llamacpp_prompt_cache_update_duration_seconds",
            "Time of one RAM prompt-cache save/load/update at slot selection.",
            m,
            buckets=CACHE_UPDATE_BUCKETS,
            registry=r,
        )
        # Set or counted for every line or every few: plain numbers, rendered at scrape time
        # (no lock, no label lookup on the hot path), as client_python advises for exporters.
        self.in_progress = GaugeValues(
            "llamacpp_slot_prefill_tokens_in_progress",
            "Prompt tokens the slot's running prefill computes; 0 when not prefilling (needs -lv 4).",
            ["model", "slot"],
        )
        self.prefill_tokens_in_progress = self.in_progress.values  # by (model, slot id)
        # lines read, by result (LOG_LINE_RESULTS, line_counts): plain numbers, counted for every line
        self.parsed_lines = 0
        self.ignored_lines = 0
        self.unrecognized_lines = 0
        self.unrecognized_by: dict[tuple[str, str], int] = {}  # (logger, function) -> lines
        self.unreadable_lines = 0
        self.oversized_lines = 0
        self.last_line_time = 0.0
        registry.register(_LineCollector(self))
        self.diag_available = Gauge(
            "llamacpp_exporter_cache_diagnostics_available",
            "1 when llama-server logs at -lv 4 (RAM prompt-cache narrative visible), 0 when not, -1 while unknown.",
            m,
            registry=r,
        )
        self.verbosity = Gauge(
            "llamacpp_exporter_server_log_verbosity",
            "llama-server's -lv as read from its log, -1 while unknown.",
            m,
            registry=r,
        )
        self.debug_logging = Gauge(
            "llamacpp_exporter_server_debug_logging",
            "1 while the running llama-server logs DEBUG lines (-lv 5 / -v), which contain prompt text (the exporter drops "
            "them); 0 again once it restarts without them.",
            m,
            registry=r,
        )
        self.arrivals_dropped = Counter(
            "llamacpp_exporter_conversation_arrivals_dropped",
            "Requests seen arriving (conv_id=) whose task never appeared (rejected, or cancelled by a line the join "
            "could not place), dropped from the conversation join after an idle spell.",
            m,
            registry=r,
        )
        self.restarts = Counter(
            "llamacpp_exporter_server_restarts",
            "llama-server restarts seen in the log (new epochs); a router's child counts its own.",
            m,
            registry=r,
        )
        self.server_build_info = Gauge(
            "llamacpp_exporter_server_build_info",
            "1 for the llama-server build read from its log (build 0, commit unknown: built without version info).",
            ["model", "build", "commit"],
            registry=r,
        )
        self.internal_errors = Counter(
            "llamacpp_exporter_internal_errors",
            "Log events the exporter failed to assemble (a bug: please report it). The line is counted in "
            "llamacpp_exporter_log_lines_total as read; its event is skipped.",
            registry=r,
        )
        self.log_tokens = Counter(
            "llamacpp_exporter_log_tokens",
            "Tokens the log accounts for, by kind, of every task that ended (child tasks of n > 1 requests and "
            "embeddings too): prompt_computed (its timings, or its prompt less what it reused), prompt_cached "
            "(reused from the slot or the RAM cache, where known), generated (its timings). Compare with "
            "llama-server's own counters (llamacpp_server_prompt_tokens_total, _prompt_tokens_cached_total, "
            "_tokens_predicted_total): far less means the exporter is blind (LlamaCppExporterBlind).",
            ["model", "kind"],
            registry=r,
        )
        self.out_of_order = Counter(
            "llamacpp_exporter_log_lines_out_of_order",
            "Lines whose timestamp went back without a restart (a stray line): counted at the current time.",
            m,
            registry=r,
        )
        self._slots: dict[str, set[int]] = {}
        self.models: set[str] = set()
        # each model's RAM-cache children, looked up once: labels() costs more than the update
        self._cache_series: dict[str, _CacheSeries] = {}
        self._builds: dict[str, tuple[str, str]] = {}  # model -> the build labels it shows
        self.restarts_seen = 0  # of every model, forgotten ones too
        self.model_known("")

    def model_known(self, model: str) -> None:
        if model in self.models:
            return
        self.models.add(model)
        for g in (self.cache_entries, self.cache_bytes, self.cache_limit):
            g.values.setdefault((model,), 0.0)
        for k in (self.cache_saves, self.cache_evictions, self.cache_evicted_bytes, self.cache_update):
            k.labels(model)
        for k in (self.arrivals_dropped, self.restarts, self.out_of_order):
            k.labels(model)
        for kind in LOG_TOKEN_KINDS:
            self.log_tokens.labels(model, kind)
        self.debug_logging.labels(model)
        self.diag_available.labels(model).set(-1)
        self.verbosity.labels(model).set(-1)

    def forget_model(self, model: str) -> None:
        """A model the log no longer serves (a router's "", a child that exited): its series go."""
        if model not in self.models:
            return
        self.models.discard(model)
        for v in (self.cache_entries, self.cache_bytes, self.cache_limit):
            v.values.pop((model,), None)
        for g in (
            self.cache_saves,
            self.cache_evictions,
            self.cache_evicted_bytes,
            self.cache_update,
            self.arrivals_dropped,
            self.restarts,
            self.out_of_order,
            self.debug_logging,
            self.diag_available,
            self.verbosity,
        ):
            try:
                g.remove(model)
            except KeyError:
                pass
        for kind in LOG_TOKEN_KINDS:
            try:
                self.log_tokens.remove(model, kind)
            except KeyError:
                pass
        self._cache_series.pop(model, None)
        self._remove_build(model)
        for key in [k for k in self.prefill_tokens_in_progress if k[0] == model]:
            del self.prefill_tokens_in_progress[key]
        self._slots.pop(model, None)

    def _remove_build(self, model: str) -> None:
        labels = self._builds.pop(model, None)
        if labels is not None:
            self.server_build_info.remove(model, *labels)

    def line_counts(self) -> dict[str, int]:
        """Lines read so far, by result (LOG_LINE_RESULTS)."""
        counts = (self.parsed_lines, self.ignored_lines, self.unrecognized_lines, self.unreadable_lines)
        return dict(zip(LOG_LINE_RESULTS, (*counts, self.oversized_lines), strict=True))

    def unrecognized(self, logger: str, function: str) -> None:
        """An unrecognized line, by the logger and function that wrote it (parse.Unrecognized)."""
        self.unrecognized_lines += 1
        key = (logger, function)
        by = self.unrecognized_by
        if key not in by and len(by) >= MAX_UNRECOGNIZED_KINDS:
            key = (logger, "other")
        by[key] = by.get(key, 0) + 1

    def oversized_line_read(self, now: float | None = None) -> None:
        self.oversized_lines += 1
        self.last_line_time = time.time() if now is None else now

    def internal_error(self) -> None:
        self.internal_errors.inc()

    def _cache(self, model: str) -> _CacheSeries:
        c = self._cache_series.get(model)
        if c is None:
            c = self._cache_series[model] = _CacheSeries(
                self.cache_saves.labels(model),
                self.cache_evictions.labels(model),
                self.cache_evicted_bytes.labels(model),
                self.cache_update.labels(model),
            )
        return c

    def cache_state(self, model: str, entries: int, size_bytes: float, limit_bytes: float) -> None:
        key = (model,)
        self.cache_entries.values[key] = float(entries)
        self.cache_bytes.values[key] = size_bytes
        self.cache_limit.values[key] = limit_bytes

    def cache_saved(self, model: str) -> None:
        self._cache(model).saves.inc()

    def cache_evicted(self, model: str, size_bytes: float) -> None:
        c = self._cache(model)
        c.evictions.inc()
        c.evicted_bytes.inc(size_bytes)

    def cache_update_duration(self, model: str, seconds: float) -> None:
        self._cache(model).update.observe(seconds)

    def prefill_in_progress(self, model: str, slot: int, tokens: int) -> None:
        if slot in self._slots.get(model, ()):  # a slot id the server announced: labels stay bounded
            self.prefill_tokens_in_progress[(model, str(slot))] = tokens

    def slots_known(self, model: str, slot_ids: list[int]) -> None:
        self._slots.setdefault(model, set()).update(slot_ids)
        for i in slot_ids:
            self.prefill_tokens_in_progress.setdefault((model, str(i)), 0)

    def conversation_arrival_dropped(self, model: str) -> None:
        self.arrivals_dropped.labels(model).inc()

    def server_restart(self, model: str) -> None:
        self.restarts.labels(model).inc()
        self.restarts_seen += 1

    def server_build(self, model: str, number: int, commit: str) -> None:
        self._remove_build(model)  # one process at a time: a restart may bring another build
        self._builds[model] = (str(number), commit)
        self.server_build_info.labels(model, str(number), commit).set(1)

    def out_of_order_lines(self, model: str, n: int) -> None:
        self.out_of_order.labels(model).inc(n)

    def tokens_accounted(self, model: str, computed: int | None, cached: int | None, generated: int | None) -> None:
        for kind, n in zip(LOG_TOKEN_KINDS, (computed, cached, generated), strict=True):
            if n:
                self.log_tokens.labels(model, kind).inc(n)

    def diagnostics(self, model: str, available: bool, verbosity: int | None) -> None:
        self.diag_available.labels(model).set(1 if available else 0)
        if verbosity is not None:
            self.verbosity.labels(model).set(verbosity)

    def debug_logging_seen(self, model: str) -> None:
        self.debug_logging.labels(model).set(1)

    def debug_logging_ended(self, model: str) -> None:
        self.debug_logging.labels(model).set(0)


class ModelMetrics:
    """The metrics of one server process (a plain server, "" for its model, or a router's
    child): the facts its assembler reads from the log, each under that model's label."""

    def __init__(self, log: LogMetrics, requests: RequestMetrics, costs: ConversationCosts, model: str) -> None:
        self.log = log
        self.requests = requests
        self.costs = costs
        self.model = model
        log.model_known(model)

    def cache_state(self, entries: int, size_bytes: float, limit_bytes: float) -> None:
        self.log.cache_state(self.model, entries, size_bytes, limit_bytes)

    def cache_saved(self) -> None:
        self.log.cache_saved(self.model)

    def cache_evicted(self, size_bytes: float) -> None:
        self.log.cache_evicted(self.model, size_bytes)

    def cache_update_duration(self, seconds: float) -> None:
        self.log.cache_update_duration(self.model, seconds)

    def prefill_in_progress(self, slot: int, tokens: int) -> None:
        self.log.prefill_in_progress(self.model, slot, tokens)

    def out_of_order_lines(self, n: int) -> None:
        self.log.out_of_order_lines(self.model, n)

    def tokens_accounted(self, computed: int | None, cached: int | None, generated: int | None) -> None:
        self.log.tokens_accounted(self.model, computed, cached, generated)

    def conversation_arrival_dropped(self) -> None:
        self.log.conversation_arrival_dropped(self.model)

    def request_never_started(self) -> None:
        self.requests.never_started(self.model)

    def conversation_cost(self, conversation: str, seconds: float) -> None:
        self.costs.cost(conversation, seconds)

    def join_cost(self, source: str, seconds: float) -> None:
        self.requests.join_cost(self.model, source, seconds)

    def slots_known(self, slot_ids: list[int]) -> None:
        self.log.slots_known(self.model, slot_ids)
        self.requests.slots_known(self.model, slot_ids)

    def diagnostics(self, available: bool, verbosity: int | None) -> None:
        self.log.diagnostics(self.model, available, verbosity)

    def debug_logging_seen(self) -> None:
        self.log.debug_logging_seen(self.model)

    def debug_logging_ended(self) -> None:
        self.log.debug_logging_ended(self.model)

    def server_build(self, number: int, commit: str) -> None:
        self.log.server_build(self.model, number, commit)

    def server_restart(self) -> None:
        self.log.server_restart(self.model)


class _LineCollector(Collector):
    def __init__(self, m: LogMetrics) -> None:
        self.m = m

    def describe(self) -> Iterator[Metric]:
        yield from self._families()

    def collect(self) -> Iterator[Metric]:
        yield from self._families()

    def render_exposition(self, encoding: Encoding) -> list[bytes]:
        return [*self.m.in_progress.render(encoding), render_families(encoding, self._line_families())]

    def _families(self) -> Iterator[Metric]:
        yield self.m.in_progress.family()
        yield from self._line_families()

    def _line_families(self) -> Iterator[Metric]:
        lines = CounterMetricFamily(
            "llamacpp_exporter_log_lines",
            "Log lines read, by result: parsed, ignored (known, not needed), unrecognized (a server line whose "
            "message is unknown: a new build), unreadable (not UTF-8 text, or binary), oversized.",
            labels=["result"],
        )
        for result, n in self.m.line_counts().items():
            lines.add_metric([result], n)
        yield lines
        unrecognized = CounterMetricFamily(
            "llamacpp_exporter_log_lines_unrecognized",
            "Unrecognized log lines (a server line whose message is unknown), by the server's logger (slot, srv, "
            "que, res; empty: a line without one) and the function that wrote it: which part of llama-server "
            "changed its log. Lines of slot, srv and que are all known on every tested build.",
            labels=["logger", "function"],
        )
        for (logger, function), n in sorted(self.m.unrecognized_by.items()):
            unrecognized.add_metric([logger, function], n)
        yield unrecognized
        yield GaugeMetricFamily(
            "llamacpp_exporter_last_log_line_timestamp_seconds",
            "Unix time at which the last log line was read.",
            value=self.m.last_line_time,
        )
