"""The compose stack and the Kubernetes example, checked without a Docker engine or a
cluster (none exists on the build machines): every mounted file exists, ports and service
names agree, images are pinned, and Prometheus and Alertmanager accept their configs."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parent.parent
COMPOSE = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
SERVICES = COMPOSE["services"]
K8S = [d for f in sorted((ROOT / "deploy/kubernetes").glob("*.yaml")) for d in yaml.safe_load_all(f.read_text()) if d]


def pinned(image: str) -> bool:
    name, _, tag = image.rpartition(":")
    return bool(name) and "/" not in tag and tag not in ("latest", "") and bool(re.search(r"\d", tag))


def test_compose_images_are_pinned():
    for name, svc in SERVICES.items():
        assert "image" in svc, name
        assert pinned(svc["image"]), f"{name}: {svc['image']}"
    assert SERVICES["exporter"]["build"] == "."


def test_compose_bind_mounts_exist():
    for name, svc in SERVICES.items():
        for v in svc.get("volumes", []):
            src = v.split(":", 1)[0]
            if src.startswith("."):
                if src == "./models":
                    continue  # the user's models; documented in the compose header and README
                assert (ROOT / src).exists(), f"{name}: {src}"
            else:
                assert src in COMPOSE["volumes"], f"{name}: named volume {src} is not declared"


def _arg(args: list[str], flag: str) -> str:
    return args[args.index(flag) + 1]


def test_compose_wiring_agrees():
    llama = SERVICES["llama-server"]["command"]
    exp = SERVICES["exporter"]["command"]
    assert _arg(exp, "--llama.url") == f"http://llama-server:{_arg(llama, '--port')}"
    assert _arg(exp, "--llama.log-path") == _arg(llama, "--log-file")
    assert _arg(llama, "-lv") == "4" and "--metrics" in llama
    # the exporter reads the log volume read-only and runs with a read-only root
    assert "llama-logs:/logs:ro" in SERVICES["exporter"]["volumes"]
    assert "llama-logs:/logs" in SERVICES["llama-server"]["volumes"]
    assert SERVICES["exporter"]["read_only"] is True
    port = _arg(exp, "--web.listen-address").rsplit(":", 1)[1]
    assert f"{port}:{port}" in SERVICES["exporter"]["ports"]
    prom = yaml.safe_load((ROOT / "deploy/prometheus/prometheus.yml").read_text())
    job = next(j for j in prom["scrape_configs"] if j["job_name"] == "llamacpp")
    assert job["static_configs"][0]["targets"] == [f"exporter:{port}"]
    am = prom["alerting"]["alertmanagers"][0]["static_configs"][0]["targets"][0]
    assert am.split(":")[0] in SERVICES and am.endswith(":9093")
    # rule files are the ones in alerts/, mounted at /etc/prometheus/rules
    assert "./alerts:/etc/prometheus/rules:ro" in SERVICES["prometheus"]["volumes"]
    for rf in prom["rule_files"]:
        assert (ROOT / "alerts" / Path(rf).name).exists() and rf.startswith("/etc/prometheus/rules/")
    assert "--enable-feature=exemplar-storage" in SERVICES["prometheus"]["command"]
    ds = yaml.safe_load((ROOT / "deploy/grafana/provisioning/datasources/prometheus.yaml").read_text())
    assert ds["datasources"][0]["url"] == "http://prometheus:9090"
    prov = yaml.safe_load((ROOT / "deploy/grafana/provisioning/dashboards/llamacpp.yaml").read_text())
    assert f"./dashboards:{prov['providers'][0]['options']['path']}:ro" in SERVICES["grafana"]["volumes"]


def test_rules_selector_matches_the_scrape_job():
    sel = yaml.safe_load((ROOT / "alerts/config/thresholds.yaml").read_text())["selector"]
    prom = yaml.safe_load((ROOT / "deploy/prometheus/prometheus.yml").read_text())
    assert sel == 'job="llamacpp"' and any(j["job_name"] == "llamacpp" for j in prom["scrape_configs"])


def test_dockerfile_runs_non_root_and_exposes_the_port():
    text = (ROOT / "Dockerfile").read_text()
    user = re.search(r"^USER (\S+)", text, re.M)
    assert user and not user.group(1).startswith(("0", "root"))
    assert "EXPOSE 10938" in text
    base = re.search(r"^FROM (\S+)", text, re.M).group(1)
    assert pinned(base)


def test_prometheus_accepts_the_stack_config(tmp_path):
    promtool = shutil.which("promtool")
    assert promtool
    cfg = yaml.safe_load((ROOT / "deploy/prometheus/prometheus.yml").read_text())
    cfg["rule_files"] = [str(ROOT / "alerts" / Path(r).name) for r in cfg["rule_files"]]  # the container's paths, here
    (tmp_path / "prometheus.yml").write_text(yaml.safe_dump(cfg))
    res = subprocess.run(
        [promtool, "check", "config", str(tmp_path / "prometheus.yml")], capture_output=True, text=True
    )
    assert res.returncode == 0, res.stdout + res.stderr


def test_alertmanager_accepts_its_config():
    amtool = shutil.which("amtool")
    if amtool is None:
        pytest.fail("amtool is missing: the test set-up installs Debian's prometheus-alertmanager package")
    res = subprocess.run(
        [amtool, "check-config", str(ROOT / "deploy/alertmanager/alertmanager.yml")], capture_output=True, text=True
    )
    assert res.returncode == 0, res.stdout + res.stderr


def _kind(kind: str) -> list[dict]:
    return [d for d in K8S if d["kind"] == kind]


def test_kubernetes_sidecar_wiring():
    (dep,) = _kind("Deployment")
    pod = dep["spec"]["template"]["spec"]
    containers = {c["name"]: c for c in pod["containers"]}
    llama, exp = containers["llama-server"], containers["exporter"]
    for c in containers.values():
        assert pinned(c["image"]), c["image"]
    assert _arg(exp["args"], "--llama.url") == f"http://127.0.0.1:{_arg(llama['args'], '--port')}"
    assert _arg(exp["args"], "--llama.log-path") == _arg(llama["args"], "--log-file")
    log_mount = next(m for m in exp["volumeMounts"] if m["name"] == "logs")
    assert log_mount["readOnly"] is True and "emptyDir" in next(v for v in pod["volumes"] if v["name"] == "logs")
    assert exp["securityContext"]["runAsNonRoot"] is True
    metrics_port = next(p for p in exp["ports"] if p["name"] == "metrics")["containerPort"]
    assert _arg(exp["args"], "--web.listen-address") == f":{metrics_port}"
    labels = dep["spec"]["template"]["metadata"]["labels"]
    for mon in _kind("PodMonitor") + _kind("ServiceMonitor"):
        assert mon["spec"]["selector"]["matchLabels"].items() <= labels.items()
        eps = mon["spec"].get("podMetricsEndpoints") or mon["spec"]["endpoints"]
        assert eps[0]["port"] == "metrics"
        assert {"targetLabel": "job", "replacement": "llamacpp"} in eps[0]["relabelings"]
    (svc,) = _kind("Service")
    assert any(p["name"] == "metrics" for p in svc["spec"]["ports"])
    (rule,) = _kind("PrometheusRule")
    assert {g["name"] for g in rule["spec"]["groups"]} >= {"llamacpp.rules", "llamacpp.prompt-cache"}
