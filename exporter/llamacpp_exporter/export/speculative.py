"""Speculative decoding: of the tokens a draft model proposed, how many the target accepted, per
request, where the build logs it (``draft acceptance = R (A accepted / G generated)``, INFO, with
the task's timings; b11434 and b11549 log it when they draft, with ``--spec-type``).

A request the log says nothing of (it drafted nothing, or its build does not log it) counts in
no series and no figure: unknown is never shown as 0. The series of a model appear with its
first request that drafted. An ``n > 1`` request counts its first choice's drafts (the record's
task; its other choices are tasks without records).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from ..config import MetricsConfig
from ..records import LORA_STATES, RequestRecord
from .concern import ConcernReport, ReportInputs, ReportSettings, Table, percent, ratio
from .families import CounterValues, HistogramValues
from .report_types import Report


def drafted(rec: RequestRecord) -> bool:
    return rec.kind == "completion" and rec.draft_tokens_generated is not None


class SpeculativeMetrics:
    def __init__(self, buckets: MetricsConfig) -> None:
        labels = ["model", "lora"]
        self.requests = CounterValues(
            "llamacpp_draft_requests",
            "Completed requests whose log reports speculative decoding (draft acceptance at the task's end), by LoRA "
            "state. Absent where the build does not log it or nothing drafted: unknown, never 0.",
            labels,
        )
        self.generated = CounterValues(
            "llamacpp_draft_tokens",
            "Tokens the draft model proposed to those requests (speculative decoding).",
            labels,
        )
        self.accepted = CounterValues(
            "llamacpp_draft_tokens_accepted",
            "Draft tokens the target model accepted: over llamacpp_draft_tokens_total, the acceptance rate. A LoRA "
            "adapter on the target and not on the draft lowers it.",
            labels,
        )
        self.families: list[CounterValues | HistogramValues] = [self.requests, self.generated, self.accepted]

    def update(self, rec: RequestRecord) -> None:
        if not drafted(rec):
            return
        key = (rec.model, rec.lora)
        self.requests.add(key)
        self.generated.add(key, rec.draft_tokens_generated or 0)
        self.accepted.add(key, rec.draft_tokens_accepted or 0)


class SpeculativeReport(ConcernReport):
    key = "speculative_decoding"

    def __init__(self, settings: ReportSettings) -> None:
        super().__init__(settings)
        # by LoRA state: requests, draft tokens, accepted tokens
        self.by_lora: dict[str, list[int]] = {}
        self.completed = 0
        self.lowest: float | None = None

    def count(self, rec: RequestRecord) -> None:
        if rec.kind != "completion":
            return
        self.completed += 1
        if not drafted(rec):
            return
        for lo in (rec.lora, "all"):
            row = self.by_lora.setdefault(lo, [0, 0, 0])
            row[0] += 1
            row[1] += rec.draft_tokens_generated or 0
            row[2] += rec.draft_tokens_accepted or 0
        if rec.draft_acceptance is not None and (self.lowest is None or rec.draft_acceptance < self.lowest):
            self.lowest = rec.draft_acceptance

    def result(self, given: ReportInputs) -> dict[str, Any]:
        section = self._section()
        return {} if section is None else {self.key: section}

    def _section(self) -> dict[str, Any] | None:
        if not self.by_lora:
            return None
        return {
            "completed_requests": self.completed,
            "by_lora": {
                lo: {"requests": n, "draft_tokens": g, "accepted_tokens": a, "acceptance": ratio(a, g)}
                for lo in (*LORA_STATES, "all")
                if (row := self.by_lora.get(lo))
                for n, g, a in [row]
            },
            "lowest_request_acceptance": self.lowest,
        }

    @staticmethod
    def tables(rep: Report) -> list[Table]:
        section = rep.get("speculative_decoding")
        return [] if section is None else [SpeculativeReport._table(section)]

    @staticmethod
    def _table(section: dict[str, Any]) -> Table:
        rows = [
            [lo, str(r["requests"]), str(r["draft_tokens"]), str(r["accepted_tokens"]), percent(r["acceptance"])]
            for lo, r in section["by_lora"].items()
        ]
        return (
            "Speculative decoding: draft tokens the target accepted",
            ["LoRA state", "requests", "draft tokens", "accepted", "acceptance"],
            rows,
            f"requests whose log reports drafts, of {section['completed_requests']} completed; lowest acceptance of "
            f"a request: {percent(section['lowest_request_acceptance'])}",
        )

    @staticmethod
    def csv_rows(rep: Report) -> Iterable[list[Any]]:
        section = rep.get("speculative_decoding")
        if section is None:
            return
        for lo, r in section["by_lora"].items():
            yield ["speculative_decoding", "", lo, "requests", "", "", r["requests"]]
            yield [
                "speculative_decoding",
                "",
                lo,
                "acceptance",
                r["accepted_tokens"],
                r["draft_tokens"],
                r["acceptance"],
            ]
        yield [
            "speculative_decoding",
            "",
            "",
            "lowest_request_acceptance",
            "",
            "",
            section["lowest_request_acceptance"],
        ]
