"""How long requests took: prefill (and the tokens it computed), time per output token by
contention, and, where the log pins the arrival, queue time, time to first token and end to end.
Exemplars name the slot, the task and the conversation. Afterwards, the report's prefill
durations by selection path and its count of large prefills (time per output token is read there
as contention: contention.py)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Final

from ..config import MetricsConfig
from ..records import CONTENTION, RequestRecord, end_to_end_seconds, ended_unanswered, time_to_first_token
from .concern import (
    PATH_LORA,
    PATH_LORA_VALUES,
    PERCENTILE_KEYS,
    RATE_PATHS,
    ConcernReport,
    ReportInputs,
    ReportSettings,
    Table,
    group_percentiles,
    percentile_row,
    secs,
)
from .families import CounterValues, HistogramValues
from .report_types import Report
from .traces import trace_id_hex

PREFILL_TOKENS_BUCKETS: Final = tuple(float(2**i) for i in range(18))  # 1 .. 131072


class LatencyMetrics:
    def __init__(self, buckets: MetricsConfig) -> None:
        b = buckets
        self.trace_exemplars = False  # traces are sent: exemplars carry the request's trace id
        self.prefill_seconds = HistogramValues(
            "llamacpp_prefill_duration_seconds",
            "Prefill time of a request (slot start to first token, llama-server's prompt eval time).",
            PATH_LORA,
            b.prefill_duration_buckets,
            PATH_LORA_VALUES,
        )
        self.prefill_tokens = HistogramValues(
            "llamacpp_prefill_tokens",
            "Prompt tokens computed (not reused) by a request's prefill.",
            PATH_LORA,
            PREFILL_TOKENS_BUCKETS,
            PATH_LORA_VALUES,
        )
        self.tpot = HistogramValues(
            "llamacpp_time_per_output_token_seconds",
            "Mean decode time per output token of a request; contention=prefill when other slots prefilled during more than the configured fraction of its decoding.",
            ["model", "contention"],
            b.time_per_output_token_buckets,
            (CONTENTION,),
        )
        self.queue = HistogramValues(
            "llamacpp_request_queue_seconds",
            "Time a request waited from its arrival (its conv_id line, -lv 4) to its launch on a slot: for a free "
            "slot, tokenizing; on a busy server, waiting for one. Observed where the log pins the arrival "
            "to within 25 ms (else counted in llamacpp_request_latency_unknown_total).",
            ["model"],
            b.latency_buckets,
            (),
        )
        self.ttft = HistogramValues(
            "llamacpp_time_to_first_token_seconds",
            "Time to first token of a request: its queue time plus its prefill (llama-server's prompt eval time).",
            ["model"],
            b.latency_buckets,
            (),
        )
        self.e2e = HistogramValues(
            "llamacpp_request_duration_seconds",
            "End-to-end time of a request in llama-server: from its arrival to its slot's release (queue, "
            "prefill and generation).",
            ["model"],
            b.latency_buckets,
            (),
        )
        self.latency_unknown = CounterValues(
            "llamacpp_request_latency_unknown",
            "Completed requests whose queue time, time to first token and end-to-end time are not observed: the log "
            "does not pin their arrival (below -lv 4, or several requests arrived at once and the task ids do not "
            "tell which was which).",
            ["model"],
            (),
        )
        self.families: list[CounterValues | HistogramValues] = [
            self.prefill_seconds,
            self.prefill_tokens,
            self.tpot,
            self.queue,
            self.ttft,
            self.e2e,
            self.latency_unknown,
        ]

    def update(self, rec: RequestRecord) -> None:
        if rec.kind != "completion":
            return
        key = (rec.model, rec.path, rec.lora)
        exemplar = {"slot": str(rec.slot), "task": str(rec.task)}
        if rec.conversation:
            exemplar["conversation"] = rec.conversation
        if self.trace_exemplars:
            exemplar["trace_id"] = trace_id_hex(rec.key)
        if not ended_unanswered(rec):
            self._latency(rec, exemplar)
        if rec.prefill_seconds is not None:
            self.prefill_seconds.observe(key, rec.prefill_seconds, exemplar)
        if rec.prefill_tokens is not None:
            self.prefill_tokens.observe(key, rec.prefill_tokens, exemplar)
        if rec.time_per_output_token_seconds is not None and rec.contention is not None:
            self.tpot.observe((rec.model, rec.contention), rec.time_per_output_token_seconds, exemplar)

    def _latency(self, rec: RequestRecord, exemplar: dict[str, str]) -> None:
        key = (rec.model,)
        q, ttft, e2e = rec.queue_seconds, time_to_first_token(rec), end_to_end_seconds(rec)
        if q is None or ttft is None or e2e is None:
            self.latency_unknown.add(key)
            return
        self.queue.observe(key, q, exemplar)
        self.ttft.observe(key, ttft, exemplar)
        self.e2e.observe(key, e2e, exemplar)


class LatencyReport(ConcernReport):
    def __init__(self, settings: ReportSettings) -> None:
        super().__init__(settings)
        self.large = 0

    def count(self, rec: RequestRecord) -> None:
        if rec.kind != "completion":
            return
        if rec.prefill_seconds is not None:
            self.settings.values.add("prefill:" + rec.path, rec.prefill_seconds)
            self.settings.values.add("prefill:all", rec.prefill_seconds)
        self.large += (rec.prefill_tokens or 0) >= self.settings.large_prefill_tokens

    def result(self, given: ReportInputs) -> dict[str, Any]:
        return {
            "prefill_seconds": {p: group_percentiles(self.settings.values, "prefill:" + p) for p in RATE_PATHS},
            "large_prefills": {"min_tokens": self.settings.large_prefill_tokens, "count": self.large},
        }

    @staticmethod
    def tables(rep: Report) -> list[Table]:
        large = rep["large_prefills"]
        return [
            (
                "Prefill duration (s)",
                ["path", "count", "p50", "p90", "p99", "max"],
                [percentile_row(p, rep["prefill_seconds"][p]) for p in RATE_PATHS],
                f"large prefills (>= {large['min_tokens']} tokens computed): {large['count']}",
            )
        ]

    @staticmethod
    def csv_rows(rep: Report) -> Iterable[list[Any]]:
        for p in RATE_PATHS:
            for k in PERCENTILE_KEYS:
                yield ["prefill_seconds", p, "", k, "", "", rep["prefill_seconds"][p][k]]

    @staticmethod
    def comparison_rows(a: Report, b: Report) -> list[list[str]]:
        pa, pb = a["prefill_seconds"]["all"], b["prefill_seconds"]["all"]
        return [[f"prefill duration {q} (s)", secs(pa[q]), secs(pb[q])] for q in ("p50", "p90")]
