"""The exporter's metrics over a log's history, for `analyze --openmetrics`: sampled every step
of server log time while the log is replayed, then written as OpenMetrics text with timestamps,
which `promtool tsdb create-blocks-from openmetrics` turns into Prometheus blocks.

A log's timestamps count from the server's start; the modification time of the file holding a
run's last line is that line's wall-clock time. A run that another run follows in the same file
has no such anchor: its samples are not written (and counted), never placed by a guess.
"""

from __future__ import annotations

import math
from array import array
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import IO

from prometheus_client import CollectorRegistry
from prometheus_client.core import Metric
from prometheus_client.openmetrics.exposition import generate_latest as openmetrics_latest
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

# live-only: the conversation figures are windows over the last minutes of wall-clock time
NOT_BACKFILLED = ("llamacpp_conversation_",)


@dataclass
class Written:
    samples: int = 0
    runs_without_time: set[int] = field(default_factory=set)
    samples_without_time: int = 0
    samples_out_of_order: int = 0


class History:
    """Every series of a registry, sampled at each step of log time (and at the end of each
    file and server run). Values are kept as arrays of doubles: 8 bytes a series a step."""

    def __init__(self, registry: CollectorRegistry, step_seconds: float) -> None:
        self.registry = registry
        self.step_us = max(1, int(step_seconds * 1_000_000))
        self.points: list[tuple[int, int]] = []  # (server run, log time in us) of each sample
        self.families: dict[str, tuple[str, str, str]] = {}  # name -> (type, help, unit)
        self.series: dict[tuple[str, str, tuple[tuple[str, str], ...]], int] = {}
        self.values: list[array[float]] = []
        self._epoch: int | None = None
        self._next_us = 0

    def at(self, epoch: int, now_us: int) -> None:
        """Called for every line while the log is read: samples when a step has passed."""
        if epoch != self._epoch or now_us >= self._next_us:
            self.sample(epoch, now_us)

    def sample(self, epoch: int, now_us: int, final: bool = False) -> None:
        """One sample of every series. final: at the end of a file or of the log, after the
        records still waiting were emitted; it replaces a sample taken at the same time."""
        if self.points and self.points[-1] == (epoch, now_us):
            if not final:
                return
            self.points.pop()
            for arr in self.values:
                del arr[len(self.points) :]
        self._epoch = epoch
        self._next_us = (now_us // self.step_us + 1) * self.step_us
        k = len(self.points)
        self.points.append((epoch, now_us))
        nan = math.nan
        for fam in self.registry.collect():
            if fam.name.startswith(NOT_BACKFILLED):
                continue
            self.families.setdefault(fam.name, (fam.type, fam.documentation, fam.unit))
            for s in fam.samples:
                if s.name.endswith("_created"):  # the exporter serves none either
                    continue
                key = (fam.name, s.name, tuple(sorted(s.labels.items())))
                i = self.series.get(key)
                if i is None:
                    i = self.series[key] = len(self.values)
                    self.values.append(array("d"))
                arr = self.values[i]
                if len(arr) < k:
                    arr.extend([nan] * (k - len(arr)))
                arr.append(s.value)

    def write_openmetrics(
        self, out: IO[str], wall_time: Callable[[int, int], float | None], labels: dict[str, str]
    ) -> Written:
        """OpenMetrics text: each family once, each label set's points in time order (a
        histogram's buckets, count and sum together at each time), `# EOF` at the end.
        wall_time(run, log_us) gives a sample's Unix time, or None when the run has none."""
        w = Written()
        times: list[float | None] = []
        for epoch, us in self.points:
            t = wall_time(epoch, us)
            times.append(t)
            if t is None:
                w.runs_without_time.add(epoch)
        by_family: dict[str, dict[tuple[tuple[str, str], ...], list[tuple[str, dict[str, str], int]]]] = {}
        for (fam, name, lbls), i in self.series.items():
            point = tuple((k, v) for k, v in lbls if k != "le")
            by_family.setdefault(fam, {}).setdefault(point, []).append((name, dict(lbls), i))
        for fam, groups in by_family.items():
            typ, doc, unit = self.families[fam]
            out.write(_header(fam, typ, doc, unit))
            for members in groups.values():
                series = [(name, _labels({**labels, **lb}), self.values[i]) for name, lb, i in members]
                last = -math.inf
                for k, t in enumerate(times):
                    present = [(n, lb, arr[k]) for n, lb, arr in series if k < len(arr) and not math.isnan(arr[k])]
                    if not present:
                        continue
                    if t is None:
                        w.samples_without_time += len(present)
                        continue
                    if t <= last:  # two runs' anchors overlap: keep time increasing
                        w.samples_out_of_order += len(present)
                        continue
                    last = t
                    stamp = f"{t:.3f}"
                    for n, lb, v in present:
                        out.write(f"{n}{lb} {floatToGoString(v)} {stamp}\n")
                        w.samples += 1
        out.write("# EOF\n")
        return w


def _escape(value: str) -> str:
    """A label value as the exposition formats write it: backslash, newline, double quote."""
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _labels(lbls: dict[str, str]) -> str:
    if not lbls:
        return ""
    return "{" + ",".join(f'{k}="{_escape(v)}"' for k, v in sorted(lbls.items())) + "}"


class _One(Collector):
    def __init__(self, metric: Metric) -> None:
        self.metric = metric

    def collect(self) -> Iterator[Metric]:
        yield self.metric


def _header(name: str, typ: str, doc: str, unit: str) -> str:
    """# HELP, # TYPE (and # UNIT) of a family, as prometheus_client writes them."""
    reg = CollectorRegistry(auto_describe=False)
    reg.register(_One(Metric(name, doc, typ, unit)))
    text: str = openmetrics_latest(reg).decode()
    return text[: -len("# EOF\n")] if text.endswith("# EOF\n") else text
