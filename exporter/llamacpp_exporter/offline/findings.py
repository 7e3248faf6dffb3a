"""What the report says is wrong, in plain words: each finding with its evidence as counts and
what to do. A pure function of the report (report.build's dict), so that every format says the
same and the JSON carries them structured.

A finding is stated only when its evidence passes its threshold (THRESHOLDS); with some evidence
below it, the finding says that the sample is too small; with none, nothing.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from ..export.report_types import CacheSizeCurve, Finding, Rate, Report

SEVERITIES = ("critical", "warning", "info", "small_sample")


@dataclass(frozen=True)
class Thresholds:
    # restored entries discarded for a LoRA change although computed under the request's LoRA:
    # the log proves each one, a few rule out a stray line
    lora_wrongful_discards: int = 3
    # KV reused under another adapter: each one may be a wrong answer
    lora_mismatch_reuse: int = 1
    # misses of conversations whose RAM-cache entry had been evicted, and their share of misses
    evicted_misses: int = 5
    evicted_share: float = 0.10
    # misses with a known cause, none of them evicted: enough to say a bigger cache would not help
    misses_without_eviction: int = 20
    # the larger cache to recommend: the smallest that would have avoided this share of them
    larger_cache_share: float = 0.8
    # small requests that took a big conversation's slot
    small_task_takeovers: int = 3
    # decoding with and without another slot's prefill (a large one where there were): requests
    # in each (medians, not rates: ten of each show a slowdown this large), and the slowdown
    contention_requests: int = 10
    contention_slowdown: float = 1.5


THRESHOLDS = Thresholds()


def _pct(r: Rate) -> str:
    if not r["denominator"]:
        return "-"
    return f"{100 * (r['ratio'] or 0.0):.0f}% ({r['numerator']}/{r['denominator']})"


def _ram_path_misses(ram: dict[str, Rate]) -> str:
    """The sentence on the RAM path's misses by LoRA state, of the states that had requests."""
    known = [
        f"{who} missed {_pct(ram[state])}"
        for state, who in (("active", "LoRA requests"), ("none", "requests without LoRA"))
        if ram[state]["denominator"]
    ]
    return f" Among the requests that could have hit on the RAM path, {' and '.join(known)}." if known else ""


def _finding(name: str, severity: str, summary: str, evidence: dict[str, Any], action: str) -> Finding:
    return {"finding": name, "severity": severity, "summary": summary, "evidence": evidence, "action": action}


def _lora_restore(rep: Report, t: Thresholds) -> list[Finding]:
    restores = rep["restores"]["all"]
    wrongful = restores.get("discarded_lora_wrongful", 0)
    if not wrongful:
        return []
    ram = rep["could_have_hit"]["miss_rate"]["ram"]
    evidence = {
        "discarded_lora_wrongful": wrongful,
        "restores": sum(restores.values()),
        "could_have_hit_ram_miss_rate_lora": ram["active"],
        "could_have_hit_ram_miss_rate_plain": ram["none"],
    }
    action = (
        "Fixed upstream by llama.cpp PR #30275 once it is merged: update llama-server to a build that has it "
        "(`llamacpp-exporter check-lora-restore --llama.url URL` tells whether a build is affected). Until then, "
        "send the same LoRA configuration on every request, or give each adapter its own slot (id_slot)."
    )
    if wrongful < t.lora_wrongful_discards:
        return [
            _finding(
                "lora_restore_discard",
                "small_sample",
                f"{wrongful} restored RAM-cache entr{'y was' if wrongful == 1 else 'ies were'} thrown away although "
                f"computed under the request's own LoRA: too few to call it the LoRA restore bug "
                f"({t.lora_wrongful_discards} needed).",
                evidence,
                action,
            )
        ]
    return [
        _finding(
            "lora_restore_discard",
            "critical",
            f"The LoRA restore bug: {wrongful} of {evidence['restores']} restored RAM-cache entries were thrown away "
            "although they had been computed under the request's own LoRA (the server compared it with the "
            f"previous request's LoRA on that slot).{_ram_path_misses(ram)}",
            evidence,
            action,
        )
    ]


def _lora_mismatch(rep: Report, t: Thresholds) -> list[Finding]:
    n = sum(rep.get("lora_mismatch_reuse", {}).values())
    if n < t.lora_mismatch_reuse:
        return []
    return [
        _finding(
            "lora_mismatch_reuse",
            "critical",
            f"{n} request{'s' if n != 1 else ''} reused KV cache computed under another LoRA configuration: "
            "their answers may be wrong.",
            {"requests": n, "by_lora": rep["lora_mismatch_reuse"]},
            "Until llama-server compares adapters correctly, do not mix adapters on a slot (one slot per adapter, "
            "id_slot); report it to llama.cpp with the build number.",
        )
    ]


def _capacity(rep: Report, t: Thresholds) -> list[Finding]:
    causes = rep["miss_causes"]["all"]
    misses = sum(causes.values())
    evicted = causes.get("evicted", 0)
    known = misses - causes.get("unknown", 0)
    evidence: dict[str, Any] = {"evicted_misses": evicted, "misses": misses, "misses_with_known_cause": known}
    if evicted >= t.evicted_misses and evicted >= t.evicted_share * misses:
        curve, action = _larger_cache(rep.get("cache_size_curve"), t, evidence)
        return [
            _finding(
                "cache_too_small",
                "warning",
                f"{evicted} of {misses} misses ({100 * evicted / misses:.0f}%) were of conversations whose RAM-cache "
                f"entry had been evicted before they came back: the cache is too small for this traffic.{curve}",
                evidence,
                action,
            )
        ]
    if evicted:
        return [
            _finding(
                "cache_too_small",
                "small_sample",
                f"{evicted} of {misses} misses were of conversations whose RAM-cache entry had been evicted: too few "
                f"to call the cache too small ({t.evicted_misses} and {100 * t.evicted_share:.0f}% of misses needed).",
                evidence,
                'Watch llamacpp_prompt_cache_misses_total{cause="evicted"}.',
            )
        ]
    if known >= t.misses_without_eviction:
        top = sorted(((v, c) for c, v in causes.items() if v and c != "unknown"), reverse=True)
        return [
            _finding(
                "cache_size_not_the_cause",
                "info",
                f"None of the {known} misses with a known cause came from an evicted entry: a larger --cache-ram "
                f"would not have avoided them (causes: {', '.join(f'{c} {v}' for v, c in top)}).",
                evidence,
                "Look at the causes instead: lora_discard (the LoRA restore bug), no_cache_entry (nothing saved "
                "for the conversation), slot_prefix_mismatch, forced_reprocess (the model's memory cannot reuse).",
            )
        ]
    return []


def _larger_cache(cc: CacheSizeCurve | None, t: Thresholds, evidence: dict[str, Any]) -> tuple[str, str]:
    """What the cache-size curve adds to cache_too_small: the sentence, and the action."""
    default = (
        "",
        "Raise --cache-ram (llamacpp_prompt_cache_limit_bytes shows today's limit), or keep fewer "
        "conversations in flight.",
    )
    if not cc or not cc["evicted_misses"]:
        return default
    n = cc["evicted_misses"]
    points = {f"{pt['factor']:g}x": pt for pt in cc["points"]}
    for name in ("2x", "4x"):
        if name in points:
            evidence[f"avoided_at_{name}"] = points[name]["misses_avoided"]
            evidence[f"prefill_seconds_avoided_at_{name}"] = points[name]["prefill_seconds_avoided"]
    enough = next((pt for pt in cc["points"] if pt["misses_avoided"] >= t.larger_cache_share * n), None)
    if enough is None:
        top = cc["points"][-1]
        return (
            f" Even {top['factor']:g} times the cache would have kept only {top['misses_avoided']} of these entries: "
            "each was needed again after more had been saved than a larger cache holds.",
            "A larger --cache-ram barely helps: keep fewer conversations in flight, or give long conversations "
            "their own slot (id_slot) so that their state stays on the slot.",
        )
    size = f" ({enough['cache_ram_mib']} MiB)" if enough["cache_ram_mib"] is not None else ""
    return (
        f" A --cache-ram {enough['factor']:g} times today's{size} would have kept {enough['misses_avoided']} of these "
        f"{n} entries, {enough['prefill_seconds_avoided']:.1f} s of prefill.",
        f"Raise --cache-ram to {enough['factor']:g} times today's{size} if the host has the memory "
        "(llamacpp_prompt_cache_limit_bytes shows today's limit), or keep fewer conversations in flight.",
    )


def _takeovers(rep: Report, t: Thresholds) -> list[Finding]:
    n = rep["small_task_takeovers"]
    if not n:
        return []
    sizes = rep.get("small_task_takeover_details", {})

    def p50(group: str) -> float | None:
        p = sizes.get(group)
        return None if p is None else p.get("p50")

    prompt, held, every = p50("prompt_tokens"), p50("slot_tokens_before"), p50("interval_seconds")
    evidence = {
        "takeovers": n,
        "prompt_tokens_p50": prompt,
        "slot_tokens_before_p50": held,
        "interval_seconds_p50": every,
    }
    if n < t.small_task_takeovers:
        return [
            _finding(
                "small_task_takeover",
                "small_sample",
                f"{n} small request{'s' if n != 1 else ''} took a slot that held a big conversation: too few to call "
                f"it a pattern ({t.small_task_takeovers} needed).",
                evidence,
                "Probe /health rather than sending a completion.",
            )
        ]
    period = f", about every {every:.0f} s" if every is not None else ""
    size = f" ({prompt:.0f} prompt tokens at the median)" if prompt is not None else ""
    big = f" ({held:.0f} tokens)" if held is not None else ""
    return [
        _finding(
            "small_task_takeover",
            "warning",
            f"{n} small requests{size} took a slot that held a big conversation{big}{period} (often a health "
            "probe sent as a completion, or a title generator); the conversation then computes its prompt again.",
            evidence,
            "Probe /health rather than sending a completion, or pin such small requests to one slot (id_slot).",
        )
    ]


def _contention(rep: Report, t: Thresholds) -> list[Finding]:
    tp = rep["time_per_output_token_seconds"]
    large = tp["while_a_large_prefill_ran"]
    # a long prefill is what slows everyone: judged on those where there were enough of them
    busy = large if large["count"] >= t.contention_requests else tp["while_another_slot_prefilled"]
    during = (
        f"a large prefill (>= {tp['large_prefill_tokens']} tokens) ran on another slot"
        if busy is large
        else "another slot prefilled"
    )
    calm = tp["no_concurrent_prefill"]
    if not busy["count"] or not calm["count"] or not calm["p50"]:
        return []
    slowdown = (busy["p50"] or 0.0) / calm["p50"]  # counted: neither is None
    rows = rep["top_conversations"]["rows"] if rep["top_conversations"]["by"] == "cost_to_others_seconds" else []
    costly = [r for r in rows if (r.get("cost_to_others_seconds") or 0) > 0][:3]
    evidence = {
        "while": "large_prefill" if busy is large else "any_prefill",
        "requests_while": busy["count"],
        "requests_without": calm["count"],
        "time_per_output_token_p50_while": busy["p50"],
        "time_per_output_token_p50_without": calm["p50"],
        "slowdown": round(slowdown, 2),
        "costliest_conversations": [
            {"conversation": r["conversation"], "cost_to_others_seconds": r["cost_to_others_seconds"]} for r in costly
        ],
    }
    if slowdown < t.contention_slowdown:
        return []
    action = (
        "Their prefills are mostly cache misses: the findings above are the ones to fix first. Fewer parallel "
        "slots (-np) shorten the stalls."
    )
    if min(busy["count"], calm["count"]) < t.contention_requests:
        return [
            _finding(
                "prefill_contention",
                "small_sample",
                f"Decoding looked {slowdown:.1f} times slower while {during}, over too few requests "
                f"({busy['count']} and {calm['count']}; {t.contention_requests} each needed).",
                evidence,
                action,
            )
        ]
    who = ", ".join(f"{r['conversation']} ({r['cost_to_others_seconds']:.1f} s)" for r in costly)
    return [
        _finding(
            "prefill_contention",
            "warning",
            f"Decoding was {slowdown:.1f} times slower while {during} ({busy['p50']:.3f} s a token at the "
            f"median against {calm['p50']:.3f} s with no prefill)"
            + (f"; the conversations whose prefills cost the others most: {who}." if who else "."),
            evidence,
            action,
        )
    ]


def _diagnostics(rep: Report, t: Thresholds) -> list[Finding]:
    out = []
    for u in rep["unknown"]:
        if u["what"].startswith("RAM-cache diagnostics"):
            out.append(
                _finding(
                    "diagnostics_below_lv4",
                    "info",
                    f"{u['requests']} requests were logged below -lv 4: their restores, LoRA discards, miss causes "
                    "and exact reused tokens are unknown, so the LoRA restore bug, KV reuse under another adapter "
                    "and evictions cannot be counted for them.",
                    {"requests": u["requests"]},
                    "Start llama-server with -lv 4.",
                )
            )
        elif u["what"] == "LoRA state":
            out.append(
                _finding(
                    "lora_state_unknown",
                    "info",
                    f"The LoRA state of {u['requests']} requests is unknown (a log alone does not carry it): the miss "
                    "rates by LoRA state and the LoRA requests' rates in the LoRA restore bug need it.",
                    {"requests": u["requests"]},
                    "The events files given hold no LoRA state for these requests: the exporter that wrote them "
                    "did not see them in /slots (--no-llama.slots, or /slots unreachable: llamacpp_up"
                    '{endpoint="slots"}). Keep /slots polled.'
                    if rep.get("sources", {}).get("events_files")
                    else "Run the exporter with --events.path (it polls /slots) and pass that file to analyze with "
                    "--events.",
                )
            )
    return out


def findings(rep: Report, t: Thresholds = THRESHOLDS) -> list[Finding]:
    """Every finding of the report, the most severe first."""
    out = [
        *_lora_restore(rep, t),
        *_lora_mismatch(rep, t),
        *_capacity(rep, t),
        *_takeovers(rep, t),
        *_contention(rep, t),
        *_diagnostics(rep, t),
    ]
    return sorted(out, key=lambda f: SEVERITIES.index(f["severity"]))


def thresholds() -> dict[str, Any]:
    return asdict(THRESHOLDS)
