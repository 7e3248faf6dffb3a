"""The Kubernetes objects that carry the rules or depend on the thresholds file: a Prometheus
Operator PrometheusRule, PodMonitor and ServiceMonitor, and the log-rotate ConfigMap."""

from __future__ import annotations

from typing import Any

from .rules import alerting_rules, recording_rules


def _metadata(c: dict[str, Any]) -> dict[str, Any]:
    labels = {"app.kubernetes.io/name": "llamacpp-exporter", **(c.get("kubernetes_labels") or {})}
    return {"name": "llamacpp-exporter", "labels": labels}


def prometheus_rule(c: dict[str, Any]) -> dict[str, Any]:
    """The same groups as a Prometheus Operator PrometheusRule."""
    return {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "PrometheusRule",
        "metadata": _metadata(c),
        "spec": {"groups": recording_rules(c)["groups"] + alerting_rules(c)["groups"]},
    }


def _job_relabeling(c: dict[str, Any]) -> list[dict[str, str]]:
    job = c["selector"].split('"')[1]  # job="llamacpp": every pod's series carry the rules' job
    return [{"targetLabel": "job", "replacement": job}]


def pod_monitor(c: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "PodMonitor",
        "metadata": _metadata(c),
        "spec": {
            "selector": {"matchLabels": {"app.kubernetes.io/name": "llama-server"}},
            "podMetricsEndpoints": [{"port": "metrics", "interval": "15s", "relabelings": _job_relabeling(c)}],
        },
    }


def service_monitor(c: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "ServiceMonitor",
        "metadata": _metadata(c),
        "spec": {
            "selector": {"matchLabels": {"app.kubernetes.io/name": "llama-server"}},
            "endpoints": [{"port": "metrics", "interval": "15s", "relabelings": _job_relabeling(c)}],
        },
    }
