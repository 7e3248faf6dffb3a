"""Context shift: the context filled up and llama-server dropped part of the request's history
(the tokens after the first n_keep) to go on generating (``--context-shift``; ``slot context
shift, n_keep, n_left, n_discard``, WARN, so at every verbosity). The model silently forgot part of
the conversation: beside truncation, the other way a full context ends up.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from ..config import MetricsConfig
from ..records import RequestRecord
from .concern import ConcernReport, ReportInputs, ReportSettings, Table, percent, ratio
from .families import CounterValues, HistogramValues
from .report_types import Report


class ContextShiftMetrics:
    def __init__(self, buckets: MetricsConfig) -> None:
        self.requests = CounterValues(
            "llamacpp_requests_context_shifted",
            "Completed requests whose context filled up and that went on after llama-server dropped part of their "
            "history (context shift): the model forgot part of the conversation.",
            ["model"],
            (),
        )
        self.shifts = CounterValues(
            "llamacpp_context_shifts",
            "Context shifts of completed requests (one request can shift more than once).",
            ["model"],
            (),
        )
        self.discarded = CounterValues(
            "llamacpp_context_shift_discarded_tokens",
            "Tokens of history dropped by those context shifts.",
            ["model"],
            (),
        )
        self.families: list[CounterValues | HistogramValues] = [self.requests, self.shifts, self.discarded]

    def update(self, rec: RequestRecord) -> None:
        if rec.context_shifts and rec.kind == "completion":
            key = (rec.model,)
            self.requests.add(key)
            self.shifts.add(key, rec.context_shifts)
            self.discarded.add(key, rec.context_shift_discarded_tokens)


class ContextShiftReport(ConcernReport):
    key = "context_shift"

    def __init__(self, settings: ReportSettings) -> None:
        super().__init__(settings)
        self.completed = self.requests = self.shifts = self.discarded = self.most = 0

    def count(self, rec: RequestRecord) -> None:
        if rec.kind != "completion":
            return
        self.completed += 1
        if rec.context_shifts:
            self.requests += 1
            self.shifts += rec.context_shifts
            self.discarded += rec.context_shift_discarded_tokens
            self.most = max(self.most, rec.context_shift_discarded_tokens)

    def result(self, given: ReportInputs) -> dict[str, Any]:
        section = self._section()
        return {} if section is None else {self.key: section}

    def _section(self) -> dict[str, Any] | None:
        if not self.requests:
            return None  # nothing to say (the line is logged at every verbosity: none shifted)
        return {
            "requests": self.requests,
            "completed_requests": self.completed,
            "share": ratio(self.requests, self.completed),
            "shifts": self.shifts,
            "discarded_tokens": self.discarded,
            "most_discarded_by_a_request": self.most,
        }

    @staticmethod
    def tables(rep: Report) -> list[Table]:
        section = rep.get("context_shift")
        return [] if section is None else [ContextShiftReport._table(section)]

    @staticmethod
    def _table(section: dict[str, Any]) -> Table:
        return (
            "Context shifts: requests that forgot part of their conversation",
            ["", "value"],
            [
                ["requests", f"{section['requests']} of {section['completed_requests']} ({percent(section['share'])})"],
                ["context shifts", str(section["shifts"])],
                ["history tokens dropped", str(section["discarded_tokens"])],
                ["most dropped by one request", str(section["most_discarded_by_a_request"])],
            ],
            "the context filled up and llama-server dropped history to go on (--context-shift); without it such a "
            "request ends truncated",
        )

    @staticmethod
    def csv_rows(rep: Report) -> Iterable[list[Any]]:
        section = rep.get("context_shift")
        if section is None:
            return
        yield [
            "context_shift",
            "",
            "",
            "requests",
            section["requests"],
            section["completed_requests"],
            section["share"],
        ]
        for k in ("shifts", "discarded_tokens", "most_discarded_by_a_request"):
            yield ["context_shift", "", "", k, "", "", section[k]]
