"""Where a line's time goes, next to the budget that twice mtail's speed would leave.

On the log of throughput_vs_mtail.py (a million lines by default), in this process, each stage
alone, CPU microseconds a line:

- read: the file read and split into lines, nothing else;
- find: one regular-expression pass over the whole text (C code, no Python per line) that
  finds every line of the kinds the parser turns into events: what it costs only to recognise
  the lines that matter, before any event is built;
- parse: parse.parse_line on every line (typed events, nothing kept);
- pipeline: the whole hot path (parse, assemble every request, metrics), as the exporter runs it;
- compiled: the same pipeline as `pip install .` builds it with a C compiler (setup.py: its
  hot path compiled by mypyc), with --compiled.

Then mtail's wall time on the same file (Debian's mtail, benchmarks/llama_facts.mtail) and the
budget a line has at twice mtail's speed. Prints figures; not a pass/fail test.

Usage: .venv/bin/python benchmarks/hot_path_budget.py [--lines N] [--compiled]
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable
from functools import partial
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "tests" / "setup"))
from build_compiled import installed_package  # noqa: E402
from throughput_vs_mtail import build_log, run  # noqa: E402

# every message the parser makes an event of (parse.py), as one pattern: the lines that matter
_RELEVANT = re.compile(
    r"^\d+\.\d\d\.\d\d\d\.\d\d\d [IWE] (?:slot .{12}: id +\d+ \| task -?\d+ \| (?:cached n_tokens|clearing |"
    r"prompt eval time|processing task|prompt processing| +eval time| +- skipping, is_processing = 1|"
    r"stop processing|selected slot|saving idle slot|new prompt|init sampler|forcing full prompt)"
    r"|srv  .{12}: (?: - |   - |updating prompt cache|prompt cache update took|conv_id=|initializing|"
    r"prompt cache is enabled|cancel task|task id = |failed to |chat format: )"
    r"|cmn  .{12}: .*(?:verbosity = |print_info: build ))",
    re.M,
)

# each stage: (set-up, outside the timing; the timed part)
STAGES = {
    "read": (
        "",
        """
with open(path, encoding="utf-8", errors="replace", newline="\\n") as fh:
    for line in fh:
        line.rstrip("\\r\\n")
""",
    ),
    "find": (
        "import re\nrelevant = re.compile({pattern!r}, re.M)",
        """
with open(path, encoding="utf-8", errors="replace", newline="\\n") as fh:
    text = fh.read()
sum(1 for _ in relevant.finditer(text))
""",
    ),
    "parse": (
        "from llamacpp_exporter.parse import parse_line",
        """
with open(path, encoding="utf-8", errors="replace", newline="\\n") as fh:
    for line in fh:
        parse_line(line.rstrip("\\r\\n"))
""",
    ),
    "pipeline": (
        "from prometheus_client import CollectorRegistry\nfrom llamacpp_exporter.pipeline import replay",
        "replay(path, CollectorRegistry())",
    ),
}

TIMED = """
import resource, sys
path = sys.argv[1]
def cpu():
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime
{setup}
t0 = cpu()
{body}
print(cpu() - t0)
"""


def stage_cpu(stage: str, log: Path, pythonpath: str | None = None) -> float:
    """CPU seconds of the stage alone: the interpreter and imports are outside the timing."""
    setup, body = STAGES[stage]
    setup = setup.format(pattern=_RELEVANT.pattern)
    env = dict(os.environ)
    if pythonpath:
        env["PYTHONPATH"] = pythonpath
    out = subprocess.run(
        [sys.executable, "-c", TIMED.format(setup=setup, body=body), str(log)],
        capture_output=True,
        text=True,
        env=env,
        check=True,
    )
    return float(out.stdout.split()[-1])


def best_of(runs: int, f: Callable[[], float]) -> float:
    return min(f() for _ in range(runs))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--lines", type=int, default=1_000_000)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--compiled", action="store_true", help="also time the pipeline compiled with mypyc")
    args = ap.parse_args()
    mtail = shutil.which("mtail")
    with tempfile.TemporaryDirectory() as tmp:
        d = Path(tmp)
        log = d / "llama-server.log"
        n = build_log(log, args.lines)
        text = log.read_text(errors="replace")
        relevant = sum(1 for _ in _RELEVANT.finditer(text))
        del text
        print(f"log: {n} lines, {relevant} of them of a kind the parser makes an event of ({relevant / n:.0%})")
        us: dict[str, float] = {}
        for stage in STAGES:
            us[stage] = best_of(args.runs, partial(stage_cpu, stage, log)) / n * 1e6
        if args.compiled:
            path = str(installed_package(compiler=True))
            us["compiled"] = best_of(args.runs, lambda: stage_cpu("pipeline", log, path)) / n * 1e6
        if mtail:
            cmd = [mtail, "--one_shot", "--one_shot_format=prometheus", "--logtostderr"]
            cmd += ["--progs", str(HERE / "llama_facts.mtail"), "--logs", str(log)]
            # wall time: mtail spreads its work over threads, the target is lines per second
            us["mtail"] = best_of(args.runs, lambda: run(cmd)[0]) / n * 1e6
        print(f"{'stage':10} {'us a line, best of ' + str(args.runs) + ' (CPU; mtail: wall)':>38}")
        for name, v in us.items():
            print(f"{name:10} {v:38.2f}")
        if "mtail" in us:
            budget = us["mtail"] / 2
            print(f"twice mtail's lines per second leaves {budget:.2f} us a line for everything")
            print(f"pipeline / budget: {us['pipeline'] / budget:.1f}x over; parse alone {us['parse'] / budget:.1f}x")
            if "compiled" in us:
                print(f"compiled (mypyc) / budget: {us['compiled'] / budget:.1f}x over")
        else:
            print("mtail is missing: benchmarks/run.sh installs Debian's mtail")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
