"""`llamacpp-exporter check-lora-restore` against real llama-servers: b11434 has the LoRA
restore bug (the case that started this project), and the control run tells a bug from a
restore that failed for another reason. It refuses, with its reason, where it cannot tell."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import httpx
import pytest
from realserver import LlamaServer, llama_server_binary, model_files, wait_for

pytestmark = pytest.mark.real_server


def check(srv: LlamaServer, *extra: str) -> tuple[int, dict[str, Any] | None, str]:
    res = subprocess.run(
        [sys.executable, "-m", "llamacpp_exporter", "check-lora-restore", "--llama.url", srv.url, "--format", "json"]
        + list(extra),
        capture_output=True,
        text=True,
        timeout=300,
    )
    return res.returncode, (json.loads(res.stdout) if res.stdout.strip() else None), res.stderr


@pytest.fixture(scope="module")
def parts() -> tuple[Path, Path, Path]:
    return llama_server_binary(), *model_files()


def test_b11434_on_two_slots_is_affected_and_the_log_shows_the_discard(
    parts: tuple[Path, Path, Path], tmp_path: Path
) -> None:
    binary, model, lora = parts
    srv = LlamaServer(binary, model, lora, tmp_path / "srv", n_parallel=2).start()
    try:
        code, out, err = check(srv, "--llama.log-path", str(srv.log_path), "--slot", "1")
    finally:
        srv.stop()
    assert "sending 6 requests to slot 1" in err  # said up front
    assert code == 1 and out is not None and out["verdict"] == "affected", (code, out, err)
    # the responses' own counts: the restored entry thrown away, the control's kept
    assert out["with_lora"]["reused"] == 0 and out["with_lora"]["prompt_tokens"] > 50
    assert out["control"]["reused"] >= 0.9 * out["control"]["prompt_tokens"]
    assert out["with_lora"]["discarded"] == 1 and out["control"]["discarded"] == 0  # the log agrees
    assert "PR #30275" in out["message"] and "alpha" not in json.dumps(out)  # no prompt text


def test_a_server_without_a_ram_cache_is_refused_with_its_log_and_inconclusive_without(
    parts: tuple[Path, Path, Path], tmp_path: Path
) -> None:
    binary, model, lora = parts
    srv = LlamaServer(binary, model, lora, tmp_path / "srv", n_parallel=1, cache_ram=0).start()
    try:
        refused = check(srv, "--llama.log-path", str(srv.log_path))
        blind = check(srv)
    finally:
        srv.stop()
    assert refused[0] == 2 and "--cache-ram 0" in refused[2], refused
    # without the log the control shows it: no restore even without a LoRA, never "affected"
    assert blind[0] == 3 and blind[1] is not None and blind[1]["verdict"] == "inconclusive", blind
    assert blind[1]["control"]["reused"] == 0


def test_a_server_without_an_adapter_or_a_free_slot_is_refused(parts: tuple[Path, Path, Path], tmp_path: Path) -> None:
    binary, model, lora = parts
    plain = LlamaServer(binary, model, None, tmp_path / "plain", n_parallel=1).start()
    try:
        no_adapter = check(plain)
    finally:
        plain.stop()
    assert no_adapter[0] == 2 and "no LoRA adapter" in no_adapter[2], no_adapter
    busy = LlamaServer(binary, model, lora, tmp_path / "busy", n_parallel=1).start()
    try:
        # the one slot generating a long answer while the check asks for a free one
        def long_request() -> None:
            body = {"prompt": "Tell a very long story.", "n_predict": 4000, "ignore_eos": True}
            try:
                httpx.post(busy.url + "/completion", json=body, timeout=300)
            except httpx.HTTPError:
                pass  # the server is stopped under it at the end of the test

        t = threading.Thread(target=long_request, daemon=True)
        t.start()

        def slot_busy() -> bool:
            return any(s["is_processing"] for s in httpx.get(busy.url + "/slots", timeout=5).json())

        wait_for(slot_busy, "the slot busy", 60, 0.1)
        no_slot = check(busy)
        wrong_slot = check(busy, "--slot", "7")
    finally:
        busy.stop()
    assert no_slot[0] == 2 and "no free slot" in no_slot[2], no_slot
    assert wrong_slot[0] == 2 and "no slot 7" in wrong_slot[2], wrong_slot


@pytest.mark.integration
def test_answers_it_has_never_seen_are_a_refusal_never_a_crash(tmp_path: Path) -> None:
    """Invented answers (a web server that is not llama-server, odd JSON, an error): the check
    refuses with its reason and exit 2, never a traceback."""
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    answers = {"/lora-adapters": (200, b"<html>not json</html>")}

    class H(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802
            code, body = answers.get(self.path, (500, b"oops"))
            self.send_response(code)
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *a: Any) -> None:
            pass

    srv = ThreadingHTTPServer(("127.0.0.1", 0), H)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{srv.server_address[1]}"

    def run() -> subprocess.CompletedProcess[Any]:
        cmd = [sys.executable, "-m", "llamacpp_exporter", "check-lora-restore", "--llama.url", url]
        return subprocess.run(cmd, capture_output=True, text=True, timeout=60)

    try:
        for lora, slots in (
            ((200, b"<html>not json</html>"), None),
            ((200, b'{"not": "a list"}'), None),
            ((200, b'[{"id": 0, "scale": 0}]'), (200, b'[{"no_id": true}, 7]')),
            ((200, b'[{"id": 0, "scale": 0}]'), (500, b"oops")),
        ):
            answers["/lora-adapters"] = lora
            if slots is not None:
                answers["/slots"] = slots
            res = run()
            assert res.returncode == 2 and "refused" in res.stderr and "Traceback" not in res.stderr, res.stderr
    finally:
        srv.shutdown()
