"""Shared by the dashboard, rules and end-to-end tests: every PromQL expression the project
ships (dashboard panels and rules), and how a real Prometheus is started for them."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import yaml
from realserver import wait_for, wait_healthy

ROOT = Path(__file__).resolve().parent.parent
DASHBOARDS = sorted((ROOT / "dashboards").glob("*.json"))
RULE_FILES = [ROOT / "alerts" / "llamacpp-rules.yaml", ROOT / "alerts" / "llamacpp-alerts.yaml"]

# Grafana's variables, as a person would pick them for the test's Prometheus
GRAFANA_VARS = {
    "$__rate_interval": "1m",
    "$__range": "1h",
    "$cluster": ".*",
    "$namespace": ".*",
    "$job": "llamacpp",
    "$instance": ".+",
    "$model": ".*",
}


def grafana_to_promql(expr: str) -> str:
    for k, v in GRAFANA_VARS.items():
        expr = expr.replace(k, v)
    return expr


@dataclass(frozen=True)
class Expression:
    where: str  # "dashboard <uid> / <panel title> / <refId>" or "rule <name>"
    expr: str  # as shipped
    promql: str  # as sent to Prometheus


def dashboard_expressions() -> list[Expression]:
    out = []
    for f in DASHBOARDS:
        d = json.loads(f.read_text())
        for a in d["annotations"]["list"]:
            if "expr" in a:
                out.append(
                    Expression(
                        f"dashboard {d['uid']} / annotation {a['name']}", a["expr"], grafana_to_promql(a["expr"])
                    )
                )
        for p in d["panels"]:
            for t in p.get("targets", []):
                out.append(
                    Expression(
                        f"dashboard {d['uid']} / {p['title']} / {t['refId']}", t["expr"], grafana_to_promql(t["expr"])
                    )
                )
    return out


def rule_expressions() -> list[Expression]:
    out = []
    for f in RULE_FILES:
        for g in yaml.safe_load(f.read_text())["groups"]:
            for r in g["rules"]:
                name = r.get("alert") or r["record"]
                out.append(Expression(f"rule {name}", r["expr"], r["expr"]))
    return out


METRIC_RE = re.compile(r"\b(llamacpp_[a-z0-9_]+|[a-z_]+:llamacpp_[a-z0-9_:]+)")


def metric_names(expr: str) -> set[str]:
    return set(METRIC_RE.findall(expr))


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


class Prometheus:
    """A real Prometheus (Debian's package) on a loopback port with its own storage."""

    def __init__(self, workdir: Path, config: dict[str, Any]) -> None:
        self.workdir = workdir
        self.port = free_port()
        workdir.mkdir(parents=True, exist_ok=True)
        cfg = workdir / "prometheus.yml"
        cfg.write_text(yaml.safe_dump(config))
        binary = shutil.which("prometheus")
        assert binary, "prometheus is missing: the test set-up installs Debian's prometheus package"
        self.log = open(workdir / "prometheus.log", "wb")
        self.proc = subprocess.Popen(
            [
                binary,
                f"--config.file={cfg}",
                f"--storage.tsdb.path={workdir / 'data'}",
                f"--web.listen-address=127.0.0.1:{self.port}",
                "--enable-feature=exemplar-storage",
            ],
            stdout=self.log,
            stderr=self.log,
            stdin=subprocess.DEVNULL,
        )
        wait_healthy(self.proc, self.url + "/-/ready", 30, f"prometheus (log {workdir / 'prometheus.log'})")

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def wait_scraped(self, n_targets: int, timeout: float = 60.0) -> None:
        """Prometheus hands targets to its scrape loop only after a few seconds: wait until every
        target has been scraped, then for one more scrape, so counters start from their zeros."""
        first: dict[str, str] = {}

        def scraped_again() -> bool:
            targets = httpx.get(self.url + "/api/v1/targets", timeout=5).json()["data"]["activeTargets"]
            scraped = {t["scrapeUrl"]: t["lastScrape"] for t in targets if t["health"] == "up"}
            if not first and len(scraped) >= n_targets:
                first.update(scraped)
                return False
            # each target scraped again since all were first up
            return bool(first) and all(scraped.get(u, last) != last for u, last in first.items())

        wait_for(scraped_again, f"prometheus scraping its {n_targets} targets twice", timeout, 0.3)

    def query(self, promql: str) -> dict[str, Any]:
        r = httpx.get(self.url + "/api/v1/query", params={"query": promql}, timeout=10)
        answer: dict[str, Any] = r.json()
        return answer

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        self.log.close()
