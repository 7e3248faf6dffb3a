"""The pipeline: raw line -> parse -> assemble -> the record's consumers.

Single-threaded and replayable: ``Pipeline.process_line`` is the hot path, used both by
the live exporter (fed by the tailer thread's queue) and by a replay of a file on disk.
Each finished record, and each conversation proven after its record went out, goes to every
``RecordConsumer`` in turn (request metrics, conversation costs, the events file, a caller's);
line-level facts go to the log metrics directly.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable
from typing import Final, Protocol

from prometheus_client import CollectorRegistry

from . import parse
from .assemble.assembler import Assembler
from .assemble.finish import AssemblySettings
from .assemble.pseudonyms import Pseudonymizer
from .config import MetricsConfig
from .demux import ROUTER_EVENTS, RouterDemux
from .export.conversations import ConversationCollector, ConversationCosts
from .export.events import EventsFile
from .export.metrics import LogMetrics, ModelMetrics, RequestMetrics
from .export.router import RouterMetrics
from .export.traces import RunOffsets
from .parse import TESTED_BUILDS
from .records import ConversationProof, JoinSource, LoraAdapters, RecordKey, RequestRecord, SlotsSnapshot

log = logging.getLogger(__name__)


class RecordConsumer(Protocol):
    """Where finished records go: each record once, and the conversation of one that went out
    "uncertain" once the log proved it."""

    def record(self, rec: RequestRecord) -> None: ...

    def proven(self, rec: RequestRecord, proof: ConversationProof) -> None: ...


class Callbacks:
    """A caller's consumer from two functions (analyze's store, the tests)."""

    def __init__(
        self,
        on_record: Callable[[RequestRecord], None] | None,
        on_proof: Callable[[ConversationProof], None] | None,
    ) -> None:
        self.on_record = on_record
        self.on_proof = on_proof

    def record(self, rec: RequestRecord) -> None:
        if self.on_record is not None:
            self.on_record(rec)

    def proven(self, rec: RequestRecord, proof: ConversationProof) -> None:
        if self.on_proof is not None:
            self.on_proof(proof)


class ServerProcess(ModelMetrics):
    """One server process (a plain server, or one child of a router): its assembler, and the
    assembler's outbound side (assemble.Sink). Facts go to the metrics under its model (the
    view export/ keeps of it), with what the operator should read in the exporter's own log
    said once; each finished record and each late proof goes through the pipeline's fan-out,
    unless it is a request the exporter counted before a restart; /slots polls go to the
    poller with the model."""

    def __init__(self, pipeline: Pipeline, model: str, on_listening: Callable[[str], None] | None = None) -> None:
        super().__init__(pipeline.metrics, pipeline.requests, pipeline.costs, model)
        self.pipeline = pipeline
        self.on_listening = on_listening  # the server's own (not a router's child's)
        self._untested_warned = False
        self._of = f" (model {model})" if model else ""
        self.assembler = Assembler(
            self,
            pipeline.settings,
            slots_polled=pipeline.slots_polled,
            pseudonymize=pipeline.pseudonymize,
            model=model,
        )

    # -- what the assembler hands on
    def record(self, record: RequestRecord) -> None:
        if self.assembler.replayed(record) and self.pipeline.written_before(record):
            return
        self.pipeline.emit(record)

    def conversation_proven(self, record: RequestRecord, conversation: str, source: JoinSource) -> None:
        if self.assembler.replayed(record) and self.pipeline.written_before(record):
            return
        self.pipeline.emit_proof(record, ConversationProof(record.key, record.epoch, conversation, source))

    def slots_poll(self, until_prefill_started: bool) -> None:
        poll = self.pipeline.request_slots_poll
        if poll is not None:
            poll(until_prefill_started, self.model)

    def server_listening(self, url: str) -> None:
        if self.on_listening is not None:
            self.on_listening(url)

    # -- facts the operator reads about in the exporter's log too
    def diagnostics(self, available: bool, verbosity: int | None) -> None:
        super().diagnostics(available, verbosity)
        if not available:
            log.warning(
                "llama-server%s is not logging at -lv 4: RAM prompt-cache diagnostics (restores, LoRA "
                "discards, reused tokens from the log) are unavailable; prefill and decode figures stay "
                "exact. Start llama-server with -lv 4 to enable them.",
                self._of,
            )
        else:
            log.info("llama-server%s logs at -lv 4: RAM prompt-cache diagnostics available", self._of)

    def debug_logging_ended(self) -> None:
        super().debug_logging_ended()
        log.info("llama-server%s restarted without DEBUG lines: its new log lines hold no prompt text", self._of)

    def debug_logging_seen(self) -> None:
        super().debug_logging_seen()
        log.warning(
            "llama-server%s logs DEBUG lines (-lv 5 / -v): its log contains prompt and completion "
            "text. The exporter drops these lines and copies no text, but the log file itself "
            "holds user data. Use -lv 4.",
            self._of,
        )

    def server_build(self, number: int, commit: str) -> None:
        super().server_build(number, commit)
        if number == 0:
            log.info("llama-server%s was built without version information (build 0): its build is unknown", self._of)
        elif number in TESTED_BUILDS:
            log.info("llama-server%s build %d (%s), a build the exporter is tested with", self._of, number, commit)
        elif not self._untested_warned:
            self._untested_warned = True
            log.warning(
                "llama-server%s build %d (%s) is not one the exporter is tested with (%s): if its log changed, "
                "lines show as unrecognized in llamacpp_exporter_log_lines_total and the figures built on them "
                "as unavailable",
                self._of,
                number,
                commit,
                ", ".join(map(str, TESTED_BUILDS)),
            )

    def server_restart(self) -> None:
        super().server_restart()
        log.info("llama-server%s restart seen in the log: starting a new epoch", self._of)


class Lines:
    """Lines of the log read at one time (at most a few hundred)."""

    def __init__(self, lines: list[str]) -> None:
        self.lines = lines


class OversizedLine:
    """A line longer than the limit was read and dropped."""


class CatchUp:
    """started: the lines that follow were written before the exporter started; else they end."""

    def __init__(self, started: bool) -> None:
        self.started = started


# What the pipeline takes in, in the order it happened: the log's lines, and what the poller
# saw of the server between them.
Input = Lines | OversizedLine | CatchUp | SlotsSnapshot | LoraAdapters


class Pipeline:
    def __init__(
        self,
        registry: CollectorRegistry,
        settings: AssemblySettings | None = None,
        *,
        events_path: str | None = None,
        events_limits: tuple[int, int] = (0, 0),  # max bytes, rotated files kept (EventsFile)
        slots_polled: bool = False,
        request_slots_poll: Callable[[bool, str], None] | None = None,
        on_record: Callable[[RequestRecord], None] | None = None,
        on_proof: Callable[[ConversationProof], None] | None = None,
        on_server_listening: Callable[[str], None] | None = None,
        clock: Callable[[], float] = time.time,
        pseudonymize: Callable[[str], str] | None = None,
        costs: ConversationCosts | None = None,
        buckets: MetricsConfig | None = None,
        consumers: Iterable[RecordConsumer] = (),
        run_offsets: RunOffsets | None = None,
    ) -> None:
        self.registry = registry
        self.clock = clock
        self.settings = settings
        self.slots_polled = slots_polled
        self.request_slots_poll = request_slots_poll  # (until prefill started, model)
        self.pseudonymize = pseudonymize or Pseudonymizer()
        self.costs = costs or ConversationCosts(clock=clock)
        registry.register(ConversationCollector(self.costs))
        # run_offsets: traces are sent (export/otlp.py); the latency histograms' exemplars carry
        # each request's trace id
        self.requests = RequestMetrics(registry, buckets, trace_exemplars=run_offsets is not None)
        self.metrics = LogMetrics(registry)
        self.router = RouterMetrics(registry)
        self.events = EventsFile(events_path, registry, *events_limits) if events_path else None
        self.consumers: list[RecordConsumer] = [self.requests, self.costs]
        if self.events is not None:
            self.consumers.append(self.events)
        if on_record is not None or on_proof is not None:
            self.consumers.append(Callbacks(on_record, on_proof))
        self.consumers.extend(consumers)
        self.run_offsets = run_offsets  # where each server run's log time falls in wall-clock time
        self.records_out = 0
        # the records the events file holds from before a restart
        self.written: set[RecordKey] | None = None
        self._prefixed = False  # the log's lines carry llama-server's prefix (a timestamp)
        self._catching_up = False
        # the plain server, or the router's own lines (a router serves no request itself)
        self.assembler: Assembler = ServerProcess(self, "", on_server_listening).assembler
        self.demux = RouterDemux(self._new_assembler, self.requests, self.metrics, self.router)

    def _new_assembler(self, model: str) -> Assembler:
        a = ServerProcess(self, model).assembler
        a.catch_up(self._catching_up)
        return a

    @property
    def assemblers(self) -> list[Assembler]:
        return [self.assembler, *self.demux.children.values()]

    def emit(self, record: RequestRecord) -> None:
        self.records_out += 1
        for consumer in self.consumers:
            consumer.record(record)

    def emit_proof(self, record: RequestRecord, proof: ConversationProof) -> None:
        """A conversation proven after its record went out."""
        for consumer in self.consumers:
            consumer.proven(record, proof)

    def written_before(self, record: RequestRecord) -> bool:
        """Whether a request read again to catch up was written by the exporter that ran then.
        Known from the events file when there is one: a record that was still waiting when the
        exporter was killed goes out now; else every such request was."""
        return self.written is None or record.key in self.written

    def catch_up(self, started: bool) -> None:
        """See Assembler.catch_up: for every assembler, and those made meanwhile."""
        self._catching_up = started
        for a in self.assemblers:
            a.catch_up(started)

    def process(self, item: Input) -> None:
        """One item of the live exporter's queue."""
        if isinstance(item, Lines):
            self.process_lines(item.lines)
        elif isinstance(item, SlotsSnapshot):
            self.process_snapshot(item)
        elif isinstance(item, LoraAdapters):
            self.process_adapters(item)
        elif isinstance(item, OversizedLine):
            self.oversized_line()
        else:
            self.catch_up(item.started)

    # ------------------------------------------------------------ inputs
    def process_line(self, line: str, now: float | None = None) -> None:
        """Hot path. Never raises on input: an unknown line is counted and skipped."""
        t = self.clock() if now is None else now
        self._line(line, t, int(t * 1_000_000))

    def process_lines(self, lines: Iterable[str], now: float | None = None) -> None:
        """Lines read at one time (a batch of the live reader's): process_line on each, the
        clock read once."""
        t = self.clock() if now is None else now
        now_us = int(t * 1_000_000)
        for line in lines:
            self._line(line, t, now_us)
        if self.run_offsets is not None:
            self._saw_runs(self.run_offsets)

    def _saw_runs(self, offsets: RunOffsets) -> None:
        """Once a batch: each run's offset from the last line read live (see export/traces.py)."""
        for a in self.assemblers:
            if not a.catching_up and a.clock.last_ts is not None:
                offsets.saw(a.model, a.epoch, a.clock.read_us, a.clock.now)

    def _line(self, line: str, t: float, now_us: int) -> None:
        try:
            parsed = parse._parse_line(line)  # parse_line without its guard: this is one
        except Exception:  # a parser bug costs one line, never the exporter (parse.parse_line)
            parsed = _UNRECOGNIZED
        if parsed.bare:
            if self._prefixed:
                # the server prefixes its own lines: one without is the rest of a multi-line
                # message, possibly a client's text (a grammar at -lv 5): never an event
                parsed = _CONTINUATION
        elif not self._prefixed and parsed.ts_us is not None:
            self._prefixed = True
        m = self.metrics
        kind = type(parsed.event)
        if kind is parse.Ignored or kind is parse.DebugLine:
            m.ignored_lines += 1
        elif kind is parse.Unrecognized:
            ev = parsed.event
            if isinstance(ev, parse.Unrecognized):  # it is (kind): for the type checker
                # a line without the server's prefix may be a client's text shaped like a server
                # line (a prompt's line at -lv 5, logged with --no-log-prefix): no word of it is kept
                m.unrecognized(ev.logger, "other" if parsed.bare else ev.function)
        elif kind is parse.Unreadable:
            m.unreadable_lines += 1
        else:
            m.parsed_lines += 1
        m.last_line_time = t
        try:
            if parsed.child is not None:
                self.demux.child(parsed.child).feed(parsed, now_us)
                return
            if kind in ROUTER_EVENTS:
                self.demux.router_line(parsed.event)
            self.assembler.feed(parsed, now_us)
        except Exception:  # an assembler bug must not stop the exporter; count and go on
            log.exception("internal error while assembling a log event (line skipped)")
            self.metrics.internal_error()

    def quiet(self, now: float | None = None) -> None:
        """No line for a while: the server's time goes on although the log says nothing."""
        t = self.clock() if now is None else now
        try:
            for a in self.assemblers:
                a.quiet(int(t * 1_000_000))
        except Exception:
            log.exception("internal error while the log was quiet")
            self.metrics.internal_error()

    def oversized_line(self) -> None:
        self.metrics.oversized_line_read()

    def process_snapshot(self, snap: SlotsSnapshot) -> None:
        try:
            for a in self.assemblers:
                if a.model == snap.model:
                    a.feed_snapshot(snap)
        except Exception:
            self.metrics.internal_error()  # counted, as a line's are: a bug must show
            log.exception("internal error while applying a /slots snapshot")

    def process_adapters(self, adapters: LoraAdapters) -> None:
        for a in self.assemblers:
            if a.model == adapters.model:
                a.feed_adapters(adapters)

    def flush(self, running: bool = True) -> None:
        for a in self.assemblers:
            a.flush(running)
        if self.events is not None:
            self.events.close()


_CONTINUATION: Final = parse.ParsedLine(None, parse.IGNORED, bare=True)
_UNRECOGNIZED: Final = parse.ParsedLine(None, parse.UNRECOGNIZED)


def replay(
    path: str,
    registry: CollectorRegistry,
    settings: AssemblySettings | None = None,
    events_path: str | None = None,
    now: float = 0.0,
    pseudonymize: Callable[[str], str] | None = None,
) -> Pipeline:
    """Run a whole log file through the pipeline at full speed (tests, `analyze`)."""
    pl = Pipeline(registry, settings, events_path=events_path, clock=lambda: now, pseudonymize=pseudonymize)
    now_us = int(now * 1_000_000)
    with open(path, encoding="utf-8", errors="replace", newline="\n") as fh:
        for line in fh:
            pl._line(line.rstrip("\r\n"), now, now_us)  # process_line's work, the clock fixed
    pl.flush()
    return pl
