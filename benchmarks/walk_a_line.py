"""The way a log line takes to a request metric, as the code runs it: the call stack at the
moment the first request record reaches `RequestMetrics.record`, from the pipeline's entry
(`process_lines`, a batch of the live reader's) down. Prints each stop (file and function),
then the stops, the files and the climbs back (a stop in a file the walk had already left).

Run on the pure source of the tree it stands in, on a recorded log:
    .venv/bin/python benchmarks/walk_a_line.py [LOG]
"""

from __future__ import annotations

import sys
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "exporter"))

from prometheus_client import CollectorRegistry  # noqa: E402

import llamacpp_exporter  # noqa: E402
from llamacpp_exporter.export import metrics  # noqa: E402
from llamacpp_exporter.pipeline import Pipeline  # noqa: E402

PACKAGE = Path(llamacpp_exporter.__file__).resolve().parent


def main() -> int:
    log = Path(sys.argv[1]) if len(sys.argv) > 1 else ROOT / "tests" / "fixtures" / "logs" / "lv4-np2-text.log"
    walks: list[list[traceback.FrameSummary]] = []
    record = metrics.RequestMetrics.record

    def traced(self: metrics.RequestMetrics, rec: object) -> None:
        if not walks:
            walks.append(traceback.extract_stack()[:-1])
        record(self, rec)  # type: ignore[arg-type]

    metrics.RequestMetrics.record = traced  # type: ignore[method-assign]
    pl = Pipeline(CollectorRegistry(), clock=lambda: 0.0)
    lines = log.read_text().splitlines()
    for i in range(0, len(lines), 512):
        pl.process_lines(lines[i : i + 512], 0.0)
        if walks:
            break
    pl.flush()
    frames = [f for f in walks[0] if Path(f.filename).resolve().is_relative_to(PACKAGE)]
    first = next(i for i, f in enumerate(frames) if f.name == "process_lines")
    stops = [(str(Path(f.filename).resolve().relative_to(PACKAGE)), f.name) for f in frames[first:]]
    stops.append(("export/metrics.py", "RequestMetrics.record"))
    seen: list[str] = []
    climbs = 0
    for file, name in stops:
        if seen and file != seen[-1] and file in seen:
            climbs += 1
            mark = "  (back)"
        else:
            mark = ""
        if not seen or seen[-1] != file:
            seen.append(file)
        print(f"  {file}: {name}{mark}")
    print(f"{len(stops)} stops, {len(set(seen))} files, {climbs} climbs back")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
