"""What a finished record feeds, one module per concern: the concern declares its metric families
and how a record updates them (live), and its section of analyze's report (afterwards), side by
side, so the two cannot drift. `concerns.py` lists them; the request metrics and the report take
every concern from there.

The live halves of every concern are built this way; of the report's halves, those of context
shift and speculative decoding so far (the others are still written in offline/report.py).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Final, Protocol

from ..config import MetricsConfig
from ..records import LORA_STATES, PATHS, RequestRecord
from .families import CounterValues, HistogramValues

# the labels of the per-request families by selection path and LoRA state, and their values
PATH_LORA: Final = ["model", "path", "lora"]
PATH_LORA_VALUES: Final = (PATHS, LORA_STATES)

# a report table: title, header, rows, note (the text and Markdown forms share them)
Table = tuple[str, list[str], list[list[str]], str]


class ConcernMetrics(Protocol):
    """The live half: its families, in the order of the exposition, and a record's update."""

    def __init__(self, buckets: MetricsConfig) -> None: ...

    @property
    def families(self) -> list[CounterValues | HistogramValues]: ...

    def update(self, rec: RequestRecord) -> None: ...


class ConcernReport(Protocol):
    """The half afterwards: counts the records of a report, then its section (None: nothing to
    say, and the section is left out), and the section as a table and as CSV rows."""

    key: str  # the section's name in the JSON report and the CSV rows

    def count(self, rec: RequestRecord) -> None: ...

    def result(self) -> dict[str, Any] | None: ...

    @staticmethod
    def table(section: dict[str, Any]) -> Table: ...

    @staticmethod
    def csv_rows(section: dict[str, Any]) -> Iterable[list[Any]]: ...


def ratio(num: float, den: float) -> float | None:
    return round(num / den, 4) if den else None


def percent(r: float | None) -> str:
    return "-" if r is None else f"{100 * r:.1f}%"
