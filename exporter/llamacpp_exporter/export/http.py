"""The exporter's HTTP server: /metrics (exposition.py), the landing page, the
conversations API, /-/healthy and /-/ready, behind the optional basic auth of
--web.config.file; a threaded server that bounds its connections and never spins when out of
file descriptors."""

from __future__ import annotations

import errno
import html
import json
import logging
import socket
import sys
import threading
import time
from collections.abc import Callable
from socketserver import ThreadingMixIn
from typing import Any
from wsgiref.simple_server import ServerHandler, WSGIRequestHandler, WSGIServer

from prometheus_client import CollectorRegistry

from .. import __version__
from ..config import Config
from .conversations import ConversationCosts
from .exposition import make_metrics_app
from .web_config import WebSecurity

log = logging.getLogger(__name__)

# While a request is served, the interpreter switches threads every 0.5 ms instead of 5: a
# pipeline catching up on a long log holds the interpreter lock, and each of the dozen times a
# request waits for it (accept, read, render, send) would cost up to the whole interval.
SERVING_SWITCH_INTERVAL = 0.0005
MAX_CONNECTIONS = 256  # served at once; more are closed at once (an idle one ends after QuietHandler.timeout)


class _FastSwitching:
    """The short switch interval while at least one request is being served, the process's own
    otherwise (nothing is paid while no request waits)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._serving = 0
        self._normal = sys.getswitchinterval()

    def enter(self) -> None:
        with self._lock:
            if self._serving == 0:
                self._normal = sys.getswitchinterval()
                sys.setswitchinterval(min(self._normal, SERVING_SWITCH_INTERVAL))
            self._serving += 1

    def leave(self) -> None:
        with self._lock:
            self._serving -= 1
            if self._serving == 0:
                sys.setswitchinterval(self._normal)


class Answering:
    """Scrapes being rendered now (not idle kept-alive connections). The pipeline thread waits
    for them between batches of lines (bounded by its own timeout), so that a scrape while the
    exporter catches up on a long log does not share the interpreter with it at every step."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._n = 0
        self.idle = threading.Event()
        self.idle.set()

    def __enter__(self) -> None:
        with self._lock:
            self._n += 1
            self.idle.clear()

    def __exit__(self, *exc: object) -> None:
        with self._lock:
            self._n -= 1
            if self._n == 0:
                self.idle.set()


class ThreadingWSGIServer(ThreadingMixIn, WSGIServer):
    daemon_threads = True
    request_queue_size = 1024  # the listen backlog: socketserver's 5 drops connections under a burst of scrapes

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._slots = threading.BoundedSemaphore(MAX_CONNECTIONS)
        self.connections_refused = 0
        self.switching = _FastSwitching()

    def get_request(self) -> Any:
        try:
            return super().get_request()
        except OSError as e:
            if e.errno in (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM):
                # out of descriptors: the listening socket stays readable, so retrying at once
                # would spin; wait for connections to end
                time.sleep(0.1)
            raise

    def process_request(self, request: Any, client_address: Any) -> None:
        if not self._slots.acquire(blocking=False):
            self.connections_refused += 1
            self.shutdown_request(request)  # too many at once: this one is closed, not queued
            return
        self.switching.enter()
        try:
            super().process_request(request, client_address)
        except BaseException:  # no thread started: nothing will leave
            self.switching.leave()
            self._slots.release()
            raise

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self.switching.leave()
            self._slots.release()

    def handle_error(self, request: Any, client_address: Any) -> None:
        # a client that failed the TLS handshake or hung up: not the exporter's error
        log.debug("connection from %s failed", client_address, exc_info=True)


class V6ThreadingWSGIServer(ThreadingWSGIServer):
    address_family = socket.AF_INET6


class ClientHungUp(ConnectionAbortedError):
    """The client went away while its answer was being sent."""


class _ResponseHandler(ServerHandler):
    """wsgiref's handler, except that any socket error while sending (a TLS client that closes
    without close_notify raises SSLEOFError, which wsgiref does not expect) is the client hanging
    up, not a traceback on stderr; and an error of the exporter's own goes to its log."""

    def _write(self, data: bytes) -> None:
        try:
            super()._write(data)
        except OSError as e:
            raise ClientHungUp(str(e)) from e  # wsgiref's run() returns quietly on ConnectionAbortedError

    def _flush(self) -> None:
        try:
            super()._flush()
        except OSError as e:
            raise ClientHungUp(str(e)) from e

    def log_exception(self, exc_info: Any) -> None:
        environ = getattr(self, "environ", {})  # set by setup_environ(), before the application runs
        log.error("answering %s failed", environ.get("PATH_INFO", "?")[:200], exc_info=exc_info)


class QuietHandler(WSGIRequestHandler):
    timeout = 10  # a client that connects and stalls (or never finishes a TLS handshake) frees its thread

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - no access log
        pass

    def handle(self) -> None:
        # WSGIRequestHandler.handle, with the handler above
        self.raw_requestline = self.rfile.readline(65537)
        if len(self.raw_requestline) > 65536:
            self.requestline = self.request_version = self.command = ""
            self.send_error(414)
            return
        if not self.parse_request():
            return
        handler = _ResponseHandler(
            self.rfile,
            self.wfile,  # type: ignore[arg-type]  # a socket's writer, as in WSGIRequestHandler
            self.get_stderr(),
            self.get_environ(),
            multithread=False,
        )
        handler.request_handler = self  # type: ignore[attr-defined]  # wsgiref's back-pointer for logging
        handler.run(self.server.get_app())  # type: ignore[attr-defined]


def landing_page(cfg: Config) -> bytes:
    path = html.escape(cfg.web.telemetry_path)
    return f"""<!doctype html><html><head><title>llamacpp-exporter</title></head><body>
<h1>llamacpp-exporter {html.escape(__version__)}</h1>
<p>Prometheus exporter for llama.cpp's llama-server: one record per request from its log and /slots.</p>
<ul><li><a href="{path}">{path}</a>: metrics</li>
<li><a href="/api/v1/conversations">/api/v1/conversations</a>: conversations by cost to the others (JSON, pseudonyms only)</li>
<li><a href="/-/healthy">/-/healthy</a>: the process answers; <a href="/-/ready">/-/ready</a>: the log follower, pipeline and poller run</li></ul>
</body></html>""".encode()


def make_app(
    registry: CollectorRegistry,
    cfg: Config,
    costs: ConversationCosts | None = None,
    ready: Callable[[], list[str]] | None = None,
    security: WebSecurity | None = None,
    answering: Answering | None = None,
    polled: Callable[[], str] | None = None,
):
    metrics_app = make_metrics_app(registry)
    answering = answering or Answering()
    page = landing_page(cfg)
    telemetry = cfg.web.telemetry_path

    def app(environ, start_response):
        if security is not None and not security.authorized(environ.get("HTTP_AUTHORIZATION")):
            start_response(
                "401 Unauthorized",
                [("Content-Type", "text/plain"), ("WWW-Authenticate", 'Basic realm="llamacpp-exporter"')],
            )
            return [b"Unauthorized\n"]
        path = environ.get("PATH_INFO", "/")
        if path == telemetry:
            with answering:
                return metrics_app(environ, start_response)
        if path == "/":
            start_response("200 OK", [("Content-Type", "text/html; charset=utf-8")])
            return [page]
        if path == "/api/v1/conversations" and costs is not None:
            with answering:
                body = json.dumps(
                    {
                        "window_seconds": costs.window,
                        "conversations": costs.snapshot(),
                        "contention": costs.contention(),
                    }
                ).encode()
            start_response("200 OK", [("Content-Type", "application/json")])
            return [body]
        if path in ("/-/healthy", "/healthz"):
            start_response("200 OK", [("Content-Type", "text/plain")])
            return [b"OK\n"]
        if path == "/-/ready":
            dead = ready() if ready is not None else []
            # which llama-server is polled, and why (--llama.url, the log, a default port)
            where = f"polling llama-server at {polled()}\n".encode() if polled is not None else b""
            if dead:
                start_response("503 Service Unavailable", [("Content-Type", "text/plain")])
                return [f"not ready: {', '.join(dead)} stopped\n".encode() + where]
            start_response("200 OK", [("Content-Type", "text/plain")])
            return [b"OK\n" + where]
        start_response("404 Not Found", [("Content-Type", "text/plain")])
        return [b"not found\n"]

    return app
