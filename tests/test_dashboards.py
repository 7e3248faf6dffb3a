"""Dashboards: generated, provisionable as-is, shaped as Grafana expects, and built only on
metrics the exporter exports; every query is valid PromQL for a real Prometheus."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from promql import DASHBOARDS, ROOT, Prometheus, dashboard_expressions, metric_names
from support import exported_metric_names

PANEL_TYPES = {"row", "timeseries", "stat", "bargauge", "heatmap", "table"}


def load(f: Path) -> dict[str, Any]:
    board: dict[str, Any] = json.loads(f.read_text())
    return board


@pytest.mark.integration
def test_generated_dashboards_are_up_to_date() -> None:
    res = subprocess.run([sys.executable, "-m", "mixin", "--check"], cwd=ROOT, capture_output=True, text=True)
    assert res.returncode == 0, res.stderr


def test_three_dashboards_with_stable_unique_uids() -> None:
    uids = [load(f)["uid"] for f in DASHBOARDS]
    assert sorted(uids) == ["llamacpp-contention", "llamacpp-overview", "llamacpp-prompt-cache"]


@pytest.mark.parametrize("path", DASHBOARDS, ids=lambda p: p.name)
def test_dashboard_shape(path: Path) -> None:
    d = load(path)
    for key in ("uid", "title", "schemaVersion", "panels", "templating", "time", "tags"):
        assert key in d, key
    assert d["id"] is None and isinstance(d["schemaVersion"], int) and d["schemaVersion"] >= 36
    assert len(d["uid"]) <= 40
    variables = {v["name"]: v for v in d["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource" and variables["datasource"]["query"] == "prometheus"
    for name in ("cluster", "namespace", "job", "instance"):
        v = variables[name]
        assert v["type"] == "query" and v["datasource"]["uid"] == "${datasource}"
        assert v["multi"] and v["includeAll"]
    ids = [p["id"] for p in d["panels"]]
    assert len(ids) == len(set(ids))
    for p in d["panels"]:
        assert p["type"] in PANEL_TYPES
        g = p["gridPos"]
        assert 0 <= g["x"] and g["x"] + g["w"] <= 24 and g["h"] > 0
        if p["type"] == "row":
            continue
        assert p["title"] and p["description"], p["title"]
        assert p["fieldConfig"]["defaults"]["unit"], p["title"]
        assert p["datasource"] == {"type": "prometheus", "uid": "${datasource}"}
        refs = [t["refId"] for t in p["targets"]]
        assert refs and len(refs) == len(set(refs))
        for t in p["targets"]:
            assert t["datasource"]["uid"] == "${datasource}"
            for sel in _selectors(t["expr"]):
                assert 'job=~"$job"' in sel and 'instance=~"$instance"' in sel, (p["title"], t["expr"])
                assert 'cluster=~"$cluster"' in sel and 'namespace=~"$namespace"' in sel, (p["title"], t["expr"])
            for fn in ("rate(", "increase("):
                for part in t["expr"].split(fn)[1:]:
                    window = part.split("[", 1)[1].split("]", 1)[0]
                    assert window in ("$__rate_interval", "15m"), (p["title"], window)


def test_stats_use_a_window_that_has_data_at_llamacpp_request_rates() -> None:
    """A stat shows one number: over $__rate_interval (a few scrapes) it is mostly empty or
    zero at a few requests a minute. Stats use the alerts' 15 minutes."""
    for path in DASHBOARDS:
        for p in load(path)["panels"]:
            if p["type"] == "stat":
                for t in p["targets"]:
                    assert "$__rate_interval" not in t["expr"], (path.name, p["title"])


def test_overview_leads_with_golden_signals_and_counts_dead_exporters() -> None:
    """The first row is what users feel (vLLM's overview leads the same way): requests/s, tokens
    in and out, TTFT, time per token and end-to-end p95, error share, objective attainment;
    then the cache. Every stat says "no traffic" where there is nothing to compute."""
    d = load(ROOT / "dashboards" / "llamacpp-overview.json")
    first_row = []
    for p in d["panels"][1:]:
        if p["type"] == "row":
            break
        first_row.append(p)
    assert [p["title"] for p in first_row] == [
        "Requests/s",
        "Tokens/s in",
        "Tokens/s out",
        "TTFT p95",
        "Time per token p95",
        "End-to-end p95",
        "Error share",
        "Objective attainment",
    ]
    exprs = {p["title"]: " ".join(t["expr"] for t in p["targets"]) for p in first_row}
    assert "llamacpp_server_prompt_tokens_total" in exprs["Tokens/s in"]
    assert "llamacpp_server_tokens_predicted_total" in exprs["Tokens/s out"]
    for title, metric in (
        ("TTFT p95", "llamacpp_time_to_first_token_seconds_bucket"),
        ("Time per token p95", "llamacpp_time_per_output_token_seconds_bucket"),
        ("End-to-end p95", "llamacpp_request_duration_seconds_bucket"),
    ):
        assert exprs[title].startswith("histogram_quantile(0.95") and metric in exprs[title]
    assert 'reason=~"failed|cancelled"' in exprs["Error share"]
    for key, le in (("time_to_first_token", "10.0"), ("time_per_output_token", "0.1"), ("queue_time", "5.0")):
        assert f'le="{le}"' in exprs["Objective attainment"], key
    for p in first_row:
        assert p["fieldConfig"]["defaults"]["noValue"] == "no traffic", p["title"]
        assert {"type": "special", "options": {"match": "nan", "result": {"text": "no traffic", "color": "text"}}} in (
            p["fieldConfig"]["defaults"]["mappings"]
        )
    second_row = d["panels"][len(first_row) + 2 :]
    assert second_row[0]["title"].startswith("RAM-path miss ratio")
    panels = [p for p in d["panels"] if p["type"] != "row"]
    down = next(p for p in panels if p["title"] == "Servers down")
    assert "up{" in down["targets"][0]["expr"] and "== 0" in down["targets"][0]["expr"]
    exprs_all = " ".join(t["expr"] for p in panels for t in p["targets"])
    for m in (
        "llamacpp_server_tokens_predicted_total",
        "llamacpp_server_requests_processing",
        "llamacpp_server_requests_deferred",
        "llamacpp_slots_processing",
        "llamacpp_slots_context_usage_ratio",
    ):
        assert m in exprs_all, m
    heatmaps = {m for p in panels if p["type"] == "heatmap" for m in metric_names(p["targets"][0]["expr"])}
    assert heatmaps == {"llamacpp_prefill_duration_seconds_bucket", "llamacpp_time_per_output_token_seconds_bucket"}
    for p in panels:
        if any("slots_processing" in t["expr"] for t in p["targets"]):
            assert p["fieldConfig"]["defaults"]["unit"] != "percentunit", p["title"]


def _selectors(expr: str) -> list[str]:
    return re.findall(r"llamacpp_[a-z0-9_]+\{[^}]*\}", expr)


def test_every_panel_selector_filters_job_and_instance() -> None:
    for e in dashboard_expressions():
        bare = re.findall(r"\bllamacpp_[a-z0-9_]+(?![a-z0-9_{])", e.expr)
        assert not bare, f"{e.where}: metric without a selector: {bare}"


def test_dashboards_only_use_exported_metrics() -> None:
    exported = exported_metric_names()
    for e in dashboard_expressions():
        for m in metric_names(e.expr):
            assert m in exported, f"{e.where}: {m} is not exported"
    for f in DASHBOARDS:
        for v in load(f)["templating"]["list"]:
            if v["type"] == "query":
                for m in metric_names(v["definition"]):
                    assert m in exported


# Keys Grafana itself writes into dashboards that the foundation SDK's schema models omit.
SCHEMA_EXTRAS = (
    {".id", ".annotations.list[0].builtIn"}
    | {f".templating.list[{i}].definition" for i in range(6)}
    # Prometheus annotation queries: fields of the datasource's query, not of the dashboard schema
    | {
        f".annotations.list[{i}].{k}"
        for i in range(1, 4)
        for k in ("expr", "step", "titleFormat", "textFormat", "useValueForTime", "tagKeys")
    }
)


def _dropped(a: Any, b: Any, path: str = "") -> list[str]:
    """Keys of `a` missing from `b`, recursively."""
    out: list[str] = []
    if isinstance(a, dict) and isinstance(b, dict):
        for k, v in a.items():
            out += [f"{path}.{k}"] if k not in b else _dropped(v, b[k], f"{path}.{k}")
    elif isinstance(a, list) and isinstance(b, list):
        for i, (x, y) in enumerate(zip(a, b, strict=False)):
            out += _dropped(x, y, f"{path}[{i}]")
    return out


@pytest.mark.parametrize("path", DASHBOARDS, ids=lambda p: p.name)
def test_dashboard_round_trips_through_grafanas_schema_models(path: Path) -> None:
    """Decode with Grafana's own typed models (grafana-foundation-sdk) and encode again: a
    key Grafana's dashboard schema does not know would be dropped, a wrong type would fail."""
    from grafana_foundation_sdk.cog.encoder import JSONEncoder
    from grafana_foundation_sdk.models.dashboard import Dashboard

    d = load(path)
    again = json.loads(json.dumps(Dashboard.from_json(d), cls=JSONEncoder))
    assert set(_dropped(d, again)) <= SCHEMA_EXTRAS, _dropped(d, again)
    assert [p["type"] for p in again["panels"]] == [p["type"] for p in d["panels"]]


def test_provisioning_files() -> None:
    ds = yaml.safe_load((ROOT / "deploy/grafana/provisioning/datasources/prometheus.yaml").read_text())
    assert ds["apiVersion"] == 1
    (d,) = ds["datasources"]
    assert d["type"] == "prometheus" and d["url"].startswith("http") and d["access"] == "proxy"
    prov = yaml.safe_load((ROOT / "deploy/grafana/provisioning/dashboards/llamacpp.yaml").read_text())
    assert prov["apiVersion"] == 1
    (p,) = prov["providers"]
    assert p["type"] == "file" and p["options"]["path"] == "/var/lib/grafana/dashboards"


@pytest.fixture(scope="module")
def empty_prometheus(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Prometheus]:
    prom = Prometheus(tmp_path_factory.mktemp("prom-parse"), {"global": {"scrape_interval": "15s"}})
    yield prom
    prom.stop()


@pytest.mark.integration
def test_every_dashboard_query_is_valid_promql(empty_prometheus: Prometheus) -> None:
    for e in dashboard_expressions():
        res = empty_prometheus.query(e.promql)
        assert res["status"] == "success", f"{e.where}: {res.get('error')}"


BUILDERS = [ROOT / "mixin" / "rules.py", ROOT / "mixin" / "dashboards.py", ROOT / "mixin" / "kubernetes.py"]


def test_every_fixed_window_comes_from_the_thresholds_file() -> None:
    """The builders write no window of their own: each is an alert's, one of `windows:` in
    mixin/thresholds.yaml, or Grafana's $__rate_interval."""
    for path in BUILDERS:
        fixed = re.findall(r"\[\d+[smhdw]\]", path.read_text())
        assert not fixed, f"{path.name}: {fixed}"


def test_shared_figures_are_written_once_in_the_query_blocks() -> None:
    """The RAM-path miss ratio, wrongful discards, time per output token, evicted misses and
    unparsed lines are computed by mixin/queries.py for the rules and the dashboards alike:
    neither builder spells the series they are made of."""
    for path in BUILDERS:
        text = path.read_text()
        for series in (
            "llamacpp_prompt_cache_outcomes_total{",
            "llamacpp_time_per_output_token_seconds_sum{",
            "llamacpp_time_per_output_token_seconds_count{",
            'result="discarded_lora_wrongful"',
            'cause="evicted"',
            "unrecognized|unreadable",
            "histogram_quantile(",
        ):
            assert series not in text, f"{path.name} writes {series} itself: use mixin/queries.py"


def test_overview_has_the_latency_users_know_a_table_per_server_and_restart_marks() -> None:
    d = load(ROOT / "dashboards" / "llamacpp-overview.json")
    panels = {p["title"]: p for p in d["panels"] if p["type"] != "row"}
    for title, metric in (
        ("Time to first token", "llamacpp_time_to_first_token_seconds_bucket"),
        ("Queue time", "llamacpp_request_queue_seconds_bucket"),
        ("End-to-end latency", "llamacpp_request_duration_seconds_bucket"),
    ):
        exprs = [t["expr"] for t in panels[title]["targets"]]
        assert [e.split(",", 1)[0] for e in exprs] == [
            f"histogram_quantile({p}" for p in ("0.5", "0.9", "0.95", "0.99")
        ]
        assert all(metric in e for e in exprs)
    assert "llamacpp_requests_finished_total" in panels["Error share"]["targets"][0]["expr"]
    table = next(p for p in d["panels"] if p["type"] == "table")
    assert all("by (instance)" in t["expr"] or "instance)" in t["expr"] for t in table["targets"])
    names = {a["name"] for a in d["annotations"]["list"]}
    assert {"llama-server restarts", "llama-server build changes", "Firing alerts"} <= names
    firing = next(a for a in d["annotations"]["list"] if a["name"] == "Firing alerts")
    assert firing["expr"].startswith('ALERTS{alertstate="firing"')


def test_the_server_table_colours_cells_past_thresholds_and_links_each_server_to_its_view() -> None:
    d = load(ROOT / "dashboards" / "llamacpp-overview.json")
    table = next(p for p in d["panels"] if p["type"] == "table")
    by_name = {
        o["matcher"]["options"]: {x["id"]: x["value"] for x in o["properties"]}
        for o in table["fieldConfig"]["overrides"]
    }
    th = yaml.safe_load((ROOT / "mixin" / "thresholds.yaml").read_text())
    for column, red in (
        ("error share", th["request_errors"]["ratio"]),
        ("TTFT p95", th["latency_objectives"]["time_to_first_token"]),
        ("time/token p95", th["latency_objectives"]["time_per_output_token"]),
        ("queue p95", th["latency_objectives"]["queue_time"]),
        ("RAM-path miss ratio", th["ram_miss_rate"]["ratio"]),
    ):
        assert by_name[column]["thresholds"]["steps"][-1] == {"color": "red", "value": red}, column
        assert by_name[column]["custom.cellOptions"] == {"type": "color-background"}
    (link,) = by_name["instance"]["links"]
    assert link["url"].startswith("/d/llamacpp-overview?") and "var-instance=${__value.raw}" in link["url"]
    assert table["fieldConfig"]["defaults"]["noValue"] == "no traffic"


def test_quantile_panels_show_p95_p99_and_keep_a_window_that_holds_requests_at_low_traffic() -> None:
    for path in DASHBOARDS:
        for p in load(path)["panels"]:
            exprs = [t["expr"] for t in p.get("targets", [])]
            if p["type"] == "timeseries" and any(e.startswith("histogram_quantile") for e in exprs):
                assert any(e.startswith("histogram_quantile(0.99") for e in exprs), p["title"]
                assert any(e.startswith("histogram_quantile(0.95") for e in exprs), p["title"]
                # at a request a minute, a 1m window ($__rate_interval at 15 s scrapes) is mostly empty
                assert p.get("interval") == "5m", p["title"]


def test_rates_have_per_second_units() -> None:
    per_second = {"reqps", "ops", "cps", "suffix: tok/s", "suffix: lines/s", "suffix: errors/s"}
    for path in DASHBOARDS:
        for p in load(path)["panels"]:
            if p["type"] != "timeseries":
                continue
            exprs = [t["expr"] for t in p["targets"]]
            if all(e.startswith("sum") and "rate(" in e and "/" not in e and "_seconds" not in e for e in exprs):
                assert p["fieldConfig"]["defaults"]["unit"] in per_second, (path.name, p["title"])


def test_all_jobs_means_the_exporters_jobs_not_every_job() -> None:
    """Grafana's All with no allValue is the variable's own values joined: the jobs that export
    llamacpp_up. With allValue .+ the overview's "Servers down" counted every down target of
    every job Prometheus scrapes."""
    for path in DASHBOARDS:
        job = next(v for v in load(path)["templating"]["list"] if v["name"] == "job")
        assert "allValue" not in job and job["definition"].startswith("label_values(llamacpp_up{")
        assert job["definition"].endswith("}, job)")
