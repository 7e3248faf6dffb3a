"""The exporter as users run it (its own process, following a log file), measured from outside.

- freshness: a line appended to llama-server's log until its effect shows in /metrics
  (median, p99), one line at a time;
- scrape cost: /metrics response time once 64 slots, every histogram and the top-N
  conversations are populated (median, p99), in the text format and as a real Prometheus
  scrapes it (OpenMetrics, timed by Prometheus's own scrape_duration_seconds);
- memory: the exporter's RSS after the whole log (ten million lines by default), at each tenth
  of it, and whether it grew after the warm-up.

The log is built from recorded real logs (benchmarks/throughput_vs_mtail.py), its requests
spread over 64 slots and over many conversations: copy k of a two-slot recording runs on slots
2k mod 64 and 2k+1 mod 64, and its conversation ids carry k. The freshness lines are recorded
cache-state lines with their prompt count changed (invented values, real format).

    .venv/bin/python benchmarks/live_exporter.py [--lines N] [--probes K]
"""

from __future__ import annotations

import argparse
import re
import statistics
import subprocess
import sys
import tempfile
import time
from functools import partial
from pathlib import Path

import httpx

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "tests"))
sys.path.insert(0, str(HERE))
from procfs import rss_mib  # noqa: E402
from promql import Prometheus  # noqa: E402
from realserver import ExporterProcess, free_port  # noqa: E402
from throughput_vs_mtail import _TS, _stamp, _us, build_log  # noqa: E402

SLOTS = 64
_SLOT_ID = re.compile(r"(: id +)(\d+)( \|)")
_CONV = re.compile(r"conv_id=([^ ]+)")
_TASK = re.compile(r"\| task (\d+) \|")


def _shift_slot(base: int, mt: re.Match[str]) -> str:
    return f"{mt.group(1)}{base + int(mt.group(2))}{mt.group(3)}"


def _conv_copy(copy: int, mt: re.Match[str]) -> str:
    return f"conv_id={mt.group(1)}-{copy}"


def spread(src: Path, dst: Path) -> int:
    """Slots 0 and 1 of each copy (a new copy starts where task ids jump) moved to 2k, 2k+1."""
    copy, last_task, n = 0, -1, 0
    with open(src) as fin, open(dst, "w") as out:
        for line in fin:
            line = line.replace("n_slots = 2,", f"n_slots = {SLOTS},")
            m = _TASK.search(line)
            if m:
                task = int(m.group(1))
                if task > last_task + 1000:
                    copy += 1
                last_task = max(last_task, task)
            base = (2 * copy) % SLOTS
            line = _SLOT_ID.sub(partial(_shift_slot, base), line)
            line = _CONV.sub(partial(_conv_copy, copy), line)
            out.write(line)
            n += 1
    return n


def lines_done(exp: ExporterProcess) -> int:
    return sum(
        int(float(line.rsplit(" ", 1)[1]))
        for line in exp.metrics_text().splitlines()
        if line.startswith("llamacpp_exporter_log_lines_total{")
    )


def pct(values: list[float], q: float) -> float:
    return sorted(values)[min(len(values) - 1, int(q * len(values)))]


def prometheus_version() -> str:
    out = subprocess.run(["prometheus", "--version"], capture_output=True, text=True).stdout
    m = re.search(r"version (\S+)", out)
    return m.group(1) if m else "(unknown version)"


def prometheus_scrapes(target_url: str, workdir: Path, n: int) -> list[float]:
    """n scrapes of the exporter by a real Prometheus (every 0.5 s), in milliseconds as
    Prometheus timed them."""
    host = target_url.split("://", 1)[1]
    config = {
        "global": {"scrape_interval": "500ms", "scrape_timeout": "500ms"},
        "scrape_configs": [{"job_name": "exporter", "static_configs": [{"targets": [host]}]}],
    }
    prom = Prometheus(workdir, config)
    try:
        prom.wait_scraped(1)
        deadline = time.monotonic() + n * 0.5 + 60
        while True:
            r = prom.query(f"count_over_time(scrape_duration_seconds{{job='exporter'}}[{n * 2}s])")["data"]["result"]
            if r and int(float(r[0]["value"][1])) >= n or time.monotonic() > deadline:
                break
            time.sleep(2)
        r = prom.query(f"scrape_duration_seconds{{job='exporter'}}[{n * 2}s]")["data"]["result"]
        return [float(v) * 1000 for _, v in r[0]["values"]][-n:]
    finally:
        prom.stop()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--lines", type=int, default=10_000_000)
    ap.add_argument("--probes", type=int, default=200)
    args = ap.parse_args()
    state_line = next(
        ln
        for ln in (HERE.parent / "tests/fixtures/logs/lv4-np2-text.log").read_text().splitlines()
        if "cache state:" in ln
    )
    with tempfile.TemporaryDirectory() as tmp:
        d = Path(tmp)
        built = d / "built.log"
        build_log(built, args.lines)
        log = d / "llama-server.log"
        n = spread(built, log)
        exp = ExporterProcess(
            ["--llama.url", f"http://127.0.0.1:{free_port()}", "--llama.log-path", str(log)]
            + ["--llama.log-from-start", "--no-llama.slots", "--events.path", str(d / "events.jsonl")],
            d / "exporter",
        ).start()
        assert exp.proc is not None
        try:
            t0 = time.monotonic()
            rss = []
            while (done := lines_done(exp)) < n:
                rss.append((done, rss_mib(exp.proc.pid) or float("nan")))
                time.sleep(0.5)
            print(f"log: {n} lines over {SLOTS} slots, read in {time.monotonic() - t0:.1f} s by the live exporter")
            warm = [r for done, r in rss if done >= n // 10]
            print(
                f"memory: RSS {rss_mib(exp.proc.pid) or float('nan'):.0f} MiB after the log; after the first tenth it went from "
                f"{warm[0] if warm else float('nan'):.0f} to {max(warm) if warm else float('nan'):.0f} MiB"
            )
            step = max(1, n // 10)
            marks = [next((r for done, r in rss if done >= k * step), rss[-1][1]) for k in range(1, 11)] if rss else []
            print("memory: RSS (MiB) at each tenth of the log: " + ", ".join(f"{r:.0f}" for r in marks))
            # scrape cost, everything populated
            times = []
            with httpx.Client() as c:
                for _ in range(args.probes):
                    t = time.perf_counter()
                    body = c.get(exp.url + "/metrics").text
                    times.append((time.perf_counter() - t) * 1000)
            series = sum(1 for ln in body.splitlines() if ln and not ln.startswith("#"))
            slots = len(set(re.findall(r'llamacpp_decode_prefill_overlap_seconds_total\{[^}]*slot="(\d+)"', body)))
            convs = len(set(re.findall(r'conversation="([^"]+)"', body)))
            print(
                f"scrape: {series} series ({slots} slots, {convs} conversations named), {len(body) / 1024:.0f} KiB; "
                f"text format (httpx, gzip): p50 {statistics.median(times):.1f} ms, p99 {pct(times, 0.99):.1f} ms"
            )
            # the same, as a real Prometheus scrapes it (OpenMetrics, for the exemplars; gzip),
            # timed by Prometheus itself: its scrape_duration_seconds of each scrape
            durations = prometheus_scrapes(exp.url, d / "prometheus", args.probes)
            print(
                f"scrape: as Prometheus {prometheus_version()} scrapes it, its own scrape_duration_seconds over "
                f"{len(durations)} scrapes: p50 {statistics.median(durations):.1f} ms, p99 {pct(durations, 0.99):.1f} ms"
            )
            # freshness: one line at a time, until /metrics shows it; stamped after the log's
            # last line (a line from the past is held as a possible restart)
            last = max(_us(m) for ln in open(log) if (m := _TS.match(ln)))
            stamp = _TS.match(state_line)
            assert stamp is not None
            state_msg = state_line[stamp.end() :]
            lat = []
            with httpx.Client() as c, open(log, "a") as fh:
                for i in range(args.probes):
                    value = 100 + i % 2  # alternate, so that each probe changes the value
                    msg = re.sub(r"cache state: \d+ prompts", f"cache state: {value} prompts", state_msg)
                    line = _stamp(last + (i + 1) * 1_000_000) + msg
                    want = f'llamacpp_prompt_cache_entries{{model=""}} {float(value)}'
                    t = time.perf_counter()
                    fh.write(line + "\n")
                    fh.flush()
                    deadline = t + 30
                    while want not in c.get(exp.url + "/metrics").text:
                        if time.perf_counter() > deadline:
                            raise SystemExit(f"line {i} did not show in /metrics within 30 s")
                    lat.append((time.perf_counter() - t) * 1000)
            print(
                f"freshness: log line to /metrics, {len(lat)} probes: p50 {statistics.median(lat):.1f} ms, "
                f"p99 {pct(lat, 0.99):.1f} ms (each probe includes /metrics scrapes of the populated registry)"
            )
        finally:
            exp.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
