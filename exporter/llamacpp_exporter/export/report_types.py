"""The report of `analyze` as types: what each part holds, under the names its JSON output
uses. The report stays plain dicts and lists (`--format json` writes it as it is); these
declarations let the type checker hold every reader and writer of a key to one spelling."""

from __future__ import annotations

from typing import Any, TypedDict

# a count or a measure: a count of requests or tokens stays an int (compiled, a value typed float
# would turn 125 tokens into 125.0, and the report would print 125.000)
Number = int | float


class Rate(TypedDict):
    """A rate with its numerator and denominator; small_sample below concern.SMALL_SAMPLE."""

    numerator: int
    denominator: int
    ratio: float | None
    small_sample: bool


class Percentiles(TypedDict):
    count: int
    p50: float | None
    p90: float | None
    p99: float | None
    max: float | None
    small_sample: bool


# selection path (and "all") -> LoRA state (and "all") -> the miss rate of that cell
MissTable = dict[str, dict[str, Rate]]
# LoRA state (and "all") -> miss cause, or restore result -> requests
ByLora = dict[str, dict[str, int]]


class Requests(TypedDict):
    total: int
    finished: int
    cancelled_or_failed: int
    server_runs: int
    prompt_tokens: int
    reused_tokens: int
    tokens_known_for: int
    reuse: Rate
    by_lora: dict[str, int]
    by_path: dict[str, int]
    embedding_tasks: int
    by_model: dict[str, int]


class Unknown(TypedDict):
    """What the input cannot tell, for how many requests, and why."""

    what: str
    requests: int
    why: str


class CouldHaveHit(TypedDict):
    gap_seconds: float
    excluded: dict[str, int]  # cache_outcome.EXCLUSIONS -> requests left out for it
    considered: int
    miss_rate: MissTable


class CurvePoint(TypedDict):
    factor: float
    cache_ram_mib: int | None
    misses_avoided: int
    prefill_seconds_avoided: float


class CacheSizeCurve(TypedDict):
    """Would a larger --cache-ram have helped (see cache_outcome.CacheSizeCurveCount)."""

    evicted_misses: int
    prefill_seconds: float
    size_unknown: int
    no_byte_limit: int
    with_checkpoints: int
    limit_mib: float | None
    points: list[CurvePoint]


class LargePrefills(TypedDict):
    min_tokens: int
    count: int


class TimePerOutputToken(TypedDict):
    while_another_slot_prefilled: Percentiles
    while_a_large_prefill_ran: Percentiles
    no_concurrent_prefill: Percentiles
    large_prefill_tokens: int
    prefill_size_unknown: int


class _TopConversations(TypedDict):
    by: str  # cost_to_others_seconds (from the log) or prefill_seconds (an events file alone)
    rows: list[dict[str, Any]]


class TopConversations(_TopConversations, total=False):
    note: str


class Finding(TypedDict):
    """A finding in plain words (findings.py), past its threshold."""

    finding: str  # its name
    severity: str
    summary: str
    evidence: dict[str, Any]
    action: str


class Share(TypedDict):
    named: Number  # requests, or seconds
    total: Number


class Named(TypedDict):
    """How much has a conversation: completed requests, their prefill seconds, and the seconds
    of other requests' decoding their prefills overlapped (None: an events file alone)."""

    requests: Share
    prefill_seconds: Share
    cost_to_others_seconds: Share | None


class _Report(TypedDict):
    sources: dict[str, Any]  # what was read: files, lines, runs (analyze.Analysis.sources)
    findings: list[Finding]
    requests: Requests
    miss_rate: MissTable
    could_have_hit: CouldHaveHit
    miss_causes: ByLora
    restores: ByLora
    cache_size_curve: CacheSizeCurve
    lora_mismatch_reuse: dict[str, int]
    prefill_seconds: dict[str, Percentiles]  # by selection path, and "all"
    large_prefills: LargePrefills
    time_per_output_token_seconds: TimePerOutputToken
    small_task_takeovers: int
    small_task_takeover_details: dict[str, Percentiles]  # prompt_tokens, slot_tokens_before, interval_seconds
    top_conversations: TopConversations
    named: Named
    unknown: list[Unknown]


class Report(_Report, total=False):
    """The report, in the order of its JSON output: each part's sections in the order of
    export/concerns.py. A concern with nothing to say leaves its sections out."""

    context_shift: dict[str, Any]  # context_shift.py
    speculative_decoding: dict[str, Any]  # speculative.py
