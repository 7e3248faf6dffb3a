"""The Kubernetes objects that carry the rules or depend on the thresholds file: a Prometheus
Operator PrometheusRule, PodMonitor and ServiceMonitor, and the log-rotate ConfigMap."""

from __future__ import annotations

from typing import Any

from .rules import Block, alerting_rules, recording_rules


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


# The label kube-prometheus-stack's Grafana dashboard sidecar looks for (sidecar.dashboards.label
# and labelValue in its values.yaml)
SIDECAR_LABEL = {"grafana_dashboard": "1"}


def _dashboard_name(file_name: str) -> str:
    return file_name.removesuffix(".json")  # llamacpp-overview: a valid object name


def dashboard_configmaps(dashboards: dict[str, str]) -> list[dict[str, Any]]:
    """One ConfigMap per dashboard (file name -> JSON text), labelled for the kube-prometheus-stack
    Grafana sidecar, which loads every ConfigMap so labelled; the Grafana Operator's
    GrafanaDashboard objects read the same ConfigMaps."""
    return [
        {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {
                "name": f"{_dashboard_name(name)}-dashboard",
                "labels": {"app.kubernetes.io/name": "llamacpp-exporter", **SIDECAR_LABEL},
            },
            "data": {name: Block(text)},
        }
        for name, text in dashboards.items()
    ]


def grafana_dashboards(dashboards: dict[str, str]) -> list[dict[str, Any]]:
    """The Grafana Operator's (v5) GrafanaDashboard objects, each reading its ConfigMap. They
    select Grafana instances labelled dashboards: grafana, the operator's documented example."""
    return [
        {
            "apiVersion": "grafana.integreatly.org/v1beta1",
            "kind": "GrafanaDashboard",
            "metadata": {"name": _dashboard_name(name), "labels": {"app.kubernetes.io/name": "llamacpp-exporter"}},
            "spec": {
                "instanceSelector": {"matchLabels": {"dashboards": "grafana"}},
                "configMapRef": {"name": f"{_dashboard_name(name)}-dashboard", "key": name},
                "folder": "llama.cpp",
            },
        }
        for name in dashboards
    ]
