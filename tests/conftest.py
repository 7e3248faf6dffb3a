import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))


def pytest_addoption(parser):
    parser.addoption("--update-golden", action="store_true", help="rewrite the golden files from the current output")


def pytest_configure(config):
    config.addinivalue_line("markers", "real_server: runs a real llama-server (built and cached by the test set-up)")


@pytest.fixture
def update_golden(request) -> bool:
    return request.config.getoption("--update-golden")


@pytest.fixture(scope="session")
def parts() -> tuple[Path, Path, Path]:
    """The real llama-server binary, model and LoRA adapter (built or written once, cached)."""
    from realserver import llama_server_binary, model_files

    binary = llama_server_binary()
    model, lora = model_files()
    return binary, model, lora
