"""Every concern a finished record feeds, built as concern.py describes: the live half and the
half afterwards of each, one line a concern. The request metrics and analyze's report take them
from here, in this order (the exposition's and the report's)."""

from __future__ import annotations

from typing import Final

from .concern import ConcernMetrics, ConcernReport
from .context_shift import ContextShiftMetrics, ContextShiftReport
from .speculative import SpeculativeMetrics, SpeculativeReport

CONCERNS: Final[tuple[tuple[type[ConcernMetrics], type[ConcernReport]], ...]] = (
    (ContextShiftMetrics, ContextShiftReport),
    (SpeculativeMetrics, SpeculativeReport),
)
