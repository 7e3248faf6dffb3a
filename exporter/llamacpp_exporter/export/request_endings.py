"""How requests ended: completed (by selection path and LoRA state), cancelled or failed, why
each ended as the log states it, and those that never started on a slot. Afterwards, the
report's overview of the requests: how many, how they ended, their tokens, models, LoRA states
and selection paths, and the tasks counted apart."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from typing import Any

from ..config import MetricsConfig
from ..records import FINISH_REASONS, LORA_STATES, PATHS, RequestRecord, ended_unanswered, finish_reason
from .concern import PATH_LORA, PATH_LORA_VALUES, ConcernReport, ReportInputs, ReportSettings, Table, fmt_rate, rate
from .families import CounterValues, HistogramValues
from .report_types import Report, Unknown


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


class RequestEndingsReport(ConcernReport):
    def __init__(self, settings: ReportSettings) -> None:
        super().__init__(settings)
        self.total = self.finished = self.lora_known = self.embedding_tasks = 0
        self.known = self.prompt_tokens = self.reused_tokens = 0
        self.epochs: set[int] = set()
        self.by_model: Counter[str] = Counter()
        self.by_lora: Counter[str] = Counter()
        self.by_path: Counter[str] = Counter()

    def count(self, rec: RequestRecord) -> None:
        if rec.kind != "completion":
            # embedding and rerank tasks are no completion requests: counted apart, as the exporter does
            self.embedding_tasks += 1
            return
        self.total += 1
        self.by_model[rec.model or ""] += 1
        self.epochs.add(rec.epoch)
        # the live exporter's rules, so that analyze and the exporter count alike: a request
        # without a timings block is cancelled; tokens count where both prompt and reused are known
        self.finished += not ended_unanswered(rec)
        if rec.prompt_tokens is not None and rec.reused_tokens is not None:
            self.known += 1
            self.prompt_tokens += rec.prompt_tokens
            self.reused_tokens += rec.reused_tokens
        self.lora_known += rec.lora in ("none", "active")
        self.by_lora[rec.lora] += 1
        self.by_path[rec.path] += 1

    def result(self, given: ReportInputs) -> dict[str, Any]:
        models = sorted(self.by_model)
        return {
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
            }
        }

    def unknowns(self, given: ReportInputs) -> list[Unknown]:
        if not self.total:
            return []  # the report says no request was found
        if self.lora_known == 0:
            why = (
                "the events files given hold no LoRA state: the exporter that wrote them did not see these tasks "
                "in /slots"
                if given.sources.get("events_files")
                else "a log alone does not say which LoRA adapters a request used: pass the exporter's events file "
                "(--events), recorded while it polled /slots"
            )
            return [{"what": "LoRA state", "requests": self.total, "why": why}]
        if self.lora_known < self.total:
            return [
                {
                    "what": "LoRA state",
                    "requests": self.total - self.lora_known,
                    "why": "/slots did not show these tasks while they ran (no events record, or a poll missed them)",
                }
            ]
        return []

    @staticmethod
    def tables(rep: Report) -> list[Table]:
        rq = rep["requests"]
        rows = [
            [
                "requests (finished + cancelled/failed)",
                f"{rq['total']} ({rq['finished']} + {rq['cancelled_or_failed']})",
            ],
            ["server runs in the log", str(rq["server_runs"])],
        ]
        if rq.get("by_model"):
            rows.append(["by model (a router's)", ", ".join(f"{m or '-'} {n}" for m, n in rq["by_model"].items())])
        if rq.get("embedding_tasks"):
            rows.append(["embedding tasks (apart: no cache use)", str(rq["embedding_tasks"])])
        rows += [
            ["prompt tokens", f"{rq['prompt_tokens']} (known for {rq['tokens_known_for']} requests)"],
            ["reused tokens", str(rq["reused_tokens"])],
            ["reused share of prompt tokens", fmt_rate(rq["reuse"])],
            ["by LoRA state", ", ".join(f"{k} {v}" for k, v in rq["by_lora"].items())],
            ["by selection path", ", ".join(f"{k} {v}" for k, v in rq["by_path"].items())],
        ]
        return [("Requests", ["", "value"], rows, "")]

    @staticmethod
    def csv_rows(rep: Report) -> Iterable[list[Any]]:
        rq = rep["requests"]
        for k in ("total", "finished", "cancelled_or_failed", "server_runs", "prompt_tokens", "reused_tokens"):
            yield ["requests", "", "", k, "", "", rq[k]]

    @staticmethod
    def comparison_rows(a: Report, b: Report) -> list[list[str]]:
        return [["requests", str(a["requests"]["total"]), str(b["requests"]["total"])]]
