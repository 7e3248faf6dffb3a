"""The exporter live on a real llama-server with many slots (issue 55), as users run it.

llama-server b11434 (the tiny model at a GPU's speed with its adapter, `-np 64` by default,
`--cache-ram 256`, `-lv 4`, its console output to a file) gets the workload of
benchmarks/many_slots.py: 3 conversations a slot with X-Conversation-Id, a third with the adapter,
a third with it explicitly off, a third with no list, and clients that give up. The exporter runs
as its own process, as users start it (following the log, polling the server at its default
interval, an events file), pure Python or, with --compiled, the package `pip install .` builds
with a C compiler. Every 0.2 s: the lines written to the log, the lines the exporter has
processed (its own counter), its CPU time and RSS. Printed:

- lines per second written, and the exporter's CPU as a share of one core over the workload;
- its lag behind the log: for each sample, how long until the exporter had processed every line
  written by then (p50, p99, max; 0.2 s resolution);
- its RSS at the start, after the first tenth of the run (warm-up), at its highest and at the end;
- every answered request's record (from the events file) against its response: prompt, reused
  and generated tokens exact, its LoRA state as the server ran it (a request with no list runs
  with the global scale 1.0), its conversation named right, uncertain or wrong.

    .venv/bin/python benchmarks/many_slots_live.py [--slots 64] [--compiled]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import httpx

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "tests"))
sys.path.insert(0, str(HERE.parent / "tests" / "setup"))
from many_slots import server_for, workload  # noqa: E402
from realserver import ExporterProcess, wait_for  # noqa: E402

from llamacpp_exporter.assemble.pseudonyms import Pseudonymizer  # noqa: E402
from llamacpp_exporter.offline.analyze import read_events  # noqa: E402

TICK = os.sysconf("SC_CLK_TCK")
PAGE = os.sysconf("SC_PAGE_SIZE")
SAMPLE_SECONDS = 0.2


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK


def rss_mib(pid: int) -> float:
    return int(Path(f"/proc/{pid}/statm").read_text().split()[1]) * PAGE / 2**20


class Sampler(threading.Thread):
    """Every SAMPLE_SECONDS: (time, lines written, lines processed, exporter CPU s, RSS MiB)."""

    def __init__(self, log: Path, exporter: ExporterProcess) -> None:
        super().__init__(daemon=True)
        self.log, self.exporter = log, exporter
        self.samples: list[tuple[float, int, int, float, float]] = []
        self.stop = threading.Event()
        self._offset = self._lines = 0

    def _written(self) -> int:
        with open(self.log, "rb") as fh:
            fh.seek(self._offset)
            data = fh.read()
        end = data.rfind(b"\n") + 1  # whole lines only
        self._lines += data.count(b"\n", 0, end)
        self._offset += end
        return self._lines

    def run(self) -> None:
        assert self.exporter.proc is not None
        pid = self.exporter.proc.pid
        while not self.stop.wait(SAMPLE_SECONDS):
            t = time.monotonic()
            written = self._written()
            try:
                processed = self.exporter.lines_processed()
            except httpx.HTTPError:
                continue
            self.samples.append((t, written, processed, cpu_seconds(pid), rss_mib(pid)))


def lags(samples: list[tuple[float, int, int, float, float]]) -> list[float]:
    """For each sample: the time until a later sample shows every line written by then processed."""
    out = []
    j = 0
    for i, (t, written, *_) in enumerate(samples):
        j = max(j, i)
        while j < len(samples) and samples[j][2] < written:
            j += 1
        if j < len(samples):
            out.append(samples[j][0] - t)
    return out


def pct(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))] if values else float("nan")


def check(events: Path, truths: list[dict[str, Any]], ps: Pseudonymizer) -> dict[str, int]:
    recs, _ = read_events([str(events)])
    c = dict.fromkeys(("exact", "not exact", "no record", "two records", "lora right", "lora unknown", "lora wrong"), 0)
    c.update(dict.fromkeys(("named right", "uncertain", "named wrong"), 0))
    for t in truths:
        cands = [
            r
            for r in recs
            if r.prefill_seconds is not None
            and r.decode_seconds is not None
            and abs(r.prefill_seconds * 1000 - t["prompt_ms"]) <= 0.0051
            and abs(r.decode_seconds * 1000 - t["predicted_ms"]) <= 0.0051
            and r.generated_tokens == t["predicted_n"]
        ]
        if len(cands) != 1:
            c["no record" if not cands else "two records"] += 1  # two: same times and tokens, by chance
            continue
        r = cands[0]
        exact = (r.prompt_tokens, r.reused_tokens) == (t["cache_n"] + t["prompt_n"], t["cache_n"])
        c["exact" if exact else "not exact"] += 1
        c["lora unknown" if r.lora == "unknown" else "lora right" if r.lora == t["lora"] else "lora wrong"] += 1
        if r.conversation_source == "uncertain":
            c["uncertain"] += 1
        elif r.conversation == ps("id:" + t["conv"]) and r.conversation_source == "header":
            c["named right"] += 1
        else:
            c["named wrong"] += 1
    return c


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--slots", type=int, default=64)
    ap.add_argument("--compiled", action="store_true", help="the exporter compiled, as `pip install .` builds it")
    ap.add_argument("--seed", type=int, default=56)
    args = ap.parse_args()
    env = dict(os.environ)
    if args.compiled:
        from build_compiled import installed_package

        env["PYTHONPATH"] = str(installed_package(compiler=True))
    salt = "many-slots-live"
    env["LLAMACPP_EXPORTER_SALT"] = salt  # the records' pseudonyms, checked against the responses' ids
    with tempfile.TemporaryDirectory() as tmp:
        d = Path(tmp)
        server = server_for(args.slots, d / "server").start(timeout=120)
        exporter = None
        try:
            exporter = ExporterProcess(
                [
                    "--llama.url",
                    server.url,
                    "--llama.log-path",
                    str(server.log_path),
                    "--llama.log-from-start",
                    "--events.path",
                    str(d / "events.jsonl"),
                ],
                d / "exporter",
                env=env,
            ).start()
            exporter.wait_polled()
            sampler = Sampler(server.log_path, exporter)
            sampler.start()
            t0 = time.monotonic()
            truths, gave_up = workload(server.url, args.slots, args.seed, threading.Event())
            took = time.monotonic() - t0
            # until the exporter has processed every line written
            written = sampler._written()
            wait_for(
                lambda: exporter is not None and exporter.lines_processed() >= written, "the exporter catching up", 300
            )
            time.sleep(2 * SAMPLE_SECONDS)
            sampler.stop.set()
            sampler.join()
            wait_for(
                lambda: len(read_events([str(d / "events.jsonl")])[0]) >= len(truths),
                "the records in the events file",
                60,
            )
            # the last records (a record waits for the join up to its deadline) and late proofs
            last, still = -1, 0
            while still < 3:
                time.sleep(2.0)
                n = len(read_events([str(d / "events.jsonl")])[0])
                still, last = (still + 1, last) if n == last else (0, n)
            counts = check(d / "events.jsonl", truths, Pseudonymizer(salt))
            if counts["no record"] or counts["not exact"]:  # kept to be read again (analyze)
                keep = Path.home() / ".cache" / "llamacpp-exporter" / "many-slots-live"
                keep.mkdir(parents=True, exist_ok=True)
                shutil.copy(server.log_path, keep / f"np{args.slots}.log")
                shutil.copy(d / "events.jsonl", keep / f"np{args.slots}.events.jsonl")
                (keep / f"np{args.slots}.truth.jsonl").write_text("".join(json.dumps(t) + "\n" for t in truths))
                print(f"kept the log, the events and the responses in {keep}")
            # what this benchmark's own scrapes cost the exporter (Prometheus scrapes every 15 s,
            # not 5 times a second): the CPU of 50 scrapes of the idle exporter, one each
            assert exporter.proc is not None
            before = cpu_seconds(exporter.proc.pid)
            for _ in range(50):
                exporter.lines_processed()
            per_scrape = (cpu_seconds(exporter.proc.pid) - before) / 50
            errors = (exporter.stderr_path.read_text().count(" ERROR "),)
        finally:
            if exporter is not None:
                exporter.stop()
            server.stop()
    s = sampler.samples
    during = [x for x in s if x[0] <= t0 + took]
    lines = during[-1][1] - during[0][1]
    span = during[-1][0] - during[0][0]
    cpu = during[-1][3] - during[0][3]
    rss = [x[4] for x in s]
    warm = rss[max(0, len(rss) // 10)]
    lag = lags(s)
    print(f"exporter: {'compiled' if args.compiled else 'pure Python'}; llama-server -np {args.slots}")
    print(
        f"workload: {3 * args.slots} conversations, {len(truths)} answered, {gave_up} gave up, {took:.0f} s; "
        f"log: {s[-1][1]:,} lines, {lines / span:,.0f} lines/s written while the workload ran"
    )
    own = cpu - per_scrape * len(during)
    print(
        f"exporter CPU: {100 * own / span:.1f}% of a core ({1e6 * own / max(1, lines):.1f} us a line), less the "
        f"{len(during)} scrapes of this benchmark ({1000 * per_scrape:.1f} ms each); with them {100 * cpu / span:.1f}%"
    )
    print(f"lag behind the log: p50 {statistics.median(lag):.2f} s, p99 {pct(lag, 0.99):.2f} s, max {max(lag):.2f} s")
    print(f"RSS MiB: start {rss[0]:.1f}, after warm-up {warm:.1f}, highest {max(rss):.1f}, end {rss[-1]:.1f}")
    print("records against the responses: " + json.dumps(counts) + f"; exporter log errors: {errors[0]}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
