"""The panels of the Grafana dashboards (mixin/dashboards.py lays them out): their builders,
the variables, and the thresholds they read.

Every dashboard has datasource, job and instance variables, a stable uid, and a unit and a
description on every panel. Queries aggregate across the selected instances, so one
dashboard serves one server or fifty.
"""

from __future__ import annotations

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
