"""The deployed layout of the log: llama-server writes --log-file itself (compose, Kubernetes),
deploy/logrotate/rotate.sh copytruncates it under busybox (the sidecar's image), and the
exporter following it counts every request across rotations."""

from __future__ import annotations

import gzip
import os
import shutil
import subprocess
from pathlib import Path

import httpx
import pytest
from realserver import ROOT, ExporterProcess, LlamaServer, llama_server_binary, model_files, wait_for
from workload import completion, text

pytestmark = pytest.mark.real_server


def requests_total(exp: ExporterProcess) -> float:
    total = 0.0
    for line in exp.metrics_text().splitlines():
        if line.startswith("llamacpp_requests_total{"):
            total += float(line.rsplit(" ", 1)[1])
    return total


def metric(exp: ExporterProcess, name: str) -> float:
    for line in exp.metrics_text().splitlines():
        if line.startswith(name + " ") or line.startswith(name + "{"):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(name)


def rotate(log: os.PathLike[str]) -> None:
    busybox = shutil.which("busybox")
    assert busybox, "busybox is missing: the test set-up installs Debian's busybox"
    env = {**os.environ, "LOG": str(log), "MAX_MB": "0", "KEEP": "3"}  # any data: rotate now
    subprocess.run([busybox, "sh", str(ROOT / "deploy/logrotate/rotate.sh"), "--once"], check=True, env=env)


def test_exporter_counts_every_request_across_copytruncate_rotations(tmp_path: Path) -> None:
    import random

    server = LlamaServer(
        llama_server_binary(), *model_files(), tmp_path / "server", n_parallel=1, ctx=4096, log_file=True
    ).start()
    exp = ExporterProcess(
        ["--llama.url", server.url, "--llama.log-path", str(server.log_path), "--no-llama.slots"], tmp_path / "exp"
    ).start()
    rng = random.Random(5)
    sent = 0
    try:
        with httpx.Client(base_url=server.url) as c:

            def burst(n: int) -> None:
                nonlocal sent
                for _ in range(n):
                    completion(c, text(rng, 60), lora=False)
                    sent += 1

            def counted() -> float:
                wait_for(lambda: requests_total(exp) >= sent, f"{sent} requests counted", 20, 0.2)
                return requests_total(exp)

            burst(4)
            assert counted() == sent
            size_before = os.stat(server.log_path).st_size
            rotate(server.log_path)
            burst(4)
            assert counted() == sent
            rotate(server.log_path)
            burst(3)
            assert counted() == sent == 11
            st = os.stat(server.log_path)
            # llama-server writes on at its offset: a hole, no disk used for the rotated part
            assert st.st_size > size_before and st.st_blocks * 512 < st.st_size
            assert metric(exp, 'llamacpp_exporter_log_lines_total{result="oversized"}') == 0
    finally:
        exp.stop()
        server.stop()
    first = gzip.decompress((tmp_path / "server" / "llama-server.log.2.gz").read_bytes())
    second = gzip.decompress((tmp_path / "server" / "llama-server.log.1.gz").read_bytes())
    assert b"\0" not in first + second
    assert first.count(b"slot      release") == 4 and second.count(b"slot      release") == 4
    assert "Traceback" not in exp.stderr_path.read_text()
