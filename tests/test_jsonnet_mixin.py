"""The jsonnet mixin (llamacpp-mixin/): installed as jsonnet-bundler lays it out, evaluated by
Debian's jsonnet, it writes what `python -m mixin` writes, by default and under a _config in
which every threshold differs."""

from __future__ import annotations

import copy
import json
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from mixin import dashboards, queries, rules

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parent.parent
MIXIN = ROOT / "llamacpp-mixin"


@pytest.fixture(scope="module")
def vendor(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The mixin where `jb install github.com/.../llamacpp-mixin` puts it: vendor/llamacpp-mixin."""
    assert shutil.which("jsonnet"), "jsonnet is missing: the test set-up installs Debian's jsonnet package"
    assert json.loads((MIXIN / "jsonnetfile.json").read_text())["version"] == 1
    root = tmp_path_factory.mktemp("jb")
    shutil.copytree(MIXIN, root / "vendor" / "llamacpp-mixin")
    return root / "vendor"


def evaluate(vendor: Path, code: str) -> Any:
    res = subprocess.run(["jsonnet", "-J", str(vendor), "-e", code], capture_output=True, text=True)
    assert res.returncode == 0, res.stderr
    return json.loads(res.stdout)


def mixin_fields(vendor: Path, config: dict[str, Any] | None = None, override: str = "") -> dict[str, Any]:
    mixed = "(import 'llamacpp-mixin/mixin.libsonnet')"
    if config is not None:
        mixed += " + { _config+:: " + json.dumps(config) + " }"
    if override:
        mixed += " + " + override
    fields: dict[str, Any] = evaluate(
        vendor,
        f"local m = {mixed}; {{ alerts: m.prometheusAlerts, rules: m.prometheusRules, dashboards: m.grafanaDashboards }}",
    )
    return fields


def python_fields(config: dict[str, Any]) -> dict[str, Any]:
    """What the Python generator writes under `config`, read back as data."""
    fields: dict[str, Any] = json.loads(
        json.dumps(
            {
                "alerts": rules.alerting_rules(config),
                "rules": rules.recording_rules(config),
                "dashboards": dashboards.build(config),
            }
        )
    )
    return fields


def test_default_output_is_the_generated_files(vendor: Path) -> None:
    m = mixin_fields(vendor)
    assert m["alerts"] == yaml.safe_load((ROOT / "alerts" / "llamacpp-alerts.yaml").read_text())
    assert m["rules"] == yaml.safe_load((ROOT / "alerts" / "llamacpp-rules.yaml").read_text())
    files = {p.name: json.loads(p.read_text()) for p in sorted((ROOT / "dashboards").glob("*.json"))}
    assert m["dashboards"] == files


def changed(config: dict[str, Any]) -> dict[str, Any]:
    """Every threshold, window, label and pattern different from thresholds.yaml's."""

    def change(value: Any) -> Any:
        if isinstance(value, dict):
            return {k: change(v) for k, v in value.items()}
        if isinstance(value, bool):
            return not value
        if isinstance(value, int):
            return value + 1
        if isinstance(value, float):
            return round(value * 0.9, 4) if value < 1 else value + 1.0  # 2.0 -> 3.0: a whole float
        window = re.fullmatch(r"([0-9]+)([smhd])", value)
        if window:
            return f"{int(window[1]) + 1}{window[2]}"
        return value

    c: dict[str, Any] = change(copy.deepcopy(config))
    c.update(
        selector='job="llama", env="prod"',
        cluster_label="k8s_cluster",
        runbook_url_pattern="https://runbooks.example.org/llama.cpp#%s",
    )
    c["server_down"]["severity"] = "page"
    lo = c["latency_objectives"]
    # bounds of the exporter's buckets, and two pairs that share no window (four recorded ones)
    lo.update(time_to_first_token=5, time_per_output_token=0.05, queue_time=10, target=0.99)
    lo["slow"]["short"] = "45m"
    return c


def test_a_config_override_changes_what_thresholds_yaml_would(vendor: Path) -> None:
    default = queries.thresholds()
    c = changed(default)
    expected = python_fields(c)
    assert expected != python_fields(default)
    got = mixin_fields(vendor, c)
    for field in ("alerts", "rules", "dashboards"):
        assert got[field] == expected[field], field
    windows = [r["record"] for g in got["rules"]["groups"] for r in g["rules"] if "over_objective_ratio" in r["record"]]
    assert sum("time_to_first_token" in w for w in windows) == 4  # 5m 31m 45m 7h: none shared


def test_a_nested_override_as_the_header_shows(vendor: Path) -> None:
    c = queries.thresholds()
    c["ram_miss_rate"]["ratio"] = 0.3
    got = mixin_fields(vendor, override="{ _config+:: { ram_miss_rate+: { ratio: 0.3 } } }")
    assert got["alerts"] == python_fields(c)["alerts"]
    assert "> 0.3" in json.dumps(got["alerts"])


def test_an_objective_that_is_not_a_bucket_is_refused_by_both(vendor: Path) -> None:
    code = (
        "((import 'llamacpp-mixin/mixin.libsonnet')"
        " + { _config+:: { latency_objectives+: { time_to_first_token: 7 } } }).prometheusAlerts"
    )
    res = subprocess.run(["jsonnet", "-J", str(vendor), "-e", code], capture_output=True, text=True)
    assert res.returncode != 0
    assert "latency_objectives.time_to_first_token is not a bound" in res.stderr
    c = queries.thresholds()
    c["latency_objectives"]["time_to_first_token"] = 7
    with pytest.raises(SystemExit, match="time_to_first_token 7 is not a bound"):
        rules.recording_rules(c)


def test_a_threshold_used_as_a_python_value_is_refused() -> None:
    """A generator step that decides on a threshold's value would bake the default into the
    mixin: the symbolic value refuses it, so `python -m mixin` fails instead."""
    from mixin.jsonnet import NotCarried, Tokens, symbolic

    c = symbolic({"ratio": 0.5, "window": "15m"}, Tokens())
    for use in (float, bool, str, hash, lambda p: p == 0.5, lambda p: p < 1, lambda p: {p: 1}):
        with pytest.raises(NotCarried):
            use(c["ratio"])
    assert f"{c['window']}" != "15m"  # a token the writer turns into $._config.window
