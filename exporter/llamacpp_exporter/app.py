"""Wiring: log source thread -> queue -> pipeline thread; server poller thread; HTTP server.

The pipeline runs on one thread and owns all assembly state; the other threads only
put lines (those of one read as one item) and snapshots on its queue. The queue is bounded:
a stalled pipeline slows the reader (the file or pipe keeps the data) instead of growing memory.
"""

from __future__ import annotations

import logging
import platform
import queue
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any
from wsgiref.simple_server import WSGIServer, make_server

from prometheus_client import (
    Gauge,
    PlatformCollector,
    ProcessCollector,
)
from prometheus_client.registry import Collector

from . import __version__, log_reading
from .assemble.finish import AssemblySettings
from .assemble.pseudonyms import Pseudonymizer
from .config import Config, parse_listen_address, position_file, read_api_key, read_salt
from .export import otlp
from .export.conversations import ConversationCosts
from .export.events import written_records
from .export.exposition import ExpositionRegistry
from .export.http import (
    Answering,
    ConnectionsCollector,
    QuietHandler,
    ThreadingWSGIServer,
    V6ThreadingWSGIServer,
    make_app,
)
from .export.otlp import TraceExport
from .export.traces import RunOffsets
from .export.web_config import WebConfigFile
from .pipeline import CatchUp, Input, Lines, OversizedLine, Pipeline
from .sources.command import CommandSource
from .sources.file import FileFollower, FileSource, LogPosition, load_position, save_position
from .sources.lines import LineSplitter, LogSource, SourceStats
from .sources.llama_server import ServerPoller
from .sources.server_address import ServerAddress
from .sources.stream import StreamSource

log = logging.getLogger(__name__)

POSITION_SAVE_INTERVAL = 1.0  # seconds; and at every orderly stop


class _Stop:
    """The pipeline thread's last item."""


QUIET_SECONDS = 0.5
# at most this long a batch of lines waits for a scrape being rendered (a slow one never stalls
# the pipeline for longer)
YIELD_TO_SCRAPE_SECONDS = 0.05
# The queue's items, in the order they happened: what the pipeline takes (pipeline.Input),
# the read positions that follow the lines (saved here), and the last item.
QueueItem = Input | LogPosition | _Stop
LINE_BATCH = 512  # lines per queue item: a queue put and get per batch, not per line
QUEUE_ITEMS = 64  # line batches, snapshots, positions: at most about 32k lines wait for the pipeline


class _LineBatches(LineSplitter):
    """The splitter, handing on the lines of each read as one queue item (at most LINE_BATCH
    lines), in order with the oversized marks and the positions that follow the read."""

    def __init__(self, put: Callable[[QueueItem], None], max_line_bytes: int) -> None:
        self._batch: list[str] = []
        self._put_item = put
        super().__init__(self, max_line_bytes)

    def process_line(self, line: str) -> None:
        self._batch.append(line)
        if len(self._batch) >= LINE_BATCH:
            self._send()

    def oversized_line(self) -> None:
        self._send()
        self._put_item(OversizedLine())

    def _send(self) -> None:
        if self._batch:
            batch, self._batch = self._batch, []
            self._put_item(Lines(batch))

    def feed(self, data: bytes) -> None:
        super().feed(data)
        self._send()

    def flush(self) -> None:
        super().flush()
        self._send()

    def handed(self) -> None:
        self._send()


class _ServerFamilies(Collector):
    """Re-exports llama-server's own /metrics (as last polled) under llamacpp_server_*."""

    def __init__(self, poller: ServerPoller) -> None:
        self.poller = poller

    def collect(self) -> Iterable[Any]:
        try:
            return self.poller.collect_server_families()
        except Exception:  # never fail a scrape
            return []


class Exporter:
    def __init__(self, cfg: Config) -> None:
        self.cfg = cfg
        self.registry = ExpositionRegistry()
        self.stop = threading.Event()
        self.q: queue.Queue[QueueItem] = queue.Queue(maxsize=QUEUE_ITEMS)
        api_key = read_api_key(cfg.llama)
        salt = read_salt(cfg.conversations)
        if salt is None:
            log.warning(
                "no conversations salt configured (--conversations.salt-file or $%s): conversation "
                "pseudonyms change when the exporter restarts",
                cfg.conversations.salt_env,
            )
        self.costs = ConversationCosts(
            window_seconds=cfg.conversations.window_seconds,
            top_n=cfg.conversations.top,
            max_conversations=cfg.conversations.max_tracked,
        )
        self.answering = Answering()  # scrapes being rendered: the pipeline lets them go first
        self.traces = self._traces()
        self.address = ServerAddress(cfg.llama.url)
        self.pipeline = Pipeline(
            self.registry,
            AssemblySettings.from_config(cfg),
            events_path=cfg.events.path,
            events_limits=(cfg.events.max_bytes, cfg.events.max_files),
            slots_polled=cfg.llama.poll_slots,
            request_slots_poll=self._request_slots_poll if cfg.llama.poll_slots else None,
            pseudonymize=Pseudonymizer(salt),
            costs=self.costs,
            on_server_listening=self.address.from_log,
            buckets=cfg.metrics,
            consumers=[self.traces] if self.traces is not None else [],
            run_offsets=self.traces.offsets if self.traces is not None else None,
        )
        self.poller = ServerPoller(
            self.address,
            api_key=api_key,
            timeout=cfg.llama.timeout_seconds,
            interval=cfg.llama.poll_interval_seconds,
            poll_slots=cfg.llama.poll_slots,
            poll_metrics=cfg.llama.poll_metrics,
            registry=self.registry,
            on_snapshot=lambda s: self._put(s),
            on_adapters=lambda a: self._put(a),
        )
        self.poller.metrics_on_own_thread = cfg.llama.poll_metrics
        self.registry.register(_ServerFamilies(self.poller))
        ProcessCollector(registry=self.registry)
        PlatformCollector(registry=self.registry)
        self.registry.register(
            ConnectionsCollector(lambda: self.httpd if isinstance(self.httpd, ThreadingWSGIServer) else None)
        )
        Gauge(
            "llamacpp_exporter_build_info",
            "A metric with a constant '1' value labelled by the exporter's version and Python version.",
            ["version", "pythonversion"],
            registry=self.registry,
        ).labels(__version__, platform.python_version()).set(1)
        self._source_failed = False
        self.position_path = position_file(cfg) if cfg.llama.log_path and cfg.llama.log_path != "-" else None
        self._position: LogPosition | None = None
        self._position_saved = 0.0
        self._records_at_save = 0
        self._position_error_logged = False
        Gauge(
            "llamacpp_exporter_ready",
            "1 while the log follower, the pipeline and the poller run (as /-/ready), 0 when one has stopped.",
            registry=self.registry,
        ).set_function(lambda: 0.0 if self.not_running() else 1.0)
        self.stats = SourceStats(self.registry)
        self.source = self._log_source()
        self.threads: list[threading.Thread] = []
        self.httpd: WSGIServer | None = None

    def _traces(self) -> TraceExport | None:
        """Each request's trace over OTLP: asked for by --traces.otlp-endpoint (checked with the
        configuration: the SDK is there) or by the standard OTEL_* variables."""
        endpoint = self.cfg.traces.otlp_endpoint
        if endpoint is None and otlp.endpoint_from_environment() is None:
            return None
        if not otlp.available():
            log.warning(
                "OTEL_EXPORTER_OTLP_ENDPOINT is set, but the OpenTelemetry SDK is not installed: no traces are sent "
                "(%s)",
                otlp.EXTRA_HINT,
            )
            return None
        otlp.quiet_sdk_logs()
        # a given endpoint is a base URL, as OTEL_EXPORTER_OTLP_ENDPOINT; None: the SDK reads the variables
        traces = TraceExport(
            otlp.traces_url(endpoint) if endpoint else None, self.cfg.traces.max_queued, RunOffsets(), self.registry
        )
        log.info("sending each request's trace over OTLP/HTTP to %s", traces.endpoint)
        return traces

    def _request_slots_poll(self, until_prefill_started: bool, model: str) -> None:
        self.poller.request_slots_poll(until_prefill_started, model)

    def _put(self, item: QueueItem) -> None:
        while not self.stop.is_set():
            try:
                self.q.put(item, timeout=0.5)
                return
            except queue.Full:
                continue

    # ------------------------------------------------------------ threads
    def _log_source(self) -> LogSource | None:
        """The configured source of llama-server's log, or None (the exporter then only polls)."""
        lc = self.cfg.llama
        if lc.log_command:
            return CommandSource(lc.log_command, self.stats)
        if lc.log_path == "-":
            return StreamSource(sys.stdin.buffer)
        if not lc.log_path:
            return None
        path = lc.log_path

        def follower(splitter: LineSplitter) -> FileFollower:
            resume = load_position(self.position_path) if self.position_path else None
            if resume is not None and self.cfg.events.path and self.cfg.events.path != "-":
                # records written before the stop are not written again; those still in
                # flight when it came (a kill) are: read again, they go out now
                self.pipeline.written = written_records(self.cfg.events.path)
            return FileFollower(
                path,
                splitter,
                self.stats,
                from_start=lc.log_from_start,
                resume=resume,
                on_position=self._put if self.position_path else None,
                on_catch_up=lambda started: self._put(CatchUp(started)),
            )

        return FileSource(follower, lc.log_poll_interval_seconds)

    def _source(self) -> None:
        splitter = _LineBatches(self._put, self.cfg.llama.log_max_line_bytes)
        try:
            if self.source is not None:
                self.source.run(splitter, self.stop)
        except Exception:
            log.exception("log source failed")
            self.stats.read_error()
            self._source_failed = True

    def _process(self) -> None:
        pl = self.pipeline
        while True:
            try:
                item = self.q.get(timeout=QUIET_SECONDS)
            except queue.Empty:
                pl.quiet()  # the log is quiet: records waiting for the join go out in time
                continue
            if isinstance(item, _Stop):
                break
            if isinstance(item, LogPosition):
                # every line before it has been processed: what a restart may skip
                self._position = item
                # saved at once when records went out since the last save (a restart must not
                # emit them again), else at most once a second
                if (
                    pl.records_out != self._records_at_save
                    or time.monotonic() - self._position_saved >= POSITION_SAVE_INTERVAL
                ):
                    self._save_position()
                continue
            if isinstance(item, Lines):
                # a scrape being rendered goes first (a catch-up's batches can wait)
                self.answering.idle.wait(YIELD_TO_SCRAPE_SECONDS)
            pl.process(item)
        # with a saved position the next start reads the running tasks' ends: not cancelled
        pl.flush(running=self.position_path is None)
        self._save_position()

    def start(self) -> None:
        host, port = parse_listen_address(self.cfg.web.listen_address)
        server_class = V6ThreadingWSGIServer if ":" in host else ThreadingWSGIServer
        web = WebConfigFile(self.cfg.web.config_file, self.registry) if self.cfg.web.config_file else None
        self.httpd = make_server(
            host,
            port,
            make_app(self.registry, self.cfg, self.costs, self.not_running, web, self.answering, self.address.describe),
            server_class=server_class,
            handler_class=QuietHandler,
        )
        if web is not None:
            # each handshake is done by the front door, bounded like a request's header, with
            # the certificate in force (read again when its file changes)
            self.httpd.tls = lambda: web.current().ssl_context
            if web.current().ssl_context is not None:
                self.httpd.base_environ["HTTPS"] = "on"
        self.port = self.httpd.server_address[1]
        if self.traces is not None:
            self.traces.start()
        for name, target in (
            ("pipeline", self._process),
            ("log-source", self._source),
            ("poller", lambda: self.poller.run(self.stop)),
            ("health-poller", lambda: self.poller.run_health(self.stop)),
            *([("metrics-poller", lambda: self.poller.run_metrics(self.stop))] if self.cfg.llama.poll_metrics else []),
            ("http", self.httpd.serve_forever),
        ):
            t = threading.Thread(target=target, name=name, daemon=True)
            t.start()
            self.threads.append(t)
        src = self.cfg.llama.log_command and "command" or self.cfg.llama.log_path or "none"
        log.info(
            "llamacpp-exporter %s listening on %s:%d, llama-server %s, log source %s, log reading %s",
            __version__,
            host,
            self.port,
            self.address.describe(),
            src,
            log_reading(),  # pip install . compiles it where a C compiler is at hand (setup.py)
        )
        if not self.cfg.llama.log_path and not self.cfg.llama.log_command:
            log.warning(
                "no log source (--llama.log-path or --llama.log-command): only llama-server's endpoints are exported"
            )

    def _save_position(self) -> None:
        if self.position_path is None or self._position is None:
            return
        self._position_saved = time.monotonic()
        self._records_at_save = self.pipeline.records_out
        try:
            save_position(self.position_path, self._position)
        except OSError as e:
            if not self._position_error_logged:
                log.warning("cannot save the log position to %s: %s", self.position_path, e.strerror)
                self._position_error_logged = True

    def dead_threads(self) -> list[str]:
        """Threads that ended although they should run for the process's life (a log source
        that ended with its input, standard input closed, is not one)."""
        watched = ("pipeline", "poller", "health-poller", "metrics-poller", "http")
        dead = [t.name for t in self.threads if t.name in watched and not t.is_alive()]
        return dead + (["log-source"] if self._source_failed else [])

    def not_running(self) -> list[str]:
        """Threads that should run and do not (for /-/ready). A log source that ended because
        its input ended (standard input closed) is not a failure."""
        watched = ("pipeline", "poller", "health-poller", "metrics-poller")
        dead = [t.name for t in self.threads if t.name in watched and not t.is_alive()]
        if self._source_failed:
            dead.append("log-source")
        elif (
            isinstance(self.source, FileSource)
            and self.source.follower is not None
            and self.source.follower.open_error is not None
        ):
            dead.append(f"log-source ({self.source.follower.open_error})")
        return dead

    def shutdown(self) -> None:
        self.stop.set()
        self.poller.request_slots_poll()
        if self.httpd is not None:
            self.httpd.shutdown()
        try:
            self.q.put(_Stop(), timeout=5)
        except queue.Full:
            pass
        for t in self.threads:
            if t.name == "pipeline":
                t.join(timeout=10)
            elif t.name == "log-source":
                t.join(timeout=1)  # lets a --log.command child be stopped with us
        self.poller.close()
        if self.traces is not None:
            self.traces.close()  # what waits goes out, for at most a few seconds


def _raise_open_files_limit() -> None:
    """As Go programs do (node_exporter among them): the soft limit of open files up to the
    hard one, so that a burst of connections does not run the process out of descriptors."""
    try:
        import resource

        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        target = 1 << 20 if hard == resource.RLIM_INFINITY else hard
        if soft != resource.RLIM_INFINITY and target > soft:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
    except (ImportError, ValueError, OSError):
        pass


def run(cfg: Config) -> int:
    _raise_open_files_limit()
    exp = Exporter(cfg)
    done = threading.Event()

    def _signal(signum: int, frame: Any) -> None:
        done.set()

    def _reopen(signum: int, frame: Any) -> None:
        # as daemons do: our own output was rotated. The flag is read by the pipeline thread,
        # which alone writes the file.
        if exp.pipeline.events is not None:
            exp.pipeline.events.reopen_requested = True
        log.info("SIGHUP: the events file is opened again at its next record")

    # before anything answers: a SIGHUP sent once /-/healthy answers must never meet the
    # default action (the end of the process)
    signal.signal(signal.SIGTERM, _signal)
    signal.signal(signal.SIGINT, _signal)
    signal.signal(signal.SIGHUP, _reopen)
    exp.start()
    # When standard input ends the exporter keeps serving its final metrics until stopped.
    while not done.wait(1.0):
        dead = exp.dead_threads()
        if dead:
            # a thread that cannot go on: frozen values would look like a quiet server. End,
            # non-zero, so that the supervisor (systemd, Kubernetes, compose) starts it again
            log.error("exporter thread(s) stopped unexpectedly: %s; exiting to be restarted", ", ".join(dead))
            exp.shutdown()
            return 3
    log.info("shutting down")
    exp.shutdown()
    return 0
