"""Replay throughput of the whole pipeline (parse -> assemble -> metrics) on recorded real
logs, at full speed. Prints lines per second; not a pass/fail test.

Usage: .venv/bin/python benchmarks/replay_throughput.py [REPEATS]
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

from prometheus_client import CollectorRegistry

from llamacpp_exporter.pipeline import Pipeline

LOGS = Path(__file__).resolve().parent.parent / "tests" / "fixtures" / "logs"


def main() -> None:
    repeats = int(sys.argv[1]) if len(sys.argv) > 1 else 20
    for name in ("lv4-np2-text.log", "lv4-np2-jsonl.log", "lv3-np2-text.log"):
        lines = (LOGS / name).read_text(errors="replace").splitlines() * repeats  # each copy is a new epoch
        pl = Pipeline(CollectorRegistry(), clock=lambda: 0.0)
        t0 = time.perf_counter()
        for line in lines:
            pl.process_line(line, 0.0)
        pl.flush()
        dt = time.perf_counter() - t0
        print(f"{name:22} {len(lines):8d} lines  {dt:6.2f} s  {len(lines) / dt:10.0f} lines/s")


if __name__ == "__main__":
    main()
