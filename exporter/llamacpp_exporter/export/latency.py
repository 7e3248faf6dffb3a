"""How long requests took: prefill (and the tokens it computed), time per output token by
contention, and, where the log pins the arrival, queue time, time to first token and end to end.
Exemplars name the slot, the task and the conversation."""

from __future__ import annotations

from typing import Final

from ..config import MetricsConfig
from ..records import CONTENTION, RequestRecord, ended_unanswered
from .concern import PATH_LORA, PATH_LORA_VALUES
from .families import CounterValues, HistogramValues

PREFILL_TOKENS_BUCKETS: Final = tuple(float(2**i) for i in range(18))  # 1 .. 131072


class LatencyMetrics:
    def __init__(self, buckets: MetricsConfig) -> None:
        b = buckets
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
        q = rec.queue_seconds
        if q is None or rec.prefill_seconds is None or rec.start_us is None or rec.end_us is None:
            self.latency_unknown.add(key)
            return
        self.queue.observe(key, q, exemplar)
        self.ttft.observe(key, q + rec.prefill_seconds, exemplar)
        self.e2e.observe(key, q + (rec.end_us - rec.start_us) / 1e6, exemplar)
