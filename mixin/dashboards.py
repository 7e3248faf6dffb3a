"""The Grafana dashboards (dashboards/*.json, provisioned from files as they are).

Every dashboard has datasource, job and instance variables, a stable uid, and a unit and a
description on every panel. Queries aggregate across the selected instances, so one
dashboard serves one server or fifty.
"""

from __future__ import annotations

import json
import re
from typing import Any

from . import queries as q  # the PromQL blocks the rules use too
from .jsonnet import Param

DS = {"type": "prometheus", "uid": "${datasource}"}
RI = "$__rate_interval"
LARGE_PREFILL_TOKENS = 4096  # a bucket boundary of llamacpp_prefill_tokens (powers of two)


def variables() -> dict[str, Any]:
    def query_var(name: str, label: str, query: str) -> dict[str, Any]:
        return {
            "name": name,
            "label": label,
            "type": "query",
            "datasource": DS,
            "definition": query,
            "query": {"query": query, "refId": f"{name}-variable"},
            "refresh": 2,
            "includeAll": True,
            "multi": True,
            "allValue": ".+",
            "sort": 1,
            "current": {},
            "options": [],
            "hide": 0,
        }

    return {
        "list": [
            {
                "name": "datasource",
                "label": "Data source",
                "type": "datasource",
                "query": "prometheus",
                "current": {},
                "options": [],
                "refresh": 1,
                "regex": "",
                "hide": 0,
            },
            # fleets across clusters and namespaces; where the series carry neither label the
            # variables hold nothing and All (.*) matches the series without them
            {**query_var("cluster", "Cluster", f"label_values(llamacpp_up, {CLUSTER})"), "allValue": ".*"},
            {
                **query_var("namespace", "Namespace", f'label_values(llamacpp_up{{{CLUSTER}=~"$cluster"}}, namespace)'),
                "allValue": ".*",
            },
            # All: the jobs that export llamacpp_up (Grafana joins their names), never every job
            # Prometheus scrapes: "Servers down" counts up == 0 of this exporter's targets only
            {
                k: v
                for k, v in query_var(
                    "job", "Job", f'label_values(llamacpp_up{{{CLUSTER}=~"$cluster", namespace=~"$namespace"}}, job)'
                ).items()
                if k != "allValue"
            },
            query_var(
                "instance",
                "Instance",
                f'label_values(llamacpp_up{{{CLUSTER}=~"$cluster", namespace=~"$namespace", job=~"$job"}}, instance)',
            ),
            # a router's models; none for a plain server, whose series have no model: All (.*)
            # matches them
            {
                **query_var(
                    "model",
                    "Model",
                    f"label_values(llamacpp_requests_total{{{S}}}, model)",
                ),
                "allValue": ".*",
            },
        ]
    }


class Layout:
    """Places panels left to right, 24 columns wide, and numbers them."""

    def __init__(self) -> None:
        self.panels: list[dict[str, Any]] = []
        self.x = self.y = 0
        self.row_h = 0
        self.next_id = 1

    def row(self, title: str) -> None:
        self.newline()
        self.panels.append(
            {
                "id": self._id(),
                "type": "row",
                "title": title,
                "collapsed": False,
                "panels": [],
                "gridPos": {"h": 1, "w": 24, "x": 0, "y": self.y},
            }
        )
        self.y += 1

    def newline(self) -> None:
        if self.x:
            self.y += self.row_h
            self.x = self.row_h = 0

    def add(self, panel: dict[str, Any], w: int, h: int) -> None:
        if self.x + w > 24:
            self.newline()
        panel["id"] = self._id()
        panel["gridPos"] = {"h": h, "w": w, "x": self.x, "y": self.y}
        self.panels.append(panel)
        self.x += w
        self.row_h = max(self.row_h, h)

    def _id(self) -> int:
        self.next_id += 1
        return self.next_id - 1


# Series of the exporter and the poller as a whole carry no model; every other llamacpp_
# series does (a router's child's model, "" for a plain server, which Prometheus stores as no
# label: the "All" value .* matches it).
_NO_MODEL = (
    "llamacpp_up",
    "llamacpp_loading",
    "llamacpp_slots_",
    "llamacpp_conversation_",
    "llamacpp_exporter_log_lines_total",
    "llamacpp_exporter_scrape_",
    "llamacpp_exporter_last_",
    "llamacpp_exporter_ready",
    "llamacpp_exporter_build_info",
    "llamacpp_exporter_events_",
    "llamacpp_exporter_answers_",
    "llamacpp_exporter_internal_",
    "llamacpp_exporter_log_r",
    "llamacpp_exporter_log_t",
    "llamacpp_exporter_log_command",
)


# set by use_thresholds
THRESHOLDS: dict[str, Any]
WINDOWS: dict[str, Any]
LARGER_CACHE_WINDOW: str
LATENCY_OBJECTIVES: dict[str, Any]
CLUSTER: str
TARGET: str
S: str
_SELECTOR: re.Pattern[str]


def use_thresholds(c: dict[str, Any]) -> None:
    """The thresholds the builders below read (thresholds.yaml's, or the jsonnet mixin's
    symbolic $._config: see mixin/jsonnet.py)."""
    global THRESHOLDS, WINDOWS, LARGER_CACHE_WINDOW, LATENCY_OBJECTIVES, CLUSTER, TARGET, S, _SELECTOR
    THRESHOLDS = c
    WINDOWS = c["windows"]
    LARGER_CACHE_WINDOW = WINDOWS["summary"]
    LATENCY_OBJECTIVES = c["latency_objectives"]
    CLUSTER = c["cluster_label"]
    TARGET = q.target_labels(c)  # a scrape target's labels, where present
    # every series selector carries these; cluster and namespace are All (.*) where series lack them
    S = f'{CLUSTER}=~"$cluster", namespace=~"$namespace", job=~"$job", instance=~"$instance"'
    _SELECTOR = re.compile(r"\b(llamacpp_[a-z0-9_]+)\{" + re.escape(S))


use_thresholds(q.thresholds())


def with_model(expr: str) -> str:
    """The $model variable on every series that carries a model."""
    return _SELECTOR.sub(
        lambda m: m.group(0) if m.group(1).startswith(_NO_MODEL) else m.group(0) + ', model=~"$model"', expr
    )


def target(expr: str, legend: str, ref: str, exemplar: bool = False, instant: bool = False) -> dict[str, Any]:
    expr = with_model(expr)
    t = {"datasource": DS, "expr": expr, "legendFormat": legend, "refId": ref, "exemplar": exemplar}
    if instant:
        t["instant"] = True
        t["range"] = False
    else:
        t["range"] = True
    return t


def _targets(queries: list[tuple[str, str]], exemplar: bool, instant: bool = False) -> list[dict[str, Any]]:
    return [target(e, leg, chr(ord("A") + i), exemplar, instant) for i, (e, leg) in enumerate(queries)]


def timeseries(
    title: str,
    description: str,
    unit: str,
    queries: list[tuple[str, str]],
    *,
    stack: bool = False,
    exemplar: bool = False,
    threshold: float | None = None,
    overrides: list[dict[str, Any]] | None = None,
    minimum: float | None = 0,
    min_interval: str | None = None,
) -> dict[str, Any]:
    custom: dict[str, Any] = {"drawStyle": "line", "lineWidth": 1, "fillOpacity": 10, "showPoints": "never"}
    if stack:
        custom["stacking"] = {"mode": "normal", "group": "A"}
        custom["fillOpacity"] = 40
    defaults: dict[str, Any] = {"unit": unit, "custom": custom}
    if minimum is not None:
        defaults["min"] = minimum
    if threshold is not None:
        custom["thresholdsStyle"] = {"mode": "line+area"}
        defaults["thresholds"] = {
            "mode": "absolute",
            "steps": [{"color": "transparent", "value": None}, {"color": "red", "value": threshold}],
        }
    panel: dict[str, Any] = {
        "type": "timeseries",
        "title": title,
        "description": description,
        "datasource": DS,
        "fieldConfig": {"defaults": defaults, "overrides": overrides or []},
        "options": {
            "legend": {"displayMode": "list", "placement": "bottom", "showLegend": True},
            "tooltip": {"mode": "multi", "sort": "desc"},
        },
        "targets": _targets(queries, exemplar),
    }
    if min_interval:
        # $__rate_interval is at least this: at a request a minute a 1m window is mostly empty
        # and a quantile line is mostly gaps
        panel["interval"] = min_interval
    return panel


def stat(
    title: str,
    description: str,
    unit: str,
    expr: str,
    *,
    red_above: float | None = None,
    green_from: float | None = None,
    mappings: list[dict[str, Any]] | None = None,
    queries: list[tuple[str, str]] | None = None,
) -> dict[str, Any]:
    steps: list[dict[str, Any]] = [{"color": "green", "value": None}]
    if red_above is not None:
        steps.append({"color": "red", "value": red_above})
    if green_from is not None:
        steps = [{"color": "red", "value": None}, {"color": "green", "value": green_from}]
    return {
        "type": "stat",
        "title": title,
        "description": description,
        "datasource": DS,
        "fieldConfig": {
            "defaults": {
                "unit": unit,
                "thresholds": {"mode": "absolute", "steps": steps},
                "mappings": [*(mappings or []), *NO_TRAFFIC],
                "noValue": "no traffic",
            },
            "overrides": [],
        },
        "options": {
            "reduceOptions": {"calcs": ["lastNotNull"], "fields": "", "values": False},
            "colorMode": "background",
            "graphMode": "none",
            "textMode": "value_and_name" if queries else "auto",
        },
        "targets": _targets(queries or [(expr, "")], False, instant=True),
    }


# a ratio or a quantile of nothing (no request in the window) is NaN: say why, not "NaN"
NO_TRAFFIC = [{"type": "special", "options": {"match": "nan", "result": {"text": "no traffic", "color": "text"}}}]


def heatmap(title: str, description: str, unit: str, metric: str) -> dict[str, Any]:
    """A histogram's buckets over time (as vLLM's and SGLang's dashboards show latency)."""
    t = target(f"sum by (le) (increase({metric}_bucket{{{S}}}[{RI}]))", "{{le}}", "A")
    t["format"] = "heatmap"
    return {
        "type": "heatmap",
        "title": title,
        "description": description,
        "datasource": DS,
        "fieldConfig": {
            "defaults": {"unit": unit, "custom": {"scaleDistribution": {"type": "linear"}}},
            "overrides": [],
        },
        "options": {
            "calculate": False,
            "cellGap": 1,
            "color": {"mode": "scheme", "scheme": "Oranges", "scale": "exponential", "exponent": 0.5, "steps": 64},
            "yAxis": {"axisPlacement": "left", "unit": unit},
            "rowsFrame": {"layout": "auto"},
            "tooltip": {"mode": "single", "yHistogram": False, "showColorScale": False},
            "legend": {"show": True},
            "filterValues": {"le": 1e-9},
            "exemplars": {"color": "rgba(255,0,255,0.7)"},
        },
        "targets": [t],
    }


def bargauge(title: str, description: str, unit: str, expr: str, legend: str) -> dict[str, Any]:
    return {
        "type": "bargauge",
        "title": title,
        "description": description,
        "datasource": DS,
        "fieldConfig": {
            "defaults": {
                "unit": unit,
                "min": 0,
                "thresholds": {"mode": "absolute", "steps": [{"color": "orange", "value": None}]},
            },
            "overrides": [],
        },
        "options": {
            "orientation": "horizontal",
            "displayMode": "gradient",
            "reduceOptions": {"calcs": ["lastNotNull"], "fields": "", "values": False},
            "showUnfilled": True,
        },
        "targets": [target(expr, legend, "A", instant=True)],
    }


def color(name: str, c: str) -> dict[str, Any]:
    return {
        "matcher": {"id": "byName", "options": name},
        "properties": [{"id": "color", "value": {"mode": "fixed", "fixedColor": c}}],
    }


def dashboard(
    uid: str,
    title: str,
    description: str,
    layout: Layout,
    links: list[str],
    annotations: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    return {
        "uid": uid,
        "title": title,
        "description": description,
        "id": None,
        "tags": ["llamacpp", "llama-server"],
        "timezone": "browser",
        "editable": True,
        "graphTooltip": 1,
        "schemaVersion": 39,
        "version": 1,
        "refresh": "30s",
        "time": {"from": "now-3h", "to": "now"},
        "timepicker": {},
        "fiscalYearStartMonth": 0,
        "liveNow": False,
        "weekStart": "",
        "templating": variables(),
        "annotations": {
            "list": [
                {
                    "builtIn": 1,
                    "datasource": {"type": "grafana", "uid": "-- Grafana --"},
                    "enable": True,
                    "hide": True,
                    "iconColor": "rgba(0, 211, 255, 1)",
                    "name": "Annotations & Alerts",
                    "type": "dashboard",
                },
                *(annotations or []),
            ]
        },
        "links": [
            {
                "title": t,
                "type": "link",
                "url": f"/d/{u}?${{__url_time_range}}&${{__all_variables}}",
                "icon": "dashboard",
                "targetBlank": False,
                "tooltip": "",
                "asDropdown": False,
                "includeVars": False,
                "keepTime": False,
                "tags": [],
            }
            for u, t in (l_.split("|") for l_ in links)
        ],
        "panels": layout.panels,
    }


def minutes(window: str) -> str:
    """15m -> 15 min, for titles (the jsonnet mixin's minutes() for a configured window)."""
    if isinstance(window, Param):
        return window.call("minutes")
    return f"{window[:-1]} min" if window.endswith("m") else window


def quantiles(metric: str, by: str, legend: str) -> list[tuple[str, str]]:
    return [(q.quantile(p, metric, S, by, RI), f"p{round(p * 100)} {legend}".strip()) for p in (0.5, 0.9, 0.95, 0.99)]


QUANTILE_INTERVAL = "5m"  # the least window of a quantile panel (see timeseries' min_interval)


def table(title: str, description: str, columns: list[tuple[str, str, str, float | None]]) -> dict[str, Any]:
    """One row per instance, one column per (header, unit, instant query by instance, the value
    above which its cell is red); the instance links to that server's own view."""
    targets = []
    for i, (_, _, expr, _) in enumerate(columns):
        t = target(expr, "", chr(ord("A") + i), instant=True)
        t["format"] = "table"
        targets.append(t)
    rename = {f"Value #{chr(ord('A') + i)}": header for i, (header, _, _, _) in enumerate(columns)}
    overrides: list[dict[str, Any]] = []
    for header, unit, _, red_above in columns:
        props: list[dict[str, Any]] = [{"id": "unit", "value": unit}]
        if red_above is not None:
            steps = [{"color": "green", "value": None}, {"color": "red", "value": red_above}]
            props += [
                {"id": "thresholds", "value": {"mode": "absolute", "steps": steps}},
                {"id": "custom.cellOptions", "value": {"type": "color-background"}},
            ]
        overrides.append({"matcher": {"id": "byName", "options": header}, "properties": props})
    link = "/d/llamacpp-overview?var-job=${job}&var-instance=${__value.raw}&${__url_time_range}"
    overrides.append(
        {
            "matcher": {"id": "byName", "options": "instance"},
            "properties": [{"id": "links", "value": [{"title": "This server's view", "url": link}]}],
        }
    )
    return {
        "type": "table",
        "title": title,
        "description": description,
        "datasource": DS,
        "fieldConfig": {
            "defaults": {"unit": "none", "noValue": "no traffic", "mappings": NO_TRAFFIC},
            "overrides": overrides,
        },
        "options": {"showHeader": True, "sortBy": [{"displayName": columns[1][0], "desc": True}]},
        "transformations": [
            {"id": "merge", "options": {}},
            {"id": "organize", "options": {"excludeByName": {"Time": True}, "renameByName": rename}},
        ],
        "targets": targets,
    }


LINKS = [
    "llamacpp-overview|llama.cpp overview",
    "llamacpp-prompt-cache|llama.cpp prompt cache",
    "llamacpp-contention|llama.cpp prefill contention",
]


def golden_signals(lay: Layout) -> None:
    """The first row: what users feel, over the alerts' summary window (a stat over
    $__rate_interval is mostly empty at llama.cpp's request rates)."""
    w = WINDOWS["summary"]
    lo = LATENCY_OBJECTIVES
    lay.row(f"Golden signals, last {minutes(w)}")
    p95 = "p95 over the last " + minutes(w) + "utes, all selected servers."
    known = " Needs -lv 4 (the arrival is read from the log)."
    signals = [
        stat(
            "Requests/s",
            f"Requests that ended per second over the last {minutes(w)}utes (any way they ended).",
            "reqps",
            q.rate(q.FINISHED, S, w),
        ),
        stat(
            "Tokens/s in",
            f"Prompt tokens computed per second over the last {minutes(w)}utes, from llama-server's own counter "
            "(--metrics; older builds count reused tokens in).",
            "suffix: tok/s",
            q.rate("llamacpp_server_prompt_tokens_total", S, w),
        ),
        stat(
            "Tokens/s out",
            f"Tokens generated per second over the last {minutes(w)}utes (llama-server's --metrics).",
            "suffix: tok/s",
            q.rate("llamacpp_server_tokens_predicted_total", S, w),
        ),
        stat(
            "TTFT p95",
            "Time to first token (arrival to first token), " + p95 + known,
            "s",
            q.quantile(0.95, q.TTFT, S, "", w),
            red_above=lo["time_to_first_token"],
        ),
        stat(
            "Time per token p95",
            "Time per output token, " + p95,
            "s",
            q.quantile(0.95, q.TPOT, S, "", w),
            red_above=lo["time_per_output_token"],
        ),
        stat(
            "End-to-end p95",
            "Arrival to release (queue, prefill, generation), " + p95 + known,
            "s",
            q.quantile(0.95, q.E2E, S, "", w),
        ),
        stat(
            "Error share",
            f"Requests that failed or were cancelled while they ran, of all that ended, over the last {minutes(w)}"
            "utes. Requests whose client gave up while queued never started and are not in it.",
            "percentunit",
            q.finished_ratio(S, None, w, q.FAILED_OR_CANCELLED),
            red_above=THRESHOLDS["request_errors"]["ratio"],
        ),
        stat(
            "Objective attainment",
            f"Share of requests within each latency objective over the last {minutes(w)}utes (time to first token "
            f"{lo['time_to_first_token']:g} s, time per token {lo['time_per_output_token']:g} s, queue "
            f"{lo['queue_time']:g} s: mixin/thresholds.yaml); red below the {lo['target']:.0%} target.",
            "percentunit",
            "",
            green_from=lo["target"],
            queries=[(q.within_objective_ratio(o.histogram, S, None, w, lo[o.key]), o.label) for o in q.OBJECTIVES],
        ),
    ]
    for panel in signals:
        lay.add(panel, 3, 4)


def overview() -> dict[str, Any]:
    miss_t = THRESHOLDS["ram_miss_rate"]["ratio"]
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
    w_sum, w_miss = WINDOWS["summary"], THRESHOLDS["ram_miss_rate"]["window"]
    w_wrongful, w_drift = THRESHOLDS["wrongful_lora_discard"]["window"], THRESHOLDS["log_parse_drift"]["window"]
    lay = Layout()
    golden_signals(lay)
    lay.row("The prompt cache and health at a glance")
    # Stats use the alerts' windows (and windows.summary): at llama.cpp's request rates a
    # $__rate_interval window is often empty.
    lay.add(
        stat(
            f"RAM-path miss ratio, {minutes(w_miss)}",
            "Share of long prompts (>= cache.min_prompt_tokens) coming back through the RAM prompt cache that "
            f"reused less than 10% of their prompt, over the alert's {minutes(w_miss)}utes. Needs -lv 4.",
            "percentunit",
            q.ram_miss_ratio(S, "job", w_miss),
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
            q.wrongful_lora_discards(S, None, w_wrongful),
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
            f'(count(llamacpp_up{{{S}, endpoint="health"}} == 0 unless on ({TARGET}) llamacpp_loading{{{S}}} == 1) '
            f"or vector(0))\n+\n(count(up{{{S}}} == 0) or vector(0))",
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
            f"min(llamacpp_exporter_cache_diagnostics_available{{{S}}})",
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
            q.unparsed_lines(S, None, w_drift),
            red_above=10,
        ),
        4,
        4,
    )
    lay.row("Serving: traffic, saturation, errors")
    lay.add(
        stat(
            f"Requests, last {minutes(w_sum)}",
            f"Completed requests in the last {minutes(w_sum)}utes, all selected servers.",
            "short",
            q.increase("llamacpp_requests_total", S, w_sum),
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
                    f"sum(rate(llamacpp_server_prompt_tokens_total{{{S}}}[{RI}])"
                    f" and on ({TARGET}, model) llamacpp_server_prompt_tokens_cached_total{{{S}}})",
                    "prompt computed",
                ),
                (f"sum(rate(llamacpp_server_prompt_tokens_cached_total{{{S}}}[{RI}]))", "prompt reused"),
                (
                    f"sum(rate(llamacpp_server_prompt_tokens_total{{{S}}}[{RI}])"
                    f" unless on ({TARGET}, model) llamacpp_server_prompt_tokens_cached_total{{{S}}})",
                    "prompt, reused included (older builds)",
                ),
                (f"sum(rate(llamacpp_server_tokens_predicted_total{{{S}}}[{RI}]))", "generated"),
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
                (f"sum(llamacpp_server_requests_processing{{{S}}})", "processing"),
                (f"sum(llamacpp_server_requests_deferred{{{S}}})", "deferred"),
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
                (f"sum by (instance) (llamacpp_slots_processing{{{S}}})", "{{instance}} busy slots"),
                (f"avg by (instance) (llamacpp_slots_context_usage_ratio{{{S}}})", "{{instance}} context used"),
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
                (f"sum by (reason) (rate({q.FINISHED}{{{S}}}[{RI}]))", "{{reason}}"),
                (f"sum(rate(llamacpp_requests_never_started_total{{{S}}}[{RI}]))", "never started"),
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
                (f"sum by (model) (rate(llamacpp_requests_total{{{S}}}[{RI}]))", "{{model}} requests"),
                (f"sum by (model) (rate(llamacpp_embedding_tasks_total{{{S}}}[{RI}]))", "{{model}} embedding tasks"),
            ],
        ),
        6,
        8,
    )
    lay.row("Requests and the RAM prompt cache")
    lay.add(
        timeseries(
            "Requests by path and LoRA",
            "Completed requests per second by how the slot was chosen (slot: it still held the conversation; "
            "ram: LRU, the RAM cache was consulted; pinned: id_slot) and LoRA state.",
            "reqps",
            [(f"sum by (path, lora) (rate(llamacpp_requests_total{{{S}}}[{RI}]))", "{{path}} / lora {{lora}}")],
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
            [(q.ram_miss_ratio(S, "lora", RI), "lora {{lora}}")],
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
                    f"sum by (result) (rate(llamacpp_prompt_cache_restores_total{{{S}}}[{RI}]))",
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
            "Share of the requests that ended which failed or were cancelled while they ran, and which were "
            "truncated (the context filled up). The red line is LlamaCppRequestErrorsHigh's threshold.",
            "percentunit",
            [
                (q.finished_ratio(S, None, RI, q.FAILED_OR_CANCELLED), "failed or cancelled"),
                (q.finished_ratio(S, None, RI, 'reason="truncated"'), "truncated"),
            ],
            overrides=[color("failed or cancelled", "red"), color("truncated", "purple")],
            threshold=THRESHOLDS["request_errors"]["ratio"],
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
    w_tab = WINDOWS["summary"]
    lo = LATENCY_OBJECTIVES
    lay.add(
        table(
            f"Servers, last {minutes(w_tab)}",
            f"One row per server over the last {minutes(w_tab)}utes, sorted by request rate: the one bad server "
            "out of fifty is the row whose red cell stands out (past an alert's threshold or a latency objective). "
            "Click a server to see only it.",
            [
                ("health", "none", f'max by (instance) (llamacpp_up{{{S}, endpoint="health"}})', None),
                ("requests/s", "reqps", q.rate(q.FINISHED, S, w_tab, "instance"), None),
                (
                    "error share",
                    "percentunit",
                    q.finished_ratio(S, "instance", w_tab, q.FAILED_OR_CANCELLED).replace("\n", " "),
                    THRESHOLDS["request_errors"]["ratio"],
                ),
                ("TTFT p95", "s", q.quantile(0.95, q.TTFT, S, "instance", w_tab), lo["time_to_first_token"]),
                ("time/token p95", "s", q.quantile(0.95, q.TPOT, S, "instance", w_tab), lo["time_per_output_token"]),
                ("queue p95", "s", q.quantile(0.95, q.QUEUE, S, "instance", w_tab), lo["queue_time"]),
                (
                    "RAM-path miss ratio",
                    "percentunit",
                    q.ram_miss_ratio(S, "instance", w_tab).replace("\n", " "),
                    THRESHOLDS["ram_miss_rate"]["ratio"],
                ),
                (
                    "latency unknown",
                    "percentunit",
                    f"sum by (instance) (increase(llamacpp_request_latency_unknown_total{{{S}}}[{w_tab}])) / "
                    f"sum by (instance) (increase(llamacpp_requests_total{{{S}}}[{w_tab}]))",
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
    lay.row("RAM prompt cache")
    lay.add(
        timeseries(
            "RAM cache size and limit",
            "Bytes held by the RAM prompt cache and its --cache-ram limit, per server.",
            "bytes",
            [
                (f"sum by (instance) (llamacpp_prompt_cache_bytes{{{S}}})", "{{instance}} used"),
                (f"sum by (instance) (llamacpp_prompt_cache_limit_bytes{{{S}}})", "{{instance}} limit"),
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
            [(f"sum by (instance) (rate(llamacpp_prompt_cache_evictions_total{{{S}}}[{RI}]))", "{{instance}}")],
        ),
        12,
        8,
    )
    lay.row("Exporter health")
    lay.add(
        timeseries(
            "llama-server endpoints up",
            "Whether the last request of the exporter to each llama-server endpoint succeeded (1) or not (0).",
            "none",
            [(f"llamacpp_up{{{S}}}", "{{instance}} {{endpoint}}")],
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
            [(f"sum by (result) (rate(llamacpp_exporter_log_lines_total{{{S}}}[{RI}]))", "{{result}}")],
        ),
        8,
        8,
    )
    lay.add(
        timeseries(
            "Endpoint errors",
            "Failed requests of the exporter to llama-server per second, by endpoint.",
            "suffix: errors/s",
            [(f"sum by (endpoint) (rate(llamacpp_exporter_scrape_errors_total{{{S}}}[{RI}]))", "{{endpoint}}")],
        ),
        8,
        8,
    )
    w_marks, w_build = WINDOWS["restart_marks"], WINDOWS["build_change"]
    annotations = [
        {
            "name": "Firing alerts",
            "datasource": DS,
            "enable": True,
            "hide": False,
            "iconColor": "orange",
            # the rules' own ALERTS series: one mark per alert while it fires
            "expr": f'ALERTS{{alertstate="firing", alertname=~"LlamaCpp.+", {S}}}',
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
                f"sum by (instance) (increase(llamacpp_exporter_server_restarts_total{{{S}}}[{w_marks}])) > 0"
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
                f"count by (instance, build, commit) (llamacpp_exporter_server_build_info{{{S}}}"
                f" unless llamacpp_exporter_server_build_info{{{S}}} offset {w_build})"
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


def prompt_cache() -> dict[str, Any]:
    lay = Layout()
    lay.row("Where requests come from")
    lay.add(
        timeseries(
            "Selection path mix",
            "Requests per second by slot-selection path: slot (LCP match, the slot still held the conversation), "
            "ram (LRU, RAM cache consulted), pinned (id_slot), unknown (selection not seen).",
            "reqps",
            [(f"sum by (path) (rate(llamacpp_requests_total{{{S}}}[{RI}]))", "{{path}}")],
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
                    q.rate(q.OUTCOMES, S, RI, "path, lora, outcome"),
                    "{{outcome}} {{path}} / lora {{lora}}",
                )
            ],
        ),
        12,
        8,
    )
    lay.row("Why prompts miss")
    lay.add(
        timeseries(
            "Misses by cause",
            "Long-prompt misses per second by cause: lora_discard (restored entry cleared for a LoRA change), "
            "forced_reprocess (no usable SWA/hybrid checkpoint), no_cache_entry, slot_prefix_mismatch, unknown.",
            "reqps",
            [(f"sum by (cause) (rate(llamacpp_prompt_cache_misses_total{{{S}}}[{RI}]))", "{{cause}}")],
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
                    f"sum by (lora, result) (rate(llamacpp_prompt_cache_restores_total{{{S}}}[{RI}]))",
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
                    f"sum by (lora) (rate(llamacpp_prompt_cache_lora_mismatch_reuse_total{{{S}}}[{RI}]))",
                    "lora {{lora}}",
                )
            ],
        ),
        8,
        8,
    )
    lay.row("Tokens")
    lay.add(
        timeseries(
            "Reused vs processed prompt tokens",
            "Prompt tokens per second reused from the slot or the RAM cache against those computed again.",
            "suffix: tok/s",
            [
                (f"sum(rate(llamacpp_prompt_tokens_reused_total{{{S}}}[{RI}]))", "reused"),
                (
                    f"sum(rate(llamacpp_prompt_tokens_total{{{S}}}[{RI}])) - "
                    f"sum(rate(llamacpp_prompt_tokens_reused_total{{{S}}}[{RI}]))",
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
            [(f"sum(rate(llamacpp_small_task_slot_takeovers_total{{{S}}}[{RI}]))", "takeovers")],
        ),
        12,
        8,
    )
    lay.row("The RAM cache itself")
    lay.add(
        timeseries(
            "Cache entries",
            "Entries held by the RAM prompt cache, per server.",
            "none",
            [(f"sum by (instance) (llamacpp_prompt_cache_entries{{{S}}})", "{{instance}}")],
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
                (f"sum(rate(llamacpp_prompt_cache_saves_total{{{S}}}[{RI}]))", "saves"),
                (f"sum(rate(llamacpp_prompt_cache_evictions_total{{{S}}}[{RI}]))", "evictions"),
            ],
        ),
        8,
        8,
    )
    lay.add(
        timeseries(
            "Would a larger --cache-ram help?",
            f"Over the past {LARGER_CACHE_WINDOW}: misses of conversations whose RAM-cache entry had been evicted, and how many of "
            "them a --cache-ram twice or four times today's would have avoided (it would still have held the "
            "entry; llama-server evicts the oldest entry first). Two lines close together: a larger cache would "
            "help. 4x far below the misses: the entries are needed again too late for any cache; keep fewer "
            "conversations in flight. `analyze` prints the whole curve.",
            "none",
            [
                (q.evicted_misses(S, None, LARGER_CACHE_WINDOW), "evicted misses"),
                (q.evicted_misses_avoidable(S, None, LARGER_CACHE_WINDOW, "2x"), "avoided by 2x --cache-ram"),
                (q.evicted_misses_avoidable(S, None, LARGER_CACHE_WINDOW, "4x"), "avoided by 4x --cache-ram"),
            ],
        ),
        24,
        8,
    )
    return dashboard(
        "llamacpp-prompt-cache",
        "llama.cpp prompt cache",
        "Why prompts miss llama-server's prompt cache: selection paths, outcomes, causes, restores and LoRA.",
        lay,
        [LINKS[0], LINKS[2]],
    )


def contention() -> dict[str, Any]:
    lay = Layout()
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
            f'{{{S}, conversation!="other"}}[$__range])))',
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
                (q.generation_speed(S, None, RI, 'contention="prefill"'), "while another slot prefills"),
                (q.generation_speed(S, None, RI, 'contention="none"'), "otherwise"),
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
                    f"sum by (source) (rate(llamacpp_exporter_conversation_joins_total{{{S}}}[{RI}]))",
                    "{{source}}",
                )
            ],
            stack=True,
            overrides=[color("header", "green"), color("lineage", "blue"), color("uncertain", "orange")],
        ),
        24,
        6,
    )
    lay.row("Who is prefilling, who is waiting")
    lay.add(
        timeseries(
            "Prefill tokens in progress per slot",
            "Prompt tokens each slot's running prefill computes (0 when not prefilling), stacked. Needs -lv 4.",
            "short",
            [
                (
                    f"sum by (instance, slot) (llamacpp_slot_prefill_tokens_in_progress{{{S}}})",
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
                (q.tpot_mean(S, "contention", RI), "mean {{contention}}"),
                *quantiles(q.TPOT, "contention", "{{contention}}"),
            ],
            exemplar=True,
            min_interval=QUANTILE_INTERVAL,
        ),
        12,
        9,
    )
    lay.row("What it costs")
    lay.add(
        timeseries(
            "Decoding overlapped by other slots' prefills",
            "Share of time each slot spent decoding while another slot was prefilling.",
            "percentunit",
            [
                (
                    f"sum by (instance, slot) (rate(llamacpp_decode_prefill_overlap_seconds_total{{{S}}}[{RI}]))",
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
                (q.quantile(p, "llamacpp_prefill_duration_seconds", S, "path", RI), f"p{round(p * 100)} {{{{path}}}}")
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
                (q.quantile(p, "llamacpp_prefill_tokens", S, "path", RI), f"p{round(p * 100)} {{{{path}}}}")
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
                    f"sum by (path) (rate(llamacpp_prefill_duration_seconds_sum{{{S}}}[{RI}]))",
                    "{{path}}",
                )
            ],
            stack=True,
        ),
        12,
        8,
    )
    w_marks = WINDOWS["large_prefill_marks"]
    below = f'le="{LARGE_PREFILL_TOKENS}.0"'
    large = (
        f"{q.increase('llamacpp_prefill_tokens_count', S, w_marks, 'instance')}\n-\n"
        f"{q.increase('llamacpp_prefill_tokens_bucket', S, w_marks, 'instance', below)} > 0"
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
    use_thresholds(c)
    try:
        return {name: fn() for name, fn in DASHBOARDS.items()}
    finally:
        use_thresholds(q.thresholds())


def render() -> dict[str, str]:
    """File name (relative to the repository) -> content."""
    return {
        f"dashboards/{name}": json.dumps(board, indent=2, ensure_ascii=False) + "\n"
        for name, board in build(q.thresholds()).items()
    }
