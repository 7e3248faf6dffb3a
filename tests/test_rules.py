"""Alert and recording rules: generated from one thresholds file, valid for promtool, unit
tested (a firing and a not-firing case for every alert), documented in the runbook, and
built only on metrics the exporter really exports."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from support import exported_metric_names

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parent.parent
ALERTS = ROOT / "alerts"
RULE_FILES = [ALERTS / "llamacpp-rules.yaml", ALERTS / "llamacpp-alerts.yaml"]
TESTS = ROOT / "tests" / "alerts" / "llamacpp-alerts.test.yaml"


def promtool(*args: str) -> subprocess.CompletedProcess[Any]:
    path = shutil.which("promtool")
    assert path, "promtool is missing: the test set-up installs Debian's prometheus package"
    return subprocess.run([path, *args], capture_output=True, text=True, cwd=ROOT)


def alerts() -> list[dict[str, Any]]:
    doc = yaml.safe_load((ALERTS / "llamacpp-alerts.yaml").read_text())
    return [r for g in doc["groups"] for r in g["rules"]]


def test_generated_rules_are_up_to_date() -> None:
    res = subprocess.run([sys.executable, "-m", "mixin", "--check"], cwd=ROOT, capture_output=True, text=True)
    assert res.returncode == 0, res.stderr


def test_promtool_check_rules() -> None:
    res = promtool("check", "rules", *map(str, RULE_FILES))
    assert res.returncode == 0, res.stdout + res.stderr


def test_promtool_unit_tests() -> None:
    res = promtool("test", "rules", str(TESTS))
    assert res.returncode == 0, res.stdout + res.stderr


def test_every_alert_has_a_firing_and_a_not_firing_case() -> None:
    tests = yaml.safe_load(TESTS.read_text())["tests"]
    firing: set[str] = set()
    quiet: set[str] = set()
    for t in tests:
        for a in t.get("alert_rule_test", []):
            (firing if a.get("exp_alerts") else quiet).add(a["alertname"])
    names = {a["alert"] for a in alerts()}
    assert names - firing == set(), "alerts without a firing case"
    assert names - quiet == set(), "alerts without a not-firing case"


REQUIRED = {
    "LlamaCppRamCacheMissRateHigh",
    "LlamaCppPromptCacheWrongfulLoraDiscard",
    "LlamaCppPromptCacheLoraMismatchReuse",
    "LlamaCppPrefillContention",
    "LlamaCppPromptCacheThrashing",
    "LlamaCppServerDown",
    "LlamaCppExporterDown",
    "LlamaCppLogStale",
    "LlamaCppLogParseDrift",
    "LlamaCppCacheDiagnosticsUnavailable",
    "LlamaCppServerLoadingTooLong",
    "LlamaCppExporterAbsent",
    "LlamaCppServerLogsPrompts",
    "LlamaCppSlotsUnreachable",
    "LlamaCppEventsWriteErrors",
}


def test_alerts_are_complete_and_documented() -> None:
    runbook = (ALERTS / "runbook.md").read_text()
    anchors = {h[3:].strip().lower() for h in runbook.splitlines() if h.startswith("## ")}
    names = set()
    for a in alerts():
        names.add(a["alert"])
        assert a["labels"]["severity"] in ("critical", "warning", "info")
        assert {"summary", "description", "runbook_url"} <= set(a["annotations"])
        assert "for" in a
        assert a["annotations"]["runbook_url"].endswith("#" + a["alert"].lower())
        assert a["alert"].lower() in anchors, f"no runbook section for {a['alert']}"
    assert REQUIRED <= names


METRIC_RE = re.compile(r"\b(llamacpp_[a-z0-9_]+)")


def test_rules_only_use_exported_metrics() -> None:
    recorded = {r["record"] for g in yaml.safe_load(RULE_FILES[0].read_text())["groups"] for r in g["rules"]}
    exported = exported_metric_names()
    for f in RULE_FILES:
        for g in yaml.safe_load(f.read_text())["groups"]:
            for r in g["rules"]:
                for m in METRIC_RE.findall(r["expr"]):
                    assert m in exported or any(m in rec for rec in recorded), f"{m} in {r.get('alert') or r['record']}"


def test_runbook_has_meaning_impact_diagnosis_and_mitigation_for_every_alert() -> None:
    sections = (ALERTS / "runbook.md").read_text().split("\n## ")[1:]
    by_name = {sec.split("\n", 1)[0].strip(): sec for sec in sections}
    for a in alerts():
        sec = by_name[a["alert"]]
        for part in ("**Means.**", "**Impact.**", "**Confirm.**", "**Act.**"):
            assert part in sec, f"{a['alert']}: no {part}"


def test_user_facing_text_describes_the_case_not_our_name_for_it() -> None:
    """'The seed' is the team's name for the case report; users read a description of the case."""
    files = [
        ROOT / "README.md",
        ALERTS / "runbook.md",
        *ALERTS.glob("*.yaml"),
        ROOT / "mixin" / "thresholds.yaml",
        *(ROOT / "dashboards").glob("*.json"),
        ROOT / "exporter" / "llamacpp_exporter" / "live" / "top.py",
        ROOT / "exporter" / "llamacpp_exporter" / "cli.py",
        ROOT / "exporter" / "llamacpp_exporter" / "export" / "metrics.py",
    ]
    for f in files:
        assert not re.search(r"\bseed'?s?\b", f.read_text(), re.IGNORECASE), f


def test_a_latency_objective_that_is_no_bucket_bound_is_refused_by_the_generator() -> None:
    """The share over an objective is read from the bucket at that bound: an objective between
    two bounds would have no bucket, and its alert could never fire."""
    from mixin import queries, rules

    c = queries.thresholds()
    rules.recording_rules(c)  # the shipped objectives are bounds of the exporter's buckets
    c["latency_objectives"]["time_to_first_token"] = 7
    with pytest.raises(SystemExit, match="time_to_first_token 7 is not a bound"):
        rules.recording_rules(c)


# What a PodMonitor's series carry, and a cluster label as Thanos or Mimir see it
TARGET = {"namespace": "llm", "pod": "llama-server-7d9f-0"}
NO_TARGET_LABELS = {"LlamaCppExporterAbsent"}  # absent() knows only its selector's labels


def _with_labels(series: str, labels: dict[str, str]) -> str:
    extra = ",".join(f'{k}="{v}"' for k, v in labels.items())
    if "{" not in series:
        return f"{series}{{{extra}}}"
    return series.replace("}", f",{extra}}}", 1) if not series.endswith("{}") else series[:-1] + extra + "}"


def test_every_alert_keeps_the_cluster_namespace_and_pod_its_series_carry(tmp_path: Path) -> None:
    """Every promtool case again, each input series labelled as behind a PodMonitor in a named
    cluster: every alert that fired fires again, now carrying those labels (Alertmanager routes
    and inhibits by them; pod-IP instances repeat across clusters). The cases without them
    are the shipped ones above."""
    cluster = yaml.safe_load((ROOT / "mixin" / "thresholds.yaml").read_text())["cluster_label"]
    labels = {cluster: "eu-west-1", **TARGET}
    doc = yaml.safe_load(TESTS.read_text())
    doc["rule_files"] = [str(f) for f in RULE_FILES]
    # the cases where an alert fires (the quiet ones carry no labels to check, and take time)
    for t in doc["tests"]:
        t["alert_rule_test"] = [a for a in t.get("alert_rule_test", []) if a.get("exp_alerts")]
    doc["tests"] = [t for t in doc["tests"] if t["alert_rule_test"]]
    fired = 0
    for t in doc["tests"]:
        for s in t.get("input_series", []):
            s["series"] = _with_labels(s["series"], labels)
        for a in t.get("alert_rule_test", []):
            for e in a.get("exp_alerts") or []:
                if a["alertname"] not in NO_TARGET_LABELS:
                    e["exp_labels"].update(labels)
                    fired += 1
    assert fired >= len({a["alert"] for a in alerts()}) - len(NO_TARGET_LABELS)
    labelled = tmp_path / "labelled.test.yaml"
    labelled.write_text(yaml.safe_dump(doc, sort_keys=False, width=1000))
    res = promtool("test", "rules", str(labelled))
    assert res.returncode == 0, res.stdout[-6000:] + res.stderr


def test_every_runbook_link_follows_the_settable_pattern_to_an_entry_of_the_shipped_runbook() -> None:
    pattern = yaml.safe_load((ROOT / "mixin" / "thresholds.yaml").read_text())["runbook_url_pattern"]
    assert pattern.count("%s") == 1
    runbook = (ALERTS / "runbook.md").read_text()
    # GitHub's anchor of a heading: lower case, spaces to dashes, punctuation dropped
    anchors = {
        re.sub(r"[^a-z0-9 -]", "", h[3:].strip().lower()).replace(" ", "-")
        for h in runbook.splitlines()
        if h.startswith("## ")
    }
    for a in alerts():
        url = a["annotations"]["runbook_url"]
        assert url == pattern % a["alert"].lower()
        assert url.rsplit("#", 1)[1] in anchors, a["alert"]
    # another pattern reaches every link
    from mixin import queries, rules

    c = queries.thresholds() | {"runbook_url_pattern": "https://wiki.example/llama/%s"}
    links = {r["annotations"]["runbook_url"] for g in rules.alerting_rules(c)["groups"] for r in g["rules"]}
    assert links and all(u.startswith("https://wiki.example/llama/llamacpp") for u in links)
