"""What sending each request's trace costs the hot path: a recorded real contention log (4 slots,
34 requests a copy) replayed through the pipeline in the live exporter's batches, with traces
off, then on, sent to a real OTLP receiver (oteltap, from PyPI) by the exporter's own sender
thread in the same process, as live. Prints the pipeline thread's CPU time per line (its own
cost: the queue append and the exemplar's trace id), the wall time (what the sender's thread
takes from it through the interpreter's lock) and the sender's cost per request. Not a pass/fail
test.

Usage: .venv/bin/python benchmarks/tracing_cost.py [COPIES]
"""

from __future__ import annotations

import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from prometheus_client import CollectorRegistry

from llamacpp_exporter.export.otlp import TraceExport, quiet_sdk_logs
from llamacpp_exporter.export.traces import RunOffsets
from llamacpp_exporter.pipeline import Pipeline
from llamacpp_exporter.records import RequestRecord

LOG = Path(__file__).resolve().parent.parent / "tests" / "fixtures" / "logs" / "b11434-lv4-np4-pileups.log"
BATCH = 512  # the live exporter's lines per queue item (app.LINE_BATCH)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def run(lines: list[str], traces: TraceExport | None) -> tuple[float, float, list[RequestRecord]]:
    """(pipeline thread CPU seconds, wall seconds, records) for the whole replay."""
    recs: list[RequestRecord] = []
    pl = Pipeline(
        CollectorRegistry(),
        on_record=recs.append,
        consumers=[traces] if traces is not None else [],
        run_offsets=traces.offsets if traces is not None else None,
    )
    cpu0, wall0 = time.thread_time(), time.perf_counter()
    for i in range(0, len(lines), BATCH):
        pl.process_lines(lines[i : i + BATCH])
    pl.flush()
    return time.thread_time() - cpu0, time.perf_counter() - wall0, recs


def main() -> None:
    copies = int(sys.argv[1]) if len(sys.argv) > 1 else 30
    lines = LOG.read_text(errors="replace").splitlines() * copies  # each copy is a new server run
    port = free_port()
    with tempfile.TemporaryDirectory() as tmp:
        out = open(Path(tmp) / "oteltap.ndjson", "wb")
        tap = subprocess.Popen([sys.executable, "-m", "oteltap", "--port", str(port)], stdout=out, stderr=out)
        try:
            deadline = time.monotonic() + 20
            while b"Listening" not in (Path(tmp) / "oteltap.ndjson").read_bytes():
                assert time.monotonic() < deadline and tap.poll() is None, "oteltap did not start"
                time.sleep(0.05)
            print(f"{LOG.name} x {copies}: {len(lines)} lines")
            run(lines[: len(lines) // copies], None)  # warm-up
            quiet_sdk_logs()
            url = f"http://127.0.0.1:{port}/v1/traces"
            off: list[tuple[float, float]] = []
            on: list[tuple[float, float]] = []
            for _ in range(3):  # alternately, the best of three each
                off_cpu, off_wall, recs = run(lines, None)
                off.append((off_cpu, off_wall))
                traces = TraceExport(url, 100_000, RunOffsets())
                traces.start()
                on_cpu, on_wall, _ = run(lines, traces)
                on.append((on_cpu, on_wall))
                t0 = time.perf_counter()
                traces.close(deadline_seconds=120)
                drain = time.perf_counter() - t0
                counts = traces.counts.counts
            # the sender's own work per request (spans, protobuf, HTTP), on this thread alone
            sender = TraceExport(url, 100_000, RunOffsets())
            batch = [(r, 0) for r in recs]
            t0 = time.perf_counter()
            for i in range(0, len(batch), 256):
                sender.send(batch[i : i + 256])
            send_seconds = time.perf_counter() - t0
            sender.close()
        finally:
            tap.terminate()
            tap.wait()
            out.close()
    per = 1e6 / len(lines)
    off_cpu, off_wall = min(c for c, _ in off), min(w for _, w in off)
    on_cpu, on_wall = min(c for c, _ in on), min(w for _, w in on)
    print(f"traces off: pipeline thread {off_cpu * per:6.1f} us CPU/line, {off_wall * per:6.1f} us wall/line")
    print(
        f"traces on:  pipeline thread {on_cpu * per:6.1f} us CPU/line, {on_wall * per:6.1f} us wall/line "
        f"({(on_cpu / off_cpu - 1) * 100:+.1f}% CPU, {(on_wall / off_wall - 1) * 100:+.1f}% wall), {len(recs)} records"
    )
    print(
        f"last round: sent {counts['sent']} traces, failed {counts['failed']}, dropped {counts['dropped']}; "
        f"the sender finished {drain:.2f} s after the last line"
    )
    print(f"the sender's own work: {send_seconds / len(recs) * 1e6:.0f} us per request (spans, protobuf, HTTP)")


if __name__ == "__main__":
    main()
