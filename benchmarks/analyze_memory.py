"""analyze's memory over a long log and over a rotated set of files.

Builds a log of ten million lines (default) from recorded real -lv 4 logs, as
benchmarks/throughput_vs_mtail.py does (one server run, timestamps and task ids shifted), then runs
`llamacpp-exporter analyze --format json` on it, sampling the process's RSS twice a second:
prints the RSS at each tenth of the run, the peak, the time and the records. Then the same log
cut into a rotated set (LOG.3.gz, LOG.2, LOG.1, LOG, as logrotate leaves it), analysed the same
way, and whether its report is the one of the single file (but for the count of files read).

    .venv/bin/python benchmarks/analyze_memory.py [--lines N]
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from procfs import rss_mib  # noqa: E402
from throughput_vs_mtail import build_log  # noqa: E402


def run_analyze(paths: list[Path], out: Path) -> tuple[float, list[float], dict[str, Any]]:
    """analyze on the files: its wall time, its RSS samples (MiB), its report."""
    env = dict(os.environ, LLAMACPP_EXPORTER_SALT="benchmark-salt")
    with open(out, "w") as fh:
        t0 = time.monotonic()
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "llamacpp_exporter",
                "analyze",
                *map(str, paths),
                "--format",
                "json",
                "--no-progress",
            ],
            stdout=fh,
            stderr=subprocess.DEVNULL,
            env=env,
        )
        samples = []
        while proc.poll() is None:
            r = rss_mib(proc.pid)
            if r is not None:
                samples.append(r)
            time.sleep(0.5)
        wall = time.monotonic() - t0
    if proc.returncode != 0:
        raise SystemExit(f"analyze failed ({proc.returncode})")
    return wall, samples, json.loads(out.read_text())


def describe(what: str, lines: int, wall: float, samples: list[float], rep: dict[str, Any]) -> None:
    tenths = [samples[min(len(samples) - 1, k * len(samples) // 10)] for k in range(1, 11)] if samples else []
    print(
        f"{what}: {lines} lines, {rep['requests']['total']} requests in {wall:.0f} s ({lines / wall:.0f} lines/s); "
        f"RSS at each tenth of the run: {', '.join(f'{r:.0f}' for r in tenths)} MiB; peak {max(samples):.0f} MiB"
    )


def rotated_set(log: Path, d: Path, parts: int = 4) -> list[Path]:
    """The log cut into `parts` files at line boundaries, named as logrotate names them (the
    oldest compressed), in a shuffled order: analyze puts them in order itself."""
    size = log.stat().st_size
    names = [d / f"llama-server.log.{k}" for k in range(parts - 1, 0, -1)] + [d / "llama-server.log"]
    with open(log, "rb") as fin:
        for i, name in enumerate(names):
            target = size * (i + 1) // parts
            with open(name, "wb") as out:
                while fin.tell() < target or i == parts - 1:
                    line = fin.readline()
                    if not line:
                        break
                    out.write(line)
    oldest = names[0]
    with open(oldest, "rb") as fin, gzip.open(str(oldest) + ".gz", "wb", compresslevel=1) as out:
        shutil.copyfileobj(fin, out)
    oldest.unlink()
    names[0] = Path(str(oldest) + ".gz")
    return [names[2], names[0], names[3], names[1]]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--lines", type=int, default=10_000_000)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        d = Path(tmp)
        log = d / "built.log"
        n = build_log(log, args.lines)
        wall, samples, whole = run_analyze([log], d / "whole.json")
        describe("one file", n, wall, samples, whole)
        parts = rotated_set(log, d)
        log.unlink()
        wall, samples, rotated = run_analyze(parts, d / "rotated.json")
        describe(f"rotated set of {len(parts)} files (one gzipped)", n, wall, samples, rotated)
        same = {k: v for k, v in rotated.items() if k != "sources"} == {
            k: v for k, v in whole.items() if k != "sources"
        }
        print(f"rotated set: the same report as the one file (but for the files counted): {'yes' if same else 'NO'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
