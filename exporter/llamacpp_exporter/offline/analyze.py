"""`llamacpp-exporter analyze`: the prompt-cache investigation from logs already on disk.

Reads llama-server logs (text or JSONL, several files, rotated and .gz ones, several server
runs) through the same pipeline the live exporter uses, and/or the exporter's own events file
(which carries the LoRA state a bare log lacks), and prints the report (report.py).
"""

from __future__ import annotations

import argparse
import gzip
import itertools
import json
import logging
import os
import re
import sqlite3
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from datetime import datetime
from functools import cached_property
from pathlib import Path
from typing import Any, TextIO

from prometheus_client import CollectorRegistry

from ..assemble.classify import outcome
from ..assemble.finish import AssemblySettings
from ..assemble.pseudonyms import Pseudonymizer
from ..config import (
    CacheConfig,
    ConfigError,
    ConversationsConfig,
    MetricsConfig,
    add_flags,
    check,
    flag_values,
    read_salt,
    redact,
    setting,
)
from ..export import otlp
from ..export.conversations import ConversationCosts
from ..export.events import events_files
from ..export.report_types import Report, Unknown
from ..pipeline import Pipeline
from ..records import ConversationProof, RecordKey, RequestRecord, record_from_event
from . import plots, report
from .history import History
from .store import RecordStore, StoredValues, write_jsonl

log = logging.getLogger("llamacpp_exporter.offline.analyze")
_ROTATED = re.compile(r"^(?P<base>.*?)(?:[.-](?P<n>\d+))?(?:\.gz)?$")
PROGRESS_BYTES = 64 << 20  # show progress on inputs larger than this
CHUNK_LINES = 8192  # lines read at a time (about a megabyte)


def rotation_order(paths: list[str]) -> list[str]:
    """Rotated files oldest first, for each base name in the order first given: x.log.3.gz,
    x.log.2, x.log.1, then x.log (logrotate numbers the oldest highest); with dateext,
    x.log-20261128, x.log-20261129, then x.log."""
    groups: dict[str, list[tuple[tuple[int, int], str]]] = {}
    for p in paths:
        m = _ROTATED.match(p)
        assert m is not None  # the pattern matches every string
        digits = m.group("n") or ""
        if not digits:
            key = (2, 0)  # the live file: newest
        elif len(digits) >= 8:
            key = (1, int(digits))  # a date: older first
        else:
            key = (0, -int(digits))  # a number: the highest is the oldest
        groups.setdefault(m.group("base"), []).append((key, p))
    return [p for g in groups.values() for _, p in sorted(g)]


def _why(e: BaseException) -> str:
    """A read error in words of our own: gzip's own message quotes the file's first bytes."""
    if isinstance(e, gzip.BadGzipFile):
        return "not a gzip file"
    if isinstance(e, EOFError):
        return "the compressed file ends early (cut short)"
    return e.strerror if isinstance(e, OSError) and e.strerror else type(e).__name__


def _open(path: str) -> TextIO:
    if path.endswith(".gz"):
        return gzip.open(path, "rt", encoding="utf-8", errors="replace", newline="\n")
    return open(path, encoding="utf-8", errors="replace", newline="\n")


@dataclass
class Inputs:
    logs: list[str] = field(default_factory=list)
    events: list[str] = field(default_factory=list)


@dataclass
class Analysis:
    store: RecordStore  # the records, on disk
    conversations: list[dict[str, Any]] | None  # the pipeline's costs, when a log was read
    sources: dict[str, Any]
    history: History | None = None
    file_ends: list[FileEnd] = field(default_factory=list)
    # seconds of other requests' decoding that prefills overlapped: (of named conversations, all)
    join_costs: tuple[float, float] | None = None

    @cached_property
    def records(self) -> list[RequestRecord]:
        """Every record in memory, in the order they were made (tests, small inputs, --plot)."""
        return list(self.store.records())

    def close(self) -> None:
        self.store.close()


class _Progress:
    """A progress line on standard error for large inputs, at most twice a second."""

    def __init__(self, total_bytes: int, enabled: bool) -> None:
        self.total = total_bytes
        self.enabled = enabled and total_bytes > PROGRESS_BYTES
        self.base = 0  # bytes of the files already read
        self._last = 0.0

    def show(self, position: int) -> None:
        if self.enabled and (now := time.monotonic()) - self._last > 0.5:
            self._last = now
            sys.stderr.write(
                f"\ranalyze: {100 * (self.base + position) / self.total:5.1f}% of {self.total >> 20} MiB read"
            )
            sys.stderr.flush()

    def file_done(self, size: int) -> None:
        self.base += size

    def close(self) -> None:
        if self.enabled:
            sys.stderr.write("\r" + " " * 60 + "\r")


@dataclass
class FileEnd:
    """Where a file ended: its last server run, that run's last log time (None without
    timestamps) and the file's modification time (the wall-clock time of its last line)."""

    epoch: int
    log_us: int | None
    mtime: float


@dataclass
class LogReading:
    pipeline: Pipeline  # its counters: lines read, unrecognized, restarts
    lines: int
    history: History | None  # the metrics over time, when a step was given
    file_ends: list[FileEnd]
    problems: list[str]  # files that could not be read to their end


def read_logs(
    paths: list[str],
    settings: AssemblySettings,
    pseudonymize: Pseudonymizer,
    store: RecordStore,
    progress: bool = False,
    history_step: float | None = None,
    buckets: MetricsConfig | None = None,
) -> LogReading:
    """Every file in turn through one pipeline (a rotated set is one stream; a server start
    inside it is a new run), each record into the store as it is made."""
    # log time only: a replay must not expire conversation costs by the wall clock
    pl = Pipeline(
        CollectorRegistry(),
        settings,
        buckets=buckets,  # the exporter's: a backfill continues its histograms with the same bounds
        on_record=store.add,
        on_proof=store.add_proof,
        clock=lambda: 0.0,
        pseudonymize=pseudonymize,
        # the whole log is one window: the clock stands still at 0 while it is read
        costs=ConversationCosts(window_seconds=3600.0, top_n=10, max_conversations=100_000, clock=lambda: 0.0),
    )
    sizes = {p: os.path.getsize(p) for p in paths}
    bar = _Progress(sum(sizes.values()), progress)
    history = History(pl.registry, history_step) if history_step else None
    a = pl.assembler
    ends = []
    n = 0
    problems: list[str] = []
    process = pl.process_line
    for path in paths:
        try:
            with _open(path) as fh:
                raw = getattr(fh.buffer, "fileobj", None) or fh.buffer  # a .gz file: its compressed bytes
                if history is None:
                    # in batches, the pipeline's own loop over them (compiled, setup.py): each line
                    # is processed as it is read, so a file that breaks off loses none before it
                    while True:
                        before = _lines_read(pl)
                        pl.process_lines((line.rstrip("\r\n") for line in itertools.islice(fh, CHUNK_LINES)), 0.0)
                        if _lines_read(pl) == before:
                            break
                        bar.show(raw.tell())
                else:  # the metrics over time are sampled at every line
                    for line in fh:
                        process(line.rstrip("\r\n"), 0.0)
                        n += 1
                        history.at(a.epoch, a.clock.now)
                        if n & 0xFFFF == 0:
                            bar.show(raw.tell())
        except (OSError, EOFError) as e:  # a truncated .gz, a file that is not gzip: keep what was read
            problems.append(f"{path}: {_why(e)}")
            log.warning("%s: read up to here, the rest is unreadable: %s", path, _why(e))
        ends.append(FileEnd(a.epoch, a.clock.last_ts, os.path.getmtime(path)))
        if history is not None:
            history.sample(a.epoch, a.clock.now, final=True)
        bar.file_done(sizes[path])
    pl.flush()
    if history is not None:
        history.sample(a.epoch, a.clock.now, final=True)
    bar.close()
    store.apply_proofs()
    return LogReading(pl, _lines_read(pl), history, ends, problems)


def join_costs(pl: Pipeline) -> tuple[float, float]:
    """The seconds of decoding that prefills overlapped, of named conversations and in all (those
    still waiting for a proof at the end of the log count as not named)."""
    by_source = pl.requests.contention.conversation_join_cost.values
    named = sum(v for (_, source), v in by_source.items() if source in ("header", "lineage"))
    pending = sum(sum(a.attribution.late_costs.values()) for a in pl.assemblers)
    return named, sum(by_source.values()) + pending


def _lines_read(pl: Pipeline) -> int:
    return sum(pl.metrics.line_counts().values())


def run_offsets_us(ends: list[FileEnd]) -> dict[int, int]:
    """Each datable run's log time 0 in Unix time (microseconds), anchored by the modification
    time of the last file in which the run ended (a run another run followed in the same file
    has none)."""
    return {e.epoch: round(e.mtime * 1e6) - e.log_us for e in ends if e.log_us is not None}


def wall_clock(ends: list[FileEnd]) -> Callable[[int, int], float | None]:
    """A run's log time to Unix time; None for a run that cannot be dated."""
    anchors = run_offsets_us(ends)

    def at(epoch: int, log_us: int) -> float | None:
        t0 = anchors.get(epoch)
        return None if t0 is None else (t0 + log_us) / 1e6

    return at


def apply_proofs(records: list[RequestRecord], proofs: dict[RecordKey, ConversationProof]) -> None:
    for i, r in enumerate(records):
        proof = proofs.get(r.key)
        if proof is not None and r.conversation_source == "uncertain":
            records[i] = replace(r, conversation=proof.conversation, conversation_source=proof.source)


def _events_lines(paths: list[str]) -> Iterator[RequestRecord | ConversationProof | None]:
    """Each line of the exporter's events files: a record, a proof (a conversation proven after
    its record was written), or None for a line that is neither
    (counted, never fatal; so is a file that cannot be read to its end)."""
    for path in paths:
        try:
            with _open(path) as fh:
                for line in fh:
                    try:
                        obj = json.loads(line)
                    except ValueError:
                        obj = None
                    if isinstance(obj, dict) and "proof" in obj:
                        yield ConversationProof.from_event(obj)
                    else:
                        yield record_from_event(obj)
        except (OSError, EOFError) as e:
            log.warning("%s: read up to here, the rest is unreadable: %s", path, _why(e))
            yield None


def read_events(paths: list[str]) -> tuple[list[RequestRecord], int]:
    """The exporter's events files in memory: one record per line, and the conversations proven
    after their record was written (applied to it), and how many lines were neither."""
    out: list[RequestRecord] = []
    proofs: dict[RecordKey, ConversationProof] = {}
    bad = 0
    for item in _events_lines(paths):
        if item is None:
            bad += 1
        elif isinstance(item, ConversationProof):
            proofs[item.key] = item
        else:
            out.append(item)
    apply_proofs(out, proofs)
    return out, bad


def _reclassified(e: RequestRecord, settings: AssemblySettings) -> RequestRecord:
    """An events record's cache outcome under this run's thresholds, not the recording exporter's."""
    if e.prompt_tokens is None or e.reused_tokens is None:
        return e
    verdict = outcome(
        e.prompt_tokens, e.reused_tokens, settings.min_prompt_tokens, settings.hit_ratio, settings.miss_ratio
    )
    return replace(e, outcome=verdict)


def _events_into(store: RecordStore, paths: list[str], settings: AssemblySettings, as_records: bool) -> tuple[int, int]:
    """The events files into the store: as the analysis's records (no log given), or as the
    records that stand for the log's of the same task. Returns (records, lines that were neither)."""
    n = bad = 0
    for item in _events_lines(paths):
        if item is None:
            bad += 1
        elif isinstance(item, ConversationProof):
            store.add_proof(item, events=True)
        else:
            n += 1
            rec = _reclassified(item, settings)
            store.add_as_is(rec) if as_records else store.add_event(rec)
    store.apply_event_proofs(to_records=as_records)
    return n, bad


def analyze(
    inputs: Inputs,
    settings: AssemblySettings | None = None,
    pseudonymize: Pseudonymizer | None = None,
    progress: bool = False,
    history_step: float | None = None,
    buckets: MetricsConfig | None = None,
) -> Analysis:
    settings = settings or AssemblySettings()
    pseudonymize = pseudonymize or Pseudonymizer()
    sources: dict[str, Any] = {"logs": len(inputs.logs), "events_files": len(inputs.events)}
    store = RecordStore()
    try:
        if inputs.events:
            n, bad = _events_into(store, inputs.events, settings, as_records=not inputs.logs)
            sources["events_records"] = n
            sources["events_lines_not_records"] = bad
        if not inputs.logs:
            return Analysis(store, None, sources)
        reading = read_logs(rotation_order(inputs.logs), settings, pseudonymize, store, progress, history_step, buckets)
    except BaseException:
        store.close()
        raise
    pl, lines = reading.pipeline, reading.lines
    counts = pl.metrics.line_counts()
    sources["log_lines"] = lines
    sources["log_lines_parsed"] = counts["parsed"]
    sources["log_lines_unrecognized"] = counts["unrecognized"]
    sources["log_lines_unreadable"] = counts["unreadable"]
    sources["server_restarts_seen"] = pl.metrics.restarts_seen
    if reading.problems:
        sources["files_not_read_to_the_end"] = reading.problems
    if inputs.events:
        sources["events_matched_to_log"] = store.matched_to_events
    return Analysis(store, pl.costs.snapshot(), sources, reading.history, reading.file_ends, join_costs(pl))


def dated(result: Analysis) -> list[tuple[float | None, RequestRecord]]:
    """Each record with the Unix time it started, None where its run cannot be dated (an
    events file alone, a run another run follows in the same file, a log without timestamps)."""
    clock = wall_clock(result.file_ends)
    return [(clock(r.epoch, r.start_us) if r.start_us is not None else None, r) for r in result.records]


def within(
    records: list[tuple[float | None, RequestRecord]], since: float | None, until: float | None
) -> tuple[list[RequestRecord], int]:
    """The records started in [since, until), and how many could not be placed in time."""
    if since is None and until is None:
        return [r for _, r in records], 0
    kept = [r for t, r in records if t is not None and (since is None or t >= since) and (until is None or t < until)]
    return kept, sum(1 for t, _ in records if t is None)


def streamed_report(
    result: Analysis, opts: Options, settings: AssemblySettings, since: float | None, until: float | None
) -> Report:
    """The report of the requests started in [since, until), read from the store one record at
    a time: counted in the order they were made, followed in start order (the whole history: a
    conversation may begin before the window), percentiles sorted by SQLite."""
    windowed = since is not None or until is not None
    clock = wall_clock(result.file_ends)
    undated = 0

    def in_window(r: RequestRecord) -> bool:
        if not windowed:
            return True
        t = clock(r.epoch, r.start_us) if r.start_us is not None else None
        return t is not None and (since is None or t >= since) and (until is None or t < until)

    builder = report.ReportBuilder(opts.gap_seconds, settings.big_conversation_tokens, StoredValues(result.store))
    for r in result.store.records():
        if in_window(r):
            builder.count(r)
        elif r.start_us is None or clock(r.epoch, r.start_us) is None:
            undated += 1
    for r in result.store.by_start():
        builder.follow(r, in_window(r))
    rep = builder.result(
        # the conversations' costs are the whole log's: a window ranks by prefill time
        conversations=None if windowed else result.conversations,
        top=opts.top,
        sources=dict(result.sources, since=since, until=until) if windowed else result.sources,
        join_costs=None if windowed else result.join_costs,
    )
    if windowed and undated:
        rep["unknown"].append(undated_unknown(undated))
    return rep


def undated_unknown(undated: int) -> Unknown:
    """The report's unknown entry for the records a time window had to leave out."""
    return {
        "what": "time",
        "requests": undated,
        "why": "left out of the time window: their server run cannot be dated (an events file "
        "alone, or another run follows it in the same log file)",
    }


def parse_time(text: str) -> float:
    """ISO 8601 (2026-11-02, 2026-11-02T14:30, with or without a zone: local time without)."""
    try:
        return datetime.fromisoformat(text).timestamp()
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an ISO 8601 date or time (e.g. 2026-11-02T14:30)") from None


# ------------------------------------------------------------------ command line
@dataclass(frozen=True)
class Options:
    """analyze's settings, declared as the exporter's are (config.setting): flags, defaults,
    bounds and help made from one place, checked by the same check()."""

    format: str = setting("text", "output format", flag="--format", choices=("text", "markdown", "json", "csv"))
    gap_seconds: float = setting(
        1800.0,
        "a request after a pause in its conversation longer than this could not have hit",
        flag="--gap",
        metavar="SECONDS",
        bounds=(0.001, 1e9),
    )
    top: int = setting(10, "conversations in the top table", flag="--top", metavar="N", bounds=(1, 1000))
    min_prompt_tokens: int = setting(
        CacheConfig.min_prompt_tokens,
        "requests with fewer prompt tokens get no cache outcome (as the exporter's cache.min_prompt_tokens)",
        flag="--min-prompt-tokens",
        metavar="N",
        bounds=(1, 1 << 30),
    )
    openmetrics_step: float = setting(
        60.0,
        "one sample of every series per this much log time, with --openmetrics",
        flag="--openmetrics-step",
        metavar="SECONDS",
        bounds=(0.001, 86400.0),
    )


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="llamacpp-exporter analyze",
        description="The prompt-cache investigation from llama-server logs already on disk: miss rates by "
        "LoRA state and selection path (with counts), miss causes, RAM-cache restores, the rates of the "
        "requests that could have hit, prefill and decode figures, and who slowed everyone down.",
    )
    ap.add_argument(
        "logs", nargs="*", metavar="LOG", help="llama-server logs (text or JSONL, .gz too; rotated sets in any order)"
    )
    ap.add_argument(
        "--events",
        action="append",
        default=[],
        metavar="EVENTS.jsonl",
        help="the exporter's events file (its records carry the LoRA state a bare log lacks), read with its "
        "rotated copies EVENTS.jsonl.1, .2, ...; repeatable",
    )
    add_flags(ap, "opt", Options)
    # the live exporter's bucket flags: --openmetrics writes its histograms with these bounds
    add_flags(ap, "metrics", MetricsConfig)
    ap.add_argument(
        "--since", type=parse_time, metavar="TIME", help="only requests started at or after TIME (ISO 8601)"
    )
    ap.add_argument("--until", type=parse_time, metavar="TIME", help="only requests started before TIME (ISO 8601)")
    cmp = ap.add_mutually_exclusive_group()
    cmp.add_argument(
        "--compare-at",
        type=parse_time,
        metavar="TIME",
        help="compare the requests before TIME with those after it (a fix deployed at TIME)",
    )
    cmp.add_argument(
        "--compare-with",
        action="append",
        metavar="LOG",
        help="compare the logs given first with these (for example before and after a fix); repeatable",
    )
    ap.add_argument(
        "--openmetrics",
        metavar="OUT",
        help="write the exporter's metrics over the log's history as OpenMetrics text, for "
        "`promtool tsdb create-blocks-from openmetrics OUT DIR` (each file's modification time dates its last line)",
    )
    ap.add_argument(
        "--label",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="a label on every backfilled series (default job=llamacpp instance=backfill; give the live "
        "exporter's instance to continue its series)",
    )
    ap.add_argument(
        "--plot",
        metavar="DIR",
        help="write PNG charts to DIR: miss rate over time by LoRA state, prefill durations, time per output "
        "token with and without another slot's prefill (needs matplotlib: pip install matplotlib)",
    )
    ap.add_argument(
        "--records",
        metavar="OUT.jsonl",
        help="also write every request record read, one JSON line each, in the exporter's events-file form "
        "(readable again with --events, or with jq or DuckDB)",
    )
    ap.add_argument(
        "--otlp",
        metavar="URL",
        help="send each request's trace over OTLP/HTTP to this collector (http://tempo:4318), at the log's own "
        "times; the same request always gets the same trace id, so sending a log again adds nothing (needs "
        "pip install 'llamacpp-exporter[otlp]')",
    )
    ap.add_argument("--no-progress", action="store_true", help="no progress line on large inputs")
    return ap


def main(argv: list[str]) -> int:
    args = build_parser().parse_args(argv)
    if not args.logs and not args.events:
        print("llamacpp-exporter analyze: give at least one log file or --events file", file=sys.stderr)
        return 2
    opts = Options(**flag_values(args, "opt", Options))
    buckets = MetricsConfig(**flag_values(args, "metrics", MetricsConfig))
    try:
        check(opts, lambda f: f.metadata["flag"])
        check(buckets, lambda f: f.metadata["flag"])
    except ConfigError as e:
        print(f"llamacpp-exporter analyze: {e}", file=sys.stderr)
        return 2
    labels = {"job": "llamacpp", "instance": "backfill"}
    for item in args.label:
        name, sep, value = item.partition("=")
        if not sep or not re.fullmatch(r"[a-zA-Z_][a-zA-Z0-9_]*", name) or name.startswith("__"):
            print(
                f"llamacpp-exporter analyze: --label {item!r}: give NAME=VALUE with a valid label name", file=sys.stderr
            )
            return 2
        labels[name] = value
    if args.openmetrics and not args.logs:
        print("llamacpp-exporter analyze: --openmetrics needs log files", file=sys.stderr)
        return 2
    if args.plot and not plots.available():
        print(
            "llamacpp-exporter analyze: --plot needs matplotlib: pip install matplotlib, into the environment the "
            f"exporter is installed in ({sys.executable} -m pip install matplotlib)",
            file=sys.stderr,
        )
        return 2
    if args.otlp:
        if not args.logs:
            print("llamacpp-exporter analyze: --otlp needs log files (their times date the spans)", file=sys.stderr)
            return 2
        if not args.otlp.startswith(("http://", "https://")):
            print(
                f"llamacpp-exporter analyze: --otlp: give an http:// or https:// URL, got {redact(args.otlp)!r}",
                file=sys.stderr,
            )
            return 2
        if not otlp.available():
            print(
                f"llamacpp-exporter analyze: --otlp needs the OpenTelemetry SDK: {otlp.EXTRA_HINT} "
                f"({sys.executable} -m pip install opentelemetry-sdk opentelemetry-exporter-otlp-proto-http)",
                file=sys.stderr,
            )
            return 2
    missing = [p for p in [*args.logs, *args.events] if not Path(p).is_file()]
    if missing:
        print(f"llamacpp-exporter analyze: no such file: {', '.join(missing)}", file=sys.stderr)
        return 2
    logging.basicConfig(level=logging.WARNING, format="llamacpp-exporter analyze: %(message)s")
    events: list[str] = []  # each with its rotated copies, oldest first, each file once
    for given in args.events:
        for name in events_files(given) or [given]:
            if all(not os.path.samefile(name, e) for e in events):
                events.append(name)
    salt = read_salt(ConversationsConfig())
    settings = AssemblySettings(min_prompt_tokens=opts.min_prompt_tokens)
    try:
        result = analyze(
            Inputs(args.logs, events),
            settings,
            Pseudonymizer(salt),
            progress=not args.no_progress and sys.stderr.isatty(),
            history_step=opts.openmetrics_step if args.openmetrics else None,
            buckets=buckets,
        )
        try:
            src = result.sources
            if args.logs and src.get("log_lines_parsed", 0) == 0:
                # an empty report would read as "nothing went wrong": say what was read instead
                unreadable = src.get("log_lines_unreadable", 0)
                print(
                    f"llamacpp-exporter analyze: none of the {src.get('log_lines', 0)} lines read from "
                    f"{', '.join(args.logs)} is a line of llama-server's log"
                    + (f" ({unreadable} not text)" if unreadable else "")
                    + ": give the file llama-server writes (--log-file) or its captured standard error",
                    file=sys.stderr,
                )
                return 1
            return _outputs(args, opts, settings, salt, labels, result)
        finally:
            result.close()
    except (sqlite3.Error, OSError) as e:  # the records' scratch file: a full or unwritable $TMPDIR
        why = e.strerror if isinstance(e, OSError) and e.strerror else str(e)
        print(
            f"llamacpp-exporter analyze: cannot keep the records in a temporary file ({why}): "
            f"set TMPDIR to a directory with room (about 1 KB a request)",
            file=sys.stderr,
        )
        return 1


def _outputs(
    args: argparse.Namespace,
    opts: Options,
    settings: AssemblySettings,
    salt: str | None,
    labels: dict[str, str],
    result: Analysis,
) -> int:
    if args.records:
        try:
            n = write_jsonl(result.store.records(), args.records)
        except OSError as e:
            print(f"llamacpp-exporter analyze: cannot write {args.records}: {e.strerror}", file=sys.stderr)
            return 1
        print(f"analyze: {n} request records written to {args.records}", file=sys.stderr)
    if args.openmetrics:
        if result.history is None or not any(e.log_us for e in result.file_ends):
            print(
                "llamacpp-exporter analyze: the log has no timestamps (llama-server's --log-timestamps): "
                "its history cannot be dated",
                file=sys.stderr,
            )
            return 1
        try:
            with open(args.openmetrics, "w", encoding="utf-8") as fh:
                w = result.history.write_openmetrics(fh, wall_clock(result.file_ends), labels)
        except OSError as e:
            print(f"llamacpp-exporter analyze: cannot write {args.openmetrics}: {e.strerror}", file=sys.stderr)
            return 1
        note = f"analyze: {w.samples} samples written to {args.openmetrics}"
        if w.runs_without_time:
            note += (
                f"; {w.samples_without_time} samples of {len(w.runs_without_time)} server run(s) not written: "
                "another run follows them in the same file, so their wall-clock time is unknown"
            )
        if w.samples_out_of_order:
            note += f"; {w.samples_out_of_order} samples dropped where runs' times overlapped"
        print(note, file=sys.stderr)

    # a collector that did not take the traces fails the command, after the report
    status = _send_traces(args, result) if args.otlp else 0

    def build(result: Analysis, since: float | None, until: float | None) -> Report:
        return streamed_report(result, opts, settings, since, until)

    if args.compare_at is not None or args.compare_with:
        if args.compare_with:
            other = analyze(Inputs(args.compare_with, []), settings, Pseudonymizer(salt))
            names = ("first logs", "--compare-with logs")
            try:
                a, b = build(result, args.since, args.until), build(other, args.since, args.until)
            finally:
                other.close()
        else:
            at = datetime.fromtimestamp(args.compare_at).isoformat(timespec="seconds")
            names = (f"before {at}", f"from {at}")
            until_a = args.compare_at if args.until is None else min(args.until, args.compare_at)
            since_b = args.compare_at if args.since is None else max(args.since, args.compare_at)
            a, b = build(result, args.since, until_a), build(result, since_b, args.until)
        out = {
            "json": lambda: json.dumps({"compare": list(names), "a": a, "b": b}, indent=2) + "\n",
            "text": lambda: report.comparison_text(a, b, names, markdown=False),
            "markdown": lambda: report.comparison_text(a, b, names, markdown=True),
            "csv": lambda: report.to_csv(a, names[0]) + report.to_csv(b, names[1], header=False),
        }[opts.format]()
        sys.stdout.write(out)
        return status
    rep = build(result, args.since, args.until)
    if args.plot:
        window = [
            (t, r)
            for t, r in dated(result)
            if (args.since is None or (t is not None and t >= args.since))
            and (args.until is None or (t is not None and t < args.until))
        ]
        try:
            for path in plots.draw(args.plot, window):
                print(f"analyze: chart written to {path}", file=sys.stderr)
        except OSError as e:
            print(f"llamacpp-exporter analyze: cannot write the charts to {args.plot}: {e.strerror}", file=sys.stderr)
            return 1
    out = {
        "json": lambda: json.dumps(rep, indent=2) + "\n",
        "text": lambda: report.to_text(rep),
        "markdown": lambda: report.to_markdown(rep),
        "csv": lambda: report.to_csv(rep),
    }[opts.format]()
    sys.stdout.write(out)
    return status


def _send_traces(args: argparse.Namespace, result: Analysis) -> int:
    """analyze --otlp: the traces of the records started in the window, at the log's times. A
    router's children keep their own log time, which the files' times do not date: not sent."""
    offsets = run_offsets_us(result.file_ends)
    kept, _ = within(dated(result), args.since, args.until)  # the window's, as the report's
    url = otlp.traces_url(args.otlp)
    counts = otlp.send_history(((r, offsets.get(r.epoch) if not r.model else None) for r in kept), url)
    url = redact(url)  # as the exporter's log: a password in the URL is never printed
    note = f"analyze: traces of {counts['sent']} requests sent to {url} ({counts['spans']} spans)"
    if counts["undated"]:
        note += (
            f"; {counts['undated']} not sent: their server run cannot be dated (another run follows it in the same "
            "file, a router's model, or a log without timestamps)"
        )
    print(note, file=sys.stderr)
    if counts["failed"]:
        print(
            f"llamacpp-exporter analyze: the OTLP collector at {url} did not take the traces of {counts['failed']} "
            "requests (down, slow or refusing); sending again sends the same traces, none twice",
            file=sys.stderr,
        )
        return 1
    return 0
