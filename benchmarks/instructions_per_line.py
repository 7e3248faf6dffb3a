"""Instructions a log line costs in the compiled hot path, counted by valgrind: a figure that
does not move with the machine's load, for comparing two versions of the code.

The package is built as `pip install .` builds it with a C compiler (setup.py: the hot path
compiled by mypyc). Valgrind's cachegrind counts the instructions of two replays of the log of
throughput_vs_mtail.py through `Pipeline.process_lines` (batches of 512 lines, as the live
exporter hands them on), one of `--lines` lines and one of three times as many; the difference
over the difference in lines is the cost of a line, Python's start and the imports taken out.

Usage: .venv/bin/python benchmarks/instructions_per_line.py [--lines N] [--pure]
Prints figures; not a pass/fail test.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "tests" / "setup"))
from build_compiled import installed_package  # noqa: E402
from throughput_vs_mtail import build_log  # noqa: E402

REPLAY = """
import sys
sys.path.insert(0, sys.argv[1])
from prometheus_client import CollectorRegistry
from llamacpp_exporter.pipeline import Pipeline
pl = Pipeline(CollectorRegistry(), clock=lambda: 0.0)
lines = open(sys.argv[2], encoding="utf-8").read().splitlines()
for i in range(0, len(lines), 512):
    pl.process_lines(lines[i : i + 512], 0.0)
pl.flush()
print(pl.records_out)
"""


def instructions(package: Path, log: Path) -> tuple[int, int]:
    """(instructions, records out) of one replay under valgrind."""
    res = subprocess.run(
        ["valgrind", "--tool=cachegrind", "--cache-sim=no", "--cachegrind-out-file=/dev/null"]
        + [sys.executable, "-c", REPLAY, str(package), str(log)],
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ, "PYTHONHASHSEED": "0"},  # the same dictionaries each run
    )
    refs = re.search(r"I\s+refs:\s+([\d,]+)", res.stderr)
    if refs is None:
        raise SystemExit(f"no instruction count in valgrind's output: {res.stderr[-500:]}")
    return int(refs[1].replace(",", "")), int(res.stdout.split()[-1])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--lines", type=int, default=20_000)
    ap.add_argument("--pure", action="store_true", help="the pure Python package instead")
    args = ap.parse_args()
    if not shutil.which("valgrind"):
        raise SystemExit("valgrind is missing: apt-get install valgrind")
    package = installed_package(compiler=not args.pure)
    with tempfile.TemporaryDirectory() as tmp:
        whole = Path(tmp) / "whole.log"
        build_log(whole, 3 * args.lines)
        lines = whole.read_text().splitlines(keepends=True)
        counts = []
        for n in (args.lines, 3 * args.lines):
            part = Path(tmp) / f"{n}.log"
            part.write_text("".join(lines[:n]))
            counts.append((n, *instructions(package, part)))
    (n1, i1, r1), (n2, i2, r2) = counts
    kind = "pure Python" if args.pure else "compiled"
    print(f"package: {package} ({kind})")
    for n, i, r in counts:
        print(f"  {n:>7} lines: {i:>14,} instructions, {r} records")
    print(f"instructions per line ({kind}): {(i2 - i1) / (n2 - n1):,.0f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
