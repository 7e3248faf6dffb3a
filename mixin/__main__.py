"""``python -m mixin [--check]``: write every generated file, or check that none is stale."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import yaml

from . import dashboards, kubernetes, libsonnet, queries, rules

ROOT = Path(__file__).resolve().parent.parent


def render() -> dict[str, str]:
    """File name (relative to the repository) -> content."""
    c = queries.thresholds()
    header = rules.HEADER

    def dump(d: dict[str, Any]) -> str:
        return header + yaml.safe_dump(d, sort_keys=False, width=200, allow_unicode=True)

    boards = {name.removeprefix("dashboards/"): text for name, text in dashboards.render().items()}

    def dump_all(docs: list[dict[str, Any]]) -> str:
        return header + yaml.safe_dump_all(docs, sort_keys=False, width=200, allow_unicode=True)

    return {
        "alerts/llamacpp-rules.yaml": dump(rules.recording_rules(c)),
        "alerts/llamacpp-alerts.yaml": dump(rules.alerting_rules(c)),
        "deploy/kubernetes/prometheusrule.yaml": dump(kubernetes.prometheus_rule(c)),
        "deploy/kubernetes/podmonitor.yaml": "# Prometheus Operator: scrape every llama-server pod's exporter sidecar (or use\n"
        "# servicemonitor.yaml, not both). Labels: kubernetes_labels in mixin/thresholds.yaml.\n"
        + dump(kubernetes.pod_monitor(c)),
        "deploy/kubernetes/log-rotate.yaml": "# deploy/logrotate/rotate.sh for the log-rotate sidecar of llama-server.yaml.\n"
        + dump(
            {
                "apiVersion": "v1",
                "kind": "ConfigMap",
                "metadata": {"name": "llamacpp-log-rotate"},
                "data": {"rotate.sh": rules.Block((ROOT / "deploy" / "logrotate" / "rotate.sh").read_text())},
            }
        ),
        "deploy/kubernetes/servicemonitor.yaml": "# Alternative to podmonitor.yaml: scrape through the Service (use one of the two).\n"
        + dump(kubernetes.service_monitor(c)),
        "deploy/kubernetes/dashboards.yaml": "# The dashboards as ConfigMaps for the kube-prometheus-stack Grafana sidecar (label\n"
        '# grafana_dashboard: "1"); the grafana-operator component reads the same ConfigMaps.\n'
        + dump_all(kubernetes.dashboard_configmaps(boards)),
        "deploy/kubernetes/grafana-operator/grafanadashboards.yaml": "# The Grafana Operator's GrafanaDashboard objects: "
        "add the component to your kustomization\n# (components: [grafana-operator]) where the operator runs.\n"
        + dump_all(kubernetes.grafana_dashboards(boards)),
        **dashboards.render(),
        libsonnet.PATH: libsonnet.render(c),
    }


def main() -> int:
    stale = []
    for name, text in render().items():
        path = ROOT / name
        if "--check" in sys.argv:
            if not path.exists() or path.read_text() != text:
                stale.append(name)
        else:
            path.write_text(text)
    if stale:
        print(f"stale: {', '.join(stale)}; run python -m mixin", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
