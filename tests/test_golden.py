"""Golden-file tests of the /metrics exposition for recorded logs, linted by promtool, and of
every analyze output format.

`pytest --update-golden` rewrites tests/golden/ (the exposition, and analyze's outputs in
tests/golden/analyze/); review the diff before committing.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, disable_created_metrics, generate_latest
from prometheus_client.openmetrics.exposition import generate_latest as generate_openmetrics

from llamacpp_exporter.assemble.pseudonyms import Pseudonymizer
from llamacpp_exporter.offline import analyze
from llamacpp_exporter.pipeline import replay

LOGS = Path(__file__).parent / "fixtures" / "logs"
GOLDEN = Path(__file__).parent / "golden"
disable_created_metrics()


def exposition(log: str, openmetrics: bool = False) -> str:
    reg = CollectorRegistry()
    replay(str(LOGS / log), reg, now=1_800_000_000.0, pseudonymize=Pseudonymizer("golden-salt"))
    return (generate_openmetrics if openmetrics else generate_latest)(reg).decode()


def check_golden(name: str, text: str, update: bool) -> None:
    path = GOLDEN / name
    if update or not path.exists():
        if not update:
            pytest.fail(f"{path} is missing; run pytest --update-golden and review it")
        path.parent.mkdir(exist_ok=True)
        path.write_text(text)
    assert text == path.read_text(), f"exposition differs from {path}; run pytest --update-golden and review the diff"


LOG_NAMES = [
    "lv4-np1-seed-scenario",
    "lv4-np2-text",
    "lv4-np2-jsonl",
    "lv3-np2-text",
    "router-two-models",
    "lv4-np2-mixed-kinds",
]


@pytest.mark.parametrize("log", LOG_NAMES)
def test_exposition_golden(log: str, update_golden: bool) -> None:
    check_golden(f"{log}.prom", exposition(f"{log}.log"), update_golden)


def test_openmetrics_exposition_carries_exemplars(update_golden: bool) -> None:
    # exemplar timestamps are the wall clock of the observation: masked for the comparison
    text = re.sub(
        r"(# \{[^}]*\} \S+) \d+(\.\d+)?$", r"\1 <ts>", exposition("lv4-np2-text.log", openmetrics=True), flags=re.M
    )
    check_golden("lv4-np2-text.openmetrics.txt", text, update_golden)
    # histograms point at the very request, and its conversation
    assert re.search(r'# \{conversation="c[0-9a-f]{12}",slot="0",task="2"\}', text)


def promtool() -> str:
    path = shutil.which("promtool")
    assert path, "promtool is missing: the test set-up installs Debian's prometheus package"
    return path


@pytest.mark.integration
@pytest.mark.parametrize("log", LOG_NAMES)
def test_exposition_passes_promtool_check_metrics(log: str) -> None:
    res = subprocess.run(
        [promtool(), "check", "metrics"], input=exposition(f"{log}.log"), capture_output=True, text=True
    )
    assert res.returncode == 0, res.stdout + res.stderr


# analyze's every output format, on recorded logs of every shape: one server, JSONL, -lv 3, a
# router, kinds of tasks, the LoRA case with the exporter's events file, contention, evictions
# (the cache-size curve), clients that gave up, b11549, and two logs compared
ANALYZED = {
    "lv4-np1-seed-scenario": ["lv4-np1-seed-scenario.log"],
    "lv4-np2-text": ["lv4-np2-text.log"],
    "lv4-np2-jsonl": ["lv4-np2-jsonl.log"],
    "lv3-np2-text": ["lv3-np2-text.log"],
    "router-two-models": ["router-two-models.log"],
    "lv4-np2-mixed-kinds": ["lv4-np2-mixed-kinds.log"],
    "lv4-np2-lora-events": ["lv4-np2-lora-events.log", "--events", "lv4-np2-lora-events.events.jsonl"],
    "lv4-np2-contention": ["lv4-np2-contention.log"],
    "lv4-np1-cache-thrashing": ["lv4-np1-cache-thrashing.log"],
    "lv4-np2-impatient-ids": ["lv4-np2-impatient-ids.log"],
    "b11549-lv4-text": ["builds/b11549-lv4-text.log"],
    "compare": ["lv4-np2-text.log", "--compare-with", "lv4-np2-contention.log"],
}


@pytest.mark.parametrize("name", sorted(ANALYZED))
@pytest.mark.parametrize("fmt", ["text", "markdown", "json", "csv"])
def test_analyze_golden(
    name: str, fmt: str, update_golden: bool, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("LLAMACPP_EXPORTER_SALT", "golden-salt")
    monkeypatch.chdir(LOGS)  # the report names its inputs as given
    args = [*ANALYZED[name], "--format", fmt, "--min-prompt-tokens", "1", "--no-progress"]
    assert analyze.main(args) == 0
    check_golden(f"analyze/{name}.{fmt}", capsys.readouterr().out, update_golden)
