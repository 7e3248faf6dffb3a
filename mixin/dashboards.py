"""The Grafana dashboards (dashboards/*.json, provisioned from files as they are), laid out
row by row: each row is a function of its own, the panels' builders are mixin/panels.py.

Every dashboard has datasource, job and instance variables, a stable uid, and a unit and a
description on every panel. Queries aggregate across the selected instances, so one
dashboard serves one server or fifty.
"""

from __future__ import annotations

import json
from typing import Any

from . import panels as P
from . import queries as q  # the PromQL blocks the rules use too
from .panels import (
    DS,
    LARGE_PREFILL_TOKENS,
    LINKS,
    QUANTILE_INTERVAL,
    RI,
    Layout,
    bargauge,
    color,
    dashboard,
    heatmap,
    minutes,
    quantiles,
    stat,
    table,
    timeseries,
    with_model,
)


def golden_signals(lay: Layout) -> None:
    """The first row: what users feel, over the alerts' summary window (a stat over
    $__rate_interval is mostly empty at llama.cpp's request rates)."""
    w = P.WINDOWS["summary"]
    lo = P.LATENCY_OBJECTIVES
    lay.row(f"Golden signals, last {minutes(w)}")
    p95 = "p95 over the last " + minutes(w) + "utes, all selected servers."
    known = " Needs -lv 4 (the arrival is read from the log)."
    signals = [
        stat(
            "Requests/s",
            f"Requests that ended per second over the last {minutes(w)}utes (any way they ended).",
            "reqps",
            q.rate(q.FINISHED, P.S, w),
        ),
        stat(
            "Tokens/s in",
            f"Prompt tokens computed per second over the last {minutes(w)}utes, from llama-server's own counter "
            "(--metrics; older builds count reused tokens in).",
            "suffix: tok/s",
            q.rate("llamacpp_server_prompt_tokens_total", P.S, w),
        ),
        stat(
            "Tokens/s out",
            f"Tokens generated per second over the last {minutes(w)}utes (llama-server's --metrics).",
            "suffix: tok/s",
            q.rate("llamacpp_server_tokens_predicted_total", P.S, w),
        ),
        stat(
            "TTFT p95",
            "Time to first token (arrival to first token), " + p95 + known,
            "s",
            q.quantile(0.95, q.TTFT, P.S, "", w),
            red_above=lo["time_to_first_token"],
        ),
        stat(
            "Time per token p95",
            "Time per output token, " + p95,
            "s",
            q.quantile(0.95, q.TPOT, P.S, "", w),
            red_above=lo["time_per_output_token"],
        ),
        stat(
            "End-to-end p95",
            "Arrival to release (queue, prefill, generation), " + p95 + known,
            "s",
            q.quantile(0.95, q.E2E, P.S, "", w),
        ),
        stat(
            "Error share",
            f"Requests that failed or were cancelled while they ran, of all that ended, over the last {minutes(w)}"
            "utes. Requests whose client gave up while queued never started and are not in it.",
            "percentunit",
            q.finished_ratio(P.S, None, w, q.FAILED_OR_CANCELLED),
            red_above=P.THRESHOLDS["request_errors"]["ratio"],
        ),
        stat(
            "Objective attainment",
            f"Share of requests within each latency objective over the last {minutes(w)}utes (time to first token "
            f"{lo['time_to_first_token']:g} s, time per token {lo['time_per_output_token']:g} s, queue "
            f"{lo['queue_time']:g} s: mixin/thresholds.yaml); red below the {lo['target']:.0%} target.",
            "percentunit",
            "",
            green_from=lo["target"],
            queries=[(q.within_objective_ratio(o.histogram, P.S, None, w, lo[o.key]), o.label) for o in q.OBJECTIVES],
        ),
    ]
    for panel in signals:
        lay.add(panel, 3, 4)


def cache_and_health(lay: Layout) -> None:
    """The prompt cache and health at a glance: the RAM-path miss ratio, wrongful LoRA discards, who is down, the diagnostics."""
    miss_t = P.THRESHOLDS["ram_miss_rate"]["ratio"]
    up_map = [{"type": "value", "options": {"0": {"text": "all up", "color": "green"}}}]
    diag_map = [
        {
            "type": "value",
            "options": {
                "1": {"text": "-lv 4: on", "color": "green"},
                "0": {"text": "off (-lv 3)", "color": "orange"},
                "-1": {"text": "unknown", "color": "blue"},
            },
        }
    ]
    w_miss = P.THRESHOLDS["ram_miss_rate"]["window"]
    w_wrongful, w_drift = P.THRESHOLDS["wrongful_lora_discard"]["window"], P.THRESHOLDS["log_parse_drift"]["window"]
    lay.row("The prompt cache and health at a glance")
    # Stats use the alerts' windows (and windows.summary): at llama.cpp's request rates a
    # $__rate_interval window is often empty.
    lay.add(
        stat(
            f"RAM-path miss ratio, {minutes(w_miss)}",
            "Share of long prompts (>= cache.min_prompt_tokens) coming back through the RAM prompt cache that "
            f"reused less than 10% of their prompt, over the alert's {minutes(w_miss)}utes. Needs -lv 4.",
            "percentunit",
            q.ram_miss_ratio(P.S, "job", w_miss),
            red_above=miss_t,
        ),
        4,
        4,
    )
    lay.add(
        stat(
            f"Wrongful LoRA discards, {minutes(w_wrongful)}",
            "Restored RAM-cache entries that llama-server discarded for a LoRA change although they were computed "
            "under the request's own LoRA (the LoRA restore bug: the server compares with the previous request's "
            f"LoRA on that slot), over the last {minutes(w_wrongful)}utes.",
            "none",
            q.wrongful_lora_discards(P.S, None, w_wrongful),
            red_above=0.5,
        ),
        4,
        4,
    )
    lay.add(
        stat(
            "Servers down",
            "llama-servers whose /health the exporter cannot reach (not counting a server loading its model), "
            "plus exporters Prometheus cannot scrape (up == 0): a dead exporter never shows all green.",
            "none",
            f'(count(llamacpp_up{{{P.S}, endpoint="health"}} == 0 unless on ({P.TARGET}) llamacpp_loading{{{P.S}}} == 1) '
            f"or vector(0))\n+\n(count(up{{{P.S}}} == 0) or vector(0))",
            red_above=1,
            mappings=up_map,
        ),
        4,
        4,
    )
    lay.add(
        stat(
            "Cache diagnostics",
            "Whether llama-server logs at -lv 4, which the RAM prompt-cache diagnostics need (lowest across servers).",
            "none",
            f"min(llamacpp_exporter_cache_diagnostics_available{{{P.S}}})",
            mappings=diag_map,
        ),
        4,
        4,
    )
    lay.add(
        stat(
            f"Unrecognized log lines, {minutes(w_drift)}",
            f"Log lines the exporter did not recognise, or that were not text, in the last {minutes(w_drift)}utes. "
            "Rising: a new llama.cpp build changed its log, or something else writes into the log file.",
            "short",
            q.unparsed_lines(P.S, None, w_drift),
            red_above=10,
        ),
        4,
        4,
    )


def serving(lay: Layout) -> None:
    """Serving: traffic, saturation, errors."""
    w_sum = P.WINDOWS["summary"]
    lay.row("Serving: traffic, saturation, errors")
    lay.add(
        stat(
            f"Requests, last {minutes(w_sum)}",
            f"Completed requests in the last {minutes(w_sum)}utes, all selected servers.",
            "short",
            q.increase("llamacpp_requests_total", P.S, w_sum),
        ),
        4,
        4,
    )
    lay.add(
        timeseries(
            "Tokens per second",
            "Prompt tokens computed, prompt tokens reused from the cache and tokens generated per second, from "
            "llama-server's own counters (needs --metrics). Builds before llama.cpp PR #26920 count reused tokens "
            "into prompt_tokens_total and report no cached counter: their prompt line includes reused tokens.",
            "suffix: tok/s",
            [
                (
                    f"sum(rate(llamacpp_server_prompt_tokens_total{{{P.S}}}[{RI}])"
                    f" and on ({P.TARGET}, model) llamacpp_server_prompt_tokens_cached_total{{{P.S}}})",
                    "prompt computed",
                ),
                (f"sum(rate(llamacpp_server_prompt_tokens_cached_total{{{P.S}}}[{RI}]))", "prompt reused"),
                (
                    f"sum(rate(llamacpp_server_prompt_tokens_total{{{P.S}}}[{RI}])"
                    f" unless on ({P.TARGET}, model) llamacpp_server_prompt_tokens_cached_total{{{P.S}}})",
                    "prompt, reused included (older builds)",
                ),
                (f"sum(rate(llamacpp_server_tokens_predicted_total{{{P.S}}}[{RI}]))", "generated"),
            ],
        ),
        6,
        8,
    )
    lay.add(
        timeseries(
            "Requests processing and deferred",
            "Requests llama-server is processing and requests waiting for a free slot (deferred), from its "
            "own gauges (needs --metrics). Deferred above zero: every slot is busy.",
            "short",
            [
                (f"sum(llamacpp_server_requests_processing{{{P.S}}})", "processing"),
                (f"sum(llamacpp_server_requests_deferred{{{P.S}}})", "deferred"),
            ],
            overrides=[color("deferred", "orange")],
        ),
        6,
        8,
    )
    lay.add(
        timeseries(
            "Busy slots and context used",
            "Slots processing a task, and the share of the slots' context their tokens fill, as the exporter's "
            "/slots poll sees them.",
            "short",
            [
                (f"sum by (instance) (llamacpp_slots_processing{{{P.S}}})", "{{instance}} busy slots"),
                (f"avg by (instance) (llamacpp_slots_context_usage_ratio{{{P.S}}})", "{{instance}} context used"),
            ],
            overrides=[
                {
                    "matcher": {"id": "byRegexp", "options": ".*context used"},
                    "properties": [
                        {"id": "unit", "value": "percentunit"},
                        {"id": "max", "value": 1},
                        {"id": "custom.axisPlacement", "value": "right"},
                    ],
                }
            ],
        ),
        6,
        8,
    )
    lay.add(
        timeseries(
            "Requests by how they ended",
            "Requests per second by how they ended: stop (end of sequence, stop word or token limit), truncated "
            "(the context filled up), cancelled (the client went away while it ran), failed (an error); and "
            "requests that never started (their client gave up while queued, or rejected: -lv 4, counted once "
            "the server idles).",
            "reqps",
            [
                (f"sum by (reason) (rate({q.FINISHED}{{{P.S}}}[{RI}]))", "{{reason}}"),
                (f"sum(rate(llamacpp_requests_never_started_total{{{P.S}}}[{RI}]))", "never started"),
            ],
            overrides=[
                color("failed", "red"),
                color("cancelled", "orange"),
                color("truncated", "purple"),
                color("never started", "yellow"),
            ],
        ),
        6,
        8,
    )
    lay.add(
        timeseries(
            "Requests by model",
            "Completed requests and embedding tasks per second by model (a llama-server router's models; one "
            "unnamed series for a plain server).",
            "reqps",
            [
                (f"sum by (model) (rate(llamacpp_requests_total{{{P.S}}}[{RI}]))", "{{model}} requests"),
                (f"sum by (model) (rate(llamacpp_embedding_tasks_total{{{P.S}}}[{RI}]))", "{{model}} embedding tasks"),
            ],
        ),
        6,
        8,
    )


def requests_and_cache(lay: Layout) -> None:
    """Requests and the RAM prompt cache: outcomes, restores, how requests ended."""
    miss_t = P.THRESHOLDS["ram_miss_rate"]["ratio"]
    lay.row("Requests and the RAM prompt cache")
    lay.add(
        timeseries(
            "Requests by path and LoRA",
            "Completed requests per second by how the slot was chosen (slot: it still held the conversation; "
            "ram: LRU, the RAM cache was consulted; pinned: id_slot) and LoRA state.",
            "reqps",
            [(f"sum by (path, lora) (rate(llamacpp_requests_total{{{P.S}}}[{RI}]))", "{{path}} / lora {{lora}}")],
            stack=True,
        ),
        8,
        8,
    )
    lay.add(
        timeseries(
            "RAM-path miss ratio by LoRA",
            "Share of long RAM-path prompts that missed the cache, by LoRA state. The red line is the "
            "LlamaCppRamCacheMissRateHigh threshold (the alert also needs enough requests).",
            "percentunit",
            [(q.ram_miss_ratio(P.S, "lora", RI), "lora {{lora}}")],
            threshold=miss_t,
        ),
        8,
        8,
    )
    lay.add(
        timeseries(
            "RAM-cache restores by result",
            "Requests per second whose restored RAM-cache entry was kept, reprocessed, or discarded for a LoRA "
            "change (wrongful: computed under the request's own LoRA; correct: under another).",
            "reqps",
            [
                (
                    f"sum by (result) (rate(llamacpp_prompt_cache_restores_total{{{P.S}}}[{RI}]))",
                    "{{result}}",
                )
            ],
            overrides=[
                color("discarded_lora_wrongful", "red"),
                color("discarded_lora_correct", "orange"),
                color("kept", "green"),
            ],
        ),
        8,
        8,
    )


def latency(lay: Layout) -> None:
    """Latency: the quantiles and heatmaps of each stage of a request."""
    lay.row("Latency")
    known = (
        "Observed for requests whose arrival the log pins (-lv 4); the others are counted in "
        "llamacpp_request_latency_unknown_total (the table's last column)."
    )
    lay.add(
        timeseries(
            "Time to first token",
            "From a request's arrival in llama-server to its first token (queue time plus prefill), p50, p90, p95 "
            f"and p99. {known} Exemplars name slot and task.",
            "s",
            quantiles("llamacpp_time_to_first_token_seconds", "", ""),
            exemplar=True,
            min_interval=QUANTILE_INTERVAL,
        ),
        8,
        8,
    )
    lay.add(
        timeseries(
            "Queue time",
            "From a request's arrival to its launch on a slot, p50, p90, p95 and p99: above a few milliseconds it "
            f"waited for a free slot (every slot busy). {known}",
            "s",
            quantiles("llamacpp_request_queue_seconds", "", ""),
            exemplar=True,
            min_interval=QUANTILE_INTERVAL,
        ),
        8,
        8,
    )
    lay.add(
        timeseries(
            "End-to-end latency",
            "From a request's arrival in llama-server to its slot's release (queue, prefill, generation), p50, p90, "
            f"p95 and p99. {known}",
            "s",
            quantiles("llamacpp_request_duration_seconds", "", ""),
            exemplar=True,
            min_interval=QUANTILE_INTERVAL,
        ),
        8,
        8,
    )
    lay.add(
        timeseries(
            "Error share",
            "Share of the requests that ended which failed or were cancelled while they ran, which were "
            "truncated (the context filled up), and which went on after a context shift (the context filled up and "
            "llama-server dropped part of the conversation: the model silently forgot it). The red line is "
            "LlamaCppRequestErrorsHigh's threshold.",
            "percentunit",
            [
                (q.finished_ratio(P.S, None, RI, q.FAILED_OR_CANCELLED), "failed or cancelled"),
                (q.finished_ratio(P.S, None, RI, 'reason="truncated"'), "truncated"),
                (q.context_shifted_ratio(P.S, None, RI), "context shifted (forgot history)"),
            ],
            overrides=[
                color("failed or cancelled", "red"),
                color("truncated", "purple"),
                color("context shifted (forgot history)", "orange"),
            ],
            threshold=P.THRESHOLDS["request_errors"]["ratio"],
            min_interval=QUANTILE_INTERVAL,
        ),
        8,
        8,
    )
    lay.add(
        timeseries(
            "Prefill duration",
            "Prefill time per request (slot start to first token), p50, p90, p95 and p99. Exemplars name slot and task.",
            "s",
            quantiles("llamacpp_prefill_duration_seconds", "", ""),
            exemplar=True,
            min_interval=QUANTILE_INTERVAL,
        ),
        8,
        8,
    )
    lay.add(
        timeseries(
            "Time per output token by contention",
            "Mean decode time per token of requests, p50, p90, p95 and p99, split by whether other slots were "
            "prefilling during their decoding (prefill) or not (none).",
            "s",
            quantiles(q.TPOT, "contention", "{{contention}}"),
            exemplar=True,
            min_interval=QUANTILE_INTERVAL,
        ),
        8,
        8,
    )
    lay.add(
        timeseries(
            "Speculative decoding: draft acceptance",
            "Share of the draft model's tokens the target model accepted, by LoRA state (an adapter on the target "
            "and not on the draft lowers it). From the log's draft acceptance line, where the build logs it: no "
            "data means unknown (no draft model, or a build that does not say), never 0.",
            "percentunit",
            [(q.draft_acceptance(P.S, "lora", RI), "{{lora}}")],
        ),
        8,
        8,
    )


def servers(lay: Layout) -> None:
    """The servers table: one row per server, red past the thresholds, each linking to its own view."""
    w_tab = P.WINDOWS["summary"]
    lo = P.LATENCY_OBJECTIVES
    lay.add(
        table(
            f"Servers, last {minutes(w_tab)}",
            f"One row per server over the last {minutes(w_tab)}utes, sorted by request rate: the one bad server "
            "out of fifty is the row whose red cell stands out (past an alert's threshold or a latency objective). "
            "Click a server to see only it.",
            [
                ("health", "none", f'max by (instance) (llamacpp_up{{{P.S}, endpoint="health"}})', None),
                ("requests/s", "reqps", q.rate(q.FINISHED, P.S, w_tab, "instance"), None),
                (
                    "error share",
                    "percentunit",
                    q.finished_ratio(P.S, "instance", w_tab, q.FAILED_OR_CANCELLED).replace("\n", " "),
                    P.THRESHOLDS["request_errors"]["ratio"],
                ),
                ("TTFT p95", "s", q.quantile(0.95, q.TTFT, P.S, "instance", w_tab), lo["time_to_first_token"]),
                ("time/token p95", "s", q.quantile(0.95, q.TPOT, P.S, "instance", w_tab), lo["time_per_output_token"]),
                ("queue p95", "s", q.quantile(0.95, q.QUEUE, P.S, "instance", w_tab), lo["queue_time"]),
                (
                    "RAM-path miss ratio",
                    "percentunit",
                    q.ram_miss_ratio(P.S, "instance", w_tab).replace("\n", " "),
                    P.THRESHOLDS["ram_miss_rate"]["ratio"],
                ),
                (
                    "latency unknown",
                    "percentunit",
                    f"sum by (instance) (increase(llamacpp_request_latency_unknown_total{{{P.S}}}[{w_tab}])) / "
                    f"sum by (instance) (increase(llamacpp_requests_total{{{P.S}}}[{w_tab}]))",
                    None,
                ),
            ],
        ),
        24,
        9,
    )
    lay.add(
        heatmap(
            "Prefill duration heatmap",
            "Requests per prefill-duration bucket over time: a band moving up is prompts missing the cache.",
            "s",
            "llamacpp_prefill_duration_seconds",
        ),
        12,
        8,
    )
    lay.add(
        heatmap(
            "Time per output token heatmap",
            "Requests per time-per-output-token bucket over time: a second band above the usual one is requests "
            "slowed by other slots' prefills.",
            "s",
            "llamacpp_time_per_output_token_seconds",
        ),
        12,
        8,
    )


def ram_cache(lay: Layout) -> None:
    """The RAM prompt cache: bytes against the limit, evictions."""
    lay.row("RAM prompt cache")
    lay.add(
        timeseries(
            "RAM cache size and limit",
            "Bytes held by the RAM prompt cache and its --cache-ram limit, per server.",
            "bytes",
            [
                (f"sum by (instance) (llamacpp_prompt_cache_bytes{{{P.S}}})", "{{instance}} used"),
                (f"sum by (instance) (llamacpp_prompt_cache_limit_bytes{{{P.S}}})", "{{instance}} limit"),
            ],
        ),
        12,
        8,
    )
    lay.add(
        timeseries(
            "RAM cache evictions",
            "Entries evicted from the RAM prompt cache per second, per server.",
            "ops",
            [(f"sum by (instance) (rate(llamacpp_prompt_cache_evictions_total{{{P.S}}}[{RI}]))", "{{instance}}")],
        ),
        12,
        8,
    )


def exporter_health(lay: Layout) -> None:
    """Exporter health."""
    lay.row("Exporter health")
    lay.add(
        timeseries(
            "llama-server endpoints up",
            "Whether the last request of the exporter to each llama-server endpoint succeeded (1) or not (0).",
            "none",
            [(f"llamacpp_up{{{P.S}}}", "{{instance}} {{endpoint}}")],
        ),
        8,
        8,
    )
    lay.add(
        timeseries(
            "Log lines by result",
            "Log lines read per second: parsed, ignored (known, not needed), unrecognized, unreadable (not text), "
            "oversized.",
            "suffix: lines/s",
            [(f"sum by (result) (rate(llamacpp_exporter_log_lines_total{{{P.S}}}[{RI}]))", "{{result}}")],
        ),
        8,
        8,
    )
    lay.add(
        timeseries(
            "Endpoint errors",
            "Failed requests of the exporter to llama-server per second, by endpoint.",
            "suffix: errors/s",
            [(f"sum by (endpoint) (rate(llamacpp_exporter_scrape_errors_total{{{P.S}}}[{RI}]))", "{{endpoint}}")],
        ),
        8,
        8,
    )
    w_share = "15m"  # the alert's half hour is steadier; a quarter is the dashboards' window
    lay.add(
        timeseries(
            "The log's share of the server's tokens",
            "Of the tokens llama-server's own /metrics counted (needs --metrics), the share the log accounts for "
            "over the last 15 minutes, by kind: generated, prompt (computed and reused), prompt cached. Near 100%: "
            "the exporter sees what the server does. Under half while the server works: it is blind (its log "
            "changed, its verbosity dropped, or the log is another's): LlamaCppExporterBlind.",
            "percentunit",
            [
                (q.log_share(k, P.S, "instance, model", w_share), "{{instance}} {{model}} " + k)
                for k in q.LOG_SHARE_KINDS
            ],
        ),
        12,
        8,
    )
    lay.add(
        timeseries(
            "Unrecognized lines by function",
            "Lines of llama-server's own loggers the exporter does not know, per second, by logger and the "
            "function that wrote them: which part of the server changed its log (LlamaCppServerLogChanged). "
            "Empty on every tested build.",
            "suffix: lines/s",
            [
                (
                    f"sum by (logger, function) (rate(llamacpp_exporter_log_lines_unrecognized_total{{{P.S}}}[{RI}]))",
                    "{{logger}} {{function}}",
                )
            ],
        ),
        12,
        8,
    )


def overview() -> dict[str, Any]:
    lay = Layout()
    golden_signals(lay)
    cache_and_health(lay)
    serving(lay)
    requests_and_cache(lay)
    latency(lay)
    servers(lay)
    ram_cache(lay)
    exporter_health(lay)
    w_marks, w_build = P.WINDOWS["restart_marks"], P.WINDOWS["build_change"]
    annotations = [
        {
            "name": "Firing alerts",
            "datasource": DS,
            "enable": True,
            "hide": False,
            "iconColor": "orange",
            # the rules' own ALERTS series: one mark per alert while it fires
            "expr": f'ALERTS{{alertstate="firing", alertname=~"LlamaCpp.+", {P.S}}}',
            "step": w_marks,
            "titleFormat": "{{alertname}} ({{severity}})",
            "textFormat": "{{instance}} {{model}}",
            "tagKeys": "severity",
            "useValueForTime": False,
        },
        {
            "name": "llama-server restarts",
            "datasource": DS,
            "enable": True,
            "hide": False,
            "iconColor": "red",
            "expr": with_model(
                f"sum by (instance) (increase(llamacpp_exporter_server_restarts_total{{{P.S}}}[{w_marks}])) > 0"
            ),
            "step": w_marks,
            "titleFormat": "llama-server restarted",
            "textFormat": "{{instance}}: a new start banner in its log",
            "useValueForTime": False,
        },
        {
            "name": "llama-server build changes",
            "datasource": DS,
            "enable": True,
            "hide": False,
            "iconColor": "purple",
            "expr": with_model(
                f"count by (instance, build, commit) (llamacpp_exporter_server_build_info{{{P.S}}}"
                f" unless llamacpp_exporter_server_build_info{{{P.S}}} offset {w_build})"
            ),
            "step": w_marks,
            "titleFormat": "llama-server build",
            "textFormat": f"{{{{instance}}}} runs build {{{{build}}}} ({{{{commit}}}}), not seen {w_build} before",
            "useValueForTime": False,
        },
    ]
    return dashboard(
        "llamacpp-overview",
        "llama.cpp overview",
        "llama-server through llamacpp-exporter: requests, RAM prompt-cache misses and LoRA discards, latency.",
        lay,
        LINKS[1:],
        annotations,
    )


def cache_sources(lay: Layout) -> None:
    """Where requests come from: selection paths, outcomes by path and LoRA."""
    lay.row("Where requests come from")
    lay.add(
        timeseries(
            "Selection path mix",
            "Requests per second by slot-selection path: slot (LCP match, the slot still held the conversation), "
            "ram (LRU, RAM cache consulted), pinned (id_slot), unknown (selection not seen).",
            "reqps",
            [(f"sum by (path) (rate(llamacpp_requests_total{{{P.S}}}[{RI}]))", "{{path}}")],
            stack=True,
        ),
        12,
        8,
    )
    lay.add(
        timeseries(
            "Outcomes by path and LoRA",
            "Long prompts (>= cache.min_prompt_tokens) per second by outcome: hit (>= 90% reused), partial, "
            "miss (< 10% reused).",
            "reqps",
            [
                (
                    q.rate(q.OUTCOMES, P.S, RI, "path, lora, outcome"),
                    "{{outcome}} {{path}} / lora {{lora}}",
                )
            ],
        ),
        12,
        8,
    )


def miss_causes(lay: Layout) -> None:
    """Why prompts miss: causes, restores, LoRA mismatch reuse."""
    lay.row("Why prompts miss")
    lay.add(
        timeseries(
            "Misses by cause",
            "Long-prompt misses per second by cause: lora_discard (restored entry cleared for a LoRA change), "
            "forced_reprocess (no usable SWA/hybrid checkpoint), no_cache_entry, slot_prefix_mismatch, unknown.",
            "reqps",
            [(f"sum by (cause) (rate(llamacpp_prompt_cache_misses_total{{{P.S}}}[{RI}]))", "{{cause}}")],
            stack=True,
        ),
        8,
        8,
    )
    lay.add(
        timeseries(
            "Restores by result and LoRA",
            "RAM-cache restores per second by what became of them and the request's LoRA state.",
            "reqps",
            [
                (
                    f"sum by (lora, result) (rate(llamacpp_prompt_cache_restores_total{{{P.S}}}[{RI}]))",
                    "{{result}} / lora {{lora}}",
                )
            ],
            overrides=[color("discarded_lora_wrongful / lora active", "red")],
        ),
        8,
        8,
    )
    lay.add(
        timeseries(
            "LoRA mismatch reuse",
            "Restored entries computed under another LoRA configuration and reused anyway, per second "
            "(wrong-output risk).",
            "ops",
            [
                (
                    f"sum by (lora) (rate(llamacpp_prompt_cache_lora_mismatch_reuse_total{{{P.S}}}[{RI}]))",
                    "lora {{lora}}",
                )
            ],
        ),
        8,
        8,
    )


def cache_tokens(lay: Layout) -> None:
    """Tokens: reused against processed."""
    lay.row("Tokens")
    lay.add(
        timeseries(
            "Reused vs processed prompt tokens",
            "Prompt tokens per second reused from the slot or the RAM cache against those computed again.",
            "suffix: tok/s",
            [
                (f"sum(rate(llamacpp_prompt_tokens_reused_total{{{P.S}}}[{RI}]))", "reused"),
                (
                    f"sum(rate(llamacpp_prompt_tokens_total{{{P.S}}}[{RI}])) - "
                    f"sum(rate(llamacpp_prompt_tokens_reused_total{{{P.S}}}[{RI}]))",
                    "processed",
                ),
            ],
            stack=True,
            overrides=[color("reused", "green"), color("processed", "orange")],
        ),
        12,
        8,
    )
    lay.add(
        timeseries(
            "Small-task slot takeovers",
            "Requests under takeover.small_task_tokens placed on a slot holding a conversation of "
            "takeover.big_conversation_tokens or more (e.g. a health probe on /completion), per second.",
            "ops",
            [(f"sum(rate(llamacpp_small_task_slot_takeovers_total{{{P.S}}}[{RI}]))", "takeovers")],
        ),
        12,
        8,
    )


def cache_itself(lay: Layout) -> None:
    """The RAM cache itself: entries, update time, small-task takeovers."""
    lay.row("The RAM cache itself")
    lay.add(
        timeseries(
            "Cache entries",
            "Entries held by the RAM prompt cache, per server.",
            "none",
            [(f"sum by (instance) (llamacpp_prompt_cache_entries{{{P.S}}})", "{{instance}}")],
        ),
        8,
        8,
    )
    lay.add(
        timeseries(
            "Cache update time",
            "Time of one RAM prompt-cache save/load/update at slot selection, p50, p90, p95 and p99.",
            "s",
            quantiles("llamacpp_prompt_cache_update_duration_seconds", "", ""),
            min_interval=QUANTILE_INTERVAL,
        ),
        8,
        8,
    )
    lay.add(
        timeseries(
            "Saves and evictions",
            "Slot prompts saved into and entries evicted from the RAM prompt cache per second.",
            "ops",
            [
                (f"sum(rate(llamacpp_prompt_cache_saves_total{{{P.S}}}[{RI}]))", "saves"),
                (f"sum(rate(llamacpp_prompt_cache_evictions_total{{{P.S}}}[{RI}]))", "evictions"),
            ],
        ),
        8,
        8,
    )
    lay.add(
        timeseries(
            "Would a larger --cache-ram help?",
            f"Over the past {P.LARGER_CACHE_WINDOW}: misses of conversations whose RAM-cache entry had been evicted, and how many of "
            "them a --cache-ram twice or four times today's would have avoided (it would still have held the "
            "entry; llama-server evicts the oldest entry first). Two lines close together: a larger cache would "
            "help. 4x far below the misses: the entries are needed again too late for any cache; keep fewer "
            "conversations in flight. `analyze` prints the whole curve.",
            "none",
            [
                (q.evicted_misses(P.S, None, P.LARGER_CACHE_WINDOW), "evicted misses"),
                (q.evicted_misses_avoidable(P.S, None, P.LARGER_CACHE_WINDOW, "2x"), "avoided by 2x --cache-ram"),
                (q.evicted_misses_avoidable(P.S, None, P.LARGER_CACHE_WINDOW, "4x"), "avoided by 4x --cache-ram"),
            ],
        ),
        24,
        8,
    )


def prompt_cache() -> dict[str, Any]:
    lay = Layout()
    cache_sources(lay)
    miss_causes(lay)
    cache_tokens(lay)
    cache_itself(lay)
    return dashboard(
        "llamacpp-prompt-cache",
        "llama.cpp prompt cache",
        "Why prompts miss llama-server's prompt cache: selection paths, outcomes, causes, restores and LoRA.",
        lay,
        [LINKS[0], LINKS[2]],
    )


def who(lay: Layout) -> None:
    """Who is doing this: the top conversations by cost to the others, how requests were attributed."""
    lay.row("Who is doing this")
    lay.add(
        bargauge(
            "Top conversations by cost to the others, over the dashboard's range",
            "Decode seconds of other slots that each conversation's prefills overlapped: the most within any "
            "exporter window (--conversations.window, 15 min) of the dashboard's time range, so a long prefill an "
            "hour ago is still named. Conversations are pseudonyms; `llamacpp-exporter top` shows the same list "
            "now, with prompt sizes, reuse and the last miss cause.",
            "s",
            "topk(10, max by (conversation) (max_over_time(llamacpp_conversation_cost_to_others_seconds"
            f'{{{P.S}, conversation!="other"}}[$__range])))',
            "{{conversation}}",
        ),
        12,
        9,
    )
    lay.add(
        timeseries(
            "Generation speed while another slot prefills",
            "Tokens per second of requests that decoded while another slot prefilled, "
            "against the others (1 / mean time per output token).",
            "suffix: tok/s",
            [
                (q.generation_speed(P.S, None, RI, 'contention="prefill"'), "while another slot prefills"),
                (q.generation_speed(P.S, None, RI, 'contention="none"'), "otherwise"),
            ],
            overrides=[color("while another slot prefills", "red"), color("otherwise", "green")],
        ),
        12,
        9,
    )
    lay.add(
        timeseries(
            "How requests were attributed to conversations",
            "header: the X-Conversation-Id the request sent; lineage: it sent none and is grouped by cache "
            "lineage; uncertain: the log cannot prove which request the task was (two requests arrived within "
            "milliseconds, or a cancel line could not be placed), so it is left out of the conversations above "
            "rather than named after the wrong one.",
            "reqps",
            [
                (
                    f"sum by (source) (rate(llamacpp_exporter_conversation_joins_total{{{P.S}}}[{RI}]))",
                    "{{source}}",
                )
            ],
            stack=True,
            overrides=[color("header", "green"), color("lineage", "blue"), color("uncertain", "orange")],
        ),
        24,
        6,
    )


def prefilling_and_waiting(lay: Layout) -> None:
    """Who is prefilling, who is waiting: prefill tokens in progress against the time per output token."""
    lay.row("Who is prefilling, who is waiting")
    lay.add(
        timeseries(
            "Prefill tokens in progress per slot",
            "Prompt tokens each slot's running prefill computes (0 when not prefilling), stacked. Needs -lv 4.",
            "short",
            [
                (
                    f"sum by (instance, slot) (llamacpp_slot_prefill_tokens_in_progress{{{P.S}}})",
                    "{{instance}} slot {{slot}}",
                )
            ],
            stack=True,
        ),
        12,
        9,
    )
    lay.add(
        timeseries(
            "Time per output token by contention",
            "Mean decode time per token of requests that decoded while another slot prefilled (prefill) and of "
            "the others (none). Exemplars name slot and task.",
            "s",
            [
                (q.tpot_mean(P.S, "contention", RI), "mean {{contention}}"),
                *quantiles(q.TPOT, "contention", "{{contention}}"),
            ],
            exemplar=True,
            min_interval=QUANTILE_INTERVAL,
        ),
        12,
        9,
    )


def what_it_costs(lay: Layout) -> None:
    """What it costs: overlap, prefill duration and size."""
    lay.row("What it costs")
    lay.add(
        timeseries(
            "Decoding overlapped by other slots' prefills",
            "Share of time each slot spent decoding while another slot was prefilling.",
            "percentunit",
            [
                (
                    f"sum by (instance, slot) (rate(llamacpp_decode_prefill_overlap_seconds_total{{{P.S}}}[{RI}]))",
                    "{{instance}} slot {{slot}}",
                )
            ],
        ),
        12,
        8,
    )
    lay.add(
        timeseries(
            "Prefill duration by path",
            "p90, p95 and p99 prefill time by slot-selection path. Exemplars point at the very request (slot, task) of "
            "a long prefill.",
            "s",
            [
                (q.quantile(p, "llamacpp_prefill_duration_seconds", P.S, "path", RI), f"p{round(p * 100)} {{{{path}}}}")
                for p in (0.9, 0.95, 0.99)
            ],
            exemplar=True,
            min_interval=QUANTILE_INTERVAL,
        ),
        12,
        8,
    )
    lay.add(
        timeseries(
            "Prefill size by path",
            "p90, p95 and p99 of prompt tokens computed per prefill, by slot-selection path. Exemplars name slot and task.",
            "short",
            [
                (q.quantile(p, "llamacpp_prefill_tokens", P.S, "path", RI), f"p{round(p * 100)} {{{{path}}}}")
                for p in (0.9, 0.95, 0.99)
            ],
            exemplar=True,
            min_interval=QUANTILE_INTERVAL,
        ),
        12,
        8,
    )
    lay.add(
        timeseries(
            "Slots busy prefilling",
            "Average number of slots prefilling (seconds of prefill completed per second of wall time), by path: "
            "above 1, prefills kept more than one slot busy.",
            "short",
            [
                (
                    f"sum by (path) (rate(llamacpp_prefill_duration_seconds_sum{{{P.S}}}[{RI}]))",
                    "{{path}}",
                )
            ],
            stack=True,
        ),
        12,
        8,
    )


def contention() -> dict[str, Any]:
    lay = Layout()
    who(lay)
    prefilling_and_waiting(lay)
    what_it_costs(lay)
    w_marks = P.WINDOWS["large_prefill_marks"]
    below = f'le="{LARGE_PREFILL_TOKENS}.0"'
    large = (
        f"{q.increase('llamacpp_prefill_tokens_count', P.S, w_marks, 'instance')}\n-\n"
        f"{q.increase('llamacpp_prefill_tokens_bucket', P.S, w_marks, 'instance', below)} > 0"
    )
    annotations = [
        {
            "name": f"Prefills above {LARGE_PREFILL_TOKENS} tokens",
            "datasource": DS,
            "enable": True,
            "hide": False,
            "iconColor": "orange",
            "expr": with_model(large),
            "step": w_marks,
            "titleFormat": "Large prefill",
            "textFormat": f"{{{{instance}}}}: {{{{value}}}} prefill(s) above {LARGE_PREFILL_TOKENS} tokens",
            "useValueForTime": False,
        }
    ]
    return dashboard(
        "llamacpp-contention",
        "llama.cpp prefill contention",
        "Which long prefills slowed everyone's generation down, and by how much.",
        lay,
        LINKS[:2],
        annotations,
    )


DASHBOARDS = {
    "llamacpp-overview.json": overview,
    "llamacpp-prompt-cache.json": prompt_cache,
    "llamacpp-contention.json": contention,
}


def build(c: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """File name -> dashboard, under the thresholds `c`."""
    P.use_thresholds(c)
    try:
        return {name: fn() for name, fn in DASHBOARDS.items()}
    finally:
        P.use_thresholds(q.thresholds())


def render() -> dict[str, str]:
    """File name (relative to the repository) -> content."""
    return {
        f"dashboards/{name}": json.dumps(board, indent=2, ensure_ascii=False) + "\n"
        for name, board in build(q.thresholds()).items()
    }
