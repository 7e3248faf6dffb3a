"""What the benchmarks read of a process from /proc."""

from __future__ import annotations

from pathlib import Path


def rss_mib(pid: int) -> float | None:
    """The process's resident memory in MiB; None once it is gone."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return None
