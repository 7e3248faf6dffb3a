"""Headroom against the fastest llama-server here: how fast a real llama-server writes its log at
its fastest, and how much faster the live exporter reads such a log.

1. A real llama-server at -lv 4 (the tiny model, 4 slots, the LoRA adapter loaded, RAM cache on)
   gets short requests back to back from 8 clients (a short prompt, 4 tokens): the log's lines
   and the requests per second, and the exporter's CPU while it follows that log live.
2. That log, its requests repeated to half a million lines (timestamps and task ids shifted, as
   benchmarks/throughput_vs_mtail.py builds its log), read from the start by a fresh live
   exporter (following a file, as users run it): its lines per second. The headroom is (2)
   over (1).

    .venv/bin/python benchmarks/server_log_rate.py [--seconds 30] [--clients 8] [--slots 4]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "tests"))
sys.path.insert(0, str(HERE))
from realserver import ExporterProcess, LlamaServer, free_port, llama_server_binary, model_files  # noqa: E402
from throughput_vs_mtail import build_log  # noqa: E402

TICK = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK


def lines(path: Path) -> int:
    with open(path, "rb") as fh:
        return sum(chunk.count(b"\n") for chunk in iter(lambda: fh.read(1 << 20), b""))


def hammer(url: str, seconds: float, clients: int) -> int:
    """Short requests back to back from `clients` threads for `seconds`; completed requests."""
    done = [0] * clients
    stop = time.monotonic() + seconds

    def client(i: int) -> None:
        with httpx.Client(timeout=60) as c:
            k = 0
            while time.monotonic() < stop:
                k += 1
                r = c.post(
                    url + "/completion",
                    json={"prompt": f"Client {i} asks question {k}: what is {k} plus {i}?", "n_predict": 4},
                )
                r.raise_for_status()
                done[i] += 1

    threads = [threading.Thread(target=client, args=(i,)) for i in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return sum(done)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=30.0)
    ap.add_argument("--clients", type=int, default=8)
    ap.add_argument("--slots", type=int, default=4)
    ap.add_argument("--replay-lines", type=int, default=500_000)
    args = ap.parse_args()
    model, lora = model_files()
    with tempfile.TemporaryDirectory() as tmp:
        d = Path(tmp)
        server = LlamaServer(llama_server_binary(), model, lora, d / "server", n_parallel=args.slots).start()
        try:
            exp = ExporterProcess(
                ["--llama.url", server.url, "--llama.log-path", str(server.log_path)], d / "exporter"
            ).start()
            try:
                exp.wait_following()
                assert exp.proc is not None
                n0, e0 = lines(server.log_path), cpu_seconds(exp.proc.pid)
                t0 = time.monotonic()
                requests = hammer(server.url, args.seconds, args.clients)
                wall = time.monotonic() - t0
                n1 = lines(server.log_path)
                exp.wait_lines_processed(n1 - n0)
                exporter_cpu = cpu_seconds(exp.proc.pid) - e0
            finally:
                exp.stop()
        finally:
            server.stop()
        server_lines = (n1 - n0) / wall
        print(
            f"llama-server at its fastest ({args.slots} slots, {args.clients} clients, -lv 4, short requests of "
            f"4 tokens): {requests / wall:.1f} requests/s, {server_lines:.0f} log lines/s "
            f"({(n1 - n0) / max(requests, 1):.0f} lines a request) over {wall:.0f} s"
        )
        print(
            f"live exporter following it: {exporter_cpu:.2f} CPU s in {wall:.0f} s "
            f"({100 * exporter_cpu / wall:.1f}% of one core)"
        )
        # the same kind of log from the start, as fast as the exporter can read it
        long_log = d / "repeated.log"
        total = build_log(long_log, args.replay_lines, [server.log_path])
        best = 0.0
        for run in range(3):
            exp = ExporterProcess(
                ["--llama.url", f"http://127.0.0.1:{free_port()}", "--llama.log-path", str(long_log)]
                + ["--llama.log-from-start", "--no-llama.slots"],
                d / f"replay-{run}",
            ).start()
            try:
                t = time.monotonic()
                exp.wait_lines_processed(total, timeout=600)
                best = max(best, total / (time.monotonic() - t))
            finally:
                exp.stop()
        print(f"live exporter reading {total} lines of it from the start: {best:.0f} lines/s (best of 3)")
        per_request = (n1 - n0) / max(requests, 1)
        print(
            f"headroom: {best / server_lines:.1f}x the log rate of the fastest server here; at {per_request:.0f} "
            f"lines a request the exporter keeps up with {best / per_request:.0f} such requests/s"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
