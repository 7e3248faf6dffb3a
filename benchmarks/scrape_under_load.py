"""Scrape latency while the exporter replays a large log at full speed: scrapes are served by
their own threads and must not queue behind the pipeline. Prints p50, p99 and max.

    .venv/bin/python benchmarks/scrape_under_load.py [--copies 2400]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
from realserver import free_port  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument(
        "--copies", type=int, default=2400, help="copies of the recorded 1,674-line log (default 2400: 4 million lines)"
    )
    args = ap.parse_args()
    log = (ROOT / "tests/fixtures/logs/lv4-np2-text.log").read_text()
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "llama.log"
        path.write_text(log * args.copies)
        lines = len(log.splitlines()) * args.copies
        port = free_port()
        proc = subprocess.Popen(
            [sys.executable, "-m", "llamacpp_exporter", "--web.listen-address", f"127.0.0.1:{port}",
             "--llama.url", f"http://127.0.0.1:{free_port()}", "--llama.log-path", str(path), "--llama.log-from-start"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        url = f"http://127.0.0.1:{port}/metrics"
        try:
            while True:
                try:
                    httpx.get(url, timeout=1)
                    break
                except httpx.HTTPError:
                    time.sleep(0.05)
            lat, read = [], 0.0
            with httpx.Client(timeout=30) as c:
                t_end = time.monotonic() + 600
                while time.monotonic() < t_end:
                    t0 = time.monotonic()
                    text = c.get(url).text
                    lat.append(time.monotonic() - t0)
                    read = sum(
                        float(x.rsplit(" ", 1)[1])
                        for x in text.splitlines()
                        if x.startswith("llamacpp_exporter_log_lines_total{")
                    )
                    if read >= lines:
                        break
                    time.sleep(0.05)
        finally:
            proc.terminate()
            proc.wait(10)
    lat.sort()
    p99 = lat[min(len(lat) - 1, int(len(lat) * 0.99))]
    print(f"{len(lat)} scrapes during a replay of {lines} lines ({read:.0f} read)")
    print(
        f"scrape latency: p50 {statistics.median(lat) * 1000:.1f} ms, p99 {p99 * 1000:.1f} ms, max {lat[-1] * 1000:.1f} ms"
    )


if __name__ == "__main__":
    main()
