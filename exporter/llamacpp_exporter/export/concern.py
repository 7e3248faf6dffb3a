"""What a finished record feeds, one module per concern: the concern declares its metric families
and how a record updates them (live), and its part of analyze's report (afterwards), side by
side, so the two cannot drift. `concerns.py` lists them; the request metrics and the report take
every concern from there, in that order: the exposition's, and every report format's.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, Final, Literal, Protocol

from ..config import MetricsConfig
from ..records import LORA_STATES, PATHS, RequestRecord
from .families import CounterValues, HistogramValues
from .report_types import Number, Percentiles, Rate, Report, Unknown

# the labels of the per-request families by selection path and LoRA state, and their values
PATH_LORA: Final = ["model", "path", "lora"]
PATH_LORA_VALUES: Final = (PATHS, LORA_STATES)

# the report's rows by selection path and by LoRA state, each with its total
RATE_PATHS: Final = ("ram", "slot", "pinned", "unknown", "all")
RATE_LORA: Final = (*LORA_STATES, "all")
SMALL_SAMPLE: Final = 30  # a rate over fewer requests than this is flagged
PercentileKey = Literal["count", "p50", "p90", "p99", "max"]
PERCENTILE_KEYS: Final[tuple[PercentileKey, ...]] = ("count", "p50", "p90", "p99", "max")

# a report table: title, header, rows, note (the text and Markdown forms share them)
Table = tuple[str, list[str], list[list[str]], str]


class ConcernMetrics(Protocol):
    """The live half: its families, in the order of the exposition, and a record's update."""

    def __init__(self, buckets: MetricsConfig) -> None: ...

    @property
    def families(self) -> list[CounterValues | HistogramValues]: ...

    def update(self, rec: RequestRecord) -> None: ...


class Values(Protocol):
    """Values to take percentiles of, by group: in memory (report.ValueLists) or on disk
    (store.StoredValues)."""

    def add(self, group: str, value: Number) -> None: ...

    def ranked(self, group: str, ranks: Iterable[int]) -> tuple[int, dict[int, Number]]: ...


@dataclass(frozen=True)
class ReportSettings:
    gap_seconds: float  # a conversation's pause after which its cache entry may be gone
    large_prefill_tokens: int  # a prefill this large is a large one
    values: Values


@dataclass(frozen=True)
class ReportInputs:
    """What the report's parts are given besides the records: what was read, and the pipeline's
    conversation costs (None: an events file alone, which does not carry them)."""

    sources: dict[str, Any] = field(default_factory=dict)
    conversations: list[dict[str, Any]] | None = None
    top: int = 10
    join_costs: tuple[float, float] | None = None


class ConcernReport:
    """The half afterwards. ``count`` sees every record of the report (completions and the tasks
    counted apart), ``follow`` every record of the history in start order; ``result`` gives the
    concern's sections of the JSON report (none: nothing to say, and its tables and rows are left
    out), ``unknowns`` what the input could not tell it. ``tables``, ``csv_rows`` and
    ``comparison_rows`` render the sections from the report, so a report read back renders alike."""

    def __init__(self, settings: ReportSettings) -> None:
        self.settings = settings

    def count(self, rec: RequestRecord) -> None:
        raise NotImplementedError

    def follow(self, rec: RequestRecord, in_report: bool) -> None:
        return None

    def result(self, given: ReportInputs) -> dict[str, Any]:
        raise NotImplementedError

    def unknowns(self, given: ReportInputs) -> list[Unknown]:
        return []

    @staticmethod
    def tables(rep: Report) -> list[Table]:
        return []

    @staticmethod
    def csv_rows(rep: Report) -> Iterable[list[Any]]:
        return ()

    @staticmethod
    def comparison_rows(a: Report, b: Report) -> list[list[str]]:
        return []


def ratio(num: float, den: float) -> float | None:
    return round(num / den, 4) if den else None


def percent(r: float | None) -> str:
    return "-" if r is None else f"{100 * r:.1f}%"


def rate(num: int, den: int) -> Rate:
    return {
        "numerator": num,
        "denominator": den,
        "ratio": (num / den) if den else None,
        "small_sample": den < SMALL_SAMPLE,
    }


def fmt_rate(r: Rate) -> str:
    if not r["denominator"]:
        return "-"
    s = f"{100 * (r['ratio'] or 0.0):.0f}% ({r['numerator']}/{r['denominator']})"
    return s + " *" if r["small_sample"] else s


def group_percentiles(values: Values, group: str) -> Percentiles:
    """Count, p50, p90, p99 and max of the group's values: the value at rank int(p * n) of the n
    sorted (None where there is none)."""
    n, _ = values.ranked(group, ())
    if not n:
        return {"count": 0, "p50": None, "p90": None, "p99": None, "max": None, "small_sample": True}
    ranks = {p: min(n - 1, int(p * n)) for p in (0.5, 0.9, 0.99)}
    _, at = values.ranked(group, [*ranks.values(), n - 1])
    return {
        "count": n,
        "p50": at[ranks[0.5]],
        "p90": at[ranks[0.9]],
        "p99": at[ranks[0.99]],
        "max": at[n - 1],
        "small_sample": n < SMALL_SAMPLE,
    }


def secs(v: float | None) -> str:
    return "-" if v is None else f"{v:.3f}"


def cell(v: Any, decimals: int = 3) -> str:
    """A table cell: '-' for unknown, floats to a fixed number of decimals."""
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:.{decimals}f}"
    return str(v)


def percentile_row(name: str, p: Percentiles) -> list[str]:
    return [name, str(p["count"]), *(secs(p[k]) for k in ("p50", "p90", "p99", "max"))]
