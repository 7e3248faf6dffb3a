"""Hot-path throughput next to mtail, on the same file in the same run.

Builds a log of at least a million lines from recorded real llama-server -lv 4 logs (the
requests of each recording appended again and again to one server process: timestamps and task
ids shifted, so the assembler sees one long run), then reads it with Debian's mtail
(`--one_shot`, benchmarks/llama_facts.mtail: the same per-line facts as our parser), with the
exporter's whole pipeline (parse, assemble every request, metrics), and with `llamacpp-exporter
analyze` (the same pipeline, plus its report), each as the pure source and as `pip install .` builds it
with a C compiler (the hot path compiled by mypyc, setup.py). Prints lines per second,
CPU seconds, peak memory and the ratio. Not a pass/fail test: absolute figures do not travel
between machines, the ratio does.

Usage: .venv/bin/python benchmarks/throughput_vs_mtail.py [--lines N] [--runs K]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from functools import partial
from pathlib import Path

HERE = Path(__file__).resolve().parent
LOGS = HERE.parent / "tests" / "fixtures" / "logs"
sys.path.insert(0, str(HERE.parent / "tests" / "setup"))
from build_compiled import installed_package  # noqa: E402

# recorded real -lv 4 logs with timestamps: two slots, LoRA and plain requests, cache misses,
# restores and evictions
SOURCES = ["lv4-np2-text.log", "lv4-np2-slow-machine.log", "lv4-np1-cache-thrashing.log"]
_TS = re.compile(r"^(\d+)\.(\d\d)\.(\d\d\d)\.(\d\d\d) ")
_TASK = re.compile(r"(\| task |id_task = |task id = )(\d+)")


def _shift_task(shift: int, mt: re.Match[str]) -> str:
    return mt.group(1) + str(int(mt.group(2)) + shift)


def _us(m: re.Match[str]) -> int:
    return int(m.group(1)) * 60_000_000 + int(m.group(2)) * 1_000_000 + int(m.group(3)) * 1_000 + int(m.group(4))


def _stamp(us: int) -> str:
    return f"{us // 60_000_000}.{us // 1_000_000 % 60:02d}.{us // 1000 % 1000:03d}.{us % 1000:03d} "


def build_log(path: Path, min_lines: int, sources: list[Path] | None = None) -> int:
    """The first recording whole (start banner included), then the request part of each
    recording in turn, shifted past the last timestamp and task id so far."""
    recordings = []
    for src in sources or [LOGS / name for name in SOURCES]:
        lines = src.read_text().splitlines(keepends=True)
        first = next(i for i, ln in enumerate(lines) if "conv_id=" in ln or "launch_slot_" in ln)
        recordings.append((lines[:first], lines[first:]))
    n = 0
    t_end = task_end = 0
    with open(path, "w") as out:
        banner, _ = recordings[0]
        out.writelines(banner)
        n += len(banner)
        k = 0
        while n < min_lines:
            _, body = recordings[k % len(recordings)]
            k += 1
            t_shift, task_shift = t_end + 1_000_000, task_end + 1
            first_ts = next(_us(m) for ln in body if (m := _TS.match(ln)))
            for ln in body:
                m = _TS.match(ln)
                if m:
                    t = _us(m) - first_ts + t_shift
                    t_end = max(t_end, t)
                    ln = _stamp(t) + ln[m.end() :]
                ln = _TASK.sub(partial(_shift_task, task_shift), ln)
                out.write(ln)
            task_end = max(task_end, *(int(x) + task_shift for ln in body for _, x in _TASK.findall(ln)), task_shift)
            n += len(body)
    return n


def run(cmd: list[str], env: dict[str, str] | None = None) -> tuple[float, float, int, str]:
    """Wall seconds, CPU seconds and peak RSS (KiB) of this one child process, and its output."""
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        t0 = time.perf_counter()
        proc = subprocess.Popen(cmd, stdout=out, stderr=err, env={**os.environ, **env} if env else None)
        _, status, usage = os.wait4(proc.pid, 0)  # this child's own usage, not all children's
        wall = time.perf_counter() - t0
        proc.returncode = os.waitstatus_to_exitcode(status)
        if proc.returncode != 0:
            err.seek(0)
            raise SystemExit(f"{cmd[0]} failed ({proc.returncode}): {err.read()[-2000:]}")
        out.seek(0)
        return wall, usage.ru_utime + usage.ru_stime, usage.ru_maxrss, out.read()


# the pipeline reading the file as analyze and a replay do (pipeline.replay)
REPLAY = """
import sys
import llamacpp_exporter.pipeline as p
from prometheus_client import CollectorRegistry
pl = p.replay(sys.argv[1], CollectorRegistry())
restarts = pl.registry.get_sample_value("llamacpp_exporter_server_restarts_total", {"model": ""})
print(pl.records_out, int(restarts), p.__file__.endswith(".so"))
"""


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--lines", type=int, default=1_000_000)
    ap.add_argument("--runs", type=int, default=3)
    args = ap.parse_args()
    mtail = shutil.which("mtail")
    if mtail is None:
        print("mtail is missing: benchmarks/run.sh installs Debian's mtail", file=sys.stderr)
        return 1
    with tempfile.TemporaryDirectory() as tmp:
        log = Path(tmp) / "llama-server.log"
        n = build_log(log, args.lines)
        size = log.stat().st_size / 1e6
        print(f"log: {n} lines, {size:.0f} MB, from {', '.join(SOURCES)}")
        mtail_cmd = [mtail, "--one_shot", "--one_shot_format=prometheus", "--logtostderr"]
        mtail_cmd += ["--progs", str(HERE / "llama_facts.mtail"), "--logs", str(log)]
        ours_cmd = [sys.executable, "-c", REPLAY, str(log)]
        analyze_cmd = [
            sys.executable,
            "-m",
            "llamacpp_exporter",
            "analyze",
            str(log),
            "--format",
            "json",
            "--no-progress",
        ]
        # the package as `pip install .` builds it with a C compiler (setup.py: mypyc)
        compiled = {"PYTHONPATH": str(installed_package(compiler=True))}
        cmds = {
            "mtail": (mtail_cmd, None),
            "exporter": (ours_cmd, None),
            "compiled": (ours_cmd, compiled),
            "analyze": (analyze_cmd, None),
            "analyze-c": (analyze_cmd, compiled),
        }
        rows: dict[str, list[tuple[float, float, int]]] = {name: [] for name in cmds}
        seen = {}
        for _ in range(args.runs):  # alternating, so that a busy spell hits all
            for name, (cmd, env) in cmds.items():
                wall, cpu, rss, out = run(cmd, env)
                rows[name].append((wall, cpu, rss))
                if name in ("exporter", "compiled"):
                    n_records, n_restarts, compiled_text = out.split()
                    seen[name] = (int(n_records), int(n_restarts), compiled_text == "True")
                if name.startswith("analyze"):
                    seen[name] = json.loads(out)["requests"]["total"]
        launched = sum(1 for line in open(log) if "processing task, is_child = 0" in line)
        for name in ("exporter", "compiled"):
            records, restarts, is_compiled = seen[name]
            print(
                f"{name} ({'compiled by mypyc' if is_compiled else 'pure Python'}): {records} request records "
                f"of {launched} launched, {restarts} server restarts seen"
            )
        print(
            f"analyze (the whole command, report included): {seen['analyze']} requests; compiled: {seen['analyze-c']}"
        )
        print(f"{'':10} {'lines/s (best, worst)':>26} {'CPU s (best)':>13} {'peak RSS':>10}")
        best = {}
        for name, r in rows.items():
            walls = sorted(w for w, _, _ in r)
            best[name] = n / walls[0]
            print(
                f"{name:10} {n / walls[0]:>12,.0f} {n / walls[-1]:>12,.0f} "
                f"{min(c for _, c, _ in r):>13.2f} {max(m for _, _, m in r) / 1024:>8.0f} MB"
            )
        print(f"exporter / mtail: {best['exporter'] / best['mtail']:.2f}x pure Python, ", end="")
        print(f"{best['compiled'] / best['mtail']:.2f}x compiled (best runs; target 2x)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
