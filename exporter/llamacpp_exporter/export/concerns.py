"""Every concern a finished record feeds, built as concern.py describes: the live half and the
half afterwards of each, one line a concern. The request metrics and analyze's report take them
from here, in this order (the exposition's, and the report's in every format)."""

from __future__ import annotations

from typing import Final

from .cache_outcome import CacheOutcomeMetrics, CacheOutcomeReport
from .concern import ConcernMetrics, ConcernReport
from .contention import ContentionMetrics, ContentionReport
from .context_shift import ContextShiftMetrics, ContextShiftReport
from .latency import LatencyMetrics, LatencyReport
from .request_endings import RequestEndingsMetrics, RequestEndingsReport
from .speculative import SpeculativeMetrics, SpeculativeReport
from .task_kinds import TaskKindsMetrics

# (live, afterwards); task kinds have no section of their own: the report's overview of the
# requests (request_endings) counts the tasks apart, and n > 1 is one request
CONCERNS: Final[tuple[tuple[type[ConcernMetrics], type[ConcernReport] | None], ...]] = (
    (RequestEndingsMetrics, RequestEndingsReport),
    (CacheOutcomeMetrics, CacheOutcomeReport),
    (LatencyMetrics, LatencyReport),
    (ContentionMetrics, ContentionReport),
    (TaskKindsMetrics, None),
    (ContextShiftMetrics, ContextShiftReport),
    (SpeculativeMetrics, SpeculativeReport),
)
REPORT_PARTS: Final[tuple[type[ConcernReport], ...]] = tuple(report for _, report in CONCERNS if report is not None)
