"""The compose stack and the Kubernetes example, checked without a Docker engine or a
cluster (none exists on the build machines) by the validators the registries offer (the
compose-spec schema, docker-compose config, Kubernetes' and the Prometheus Operator's schemas)
and by our own checks: mounted files exist, ports and names agree, images are pinned,
Prometheus and Alertmanager accept their configs, the log is rotated."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parent.parent
COMPOSE = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
SERVICES = COMPOSE["services"]
K8S_FILES = sorted(f for f in (ROOT / "deploy/kubernetes").glob("*.yaml") if f.name != "kustomization.yaml")
K8S = [d for f in K8S_FILES for d in yaml.safe_load_all(f.read_text()) if d]


def pinned(image: str) -> bool:
    name, _, tag = image.rpartition(":")
    return bool(name) and "/" not in tag and tag not in ("latest", "") and bool(re.search(r"\d", tag))


def test_compose_images_are_pinned() -> None:
    for name, svc in SERVICES.items():
        assert "image" in svc, name
        assert pinned(svc["image"]), f"{name}: {svc['image']}"
    assert SERVICES["exporter"]["build"] == "."


def test_compose_bind_mounts_exist() -> None:
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


def test_compose_wiring_agrees() -> None:
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
    assert f"${{PUBLISH_ADDRESS:-127.0.0.1}}:{port}:{port}" in SERVICES["exporter"]["ports"]
    prom = yaml.safe_load((ROOT / "deploy/prometheus/prometheus.yml").read_text())
    job = next(j for j in prom["scrape_configs"] if j["job_name"] == "llamacpp")
    assert job["static_configs"][0]["targets"] == [f"exporter:{port}"]
    am = prom["alerting"]["alertmanagers"][0]["static_configs"][0]["targets"][0]
    assert am.split(":")[0] in SERVICES and am.endswith(":9093")
    # rule files are the ones in alerts/, mounted at /etc/prometheus/rules
    assert "./alerts:/etc/prometheus/rules:ro" in SERVICES["prometheus"]["volumes"]
    for rf in prom["rule_files"]:  # relative to the config file, /etc/prometheus in the container
        assert (ROOT / "alerts" / Path(rf).name).exists() and rf.startswith("rules/")
    assert "--enable-feature=exemplar-storage" in SERVICES["prometheus"]["command"]
    ds = yaml.safe_load((ROOT / "deploy/grafana/provisioning/datasources/prometheus.yaml").read_text())
    assert ds["datasources"][0]["url"] == "http://prometheus:9090"
    prov = yaml.safe_load((ROOT / "deploy/grafana/provisioning/dashboards/llamacpp.yaml").read_text())
    assert f"./dashboards:{prov['providers'][0]['options']['path']}:ro" in SERVICES["grafana"]["volumes"]


def test_compose_sends_traces_to_tempo_and_grafana_opens_them_from_exemplars() -> None:
    """The exporter's OTLP endpoint is Tempo's OTLP/HTTP receiver; Grafana's Prometheus data
    source turns an exemplar's trace_id (the label the exporter puts there: tests/test_traces.py)
    into a link to the
    Tempo data source, which reads Tempo's HTTP port; the image has the otlp extra."""
    exp = SERVICES["exporter"]["command"]
    tempo_cfg = yaml.safe_load((ROOT / "deploy/tempo/tempo.yaml").read_text())
    receiver = tempo_cfg["distributor"]["receivers"]["otlp"]["protocols"]["http"]["endpoint"]
    assert _arg(exp, "--traces.otlp-endpoint") == f"http://tempo:{receiver.rsplit(':', 1)[1]}"
    tempo = SERVICES["tempo"]
    assert tempo["command"] == ["-config.file=/etc/tempo.yaml"]
    assert "./deploy/tempo/tempo.yaml:/etc/tempo.yaml:ro" in tempo["volumes"]
    assert any(v.endswith(":/var/tempo") for v in tempo["volumes"])
    provisioned = ROOT / "deploy/grafana/provisioning/datasources"
    (prom,) = yaml.safe_load((provisioned / "prometheus.yaml").read_text())["datasources"]
    (tempo_ds,) = yaml.safe_load((provisioned / "tempo.yaml").read_text())["datasources"]
    assert tempo_ds["type"] == "tempo" and tempo_ds["access"] == "proxy"
    assert tempo_ds["url"] == f"http://tempo:{tempo_cfg['server']['http_listen_port']}"
    (dest,) = prom["jsonData"]["exemplarTraceIdDestinations"]
    assert dest == {"name": "trace_id", "datasourceUid": tempo_ds["uid"]}
    assert SERVICES["grafana"]["depends_on"]["tempo"]["condition"] == "service_healthy"
    assert '"$(echo /wheels/*.whl)[otlp]"' in (ROOT / "Dockerfile").read_text()


def test_rules_selector_matches_the_scrape_job() -> None:
    sel = yaml.safe_load((ROOT / "mixin/thresholds.yaml").read_text())["selector"]
    prom = yaml.safe_load((ROOT / "deploy/prometheus/prometheus.yml").read_text())
    assert sel == 'job="llamacpp"' and any(j["job_name"] == "llamacpp" for j in prom["scrape_configs"])


def test_dockerfile_runs_non_root_and_exposes_the_port() -> None:
    text = (ROOT / "Dockerfile").read_text()
    user = re.search(r"^USER (\S+)", text, re.M)
    assert user and not user.group(1).startswith(("0", "root"))
    assert "EXPOSE 10938" in text
    bases = re.findall(r"^FROM (\S+)", text, re.M)  # the build stage and the image
    assert len(bases) == 2 and all(pinned(b) for b in bases)


def _promtool_check_config(path: Path) -> None:
    promtool = shutil.which("promtool")
    assert promtool, "promtool is missing: the test set-up installs Debian's prometheus package"
    res = subprocess.run([promtool, "check", "config", str(path)], capture_output=True, text=True)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "2 rule files found" in res.stdout, res.stdout


def test_prometheus_accepts_the_stack_config_as_shipped() -> None:
    _promtool_check_config(ROOT / "deploy/prometheus/prometheus.yml")  # unchanged, in the repository


def test_prometheus_accepts_the_stack_config_in_the_layout_compose_mounts(tmp_path: Path) -> None:
    """The files where docker-compose.yml mounts them, under tmp_path as the container's root."""
    for v in SERVICES["prometheus"]["volumes"]:
        src, dst = v.split(":")[:2]
        if not src.startswith("./"):
            continue  # a named volume: the TSDB
        target = tmp_path / dst.lstrip("/")
        target.parent.mkdir(parents=True, exist_ok=True)
        (shutil.copytree if (ROOT / src).is_dir() else shutil.copy)(ROOT / src, target)
    config = next(a.split("=", 1)[1] for a in SERVICES["prometheus"]["command"] if a.startswith("--config.file="))
    _promtool_check_config(tmp_path / config.lstrip("/"))


def test_alertmanager_accepts_its_config() -> None:
    amtool = shutil.which("amtool")
    if amtool is None:
        pytest.fail("amtool is missing: the test set-up installs Debian's prometheus-alertmanager package")
    res = subprocess.run(
        [amtool, "check-config", str(ROOT / "deploy/alertmanager/alertmanager.yml")], capture_output=True, text=True
    )
    assert res.returncode == 0, res.stdout + res.stderr


def _kind(kind: str) -> list[dict[str, Any]]:
    return [d for d in K8S if d["kind"] == kind]


def test_kubernetes_sidecar_wiring() -> None:
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


def test_monitoring_never_gates_serving_in_kubernetes() -> None:
    """A pod is Ready only when every container is: a readiness probe on a sidecar would take
    llama-server out of its Service when the exporter or the rotation fails."""
    (dep,) = _kind("Deployment")
    containers = {c["name"]: c for c in dep["spec"]["template"]["spec"]["containers"]}
    assert containers["llama-server"]["readinessProbe"]["httpGet"]["path"] == "/health"
    for side in ("exporter", "log-rotate"):
        assert "readinessProbe" not in containers[side], side
        assert "livenessProbe" in containers[side], side
    assert containers["exporter"]["livenessProbe"]["httpGet"]["path"] == "/-/healthy"
    # the exporter's readiness is alerted instead
    alerts = yaml.safe_load((ROOT / "alerts/llamacpp-alerts.yaml").read_text())
    exprs = {r["alert"]: r["expr"] for g in alerts["groups"] for r in g["rules"]}
    assert "llamacpp_exporter_ready" in exprs["LlamaCppExporterNotReady"]


# ---------------------------------------------------------------- real validators
CACHE = Path(
    os.environ.get(
        "LLAMACPP_EXPORTER_CACHE", Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "llamacpp-exporter"
    )
)
COMPOSE_FILES = ["docker-compose.yml", "docker-compose.gpu.yml"]


def test_compose_files_match_the_compose_spec_schema() -> None:
    res = subprocess.run(
        [
            str(Path(sys.executable).parent / "check-jsonschema"),
            "--builtin-schema",
            "vendor.compose-spec",
            *COMPOSE_FILES,
        ],
        capture_output=True,
        text=True,
        cwd=ROOT,
    )
    assert res.returncode == 0, res.stdout + res.stderr


def test_docker_compose_config_accepts_the_stack_and_its_gpu_variant() -> None:
    """docker-compose's own `config` (Debian's docker-compose package): resolves variables,
    merges the GPU file, checks depends_on conditions against healthchecks. No engine needed."""
    exe = shutil.which("docker-compose")
    assert exe, "docker-compose is missing: the test set-up installs Debian's docker-compose"
    args = [exe]
    for f in COMPOSE_FILES:
        args += ["-f", f]
    res = subprocess.run(
        [*args, "config"], capture_output=True, text=True, cwd=ROOT, env={**os.environ, "LLAMA_MODEL": "m.gguf"}
    )
    assert res.returncode == 0, res.stderr
    merged = yaml.safe_load(res.stdout)["services"]["llama-server"]
    assert merged["image"].endswith("server-cuda-b11434")
    (dev,) = merged["deploy"]["resources"]["reservations"]["devices"]
    assert dev["driver"] == "nvidia" and dev["capabilities"] == ["gpu"]
    assert "-ngl" in merged["command"] and "--log-file" in merged["command"]


def test_kubernetes_manifests_match_kubernetes_schemas() -> None:
    res = subprocess.run(
        [str(Path(sys.executable).parent / "kubernetes-validate"), "--strict", "--quiet",
         *map(str, K8S_FILES)],
        capture_output=True,
        text=True,
    )  # fmt: skip
    assert res.returncode == 0, res.stdout + res.stderr
    kinds = {d["kind"] for d in K8S}
    assert {"Deployment", "Service", "ConfigMap"} <= kinds


def test_prometheus_operator_objects_match_the_operators_schemas(tmp_path: Path) -> None:
    node_modules = CACHE / "node" / "node_modules"
    assert (node_modules / "@kubernetes-models" / "prometheus-operator").is_dir(), "run tests/setup/setup.sh"
    script = CACHE / "node" / "validate_prometheus_operator.mjs"  # next to its node_modules: ESM resolves from there
    shutil.copy(ROOT / "tests/setup/validate_prometheus_operator.mjs", script)
    objs = [d for d in K8S if d["apiVersion"].startswith("monitoring.coreos.com/")]
    assert {d["kind"] for d in objs} == {"PodMonitor", "ServiceMonitor", "PrometheusRule"}
    res = subprocess.run(["node", str(script)], input=json.dumps(objs), capture_output=True, text=True)
    assert res.returncode == 0, res.stdout + res.stderr
    broken = [{**objs[0], "spec": {**objs[0]["spec"], "podMetricsEndpoints": [{"port": 10938}]}}]
    res = subprocess.run(["node", str(script)], input=json.dumps(broken), capture_output=True, text=True)
    assert res.returncode == 1 and "INVALID" in res.stdout  # the validator can fail


def _kustomize(directory: Path) -> list[dict[str, Any]]:
    kubectl = shutil.which("kubectl")
    assert kubectl, (
        "kubectl is missing: the test set-up installs Debian's kubectl (trixie on); elsewhere install kubectl >= 1.21"
    )
    res = subprocess.run([kubectl, "kustomize", str(directory)], capture_output=True, text=True)
    assert res.returncode == 0, res.stderr
    return [d for d in yaml.safe_load_all(res.stdout) if d]


def _validate_operator_objects(objs: list[dict[str, Any]]) -> subprocess.CompletedProcess[Any]:
    script = CACHE / "node" / "validate_prometheus_operator.mjs"  # next to its node_modules: ESM resolves from there
    shutil.copy(ROOT / "tests/setup/validate_prometheus_operator.mjs", script)
    return subprocess.run(["node", str(script)], input=json.dumps(objs), capture_output=True, text=True)


def test_the_kustomize_base_renders_everything_valid_and_the_dashboards_for_both_grafana_deliveries(
    tmp_path: Path,
) -> None:
    """kubectl kustomize renders the base (and an overlay setting a namespace with the Grafana
    Operator component): every object valid against Kubernetes' schemas or its operator's CRD
    schema; the dashboards' ConfigMaps, labelled for kube-prometheus-stack's Grafana sidecar,
    hold dashboards/*.json as generated; every GrafanaDashboard reads one of them."""
    base = _kustomize(ROOT / "deploy/kubernetes")
    assert {d["kind"] for d in base} == {"Deployment", "Service", "ConfigMap", "PodMonitor", "PrometheusRule"}
    overlay = tmp_path / "overlay"
    overlay.mkdir()
    rel = os.path.relpath(ROOT / "deploy/kubernetes", overlay)
    (overlay / "kustomization.yaml").write_text(
        yaml.safe_dump(
            {
                "apiVersion": "kustomize.config.k8s.io/v1beta1",
                "kind": "Kustomization",
                "namespace": "llm",
                "resources": [rel],
                "components": [f"{rel}/grafana-operator"],
            }
        )
    )
    rendered = _kustomize(overlay)
    assert all(d["metadata"]["namespace"] == "llm" for d in rendered)
    core = [d for d in rendered if "/" not in d["apiVersion"] or d["apiVersion"].startswith("apps/")]
    (tmp_path / "core.yaml").write_text(yaml.safe_dump_all(core))
    res = subprocess.run(
        [str(Path(sys.executable).parent / "kubernetes-validate"), "--strict", "--quiet", str(tmp_path / "core.yaml")],
        capture_output=True,
        text=True,
    )
    assert res.returncode == 0, res.stdout + res.stderr
    operated = [d for d in rendered if d not in core]
    assert {d["kind"] for d in operated} == {"PodMonitor", "PrometheusRule", "GrafanaDashboard"}
    res = _validate_operator_objects(operated)
    assert res.returncode == 0, res.stdout + res.stderr
    boards = {f.name: f.read_text() for f in (ROOT / "dashboards").glob("*.json")}
    maps = {
        d["metadata"]["name"]: d
        for d in rendered
        if d["kind"] == "ConfigMap" and d["metadata"].get("labels", {}).get("grafana_dashboard") == "1"
    }
    assert sorted(k for m in maps.values() for k in m["data"]) == sorted(boards)
    for m in maps.values():
        for key, text in m["data"].items():
            assert text == boards[key]
    refs = [d["spec"]["configMapRef"] for d in rendered if d["kind"] == "GrafanaDashboard"]
    assert sorted(r["key"] for r in refs) == sorted(boards)
    assert all(r["key"] in maps[r["name"]]["data"] for r in refs)
    # the validator can fail for a GrafanaDashboard too
    board = next(d for d in operated if d["kind"] == "GrafanaDashboard")
    broken = [{**board, "spec": {**board["spec"], "configMapRef": "not an object"}}]
    res = _validate_operator_objects(broken)
    assert res.returncode == 1 and "INVALID" in res.stdout


# ---------------------------------------------------------------- the ninety-day points
def test_operator_objects_carry_the_label_kube_prometheus_stack_selects() -> None:
    labels = yaml.safe_load((ROOT / "mixin/thresholds.yaml").read_text())["kubernetes_labels"]
    assert labels == {"release": "kube-prometheus-stack"}
    for d in _kind("PodMonitor") + _kind("ServiceMonitor") + _kind("PrometheusRule"):
        assert labels.items() <= d["metadata"]["labels"].items(), d["kind"]


def test_compose_publishes_on_loopback_and_waits_for_healthy_dependencies() -> None:
    for name, svc in SERVICES.items():
        for p in svc.get("ports", []):
            assert p.startswith("${PUBLISH_ADDRESS:-127.0.0.1}:"), f"{name}: {p}"
    for name in SERVICES:  # every service, as the README says
        assert SERVICES[name]["healthcheck"]["test"][0] == "CMD", name
    assert SERVICES["llama-server"]["healthcheck"]["start_period"] == "10m"
    assert SERVICES["grafana"]["depends_on"]["prometheus"]["condition"] == "service_healthy"
    assert SERVICES["prometheus"]["depends_on"]["alertmanager"]["condition"] == "service_healthy"
    # the exporter must run while llama-server loads or is down: it is what reports that
    assert SERVICES["exporter"]["depends_on"]["llama-server"]["condition"] == "service_started"
    assert "/-/ready" in " ".join(SERVICES["exporter"]["healthcheck"]["test"])


def test_exporter_image_owns_its_data_directory() -> None:
    """Docker fills a new named volume from the image's directory, owner included: /data must
    exist in the image and belong to the exporter's user, or the events file is never written."""
    text = (ROOT / "Dockerfile").read_text()
    found = re.search(r"^USER (\S+)", text, re.M)
    assert found is not None
    user = found.group(1)
    assert re.search(rf"mkdir -p /data && chown {re.escape(user)} /data", text)
    assert "exporter-data:/data" in SERVICES["exporter"]["volumes"]
    events = _arg(SERVICES["exporter"]["command"], "--events.path")
    assert events.startswith("/data/")


def test_the_log_is_rotated_in_both_layouts() -> None:
    rot = SERVICES["log-rotate"]
    assert "./deploy/logrotate/rotate.sh:/rotate.sh:ro" in rot["volumes"] and "llama-logs:/logs" in rot["volumes"]
    assert rot["environment"]["LOG"] == _arg(SERVICES["llama-server"]["command"], "--log-file")
    assert pinned(rot["image"]) and rot["image"].startswith("busybox:")
    (dep,) = _kind("Deployment")
    pod = dep["spec"]["template"]["spec"]
    containers = {c["name"]: c for c in pod["containers"]}
    env = {e["name"]: e["value"] for e in containers["log-rotate"]["env"]}
    assert env["LOG"] == _arg(containers["llama-server"]["args"], "--log-file")
    (cm,) = [c for c in _kind("ConfigMap") if c["metadata"]["name"] == "llamacpp-log-rotate"]
    assert cm["data"]["rotate.sh"] == (ROOT / "deploy/logrotate/rotate.sh").read_text()
    # what the rotation keeps on disk stays well inside the emptyDir's sizeLimit
    size_limit = next(v for v in pod["volumes"] if v["name"] == "logs")["emptyDir"]["sizeLimit"]
    assert size_limit.endswith("Gi") and int(env["MAX_MB"]) * (1 + int(env["KEEP"])) < int(size_limit[:-2]) * 1024


def test_alertmanager_sends_one_notification_for_a_fleet_wide_outage(tmp_path: Path) -> None:
    """The shipped route and inhibitions in a real Alertmanager: fifty servers of one cluster
    down at once are one notification naming all fifty and their cluster; a flapping alert of a
    server that is down is inhibited, one of a server that is up is delivered, and so is one of
    a server with the same instance (a pod IP) in another cluster. Only the receiver and the
    waits are changed (a webhook of this test, 1 s instead of 30 s)."""
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    import httpx
    from realserver import free_port, terminate, wait_for, wait_healthy

    binary = shutil.which("prometheus-alertmanager") or shutil.which("alertmanager")
    assert binary, "alertmanager is missing: the test set-up installs Debian's prometheus-alertmanager"
    notifications: list[dict[str, Any]] = []

    class Hook(BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802
            notifications.append(json.loads(self.rfile.read(int(self.headers["Content-Length"]))))
            self.send_response(200)
            self.end_headers()

        def log_message(self, format: str, *a: Any) -> None:
            pass

    hook = ThreadingHTTPServer(("127.0.0.1", 0), Hook)
    threading.Thread(target=hook.serve_forever, daemon=True).start()
    cfg = yaml.safe_load((ROOT / "deploy/alertmanager/alertmanager.yml").read_text())
    cfg["route"].update(group_wait="1s", group_interval="1s")
    for r in cfg["receivers"]:
        r["webhook_configs"] = [{"url": f"http://127.0.0.1:{hook.server_address[1]}/"}]
    (tmp_path / "am.yml").write_text(yaml.safe_dump(cfg))
    port = free_port()
    proc = subprocess.Popen(
        [
            binary,
            f"--config.file={tmp_path / 'am.yml'}",
            f"--storage.path={tmp_path / 'data'}",
            f"--web.listen-address=127.0.0.1:{port}",
            "--cluster.listen-address=",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        wait_healthy(proc, f"http://127.0.0.1:{port}/-/ready", 30, "alertmanager")

        def alert(name: str, instance: str, severity: str, cluster: str = "eu-1") -> dict[str, Any]:
            labels = {"alertname": name, "job": "llamacpp", "instance": instance, "severity": severity}
            labels |= {"cluster": cluster, "namespace": "llm"}
            return {"labels": labels, "annotations": {"summary": name}}

        fleet = [alert("LlamaCppServerDown", f"10.0.0.{i}:10938", "critical") for i in range(50)]
        flapping = [
            alert("LlamaCppServerFlapping", "10.0.0.0:10938", "warning"),  # down: inhibited
            alert("LlamaCppServerFlapping", "10.0.9.9:10938", "warning"),  # up
            alert("LlamaCppServerFlapping", "10.0.0.0:10938", "warning", cluster="us-1"),  # the same IP elsewhere
        ]
        httpx.post(f"http://127.0.0.1:{port}/api/v2/alerts", json=fleet + flapping).raise_for_status()

        def delivered() -> dict[str, list[str]]:
            out: dict[str, list[str]] = {}
            for n in notifications:
                out.setdefault(n["groupLabels"]["alertname"], []).extend(
                    f"{a['labels']['cluster']}/{a['labels']['instance']}" for a in n["alerts"]
                )
            return out

        wait_for(
            lambda: (
                len(delivered().get("LlamaCppServerDown", [])) == 50
                and len(delivered().get("LlamaCppServerFlapping", [])) == 2
            ),
            "the outage's and the flapping server's notifications",
            30,
        )
        time.sleep(3)  # a few group_intervals: a second notification would have come by now
        down = [n for n in notifications if n["groupLabels"]["alertname"] == "LlamaCppServerDown"]
        assert len(down) == 1 and len(down[0]["alerts"]) == 50
        assert down[0]["groupLabels"] == {
            "alertname": "LlamaCppServerDown",
            "cluster": "eu-1",
            "namespace": "llm",
            "job": "llamacpp",
        }
        assert sorted(delivered()["LlamaCppServerFlapping"]) == ["eu-1/10.0.9.9:10938", "us-1/10.0.0.0:10938"]
    finally:
        terminate(proc)
        hook.shutdown()


def _busybox_path(tmp_path: Path) -> dict[str, str]:
    """An environment whose commands are busybox's applets, as in the sidecar's image."""
    busybox = shutil.which("busybox")
    assert busybox, "busybox is missing: the test set-up installs Debian's busybox"
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for applet in (
        "sh",
        "stat",
        "du",
        "cut",
        "dd",
        "tr",
        "gzip",
        "mv",
        "cat",
        "touch",
        "sleep",
        "find",
        "grep",
        "wc",
        "tail",
    ):
        (bin_dir / applet).symlink_to(busybox)
    return {"PATH": str(bin_dir)}


def test_rotate_sh_never_reads_the_hole_a_truncated_log_leaves(tmp_path: Path) -> None:
    """llama-server writes on at its old offset after the copytruncate: the log is a hole of
    several GB and then the new lines. rotate.sh must copy only those lines, without reading
    the hole (wc -c and busybox's tail did: 82 s and a core for 20 GB; tail fails above 4 GiB)."""
    import gzip
    import resource

    log = tmp_path / "llama-server.log"
    hole = 8 << 30
    with open(log, "wb") as f:
        f.truncate(hole)  # what the last rotation left: no disk used
        f.seek(hole)
        new = b"".join(b"0.01.%06d I srv  update_slots: all slots are idle\n" % i for i in range(20000))
        f.write(new)
    (tmp_path / "llama-server.log.rotated-at").write_text(f"{hole}\n")
    env = {**_busybox_path(tmp_path), "LOG": str(log), "MAX_MB": "0", "KEEP": "3"}
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.monotonic()
    subprocess.run(["sh", str(ROOT / "deploy/logrotate/rotate.sh"), "--once"], check=True, env=env)
    wall = time.monotonic() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    print(f"rotate.sh on an 8 GiB hole + {len(new)} bytes: {wall:.2f} s wall, {cpu:.2f} s CPU")
    assert gzip.decompress((tmp_path / "llama-server.log.1.gz").read_bytes()) == new
    assert log.stat().st_size == 0
    assert (tmp_path / "llama-server.log.rotated-at").read_text().strip() == str(hole + len(new))
    # reading 8 GiB of zeros costs seconds of CPU on any machine; seeking past them, hundredths
    assert cpu < 1.0, f"{cpu:.2f} s of CPU: the hole was read"


def test_the_log_rotate_health_check_sees_a_stopped_rotation(tmp_path: Path) -> None:
    log = tmp_path / "llama-server.log"
    log.write_bytes(b"x\n")
    env = {**_busybox_path(tmp_path), "LOG": str(log), "MAX_MB": "100"}
    subprocess.run(["sh", str(ROOT / "deploy/logrotate/rotate.sh"), "--once"], check=True, env=env)
    check = SERVICES["log-rotate"]["healthcheck"]["test"][1:]
    check = [a.replace("/logs/", f"{tmp_path}/") for a in check]
    assert subprocess.run(check, env=env).returncode == 0
    old = time.time() - 600  # the loop stopped ten minutes ago
    os.utime(tmp_path / "llama-server.log.checked", (old, old))
    assert subprocess.run(check, env=env).returncode != 0
    (dep,) = _kind("Deployment")
    side = next(c for c in dep["spec"]["template"]["spec"]["containers"] if c["name"] == "log-rotate")
    assert side["livenessProbe"]["exec"]["command"] == SERVICES["log-rotate"]["healthcheck"]["test"][1:]
