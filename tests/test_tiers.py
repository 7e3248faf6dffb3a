"""The tiers as tests/run.sh runs them: two pytest-xdist workers, the tests that start processes
(servers, busy loops, timings) all on one, one after another; the fast tier beside them."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[1]


def test_the_tests_that_start_processes_run_on_one_worker_one_after_another() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-n", "2", "--dist", "loadgroup", "-v"]
        + ["tests/test_config.py"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    ).stdout
    ran = re.findall(r"^\[(gw\d)\] .*(?:PASSED|FAILED|ERROR) (tests/\S+)", out, re.M)
    processes = [(worker, test) for worker, test in ran if test.endswith("@processes")]
    fast = [(worker, test) for worker, test in ran if "@" not in test]
    print(f"{len(processes)} tests that start processes, {len(fast)} fast ones")
    assert len(processes) >= 10 and len(fast) >= 10, out[-3000:]
    assert len({worker for worker, _ in processes}) == 1, processes
    assert "failed" not in out.splitlines()[-1], out[-3000:]
