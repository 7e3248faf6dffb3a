"""Style and types are checked like the tests: ruff lint and format over the package, tests and benchmarks; mypy strict over the package, the mixin, the tests and the benchmarks."""

import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parent.parent
PATHS = ["exporter", "tests", "benchmarks", "mixin"]


def test_ruff_lint() -> None:
    res = subprocess.run([sys.executable, "-m", "ruff", "check", *PATHS], cwd=ROOT, capture_output=True, text=True)
    assert res.returncode == 0, res.stdout + res.stderr


def test_ruff_format() -> None:
    res = subprocess.run(
        [sys.executable, "-m", "ruff", "format", "--check", *PATHS], cwd=ROOT, capture_output=True, text=True
    )
    assert res.returncode == 0, res.stdout + res.stderr


def test_types() -> None:
    """mypy strict over the package, the mixin, the tests and the benchmarks (settings in
    pyproject.toml): the types the code states hold."""
    res = subprocess.run([sys.executable, "-m", "mypy"], cwd=ROOT, capture_output=True, text=True)
    assert res.returncode == 0, res.stdout + res.stderr
