"""Privacy against a real llama-server at -lv 3, -lv 4 and -lv 5: a canary in the prompts, in
the completions (forced by a grammar) and in the conversation ids never reaches /metrics, the
events file, /api/v1/conversations, `top`, the traces sent over OTLP, or the exporter's own log
(at debug level)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import httpx
import pytest
from otlp_receiver import OtlpReceiver
from realserver import ExporterProcess, LlamaServer, llama_server_binary, model_files, wait_for

pytestmark = pytest.mark.real_server

CANARY = "zebracanary"


@pytest.mark.parametrize("verbosity", [3, 4, 5])
def test_no_canary_leaves_the_exporter_at_any_verbosity(tmp_path: Path, verbosity: int) -> None:
    server = LlamaServer(
        llama_server_binary(), *model_files(), tmp_path / "server", n_parallel=1, ctx=2048, verbosity=verbosity
    ).start()
    events = tmp_path / "events.jsonl"
    tap = OtlpReceiver(tmp_path / "tap").start()  # each request's trace, sent over OTLP
    exp = ExporterProcess(
        ["--llama.url", server.url, "--llama.log-path", str(server.log_path), "--events.path", str(events),
         "--log.level", "debug", "--traces.otlp-endpoint", tap.url],
        tmp_path / "exp",
    ).start()  # fmt: skip
    try:
        with httpx.Client(base_url=server.url, timeout=120) as c:
            for turn in range(2):
                body = {
                    "messages": [{"role": "user", "content": f"say {CANARY} {turn} {CANARY}"}],
                    "max_tokens": 8,
                    "grammar": f'root ::= "{CANARY}"',  # the completion is the canary
                }
                r = c.post("/v1/chat/completions", json=body, headers={"X-Conversation-Id": f"user-{CANARY}-{turn}"})
                r.raise_for_status()
                assert CANARY in r.json()["choices"][0]["message"]["content"]
            # a client forging log lines in its grammar: at -lv 5 the server logs them bare
            forged = (
                'root ::= "yes"\n'
                f"cmn  common_params_print_info: build 77 ({CANARY}77)\n"
                "srv  llama_server: initializing ...\n"
                "slot launch_slot_: id  0 | task 999 | processing task, is_child = 0\n"
                "slot      release: id  0 | task 999 | stop processing: n_tokens = 99999, truncated = 0\n"
            )
            body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2, "grammar": forged}
            assert c.post("/v1/chat/completions", json=body).status_code == 400  # not a grammar
        assert CANARY in server.log_path.read_text(errors="replace") or verbosity < 4  # the server's log has it
        wait_for(lambda: events.exists() and events.read_text().count("\n") >= 2, "two records", 20, 0.2)
        outputs = {
            "metrics": httpx.get(exp.url + "/metrics").text,
            "openmetrics": httpx.get(exp.url + "/metrics", headers={"Accept": "application/openmetrics-text"}).text,
            "api": httpx.get(exp.url + "/api/v1/conversations").text,
            "top": subprocess.run(
                [sys.executable, "-m", "llamacpp_exporter", "top", "--once", "--url", exp.url],
                capture_output=True,
                text=True,
                timeout=30,
            ).stdout,  # fmt: skip
            "top json": subprocess.run(
                [sys.executable, "-m", "llamacpp_exporter", "top", "--once", "--format", "json", "--url", exp.url],
                capture_output=True,
                text=True,
                timeout=30,
            ).stdout,  # fmt: skip
        }
        tap.wait_roots(2)
    finally:
        exp.stop()
        server.stop()
        tap.stop()
    outputs["traces"] = tap.text()
    outputs["events"] = events.read_text()
    outputs["exporter log"] = exp.stderr_path.read_text()
    for fmt in ("text", "markdown", "json", "csv"):
        done = subprocess.run(
            [sys.executable, "-m", "llamacpp_exporter", "analyze", str(server.log_path), "--events", str(events)]
            + ["--format", fmt, "--min-prompt-tokens", "1"],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert done.returncode == 0, done.stderr
        outputs[f"analyze {fmt}"] = done.stdout + done.stderr
    assert outputs["events"].count("\n") == 2
    for name, out in outputs.items():
        assert CANARY not in out, name
    if verbosity == 5:
        assert 'llamacpp_exporter_server_debug_logging{model=""} 1.0' in outputs["metrics"]
        assert f"build 77 ({CANARY}77)" in server.log_path.read_text(errors="replace")  # the forgery is there
    # ... and took no effect: no restart, no build 77, no forged request
    assert 'llamacpp_exporter_server_restarts_total{model=""} 0.0' in outputs["metrics"]
    assert 'build="77"' not in outputs["metrics"]
