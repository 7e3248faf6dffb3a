"""No prompt or completion text reaches a metric, a label, the events file or the
exporter's own log, whatever llama-server's verbosity. The fixture holds every kind of
text-bearing line llama-server can print (invented, shaped per the observability
reference: DEBUG request content, chat-parser warnings, error bodies, conv_id)."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from realserver import ExporterProcess, free_port

pytestmark = pytest.mark.integration

FIXTURE = Path(__file__).parent / "fixtures" / "invented" / "text-bearing-lines.log"
CANARY = "quokkacanary"


def test_no_text_leaves_the_exporter(tmp_path):
    events = tmp_path / "events.jsonl"
    exp = ExporterProcess(
        [
            "--llama.url",
            f"http://127.0.0.1:{free_port()}",
            "--llama.log-path",
            str(FIXTURE),
            "--llama.log-from-start",
            "--events.path",
            str(events),
            "--log.level",
            "debug",
        ],
        tmp_path,
    ).start()
    try:
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and not (events.exists() and events.read_text()):
            time.sleep(0.1)
        text = httpx.get(exp.url + "/metrics").text
        om = httpx.get(exp.url + "/metrics", headers={"Accept": "application/openmetrics-text; version=1.0.0"}).text
    finally:
        exp.stop()
    assert events.read_text().count("\n") == 1
    stderr = exp.stderr_path.read_text()
    analyzed = [
        subprocess.run(
            [
                sys.executable,
                "-m",
                "llamacpp_exporter",
                "analyze",
                str(FIXTURE),
                "--events",
                str(events),
                "--format",
                fmt,
            ],
            capture_output=True,
            text=True,
            timeout=60,
        )
        for fmt in ("text", "markdown", "json", "csv")
    ]
    assert all(a.returncode == 0 for a in analyzed)
    for out in (text, om, events.read_text(), stderr, *(a.stdout + a.stderr for a in analyzed)):
        assert CANARY not in out
    assert 'llamacpp_exporter_server_debug_logging{model=""} 1.0' in text
    assert "logs DEBUG lines" in stderr  # the operator is told, without the text
