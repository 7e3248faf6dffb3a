"""Prometheus metrics of what the log says: per finished request (RequestMetrics) and per line
(LogMetrics: the RAM cache's own figures, the server's build and verbosity, the pipeline's
counts). The poller, the log source and the events file own their self-metrics.

Every metric lives on a registry passed in, never the global one. Label values come
from fixed sets (records.py) or slot ids the server announced, so cardinality is bounded.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Final, TypeVar

from prometheus_client import CollectorRegistry, Counter, Gauge
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from ..config import MetricsConfig
from ..records import ConversationProof, RequestRecord
from .concern import ConcernMetrics
from .concerns import CONCERNS
from .contention import ContentionMetrics
from .conversations import ConversationCosts
from .exposition import Encoding, render_families
from .families import CounterValues, FamiliesCollector, GaugeValues, HistogramValues
from .latency import LatencyMetrics
from .request_endings import RequestEndingsMetrics

CACHE_UPDATE_BUCKETS: Final = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5)
LOG_LINE_RESULTS: Final = ("parsed", "ignored", "unrecognized", "unreadable", "oversized")
# (logger, function) pairs of unrecognized lines kept apart; past this many a new pair counts as
# (logger, "other"): function names come from the log, and a label's values must stay few
MAX_UNRECOGNIZED_KINDS: Final = 64
# what the log accounts for, in the order of llamacpp_exporter_log_tokens_total's kinds
LOG_TOKEN_KINDS: Final = ("prompt_computed", "prompt_cached", "generated")


_C = TypeVar("_C")


class RequestMetrics(FamiliesCollector):
    """One finished request record -> the families of every concern it feeds (concerns.py), in
    the order of the exposition.

    Plain numbers, turned into metric families at scrape time: a record's dozen updates cost
    no locks, and a scrape builds its samples without prometheus_client's per-child machinery.
    """

    def __init__(
        self, registry: CollectorRegistry, buckets: MetricsConfig | None = None, trace_exemplars: bool = False
    ) -> None:
        b = buckets or MetricsConfig()
        self.concerns: list[ConcernMetrics] = [live(b) for live, _ in CONCERNS]
        _the(self.concerns, LatencyMetrics).trace_exemplars = trace_exemplars
        super().__init__([f for c in self.concerns for f in c.families])
        # the concerns told of more than records
        self.endings = _the(self.concerns, RequestEndingsMetrics)
        self.contention = _the(self.concerns, ContentionMetrics)
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
        self.contention.slots_known(model, slot_ids)

    def record(self, rec: RequestRecord) -> None:
        if rec.model not in self.models:
            self.model_known(rec.model)
        for c in self.concerns:
            c.update(rec)

    def proven(self, rec: RequestRecord, proof: ConversationProof) -> None:
        """A late proof changes no request series: the join series count how a request's
        conversation was found when it went out, and its cost once the log settled it."""

    def never_started(self, model: str) -> None:
        self.endings.never_started(model)

    def join_cost(self, model: str, source: str, seconds: float) -> None:
        self.contention.join_cost(model, source, seconds)


def _the(concerns: list[ConcernMetrics], kind: type[_C]) -> _C:
    return next(c for c in concerns if isinstance(c, kind))


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
        # counted or observed at cache lines: plain numbers too
        self.cache_saves = CounterValues(
            "llamacpp_prompt_cache_saves", "Slot prompts saved into the RAM prompt cache.", m, space=()
        )
        self.cache_evictions = CounterValues(
            "llamacpp_prompt_cache_evictions", "Entries evicted from the RAM prompt cache.", m, space=()
        )
        self.cache_evicted_bytes = CounterValues(
            "llamacpp_prompt_cache_evicted_bytes", "Bytes evicted from the RAM prompt cache.", m, space=()
        )
        self.cache_update = HistogramValues(
            "llamacpp_prompt_cache_update_duration_seconds",
            "Time of one RAM prompt-cache save/load/update at slot selection.",
            m,
            buckets=CACHE_UPDATE_BUCKETS,
            space=(),
        )
        self._cache_families = (self.cache_saves, self.cache_evictions, self.cache_evicted_bytes, self.cache_update)
        registry.register(FamiliesCollector(list(self._cache_families)))
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
        self.log_tokens = CounterValues(
            "llamacpp_exporter_log_tokens",
            "Tokens the log accounts for, by kind, of every task that ended (child tasks of n > 1 requests and "
            "embeddings too): prompt_computed (its timings, or its prompt less what it reused), prompt_cached "
            "(reused from the slot or the RAM cache, where known), generated (its timings). Compare with "
            "llama-server's own counters (llamacpp_server_prompt_tokens_total, _prompt_tokens_cached_total, "
            "_tokens_predicted_total): far less means the exporter is blind (LlamaCppExporterBlind).",
            ["model", "kind"],
            space=(LOG_TOKEN_KINDS,),
        )
        registry.register(FamiliesCollector([self.log_tokens]))
        self.out_of_order = Counter(
            "llamacpp_exporter_log_lines_out_of_order",
            "Lines whose timestamp went back without a restart (a stray line): counted at the current time.",
            m,
            registry=r,
        )
        self._slots: dict[str, set[int]] = {}
        self.models: set[str] = set()
        self._builds: dict[str, tuple[str, str]] = {}  # model -> the build labels it shows
        self.restarts_seen = 0  # of every model, forgotten ones too
        # the families labelled by model alone: a model's series exist from model_known (at 0,
        # or -1 while unknown) to forget_model. A new one is added here, and nowhere else.
        self._model_values = (self.cache_entries, self.cache_bytes, self.cache_limit)
        self._model_counts: tuple[Counter | Gauge, ...] = (
            self.arrivals_dropped,
            self.restarts,
            self.out_of_order,
            self.debug_logging,
        )
        self._model_unknown = (self.diag_available, self.verbosity)
        self.model_known("")

    def model_known(self, model: str) -> None:
        if model in self.models:
            return
        self.models.add(model)
        for v in self._model_values:
            v.values.setdefault((model,), 0.0)
        for k in self._model_counts:
            k.labels(model)
        for g in self._model_unknown:
            g.labels(model).set(-1)
        for f in (*self._cache_families, self.log_tokens):
            f.known(model)

    def forget_model(self, model: str) -> None:
        """A model the log no longer serves (a router's "", a child that exited): its series go."""
        if model not in self.models:
            return
        self.models.discard(model)
        for v in self._model_values:
            v.values.pop((model,), None)
        for g in (*self._model_counts, *self._model_unknown):
            try:
                g.remove(model)
            except KeyError:
                pass
        for f in (*self._cache_families, self.log_tokens):
            f.forget(model)
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

    def cache_state(self, model: str, entries: int, size_bytes: float, limit_bytes: float) -> None:
        key = (model,)
        self.cache_entries.values[key] = float(entries)
        self.cache_bytes.values[key] = size_bytes
        self.cache_limit.values[key] = limit_bytes

    def cache_saved(self, model: str) -> None:
        self.cache_saves.add((model,))

    def cache_evicted(self, model: str, size_bytes: float) -> None:
        self.cache_evictions.add((model,))
        self.cache_evicted_bytes.add((model,), size_bytes)

    def cache_update_duration(self, model: str, seconds: float) -> None:
        self.cache_update.observe((model,), seconds, None)

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
        values = self.log_tokens.values
        for kind, n in zip(LOG_TOKEN_KINDS, (computed, cached, generated), strict=True):
            if n:
                key = (model, kind)
                values[key] = values.get(key, 0.0) + n

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
