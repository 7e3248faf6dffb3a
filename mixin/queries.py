"""PromQL building blocks of the recording rules, the alerts (mixin/rules.py) and the
dashboards (mixin/dashboards.py). A ratio or a mean is written once, here, so that a dashboard
and a rule cannot compute the same figure two ways; every fixed window comes from
mixin/thresholds.yaml. Each block takes the series selector (the rules' job, the
dashboards' $job and $instance), the labels to keep, and the window.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from llamacpp_exporter.config import LATENCY_BUCKETS, TPOT_BUCKETS

from .jsonnet import float_text

THRESHOLDS_PATH = Path(__file__).resolve().parent / "thresholds.yaml"

OUTCOMES = "llamacpp_prompt_cache_outcomes_total"
RESTORES = "llamacpp_prompt_cache_restores_total"
MISSES = "llamacpp_prompt_cache_misses_total"
TPOT = "llamacpp_time_per_output_token_seconds"
LOG_LINES = "llamacpp_exporter_log_lines_total"
UNPARSED = 'result=~"unrecognized|unreadable"'  # lines the exporter could not read as llama-server's


def thresholds() -> dict[str, Any]:
    thresholds: dict[str, Any] = yaml.safe_load(THRESHOLDS_PATH.read_text())
    return thresholds


def _sel(selector: str, matchers: str) -> str:
    # f"{selector}": the rules' selector may be the jsonnet mixin's $._config.selector
    return "{" + ", ".join(m for m in (f"{selector}", matchers) if m) + "}"


def _sum(by: str | None, inner: str) -> str:
    return f"sum by ({by}) ({inner})" if by else f"sum({inner})"


def increase(metric: str, selector: str, window: str, by: str | None = None, matchers: str = "") -> str:
    return _sum(by, f"increase({metric}{_sel(selector, matchers)}[{window}])")


def rate(metric: str, selector: str, window: str, by: str | None = None, matchers: str = "") -> str:
    return _sum(by, f"rate({metric}{_sel(selector, matchers)}[{window}])")


def ram_long_prompts(selector: str, by: str | None, window: str) -> str:
    """Long prompts (>= cache.min_prompt_tokens) that came back through the RAM prompt cache."""
    return increase(OUTCOMES, selector, window, by, 'path="ram"')


def ram_miss_ratio(selector: str, by: str | None, window: str) -> str:
    """Share of those that missed (reused less than the miss ratio of their prompt)."""
    misses = increase(OUTCOMES, selector, window, by, 'path="ram", outcome="miss"')
    return f"{misses}\n/\n{ram_long_prompts(selector, by, window)}"


def wrongful_lora_discards(selector: str, by: str | None, window: str) -> str:
    """Restored entries discarded for a LoRA change although computed under the request's LoRA."""
    return increase(RESTORES, selector, window, by, 'result="discarded_lora_wrongful"')


def reuse_ratio(selector: str, by: str | None, window: str) -> str:
    """Prompt tokens reused over prompt tokens."""
    reused = rate("llamacpp_prompt_tokens_reused_total", selector, window, by)
    return f"{reused}\n/\n{rate('llamacpp_prompt_tokens_total', selector, window, by)}"


def tpot_mean(selector: str, by: str | None, window: str, matchers: str = "") -> str:
    """Mean decode time per output token."""
    return f"{rate(TPOT + '_sum', selector, window, by, matchers)}\n/\n{rate(TPOT + '_count', selector, window, by, matchers)}"


def generation_speed(selector: str, by: str | None, window: str, matchers: str = "") -> str:
    """Tokens per second while decoding: 1 / tpot_mean."""
    return f"{rate(TPOT + '_count', selector, window, by, matchers)}\n/\n{rate(TPOT + '_sum', selector, window, by, matchers)}"


def evicted_misses(selector: str, by: str | None, window: str) -> str:
    """Long prompts re-prefilled because their conversation's RAM-cache entry had been evicted."""
    return increase(MISSES, selector, window, by, 'cause="evicted"')


def evicted_miss_share(selector: str, by: str | None, window: str) -> str:
    return f"{evicted_misses(selector, by, window)}\n  / {increase(OUTCOMES, selector, window, by)}"


EVICTED_AVOIDABLE = "llamacpp_prompt_cache_evicted_misses_avoidable_total"


def evicted_misses_avoidable(selector: str, by: str | None, window: str, cache_ram: str) -> str:
    """Of those, the ones a --cache-ram `cache_ram` ("2x", "4x") times today's would have avoided."""
    return increase(EVICTED_AVOIDABLE, selector, window, by, f'cache_ram="{cache_ram}"')


def unparsed_lines(selector: str, by: str | None, window: str) -> str:
    return increase(LOG_LINES, selector, window, by, UNPARSED)


LOG_TOKENS = "llamacpp_exporter_log_tokens_total"
SERVER_PROMPT = "llamacpp_server_prompt_tokens_total"
SERVER_CACHED = "llamacpp_server_prompt_tokens_cached_total"  # llama.cpp PR #26920 on (b11434 has it)
SERVER_GENERATED = "llamacpp_server_tokens_predicted_total"


def log_share(kind: str, selector: str, by: str, window: str) -> str:
    """The share of llama-server's own token counters (its /metrics, re-exported) that the log
    accounts for over the window: ``generated``; ``prompt``, computed and cached together (what
    prompt_tokens_total counted before PR #26920, and it and prompt_tokens_cached_total since);
    ``prompt_cached``, where the build counts it apart."""
    if kind == "generated":
        log, server = (
            increase(LOG_TOKENS, selector, window, by, GENERATED),
            increase(SERVER_GENERATED, selector, window, by),
        )
        return f"{log}\n  / {server}"
    cached = increase(SERVER_CACHED, selector, window, by)
    if kind == "prompt_cached":
        return f"{increase(LOG_TOKENS, selector, window, by, CACHED)}\n  / {cached}"
    prompt = increase(SERVER_PROMPT, selector, window, by)
    log = increase(LOG_TOKENS, selector, window, by, PROMPT)
    return f"{log}\n  / (\n  {prompt} + {cached}\n  or\n  {prompt}\n)"


GENERATED, CACHED, PROMPT = 'kind="generated"', 'kind="prompt_cached"', 'kind=~"prompt_computed|prompt_cached"'
LOG_SHARE_KINDS = ("generated", "prompt", "prompt_cached")


UNRECOGNIZED_BY_FUNCTION = "llamacpp_exporter_log_lines_unrecognized_total"
SERVER_CORE = 'logger=~"slot|srv|que|res"'  # the loggers of llama-server's slots, requests, cache and queue


def core_lines_unrecognized(selector: str, by: str, window: str) -> str:
    """Unrecognized lines of llama-server's core loggers in the window, by ``by``: the whole count
    of a series that appeared in it (a build's first reworded line creates the series, and
    increase() would miss that line), else what the counter gained."""
    sel = _sel(selector, SERVER_CORE)
    series = f"{UNRECOGNIZED_BY_FUNCTION}{sel}"
    return f"sum by ({by}) (\n  ({series} unless {series} offset {window})\n  or\n  increase({series}[{window}])\n)"


def unparsed_ratio(selector: str, by: str | None, window: str) -> str:
    return f"{rate(LOG_LINES, selector, window, by, UNPARSED)}\n  / {rate(LOG_LINES, selector, window, by)}"


def quantile(q: float, histogram: str, selector: str, by: str, window: str) -> str:
    keep = f"le, {by}" if by else "le"
    return f"histogram_quantile({q}, {rate(histogram + '_bucket', selector, window, keep)})"


TTFT = "llamacpp_time_to_first_token_seconds"
QUEUE = "llamacpp_request_queue_seconds"
E2E = "llamacpp_request_duration_seconds"
FINISHED = "llamacpp_requests_finished_total"
FAILED_OR_CANCELLED = 'reason=~"failed|cancelled"'


def le(seconds: float) -> str:
    """The bucket of a bound as the exporter writes it (prometheus_client: 10.0, 0.1), which is
    also how Prometheus 3 normalises classic histograms' le."""
    return f'le="{float_text(seconds)}"'


def within_objective_ratio(histogram: str, selector: str, by: str | None, window: str, seconds: float) -> str:
    """Share of requests at most `seconds`: the bucket of that bound over all observations."""
    within = rate(histogram + "_bucket", selector, window, by, le(seconds))
    return f"{within}\n/\n{rate(histogram + '_count', selector, window, by)}"


def over_objective_ratio(histogram: str, selector: str, by: str | None, window: str, seconds: float) -> str:
    """Share of requests slower than `seconds`."""
    return f"1 - (\n{within_objective_ratio(histogram, selector, by, window, seconds)}\n)"


CONTEXT_SHIFTED = "llamacpp_requests_context_shifted_total"
DRAFT_TOKENS = "llamacpp_draft_tokens_total"
DRAFT_ACCEPTED = "llamacpp_draft_tokens_accepted_total"


def context_shifted_ratio(selector: str, by: str | None, window: str) -> str:
    """Share of the requests that ended whose context filled up and lost history (context shift)."""
    return f"{rate(CONTEXT_SHIFTED, selector, window, by)}\n/\n{rate(FINISHED, selector, window, by)}"


def draft_acceptance(selector: str, by: str | None, window: str) -> str:
    """Share of the draft model's tokens the target accepted (speculative decoding)."""
    return f"{rate(DRAFT_ACCEPTED, selector, window, by)}\n/\n{rate(DRAFT_TOKENS, selector, window, by)}"


def finished_ratio(selector: str, by: str | None, window: str, matchers: str) -> str:
    """Share of the requests that ended (llamacpp_requests_finished_total) ending as `matchers` says."""
    return f"{rate(FINISHED, selector, window, by, matchers)}\n/\n{rate(FINISHED, selector, window, by)}"


def mean(histogram: str, selector: str, by: str | None, window: str) -> str:
    return f"{rate(histogram + '_sum', selector, window, by)}\n/\n{rate(histogram + '_count', selector, window, by)}"


def target_labels(c: dict[str, Any]) -> str:
    """The labels of a scrape target that operators route, inhibit and tell fleets apart by:
    the cluster (its name is cluster_label, as kubernetes-mixin's clusterLabel), the Kubernetes
    namespace and pod where the series carry them (a PodMonitor's), then job and instance. An
    aggregation by labels a series lacks keeps nothing and loses nothing: the same rules serve
    docker compose and plain Prometheus."""
    return f"{c['cluster_label']}, namespace, pod, job, instance"


@dataclass(frozen=True)
class Objective:
    """A latency objective of thresholds.yaml's latency_objectives."""

    key: str
    histogram: str
    alert: str
    slower_means: str  # what a request over the objective did ({s}: the objective, {r}: 1/s)
    label: str  # its short name on a dashboard
    default_buckets: tuple[float, ...]  # the exporter's: an objective must be one of them


OBJECTIVES = (
    Objective(
        "time_to_first_token",
        TTFT,
        "LlamaCppTimeToFirstTokenSlow",
        "waited more than {s:g} s for their first token",
        "TTFT",
        LATENCY_BUCKETS,
    ),
    Objective(
        "time_per_output_token",
        TPOT,
        "LlamaCppTimePerOutputTokenSlow",
        "generated slower than {r:g} tokens/s",
        "per token",
        TPOT_BUCKETS,
    ),
    Objective(
        "queue_time",
        QUEUE,
        "LlamaCppQueueTimeSlow",
        "waited more than {s:g} s for a free slot",
        "queue",
        LATENCY_BUCKETS,
    ),
)
