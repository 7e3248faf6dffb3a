"""Each request's trace sent over OTLP/HTTP, off the hot path (pip install 'llamacpp-exporter[otlp]').

The pipeline only appends a finished record to a bounded queue (`TraceExport.record`); a
thread of its own makes the spans (export/traces.py) and sends them in batches with the
OpenTelemetry SDK's OTLP/HTTP exporter. A collector that is down, slow or refusing costs the
traces of those requests, counted in llamacpp_exporter_traces_total{result="failed"}, never a
record, a line or a scrape: the queue is bounded (a full one drops the newest, counted
result="dropped"), each send is bounded by the OTLP timeout.

Spans are placed in wall-clock time by their server run's offset (`RunOffsets`): llama-server
stamps its lines with the time since it started, and a line is read at or after it was written,
so the smallest (read time - log time) of the lines read live is the run's start, within the
reader's lag. A record waits in the queue until its run has one (lines read to catch up after a
restart were written long before they were read, and are not used).

The SDK is imported only when tracing is on: without the extra nothing here needs it.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any, Final

from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from .. import __version__
from ..config import redact
from ..records import RequestRecord
from .traces import RunOffsets, Span, spans_of

if TYPE_CHECKING:
    from opentelemetry.sdk.trace import ReadableSpan

log = logging.getLogger(__name__)

EXTRA_HINT: Final = "pip install 'llamacpp-exporter[otlp]'"
BATCH_REQUESTS: Final = 256  # requests per OTLP request (about 4 spans each)
SEND_INTERVAL_SECONDS: Final = 1.0  # a batch goes at least this often while requests finish
UNDATED_AFTER_SECONDS: Final = 600.0  # a record whose run never gets a live line goes unsent
DEFAULT_SERVICE_NAME: Final = "llama-server"  # the spans are llama-server's requests
RESULTS: Final = ("sent", "failed", "dropped", "undated")


def available() -> bool:
    """Whether the SDK and its OTLP/HTTP exporter are installed (the otlp extra)."""
    try:
        import opentelemetry.exporter.otlp.proto.http.trace_exporter  # noqa: F401
        import opentelemetry.sdk.trace  # noqa: F401
    except ImportError:
        return False
    return True


def traces_url(base: str) -> str:
    """An OTLP/HTTP base URL (as OTEL_EXPORTER_OTLP_ENDPOINT: http://tempo:4318) as the traces
    endpoint; one that already names it is kept."""
    base = base.rstrip("/")
    return base if base.endswith("/v1/traces") else base + "/v1/traces"


def endpoint_from_environment() -> str | None:
    """The standard variables' endpoint when they ask for traces, else None."""
    if os.environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return None
    if os.environ.get("OTEL_TRACES_EXPORTER", "otlp").strip().lower() == "none":
        return None
    traces = os.environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "").strip()
    if traces:
        return traces
    base = os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT", "").strip()
    return traces_url(base) if base else None


def _resource() -> Any:
    from opentelemetry.sdk.resources import SERVICE_NAME, Resource

    resource = Resource.create()
    if str(resource.attributes.get(SERVICE_NAME, "")).startswith("unknown_service"):
        # neither OTEL_SERVICE_NAME nor OTEL_RESOURCE_ATTRIBUTES names it
        resource = resource.merge(Resource({SERVICE_NAME: DEFAULT_SERVICE_NAME}))
    return resource


def to_readable(spans: Iterable[Span], resource: Any, scope: Any) -> list[ReadableSpan]:
    """The SDK's spans, with our ids and times (no tracer: the times are the log's)."""
    from opentelemetry.sdk.trace import Event, ReadableSpan
    from opentelemetry.trace import Link, SpanContext, SpanKind, Status, StatusCode, TraceFlags

    sampled = TraceFlags(TraceFlags.SAMPLED)
    out = []
    for s in spans:
        ctx = SpanContext(s.trace_id, s.span_id, is_remote=False, trace_flags=sampled)
        parent = None if s.parent_id is None else SpanContext(s.trace_id, s.parent_id, False, sampled)
        out.append(
            ReadableSpan(
                s.name,
                context=ctx,
                parent=parent,
                resource=resource,
                attributes=s.attributes,
                events=[Event(e.name, e.attributes, e.time_ns) for e in s.events],
                links=[Link(SpanContext(k.trace_id, k.span_id, True, sampled), k.attributes) for k in s.links],
                kind=SpanKind.SERVER if s.server else SpanKind.INTERNAL,
                status=Status(StatusCode.ERROR) if s.error else Status(StatusCode.UNSET),
                start_time=s.start_ns,
                end_time=s.end_ns,
                instrumentation_scope=scope,
            )
        )
    return out


class TraceCounts(Collector):
    """llamacpp_exporter_traces_total and _queued. Each counter is written by one thread."""

    def __init__(self, queued: Callable[[], int]) -> None:
        self.counts = dict.fromkeys(RESULTS, 0)
        self.spans_sent = 0
        self._queued = queued

    def collect(self) -> Iterable[Any]:
        c = CounterMetricFamily(
            "llamacpp_exporter_traces",
            "Requests whose trace the exporter handled, by result: sent (the OTLP collector took it), failed (the "
            "collector was down, slow past the OTLP timeout or refused it), dropped (the send queue was full), "
            "undated (its server run was never read live, so its wall-clock time is unknown).",
            labels=["result"],
        )
        for result, n in list(self.counts.items()):
            c.add_metric([result], n)
        yield c
        yield CounterMetricFamily(
            "llamacpp_exporter_trace_spans_sent", "Spans the OTLP collector took.", value=self.spans_sent
        )
        yield GaugeMetricFamily(
            "llamacpp_exporter_traces_queued", "Requests whose trace waits to be sent.", value=self._queued()
        )


class TraceExport:
    """The pipeline's consumer that sends each record's trace (see the module's docstring)."""

    def __init__(
        self,
        endpoint: str | None,
        max_queued: int,
        offsets: RunOffsets,
        registry: CollectorRegistry | None = None,
    ) -> None:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        from opentelemetry.sdk.util.instrumentation import InstrumentationScope

        # endpoint None: the SDK reads OTEL_EXPORTER_OTLP_(TRACES_)ENDPOINT, headers, timeout...
        self._exporter = OTLPSpanExporter(endpoint=endpoint)
        # what the SDK resolved from the variables, for the operator's messages (a password in it
        # never shown, whichever log prints them: the exporter's, analyze's)
        self.endpoint = redact(
            str(getattr(self._exporter, "_endpoint", endpoint or "the OTEL_EXPORTER_OTLP_* endpoint"))
        )
        self._resource = _resource()
        self._scope = InstrumentationScope("llamacpp_exporter", __version__)
        self.offsets = offsets
        self.max_queued = max_queued
        self._queue: deque[RequestRecord] = deque()
        self._waiting: list[tuple[float, RequestRecord]] = []  # (first seen, record): no offset yet
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._failing = False
        self.counts = TraceCounts(lambda: len(self._queue) + len(self._waiting))
        if registry is not None:
            registry.register(self.counts)
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="otlp-traces", daemon=True)
        self._thread.start()

    # -- the pipeline's side: O(1), never blocks
    def record(self, rec: RequestRecord) -> None:
        if len(self._queue) + len(self._waiting) >= self.max_queued:
            self.counts.counts["dropped"] += 1
            return
        self._queue.append(rec)
        if len(self._queue) >= BATCH_REQUESTS:
            self._wake.set()

    def proven(self, rec: RequestRecord, proof: object) -> None:
        """A trace goes out with the conversation known when its record did."""

    # -- the sender's side
    def _run(self) -> None:
        while not self._stop.is_set():
            self._wake.wait(SEND_INTERVAL_SECONDS)
            self._wake.clear()
            try:
                self.send_ready()
            except Exception:  # a bug here must not end the thread: the traces are counted lost
                log.exception("internal error while sending traces")

    def _take(self) -> list[tuple[RequestRecord, int]]:
        """The records whose run has an offset, at most a batch; the others wait (for a while)."""
        now = time.monotonic()
        ready: list[tuple[RequestRecord, int]] = []
        still: list[tuple[float, RequestRecord]] = []
        for since, rec in self._waiting:
            off = self.offsets.offset(rec.model, rec.epoch)
            if off is not None:
                ready.append((rec, off))
            elif now - since > UNDATED_AFTER_SECONDS:
                self.counts.counts["undated"] += 1
            else:
                still.append((since, rec))
        self._waiting = still
        while self._queue and len(ready) < BATCH_REQUESTS:
            rec = self._queue.popleft()
            off = self.offsets.offset(rec.model, rec.epoch)
            if off is None:
                self._waiting.append((now, rec))
            else:
                ready.append((rec, off))
        return ready

    def send_ready(self) -> None:
        """Send what can be sent now, a batch at a time."""
        while True:
            batch = self._take()
            if not batch:
                return
            self.send(batch)
            if self._stop.is_set() and not self._queue:
                return

    def send(self, batch: list[tuple[RequestRecord, int]]) -> bool:
        """One OTLP request for these records (each with its run's offset); True if taken."""
        from opentelemetry.sdk.trace.export import SpanExportResult

        spans = [s for rec, off in batch for s in spans_of(rec, off)]
        try:
            ok = self._exporter.export(to_readable(spans, self._resource, self._scope)) == SpanExportResult.SUCCESS
        except Exception as e:  # the SDK reports failures by result; anything else is counted the same
            log.debug("OTLP export raised: %s", e)
            ok = False
        if ok:
            self.counts.counts["sent"] += len(batch)
            self.counts.spans_sent += len(spans)
            if self._failing:
                self._failing = False
                log.info("the OTLP collector at %s takes traces again", self.endpoint)
        else:
            self.counts.counts["failed"] += len(batch)
            if not self._failing:
                self._failing = True
                log.warning(
                    "the OTLP collector at %s did not take %d requests' traces (down, slow or refusing): they are "
                    'lost, counted in llamacpp_exporter_traces_total{result="failed"}; records and metrics go on',
                    self.endpoint,
                    len(batch),
                )
        return ok

    def close(self, deadline_seconds: float = 5.0) -> None:
        """Send what waits (for at most deadline_seconds), then stop."""
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout=deadline_seconds)
        elif self._queue:
            self.send_ready()
        self._exporter.shutdown()  # type: ignore[no-untyped-call]


def send_history(records: Iterable[tuple[RequestRecord, int | None]], endpoint: str) -> dict[str, int]:
    """The traces of records read from logs on disk (analyze --otlp), each with its run's offset
    (None: its run cannot be dated), in batches, each batch once: counts by result and spans sent."""
    quiet_sdk_logs()
    sender = TraceExport(endpoint, 1, RunOffsets())
    batch: list[tuple[RequestRecord, int]] = []
    for rec, offset in records:
        if offset is None:
            sender.counts.counts["undated"] += 1
            continue
        batch.append((rec, offset))
        if len(batch) >= BATCH_REQUESTS:
            sender.send(batch)
            batch = []
    if batch:
        sender.send(batch)
    sender.close()
    return {**sender.counts.counts, "spans": sender.counts.spans_sent}


def quiet_sdk_logs() -> None:
    """The SDK logs every failed batch at WARNING and ERROR; the exporter says it once, and counts."""
    for name in ("opentelemetry.exporter.otlp.common.http", "opentelemetry.exporter.otlp.proto.http"):
        logging.getLogger(name).setLevel(logging.CRITICAL)
