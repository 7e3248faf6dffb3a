"""What the exporter costs the llama-server it watches: the same real workload with and without
it, alternating, on a real llama-server (2 slots, -lv 4, --metrics) with the exporter at its
defaults (following the log, polling /slots at each task and /metrics, /health).

Each run starts a fresh server (same cache state) and sends the same concurrent LoRA chat
workload (tests/workload.py, same seed within a pair). Prints, per pair and as median with
min-max: generation tokens per second (the responses' own predicted_n / predicted_ms), mean
request latency, and the exporter's CPU seconds as a share of the server's.

    .venv/bin/python benchmarks/server_overhead.py [--pairs 3]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "tests"))
from realserver import ExporterProcess, LlamaServer, llama_server_binary, model_files  # noqa: E402
from workload import chat_workload  # noqa: E402

TICK = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK  # utime + stime, all threads


def one_run(work: Path, seed: int, with_exporter: bool) -> dict[str, float]:
    binary = llama_server_binary()
    model, lora = model_files()
    server = LlamaServer(binary, model, lora, work / "server", n_parallel=2).start()
    exp = None
    try:
        if with_exporter:
            exp = ExporterProcess(
                ["--llama.url", server.url, "--llama.log-path", str(server.log_path)], work / "exporter"
            ).start()
            exp.wait_following()
        assert server.proc is not None
        s0 = cpu_seconds(server.proc.pid)
        e0 = cpu_seconds(exp.proc.pid) if exp and exp.proc else 0.0
        t0 = time.monotonic()
        truths = chat_workload(server.url, n_convs=6, turns=4, seed=seed)
        wall = time.monotonic() - t0
        server_cpu = cpu_seconds(server.proc.pid) - s0
        exporter_cpu = (cpu_seconds(exp.proc.pid) - e0) if exp and exp.proc else 0.0
    finally:
        if exp is not None:
            exp.stop()
        server.stop()
    return {
        "tps": sum(t.predicted_n for t in truths) / sum(t.predicted_ms / 1000 for t in truths),
        "latency": statistics.mean(t.t_end - t.t_start for t in truths),
        "server_cpu": server_cpu,
        "exporter_cpu": exporter_cpu,
        "wall": wall,
        "requests": len(truths),
    }


def spread(values: list[float]) -> str:
    return f"{statistics.median(values):.3f} ({min(values):.3f}-{max(values):.3f})"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pairs", type=int, default=3)
    args = ap.parse_args()
    tps_ratio, lat_ratio, share = [], [], []
    with tempfile.TemporaryDirectory() as tmp:
        for pair in range(args.pairs):
            order = (True, False) if pair % 2 == 0 else (False, True)  # alternate who goes first
            runs = {w: one_run(Path(tmp) / f"{pair}-{w}", seed=11 + pair, with_exporter=w) for w in order}
            with_, without = runs[True], runs[False]
            tps_ratio.append(with_["tps"] / without["tps"])
            lat_ratio.append(with_["latency"] / without["latency"])
            share.append(with_["exporter_cpu"] / with_["server_cpu"])
            print(
                f"pair {pair}: {with_['requests']} requests; tokens/s {with_['tps']:.1f} with, {without['tps']:.1f} "
                f"without; latency {with_['latency']:.2f} s with, {without['latency']:.2f} s without; exporter CPU "
                f"{with_['exporter_cpu']:.2f} s, server CPU {with_['server_cpu']:.1f} s"
            )
    print(f"generation tokens/s, with / without: {spread(tps_ratio)}")
    print(f"mean request latency, with / without: {spread(lat_ratio)}")
    print(f"exporter CPU / server CPU: {spread(share)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
