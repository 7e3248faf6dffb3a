"""Test tiers. fast (every test not marked otherwise): pure, no process, no sleep, no network,
enforced below. integration: processes, promtool, Prometheus, HTTP on loopback. real_server: a
real llama-server with a real model. `tests/run.sh -m fast` runs the first tier in seconds."""

import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--update-golden", action="store_true", help="rewrite the golden files from the current output")


TIERS = ("integration", "real_server")


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "fast: pure (no process, no sleep, no network): every test not marked otherwise")
    config.addinivalue_line(
        "markers", "integration: starts processes (the exporter, promtool, Prometheus) or serves HTTP"
    )
    config.addinivalue_line("markers", "real_server: runs a real llama-server (built and cached by the test set-up)")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if not any(item.get_closest_marker(t) for t in TIERS):
            item.add_marker(pytest.mark.fast)


@pytest.fixture(autouse=True)
def _fast_tests_stay_pure(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    """A fast test that starts a process, sleeps or opens a socket fails: mark it integration."""
    if request.node.get_closest_marker("fast") is None:
        return

    def refuse(what: str) -> Callable[..., None]:
        def refused(*args: object, **kwargs: object) -> None:
            raise AssertionError(f"a fast test must not {what}: mark it pytest.mark.integration")

        return refused

    monkeypatch.setattr(subprocess.Popen, "__init__", refuse("start a process"))
    monkeypatch.setattr(time, "sleep", refuse("sleep"))
    monkeypatch.setattr(socket.socket, "connect", refuse("use the network"))
    monkeypatch.setattr(socket.socket, "bind", refuse("use the network"))


@pytest.fixture(scope="session", autouse=True)
def _no_process_outlives_the_session() -> Iterator[None]:
    yield
    from realserver import STARTED, terminate

    for proc in STARTED:
        if proc.poll() is None:
            terminate(proc)


@pytest.fixture
def update_golden(request: pytest.FixtureRequest) -> bool:
    return bool(request.config.getoption("--update-golden"))


@pytest.fixture(scope="session")
def parts() -> tuple[Path, Path, Path]:
    """The real llama-server binary, model and LoRA adapter (built or written once, cached)."""
    from realserver import llama_server_binary, model_files

    binary = llama_server_binary()
    model, lora = model_files()
    return binary, model, lora
