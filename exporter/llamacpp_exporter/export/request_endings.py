"""How requests ended: completed (by selection path and LoRA state), cancelled or failed, why
each ended as the log states it, and those that never started on a slot."""

from __future__ import annotations

from ..config import MetricsConfig
from ..records import FINISH_REASONS, RequestRecord, ended_unanswered, finish_reason
from .concern import PATH_LORA, PATH_LORA_VALUES
from .families import CounterValues, HistogramValues


class RequestEndingsMetrics:
    def __init__(self, buckets: MetricsConfig) -> None:
        self.requests = CounterValues(
            "llamacpp_requests",
            "Requests (tasks) completed, by slot-selection path and LoRA state.",
            PATH_LORA,
            PATH_LORA_VALUES,
        )
        self.cancelled = CounterValues(
            "llamacpp_requests_cancelled",
            "Requests that ended without a timings block (cancelled or failed).",
            PATH_LORA,
            PATH_LORA_VALUES,
        )
        self.finished = CounterValues(
            "llamacpp_requests_finished",
            "Requests (tasks) that ended on a slot, by how, where the log states it: stop (an end of sequence, a stop "
            "word or the token limit), truncated (the context filled up), cancelled (the client went away while it "
            "ran), failed (an error), unknown (no timings and no cancel or error line: the log does not show how "
            "it ended, e.g. a build that stopped logging its timings; never counted as a failure).",
            ["model", "reason"],
            (FINISH_REASONS,),
        )
        self.not_started = CounterValues(
            "llamacpp_requests_never_started",
            "Requests that arrived (their conv_id line, -lv 4) and never started on a slot: their client gave up "
            "while they were queued, or llama-server rejected them first. Counted once the server idles and the "
            "log accounts for every arrival (never on a server that is never idle).",
            ["model"],
            (),
        )
        self.families: list[CounterValues | HistogramValues] = [
            self.requests,
            self.cancelled,
            self.finished,
            self.not_started,
        ]

    def update(self, rec: RequestRecord) -> None:
        if rec.kind != "completion":
            return
        key = (rec.model, rec.path, rec.lora)
        self.finished.add((rec.model, finish_reason(rec)))
        if ended_unanswered(rec):
            self.cancelled.add(key)
        else:
            self.requests.add(key)

    def never_started(self, model: str) -> None:
        self.not_started.add((model,))
