"""The exporter's HTTP server: /metrics (exposition.py), the landing page, the
conversations API, /-/healthy and /-/ready, behind the optional basic auth of
--web.config.file. A front door reads each request's header (and TLS handshake) on one thread,
bounded in time and number, and hands complete requests to threads: idle, slow or hostile
clients never keep a scrape from being answered, and it never spins when out of descriptors."""

from __future__ import annotations

import errno
import html
import io
import json
import logging
import os
import selectors
import socket
import ssl
import sys
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable
from socketserver import ThreadingMixIn
from typing import TYPE_CHECKING, Any
from wsgiref.simple_server import ServerHandler, WSGIRequestHandler, WSGIServer

from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from .. import __version__
from ..config import Config
from .conversations import ConversationCosts
from .exposition import make_metrics_app
from .web_config import WebConfigFile

if TYPE_CHECKING:
    from _typeshed.wsgi import StartResponse, WSGIApplication, WSGIEnvironment

log = logging.getLogger(__name__)

# While a request is served, the interpreter switches threads every 0.5 ms instead of 5: a
# pipeline catching up on a long log holds the interpreter lock, and each of the dozen times a
# request waits for it (accept, read, render, send) would cost up to the whole interval.
SERVING_SWITCH_INTERVAL = 0.0005
MAX_CONNECTIONS = 256  # requests answered at once, a thread each; more are closed at once
HEADER_TIMEOUT = 5.0  # a request's header (and TLS handshake) must arrive whole within this of its connection
MAX_WAITING = 4096  # connections waiting for their header; past it the oldest is closed
MAX_HEADER_BYTES = 64 << 10  # a longer request header is answered 431 (or 414, a longer URL) and closed
# After that answer the connection is shut for writing and what the client still sends is read and
# dropped for up to this long before it is closed: closing with unread bytes would reset it, and
# the client would lose the answer (Go's server waits so too)
LINGER_SECONDS = 1.0


def _max_waiting() -> int:
    """MAX_WAITING, or half the open-file limit where that is less: the other half stays for
    answering (a request's thread reads /proc, the log, the events file, llama-server)."""
    try:
        import resource

        soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    except (ImportError, ValueError, OSError):
        return MAX_WAITING
    if soft == resource.RLIM_INFINITY:
        return MAX_WAITING
    return max(16, min(MAX_WAITING, soft // 2))


def _spare_descriptor() -> int | None:
    try:
        return os.open(os.devnull, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None


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


class _Waiting:
    """A connection whose request header has not arrived whole yet: no thread is spent on it."""

    __slots__ = ("address", "deadline", "header", "handshaking")

    def __init__(self, address: Any, deadline: float, handshaking: bool) -> None:
        self.address = address
        self.deadline = deadline
        self.header = bytearray()
        self.handshaking = handshaking


def _too_large_answer(header: bytes) -> bytes:
    """What Go's server (node_exporter's) answers a header past its limit: 414 while the request
    line itself has not ended, else 431."""
    status = "431 Request Header Fields Too Large" if b"\n" in header else "414 URI Too Long"
    body = status.encode()
    head = f"HTTP/1.1 {status}\r\nContent-Type: text/plain; charset=utf-8\r\nContent-Length: {len(body)}\r\n"
    return (head + "Connection: close\r\n\r\n").encode() + body


class _Lingering:
    """A connection answered and shut for writing: its client's last bytes are read and dropped
    until it closes, or until the deadline."""

    __slots__ = ("deadline",)

    def __init__(self, deadline: float) -> None:
        self.deadline = deadline


class _Arrived:
    """A connection whose request header has arrived, with the bytes already read of it."""

    __slots__ = ("sock", "read")

    def __init__(self, sock: socket.socket, read: bytes) -> None:
        self.sock = sock
        self.read = read


class _AlreadyRead(io.RawIOBase):
    """The request as the handler reads it: the bytes the front door read, then the socket."""

    def __init__(self, read: bytes, sock: socket.socket) -> None:
        self._read = memoryview(read)
        self._sock = sock

    def readable(self) -> bool:
        return True

    def readinto(self, b: Any) -> int:
        if self._read:
            n = min(len(b), len(self._read))
            b[:n] = self._read[:n]
            self._read = self._read[n:]
            return n
        return self._sock.recv_into(b)


# Why a connection was closed before a request of it was served (llamacpp_exporter_http_connections_closed_total)
CLOSED_REASONS = ("header_timeout", "header_too_large", "waiting_limit", "descriptors", "busy")


class ThreadingWSGIServer(ThreadingMixIn, WSGIServer):
    """The front door, as Go's HTTP server keeps it (node_exporter's): one thread accepts every
    connection and reads its request header (and its TLS handshake) without blocking; a
    connection costs a thread only once its header has arrived whole. The header must arrive
    within HEADER_TIMEOUT; at most MAX_WAITING connections (or half the open-file limit) wait for
    theirs (past that the oldest is closed, never the new one); out of file descriptors, the oldest waiting connection
    is closed to make room, and with none waiting one spare descriptor lets the new connection
    be accepted and closed, so the loop never spins. Each connection closed so is counted."""

    daemon_threads = True
    request_queue_size = 1024  # the listen backlog: socketserver's 5 drops connections under a burst of scrapes

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._slots = threading.BoundedSemaphore(MAX_CONNECTIONS)
        self.closed = dict.fromkeys(CLOSED_REASONS, 0)
        self.switching = _FastSwitching()
        # TLS: each connection's handshake is done here, with the context in force when it came
        self.tls: Callable[[], ssl.SSLContext | None] | None = None
        self._waiting: OrderedDict[socket.socket, _Waiting] = OrderedDict()  # the oldest first
        self._lingering: OrderedDict[socket.socket, _Lingering] = OrderedDict()  # the oldest first
        self.max_waiting = _max_waiting()
        self._selector = selectors.DefaultSelector()
        self._spare: int | None = _spare_descriptor()
        self._accept_paused_until = 0.0
        self._stop = threading.Event()
        self._stopped = threading.Event()
        self._stopped.set()

    @property
    def connections_refused(self) -> int:
        return sum(self.closed.values())

    def serve_forever(self, poll_interval: float = 0.5) -> None:
        self._stop.clear()
        self._stopped.clear()
        self.socket.setblocking(False)
        self._selector.register(self.socket, selectors.EVENT_READ, None)
        try:
            while not self._stop.is_set():
                now = time.monotonic()
                wait = poll_interval
                if self._waiting:
                    wait = min(wait, max(0.0, next(iter(self._waiting.values())).deadline - now))
                if self._lingering:
                    wait = min(wait, max(0.0, next(iter(self._lingering.values())).deadline - now))
                if now < self._accept_paused_until:
                    wait = min(wait, self._accept_paused_until - now)
                for key, _events in self._selector.select(wait):
                    if key.data is None:
                        self._accept()
                    elif isinstance(key.data, _Lingering):
                        self._drain(key.fileobj)  # type: ignore[arg-type]
                    else:
                        self._read_header(key.fileobj, key.data)  # type: ignore[arg-type]
                self._expire(time.monotonic())
        finally:
            self._selector.unregister(self.socket)
            for conn in list(self._waiting):
                self._close_waiting(conn)
            for conn in list(self._lingering):
                self._close_lingering(conn)
            self._stopped.set()

    def shutdown(self) -> None:
        self._stop.set()
        self._stopped.wait()

    def _accept(self) -> None:
        if time.monotonic() < self._accept_paused_until:
            return
        for _ in range(64):  # a burst of connections, then the waiting ones get their turn
            try:
                conn, address = self.socket.accept()
            except BlockingIOError:
                return
            except OSError as e:
                if e.errno not in (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM):
                    return  # the client left before it was accepted
                if self._waiting:  # room for the new connection: the oldest waiting one goes
                    self._close_waiting(next(iter(self._waiting)), "descriptors")
                    continue
                self._refuse_one()
                return
            if len(self._waiting) >= self.max_waiting:
                self._close_waiting(next(iter(self._waiting)), "waiting_limit")
            conn.setblocking(False)
            ctx = self.tls() if self.tls is not None else None
            handshaking = ctx is not None
            if ctx is not None:
                try:
                    conn = ctx.wrap_socket(conn, server_side=True, do_handshake_on_connect=False)
                except OSError:
                    conn.close()
                    continue
            self._waiting[conn] = w = _Waiting(address, time.monotonic() + HEADER_TIMEOUT, handshaking)
            self._selector.register(conn, selectors.EVENT_READ, w)

    def _refuse_one(self) -> None:
        """Out of descriptors with none waiting (every connection is being answered): the spare
        descriptor lets one pending connection be accepted and closed; else accepting pauses."""
        if self._spare is not None:
            os.close(self._spare)
            self._spare = None
            try:
                conn, _ = self.socket.accept()
                conn.close()
                self.closed["descriptors"] += 1
                return
            except OSError:
                pass
            finally:
                self._spare = _spare_descriptor()
        self._accept_paused_until = time.monotonic() + 0.1  # never spin on a full descriptor table

    def _read_header(self, conn: socket.socket, w: _Waiting) -> None:
        try:
            if w.handshaking:
                conn.do_handshake()  # type: ignore[attr-defined]
                w.handshaking = False
            while True:
                data = conn.recv(65536)
                if not data:
                    self._close_waiting(conn)  # the client left
                    return
                w.header += data
                if b"\r\n\r\n" in w.header or b"\n\n" in w.header:
                    self._selector.unregister(conn)
                    del self._waiting[conn]
                    conn.setblocking(True)
                    self.process_request(_Arrived(conn, bytes(w.header)), w.address)
                    return
                if len(w.header) > MAX_HEADER_BYTES:
                    self._answer_too_large(conn, w)
                    return
        except (BlockingIOError, ssl.SSLWantReadError, ssl.SSLWantWriteError):
            return  # more later (a handshake that wants to write finds room at the next read)
        except OSError:  # a failed handshake, a reset: the client's doing
            log.debug("connection from %s failed", w.address, exc_info=True)
            self._close_waiting(conn)

    def _answer_too_large(self, conn: socket.socket, w: _Waiting) -> None:
        """Answer 431 (or 414), shut the connection for writing, and read what the client still
        sends until it closes (LINGER_SECONDS at most), then close it."""
        self._waiting.pop(conn, None)
        self._selector.unregister(conn)
        self.closed["header_too_large"] += 1
        try:
            conn.send(_too_large_answer(bytes(w.header[:MAX_HEADER_BYTES])))  # a few hundred bytes: room in any buffer
            conn.shutdown(socket.SHUT_WR)
        except OSError:  # the client left, or a TLS record that wants more: nothing to wait for
            conn.close()
            return
        if len(self._lingering) >= self.max_waiting:
            self._close_lingering(next(iter(self._lingering)))
        self._lingering[conn] = li = _Lingering(time.monotonic() + LINGER_SECONDS)
        self._selector.register(conn, selectors.EVENT_READ, li)

    def _drain(self, conn: socket.socket) -> None:
        try:
            for _ in range(16):  # a bounded share of the loop: 1 MiB per turn at most
                if not conn.recv(65536):
                    break
            else:
                return
        except (BlockingIOError, ssl.SSLWantReadError, ssl.SSLWantWriteError):
            return
        except OSError:
            pass
        self._close_lingering(conn)

    def _close_lingering(self, conn: socket.socket) -> None:
        self._lingering.pop(conn, None)
        self._close(conn)

    def _close(self, conn: socket.socket) -> None:
        try:
            self._selector.unregister(conn)
        except (KeyError, ValueError):
            pass
        conn.close()

    def _expire(self, now: float) -> None:
        while self._lingering:
            conn, li = next(iter(self._lingering.items()))
            if li.deadline > now:
                break
            self._close_lingering(conn)
        while self._waiting:
            conn, w = next(iter(self._waiting.items()))
            if w.deadline > now:
                return
            self._close_waiting(conn, "header_timeout")

    def _close_waiting(self, conn: socket.socket, reason: str | None = None) -> None:
        self._waiting.pop(conn, None)
        self._close(conn)
        if reason is not None:
            self.closed[reason] += 1

    def process_request(self, request: Any, client_address: Any) -> None:
        if not self._slots.acquire(blocking=False):
            self.closed["busy"] += 1
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

    def shutdown_request(self, request: Any) -> None:
        super().shutdown_request(request.sock if isinstance(request, _Arrived) else request)

    def handle_error(self, request: Any, client_address: Any) -> None:
        # a client that failed the TLS handshake or hung up: not the exporter's error
        log.debug("connection from %s failed", client_address, exc_info=True)


class ConnectionsCollector(Collector):
    """The front door's counts, read at each scrape (never raising): connections closed without
    an answer, by reason, and those waiting for their request header now."""

    def __init__(self, server: Callable[[], ThreadingWSGIServer | None]) -> None:
        self.server = server

    def describe(self) -> list[Metric]:
        return list(self._families(None))

    def collect(self) -> list[Metric]:
        try:
            return list(self._families(self.server()))
        except Exception:  # never fail a scrape
            return []

    def _families(self, srv: ThreadingWSGIServer | None) -> Iterable[Metric]:
        closed = CounterMetricFamily(
            "llamacpp_exporter_http_connections_closed",
            "Connections to the exporter closed before a request of theirs was served: header_timeout (the "
            "request header did not arrive whole in time), header_too_large (answered 431, or 414 for a URL, "
            "then closed), waiting_limit (too many waited for their header: the oldest went), descriptors (out "
            "of file descriptors: the oldest waiting one went, or the new one), busy (every request thread was "
            "answering).",
            labels=["reason"],
        )
        for reason in CLOSED_REASONS:
            closed.add_metric([reason], srv.closed[reason] if srv is not None else 0)
        yield closed
        yield GaugeMetricFamily(
            "llamacpp_exporter_http_connections_waiting",
            "Connections to the exporter whose request header has not arrived whole yet (no thread is spent on them).",
            value=len(srv._waiting) if srv is not None else 0,
        )


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
    timeout = 10  # a client that stalls in its request's body or while it is answered frees its thread

    def setup(self) -> None:
        read = b""
        if isinstance(self.request, _Arrived):  # from the front door, its header already read
            read, self.request = self.request.read, self.request.sock
        super().setup()
        if read:
            self.rfile.close()
            self.rfile = io.BufferedReader(_AlreadyRead(read, self.connection))

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
    web: WebConfigFile | None = None,
    answering: Answering | None = None,
    polled: Callable[[], str] | None = None,
) -> WSGIApplication:
    metrics_app = make_metrics_app(registry)
    answering = answering or Answering()
    page = landing_page(cfg)
    telemetry = cfg.web.telemetry_path

    def app(environ: WSGIEnvironment, start_response: StartResponse) -> Iterable[bytes]:
        security = web.current() if web is not None else None
        if security is not None and security.headers:
            respond = start_response

            def start_response(status: str, headers: list[tuple[str, str]], exc_info: Any = None) -> Any:
                return respond(status, [*headers, *security.headers], exc_info)

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
