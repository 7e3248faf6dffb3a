"""The pipeline: raw line -> parse -> assemble -> the record's consumers.

Single-threaded and replayable: ``Pipeline.process_line`` is the hot path, used both by
the live exporter (fed by the tailer thread's queue) and by a replay of a file on disk.
Each finished record goes to every consumer in turn (request metrics, conversation costs,
the events file, a caller's callback); line-level facts go to the log metrics directly.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable
from typing import IO

from prometheus_client import CollectorRegistry, Counter

from . import parse
from .assemble import Assembler, AssemblySettings
from .conversations import ConversationCollector, ConversationCosts
from .metrics import LogMetrics, RequestMetrics
from .records import LoraAdapters, RequestRecord, SlotsSnapshot

log = logging.getLogger(__name__)

# llama.cpp builds whose recorded logs are in tests/fixtures/logs/builds/ (tests/test_builds.py)
TESTED_BUILDS = (10950, 11200, 11434)

_RESULT = {
    parse.Ignored: "ignored",
    parse.Unrecognized: "unrecognized",
    parse.Unreadable: "unreadable",
    parse.DebugLine: "ignored",
}


class EventsFile:
    """Appends one JSON line per request record. Records hold numbers and fixed words only."""

    def __init__(self, path: str, registry: CollectorRegistry) -> None:
        self.path = path
        r = registry
        self.records_written = Counter(
            "llamacpp_exporter_events_written", "Request records appended to the events file.", registry=r
        )
        self.events_errors = Counter(
            "llamacpp_exporter_events_write_errors", "Failed writes to the events file.", registry=r
        )
        self._fh: IO[str] | None = None
        self._last_error_log = 0.0

    def write(self, rec: RequestRecord) -> None:
        self._append(rec.to_event(), counted=True)

    def _append(self, obj: dict, counted: bool) -> None:
        try:
            if self._fh is None:
                self._fh = open(self.path, "a", encoding="utf-8")
            self._fh.write(json.dumps(obj, separators=(",", ":")) + "\n")
            self._fh.flush()
            if counted:
                self.records_written.inc()
        except OSError as e:
            self.events_errors.inc()
            self._fh = None
            now = time.monotonic()
            if now - self._last_error_log > 60:
                self._last_error_log = now
                log.warning("cannot write events file %s: %s", self.path, e.strerror)

    def write_proof(self, rec: RequestRecord, conversation: str, source: str) -> None:
        """The conversation of a record written before it was proven: a line of its own,
        naming the record by its slot, task and start (analyze applies it to the record)."""
        self._append(
            {
                "proof": "conversation",
                "epoch": rec.epoch,
                "slot": rec.slot,
                "task": rec.task,
                "start_us": rec.start_us,
                "conversation": conversation,
                "conversation_source": source,
            },
            counted=False,
        )

    def close(self) -> None:
        if self._fh is not None:
            self._fh.close()
            self._fh = None


class _Facts:
    """The assembler's line-level facts: to the log metrics, with what the operator should
    read in the exporter's own log said once."""

    def __init__(self, metrics: LogMetrics, requests: RequestMetrics, costs: ConversationCosts) -> None:
        self.metrics = metrics
        self.requests = requests
        self._untested_warned = False
        self.cache_state = metrics.cache_state
        self.cache_saved = metrics.cache_saved
        self.cache_evicted = metrics.cache_evicted
        self.cache_update_duration = metrics.cache_update_duration
        self.prefill_in_progress = metrics.prefill_in_progress
        self.out_of_order_lines = metrics.out_of_order_lines
        self.conversation_arrival_dropped = metrics.conversation_arrival_dropped
        self.conversation_cost = costs.cost
        self.proof_consumers: list[Callable[[RequestRecord, str, str], None]] = []
        self.skip_proof: Callable[[RequestRecord], bool] = lambda _rec: False

    def conversation_proven(self, record: RequestRecord, conversation: str, source: str) -> None:
        if self.skip_proof(record):
            return
        for consume in self.proof_consumers:
            consume(record, conversation, source)

    def slots_known(self, slot_ids: list[int]) -> None:
        self.metrics.slots_known(slot_ids)
        self.requests.slots_known(slot_ids)

    def diagnostics(self, available: bool, verbosity: int | None) -> None:
        self.metrics.diagnostics(available, verbosity)
        if not available:
            log.warning(
                "llama-server is not logging at -lv 4: RAM prompt-cache diagnostics (restores, LoRA "
                "discards, reused tokens from the log) are unavailable; prefill and decode figures stay "
                "exact. Start llama-server with -lv 4 to enable them."
            )
        else:
            log.info("llama-server logs at -lv 4: RAM prompt-cache diagnostics available")

    def debug_logging_seen(self) -> None:
        self.metrics.debug_logging_seen()
        log.warning(
            "llama-server logs DEBUG lines (-lv 5 / -v): its log contains prompt and completion "
            "text. The exporter drops these lines and copies no text, but the log file itself "
            "holds user data. Use -lv 4."
        )

    def server_build(self, number: int, commit: str) -> None:
        self.metrics.server_build(number, commit)
        if number == 0:
            log.info("llama-server was built without version information (build 0): its build is unknown")
        elif number in TESTED_BUILDS:
            log.info("llama-server build %d (%s), a build the exporter is tested with", number, commit)
        elif not self._untested_warned:
            self._untested_warned = True
            log.warning(
                "llama-server build %d (%s) is not one the exporter is tested with (%s): if its log changed, "
                "lines show as unrecognized in llamacpp_exporter_log_lines_total and the figures built on them "
                "as unavailable",
                number,
                commit,
                ", ".join(map(str, TESTED_BUILDS)),
            )

    def server_restart(self) -> None:
        self.metrics.server_restart()
        log.info("llama-server restart seen in the log: starting a new epoch")


class Pipeline:
    def __init__(
        self,
        registry: CollectorRegistry,
        settings: AssemblySettings | None = None,
        *,
        events_path: str | None = None,
        slots_polled: bool = False,
        request_slots_poll: Callable[[bool], None] | None = None,
        on_record: Callable[[RequestRecord], None] | None = None,
        on_proof: Callable[[RequestRecord, str, str], None] | None = None,
        clock: Callable[[], float] = time.time,
        pseudonymize: Callable[[str], str] | None = None,
        costs: ConversationCosts | None = None,
    ) -> None:
        self.registry = registry
        self.clock = clock
        self.costs = costs or ConversationCosts(clock=clock)
        registry.register(ConversationCollector(self.costs))
        self.requests = RequestMetrics(registry)
        self.metrics = LogMetrics(registry)
        self.events = EventsFile(events_path, registry) if events_path else None
        self.consumers: list[Callable[[RequestRecord], None]] = [self.requests.record, self.costs.request]
        if self.events is not None:
            self.consumers.append(self.events.write)
        if on_record is not None:
            self.consumers.append(on_record)
        self.records_out = 0
        self._catching_up = False
        self._caught_up_at: tuple[int, int] | None = None  # (epoch, log time) the exporter started at
        self._poll: Callable[[bool], None] | None = None
        facts = _Facts(self.metrics, self.requests, self.costs)
        # a conversation proven after its record went out: to the conversation series, the
        # events file and a caller's callback
        facts.proof_consumers.append(lambda rec, conv, _source: self.costs.proven(conv, rec))
        if self.events is not None:
            facts.proof_consumers.append(self.events.write_proof)
        if on_proof is not None:
            facts.proof_consumers.append(on_proof)
        facts.skip_proof = self._before_start
        self.assembler = Assembler(
            facts,
            settings,
            on_record=self._emit,
            slots_polled=slots_polled,
            request_slots_poll=request_slots_poll,
            pseudonymize=pseudonymize,
        )

    def _emit(self, record: RequestRecord) -> None:
        if self._before_start(record):
            return
        self.records_out += 1
        for consume in self.consumers:
            consume(record)

    def _before_start(self, record: RequestRecord) -> bool:
        """A request that ended before the exporter started (read again to catch up)."""
        if self._catching_up:
            return True
        q = self._caught_up_at
        return q is not None and (record.epoch, record.end_us or 0) <= q

    def catch_up(self, started: bool) -> None:
        """The lines between ``catch_up(True)`` and ``catch_up(False)`` were written before the
        exporter started (the server run so far): they build the assembler's state as a replay
        would, but their requests are not counted again, and they ask for no /slots poll."""
        a = self.assembler
        if started:
            self._catching_up = True
            self._poll, a.request_slots_poll = a.request_slots_poll, None
        elif self._catching_up:
            self._catching_up = False
            a.request_slots_poll = self._poll
            self._caught_up_at = (a.epoch, a.clock.now)

    def process_line(self, line: str, now: float | None = None) -> None:
        """Hot path. Never raises on input: an unknown line is counted and skipped."""
        t = self.clock() if now is None else now
        parsed = parse.parse_line(line)
        m = self.metrics
        m.lines[_RESULT.get(type(parsed.event), "parsed")] += 1
        m.last_line_time = t
        try:
            self.assembler.feed(parsed, int(t * 1_000_000))
        except Exception:  # an assembler bug must not stop the exporter; count and go on
            log.exception("internal error while assembling a log event (line skipped)")
            self.metrics.internal_error()

    def quiet(self, now: float | None = None) -> None:
        """No line for a while: the server's time goes on although the log says nothing."""
        t = self.clock() if now is None else now
        try:
            self.assembler.quiet(int(t * 1_000_000))
        except Exception:
            log.exception("internal error while the log was quiet")
            self.metrics.internal_error()

    def oversized_line(self) -> None:
        self.metrics.line_read("oversized")

    def process_snapshot(self, snap: SlotsSnapshot) -> None:
        try:
            self.assembler.feed_snapshot(snap)
        except Exception:
            log.exception("internal error while applying a /slots snapshot")

    def process_adapters(self, adapters: LoraAdapters) -> None:
        self.assembler.feed_adapters(adapters)

    def flush(self, running: bool = True) -> None:
        self.assembler.flush(running)
        if self.events is not None:
            self.events.close()


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
    with open(path, encoding="utf-8", errors="replace", newline="\n") as fh:
        for line in fh:
            pl.process_line(line.rstrip("\r\n"), now)
    pl.flush()
    return pl
