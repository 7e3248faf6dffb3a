"""Every concern a finished record feeds, built as concern.py describes: the live half and the
half afterwards of each, one line a concern. The request metrics and analyze's report take them
from here, in this order (the exposition's and the report's)."""

from __future__ import annotations

from typing import Final

from .cache_outcome import CacheOutcomeMetrics
from .concern import ConcernMetrics, ConcernReport
from .contention import ContentionMetrics
from .context_shift import ContextShiftMetrics, ContextShiftReport
from .latency import LatencyMetrics
from .request_endings import RequestEndingsMetrics
from .speculative import SpeculativeMetrics, SpeculativeReport
from .task_kinds import TaskKindsMetrics

# (live, afterwards): None where the concern's section of the report is still written in
# offline/report.py
CONCERNS: Final[tuple[tuple[type[ConcernMetrics], type[ConcernReport] | None], ...]] = (
    (RequestEndingsMetrics, None),
    (CacheOutcomeMetrics, None),
    (LatencyMetrics, None),
    (ContentionMetrics, None),
    (TaskKindsMetrics, None),
    (ContextShiftMetrics, ContextShiftReport),
    (SpeculativeMetrics, SpeculativeReport),
)
