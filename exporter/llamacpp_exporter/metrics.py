"""Prometheus metrics of what the log says: per finished request (RequestMetrics) and per line
(LogMetrics: the RAM cache's own figures, the server's build and verbosity, the pipeline's
counts). The poller, the log source and the events file own their self-metrics.

Every metric lives on a registry passed in, never the global one. Label values come
from fixed sets (records.py) or slot ids the server announced, so cardinality is bounded.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Iterator

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from .records import CONTENTION, LORA_STATES, MISS_CAUSES, OUTCOMES, PATHS, RESTORE_RESULTS, RequestRecord

PREFILL_SECONDS_BUCKETS = (
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1,
    2.5,
    5,
    10,
    20,
    30,
    60,
    120,
    300,
    600,
)
PREFILL_TOKENS_BUCKETS = tuple(float(2**i) for i in range(18))  # 1 .. 131072
TPOT_BUCKETS = (0.005, 0.01, 0.015, 0.02, 0.025, 0.03, 0.04, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.5, 1, 2)
CACHE_UPDATE_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5)
LOG_LINE_RESULTS = ("parsed", "ignored", "unrecognized", "unreadable", "oversized")


class RequestMetrics:
    """One finished request record -> counters and histograms by path, LoRA state and outcome."""

    def __init__(self, registry: CollectorRegistry) -> None:
        r = registry
        pl = ["path", "lora"]
        self.requests = Counter(
            "llamacpp_requests", "Requests (tasks) completed, by slot-selection path and LoRA state.", pl, registry=r
        )
        self.cancelled = Counter(
            "llamacpp_requests_cancelled",
            "Requests that ended without a timings block (cancelled or failed).",
            pl,
            registry=r,
        )
        self.prompt_tokens = Counter(
            "llamacpp_prompt_tokens",
            "Prompt tokens of completed requests (reused plus computed), where known.",
            pl,
            registry=r,
        )
        self.reused_tokens = Counter(
            "llamacpp_prompt_tokens_reused",
            "Prompt tokens reused from the slot or the RAM prompt cache, where known.",
            pl,
            registry=r,
        )
        self.outcomes = Counter(
            "llamacpp_prompt_cache_outcomes",
            "Prompt-cache outcome of requests with at least cache.min_prompt_tokens prompt tokens: hit (reused >= hit ratio), partial, miss (reused < miss ratio).",
            [*pl, "outcome"],
            registry=r,
        )
        self.misses = Counter(
            "llamacpp_prompt_cache_misses",
            "Prompt-cache misses by cause: lora_discard, forced_reprocess (SWA/hybrid memory), evicted (the conversation's RAM-cache entry was evicted before it came back), no_cache_entry, slot_prefix_mismatch, unknown (-lv 3).",
            [*pl, "cause"],
            registry=r,
        )
        self.restores = Counter(
            "llamacpp_prompt_cache_restores",
            "RAM prompt-cache entries restored into a slot, by what became of them. discarded_lora_wrongful: "
            "discarded for a LoRA change although computed under the request's LoRA configuration.",
            ["lora", "result"],
            registry=r,
        )
        self.mismatch = Counter(
            "llamacpp_prompt_cache_lora_mismatch_reuse",
            "Restored RAM-cache entries computed under another LoRA configuration and reused anyway (wrong-output risk).",
            ["lora"],
            registry=r,
        )
        self.prefill_seconds = Histogram(
            "llamacpp_prefill_duration_seconds",
            "Prefill time of a request (slot start to first token, llama-server's prompt eval time).",
            pl,
            buckets=PREFILL_SECONDS_BUCKETS,
            registry=r,
        )
        self.prefill_tokens = Histogram(
            "llamacpp_prefill_tokens",
            "Prompt tokens computed (not reused) by a request's prefill.",
            pl,
            buckets=PREFILL_TOKENS_BUCKETS,
            registry=r,
        )
        self.tpot = Histogram(
            "llamacpp_time_per_output_token_seconds",
            "Mean decode time per output token of a request; contention=prefill when other slots prefilled during more than the configured fraction of its decoding.",
            ["contention"],
            buckets=TPOT_BUCKETS,
            registry=r,
        )
        self.overlap = Counter(
            "llamacpp_decode_prefill_overlap_seconds",
            "Seconds during which this slot was decoding while another slot was prefilling.",
            ["slot"],
            registry=r,
        )
        self.takeovers = Counter(
            "llamacpp_small_task_slot_takeovers",
            "Requests with a small prompt placed on a slot that held a big conversation (e.g. a health probe evicting it).",
            registry=r,
        )
        self.conversation_joins = Counter(
            "llamacpp_exporter_conversation_joins",
            "Requests by how their conversation was found: header (the X-Conversation-Id the request sent), lineage "
            "(it sent none: cache lineage), uncertain (the log cannot prove which request the task was, so no "
            "conversation is named), none (child tasks of n > 1 requests).",
            ["source"],
            registry=r,
        )
        self._slots: set[int] = set()
        for path, lora in itertools.product(PATHS, LORA_STATES):
            # every series exists from the start, so rate() and dashboards see zeros, not gaps
            for m in (self.requests, self.cancelled, self.prompt_tokens, self.reused_tokens):
                m.labels(path, lora)
            self.prefill_seconds.labels(path, lora)
            self.prefill_tokens.labels(path, lora)
            for o in OUTCOMES:
                self.outcomes.labels(path, lora, o)
            for c in MISS_CAUSES:
                self.misses.labels(path, lora, c)
        for lora in LORA_STATES:
            self.mismatch.labels(lora)
            for res in RESTORE_RESULTS:
                self.restores.labels(lora, res)
        for c in CONTENTION:
            self.tpot.labels(c)
        for src in ("header", "lineage", "uncertain", "none"):
            self.conversation_joins.labels(src)

    def slots_known(self, slot_ids: list[int]) -> None:
        self._slots.update(slot_ids)
        for i in slot_ids:
            self.overlap.labels(str(i))

    def record(self, rec: RequestRecord) -> None:
        path, lora = rec.path, rec.lora
        exemplar = {"slot": str(rec.slot), "task": str(rec.task)}
        if rec.conversation:
            exemplar["conversation"] = rec.conversation
        self.conversation_joins.labels(rec.conversation_source or "none").inc()
        if rec.cancelled and rec.generated_tokens is None:
            self.cancelled.labels(path, lora).inc()
        else:
            self.requests.labels(path, lora).inc()
        if rec.prompt_tokens is not None and rec.reused_tokens is not None:
            self.prompt_tokens.labels(path, lora).inc(rec.prompt_tokens)
            self.reused_tokens.labels(path, lora).inc(rec.reused_tokens)
        if rec.outcome is not None:
            self.outcomes.labels(path, lora, rec.outcome).inc()
        if rec.outcome == "miss" and rec.miss_cause is not None:
            self.misses.labels(path, lora, rec.miss_cause).inc()
        if rec.restore_result is not None:
            self.restores.labels(lora, rec.restore_result).inc()
        if rec.lora_mismatch_reuse:
            self.mismatch.labels(lora).inc()
        if rec.small_task_takeover:
            self.takeovers.inc()
        if rec.prefill_seconds is not None:
            self.prefill_seconds.labels(path, lora).observe(rec.prefill_seconds, exemplar)
        if rec.prefill_tokens is not None:
            self.prefill_tokens.labels(path, lora).observe(rec.prefill_tokens, exemplar)
        if rec.time_per_output_token_seconds is not None and rec.contention is not None:
            self.tpot.labels(rec.contention).observe(rec.time_per_output_token_seconds, exemplar)
        if rec.overlap_seconds and rec.slot in self._slots:
            self.overlap.labels(str(rec.slot)).inc(rec.overlap_seconds)


class LogMetrics:
    """Facts read straight from log lines, no assembly needed (the assembler passes them on),
    and the pipeline's own counts of what it read."""

    def __init__(self, registry: CollectorRegistry) -> None:
        r = registry
        self.cache_entries = Gauge(
            "llamacpp_prompt_cache_entries", "Entries in the RAM prompt cache (last cache state line).", registry=r
        )
        self.cache_bytes = Gauge(
            "llamacpp_prompt_cache_bytes", "Size of the RAM prompt cache in bytes (last cache state line).", registry=r
        )
        self.cache_limit = Gauge(
            "llamacpp_prompt_cache_limit_bytes",
            "Size limit of the RAM prompt cache in bytes (--cache-ram).",
            registry=r,
        )
        self.cache_saves = Counter(
            "llamacpp_prompt_cache_saves", "Slot prompts saved into the RAM prompt cache.", registry=r
        )
        self.cache_evictions = Counter(
            "llamacpp_prompt_cache_evictions", "Entries evicted from the RAM prompt cache.", registry=r
        )
        self.cache_evicted_bytes = Counter(
            "llamacpp_prompt_cache_evicted_bytes", "Bytes evicted from the RAM prompt cache.", registry=r
        )
        self.cache_update = Histogram(
            "llamacpp_prompt_cache_update_duration_seconds",
            "Time of one RAM prompt-cache save/load/update at slot selection.",
            buckets=CACHE_UPDATE_BUCKETS,
            registry=r,
        )
        self.prefill_in_progress_gauge = Gauge(
            "llamacpp_slot_prefill_tokens_in_progress",
            "Prompt tokens the slot's running prefill computes; 0 when not prefilling (needs -lv 4).",
            ["slot"],
            registry=r,
        )
        # Counted for every line: plain numbers, rendered at scrape time (no lock, no label
        # lookup on the hot path), as client_python advises for exporters.
        self.lines: dict[str, int] = dict.fromkeys(LOG_LINE_RESULTS, 0)
        self.last_line_time = 0.0
        registry.register(_LineCollector(self))
        self.diag_available = Gauge(
            "llamacpp_exporter_cache_diagnostics_available",
            "1 when llama-server logs at -lv 4 (RAM prompt-cache narrative visible), 0 when not, -1 while unknown.",
            registry=r,
        )
        self.verbosity = Gauge(
            "llamacpp_exporter_server_log_verbosity",
            "llama-server's -lv as read from its log, -1 while unknown.",
            registry=r,
        )
        self.debug_logging = Gauge(
            "llamacpp_exporter_server_debug_logging",
            "1 when llama-server logs DEBUG lines (-lv 5 / -v), which contain prompt text. The exporter drops them.",
            registry=r,
        )
        self.arrivals_dropped = Counter(
            "llamacpp_exporter_conversation_arrivals_dropped",
            "Requests seen arriving (conv_id=) whose task never appeared (rejected, or cancelled by a line the join "
            "could not place), dropped from the conversation join after an idle spell.",
            registry=r,
        )
        self.restarts = Counter(
            "llamacpp_exporter_server_restarts", "llama-server restarts seen in the log (new epochs).", registry=r
        )
        self.server_build_info = Gauge(
            "llamacpp_exporter_server_build_info",
            "1 for the llama-server build read from its log (build 0, commit unknown: built without version info).",
            ["build", "commit"],
            registry=r,
        )
        self.internal_errors = Counter(
            "llamacpp_exporter_internal_errors",
            "Log events the exporter failed to assemble (a bug: please report it). The line is counted in "
            "llamacpp_exporter_log_lines_total as read; its event is skipped.",
            registry=r,
        )
        self.out_of_order = Counter(
            "llamacpp_exporter_log_lines_out_of_order",
            "Lines whose timestamp went back without a restart (a stray line): counted at the current time.",
            registry=r,
        )
        self._slots: set[int] = set()
        self.diag_available.set(-1)
        self.verbosity.set(-1)

    def line_read(self, result: str, now: float | None = None) -> None:
        self.lines[result] += 1
        self.last_line_time = time.time() if now is None else now

    def internal_error(self) -> None:
        self.internal_errors.inc()

    def cache_state(self, entries: int, size_bytes: float, limit_bytes: float) -> None:
        self.cache_entries.set(entries)
        self.cache_bytes.set(size_bytes)
        self.cache_limit.set(limit_bytes)

    def cache_saved(self) -> None:
        self.cache_saves.inc()

    def cache_evicted(self, size_bytes: float) -> None:
        self.cache_evictions.inc()
        self.cache_evicted_bytes.inc(size_bytes)

    def cache_update_duration(self, seconds: float) -> None:
        self.cache_update.observe(seconds)

    def prefill_in_progress(self, slot: int, tokens: int) -> None:
        if slot in self._slots:  # a slot id the server announced: labels stay bounded
            self.prefill_in_progress_gauge.labels(str(slot)).set(tokens)

    def slots_known(self, slot_ids: list[int]) -> None:
        self._slots.update(slot_ids)
        for i in slot_ids:
            self.prefill_in_progress_gauge.labels(str(i))

    def conversation_arrival_dropped(self) -> None:
        self.arrivals_dropped.inc()

    def server_restart(self) -> None:
        self.restarts.inc()

    def server_build(self, number: int, commit: str) -> None:
        self.server_build_info.clear()  # one process at a time: a restart may bring another build
        self.server_build_info.labels(str(number), commit).set(1)

    def out_of_order_lines(self, n: int) -> None:
        self.out_of_order.inc(n)

    def diagnostics(self, available: bool, verbosity: int | None) -> None:
        self.diag_available.set(1 if available else 0)
        if verbosity is not None:
            self.verbosity.set(verbosity)

    def debug_logging_seen(self) -> None:
        self.debug_logging.set(1)


class _LineCollector(Collector):
    def __init__(self, m: LogMetrics) -> None:
        self.m = m

    def collect(self) -> Iterator[Metric]:
        lines = CounterMetricFamily(
            "llamacpp_exporter_log_lines",
            "Log lines read, by result: parsed, ignored (known, not needed), unrecognized (a server line whose "
            "message is unknown: a new build), unreadable (not UTF-8 text, or binary), oversized.",
            labels=["result"],
        )
        for result, n in list(self.m.lines.items()):
            lines.add_metric([result], n)
        yield lines
        yield GaugeMetricFamily(
            "llamacpp_exporter_last_log_line_timestamp_seconds",
            "Unix time at which the last log line was read.",
            value=self.m.last_line_time,
        )
