"""A real OTLP/HTTP receiver for the tests: oteltap (PyPI), in its own process, printing every
span it receives as a JSON line (the OTLP JSON mapping: hex ids, nanosecond strings, typed
attribute values)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from realserver import STARTED, free_port, terminate, wait_for


def attributes(items: list[dict[str, Any]]) -> dict[str, Any]:
    """OTLP JSON key/value pairs as a dict of plain values."""
    out: dict[str, Any] = {}
    for kv in items:
        (kind, value), *_ = kv["value"].items()
        out[kv["key"]] = int(value) if kind == "intValue" else value
    return out


@dataclass
class ReceivedSpan:
    trace_id: str
    span_id: str
    parent_id: str
    name: str
    start_ns: int
    end_ns: int
    attributes: dict[str, Any]
    events: list[tuple[str, dict[str, Any]]]
    links: list[tuple[str, str, dict[str, Any]]]  # (trace id, span id, attributes)
    server: bool
    raw: str = field(repr=False)

    @property
    def seconds(self) -> float:
        return (self.end_ns - self.start_ns) / 1e9


class OtlpReceiver:
    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.port = 0
        self.proc: subprocess.Popen[Any] | None = None

    @property
    def out_path(self) -> Path:
        return self.workdir / "oteltap.ndjson"

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> OtlpReceiver:
        self.port = self.port or free_port()
        self.workdir.mkdir(parents=True, exist_ok=True)
        out = open(self.out_path, "ab")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "oteltap", "--port", str(self.port)],
            stdout=out,
            stderr=out,
            stdin=subprocess.DEVNULL,
        )
        STARTED.append(self.proc)
        out.close()
        wait_for(lambda: "Listening" in self.out_path.read_text(errors="replace"), "oteltap listening", 20, 0.05)
        return self

    def pause(self) -> None:
        """A slow collector: its port still accepts connections (the kernel's backlog), it answers none."""
        assert self.proc is not None
        os.kill(self.proc.pid, signal.SIGSTOP)

    def resume(self) -> None:
        assert self.proc is not None
        os.kill(self.proc.pid, signal.SIGCONT)

    def stop(self) -> None:
        if self.proc is not None:
            self.resume()
        terminate(self.proc)
        self.proc = None

    def text(self) -> str:
        return self.out_path.read_text(errors="replace") if self.out_path.exists() else ""

    def spans(self) -> list[ReceivedSpan]:
        out = []
        for line in self.text().splitlines():
            if not line.startswith("{"):
                continue
            s = json.loads(line)
            if "traceId" not in s:
                continue
            out.append(
                ReceivedSpan(
                    s["traceId"],
                    s["spanId"],
                    s.get("parentSpanId", ""),
                    s["name"],
                    int(s["startTimeUnixNano"]),
                    int(s["endTimeUnixNano"]),
                    attributes(s.get("attributes", [])),
                    [(e["name"], attributes(e.get("attributes", []))) for e in s.get("events", [])],
                    [(k["traceId"], k["spanId"], attributes(k.get("attributes", []))) for k in s.get("links", [])],
                    s.get("kind") == 2,
                    line,
                )
            )
        return out

    def roots(self) -> list[ReceivedSpan]:
        return [s for s in self.spans() if s.server]

    def wait_roots(self, n: int, timeout: float = 30.0) -> list[ReceivedSpan]:
        return wait_for(lambda: r if len(r := self.roots()) >= n else [], f"{n} traces at oteltap", timeout, 0.1)
