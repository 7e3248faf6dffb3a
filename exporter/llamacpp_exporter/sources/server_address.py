"""Where llama-server is polled, and why: --llama.url, the log's ``listening on`` line, or
llama-server's default ports tried in turn. Says so in the exporter's log when it changes."""

from __future__ import annotations

import logging
from typing import Final
from urllib.parse import urlsplit

from ..config import redact

log = logging.getLogger(__name__)


# llama-server's default port: 8080 up to b11434, 9931 from b11549 on (common/common.h)
DEFAULT_PORTS: Final = (8080, 9931)


def polled_url(listening: str) -> str | None:
    """The URL to poll for a server whose log says ``listening on <url>``: an address bound to
    every interface (0.0.0.0, ::) is reached on loopback. None for what is not an HTTP URL."""
    try:
        parts = urlsplit(listening)
        port = parts.port
    except ValueError:
        return None
    if parts.scheme not in ("http", "https") or not parts.hostname or port is None:
        return None
    host = {"0.0.0.0": "127.0.0.1", "::": "[::1]"}.get(parts.hostname, parts.hostname)
    if ":" in host and not host.startswith("["):
        host = f"[{host}]"
    return f"{parts.scheme}://{host}:{port}"


class ServerAddress:
    """Where llama-server is polled, and why. --llama.url when given. Else the address of the
    log's ``listening on`` line once it has been read (a restart on another port included);
    until then llama-server's default ports on loopback, 8080 and then 9931, each tried in turn
    until one answers. Read by the poller threads, set by them and by the pipeline thread: the
    pair (url, reason) is replaced whole."""

    def __init__(self, configured: str | None) -> None:
        self.configured = configured.rstrip("/") if configured else None
        self._candidates = [f"http://127.0.0.1:{port}" for port in DEFAULT_PORTS]
        self._probing = self.configured is None
        self._warned_log: str | None = None
        if self.configured is not None:
            self._now = (self.configured, "given by --llama.url")
        else:
            self._now = (self._candidates[0], self._trying())

    def _trying(self) -> str:
        return (
            "no --llama.url given and no 'listening on' line read from the log yet: trying llama-server's "
            "default ports, 8080 and 9931 (its default from b11549 on), until one answers"
        )

    @property
    def url(self) -> str:
        return self._now[0]

    def describe(self) -> str:
        url, reason = self._now
        return f"{redact(url)} ({reason})"

    def from_log(self, listening: str) -> None:
        """The log's ``listening on`` line of the server (not of a router's child)."""
        url = polled_url(listening)
        if url is None:
            return
        if self.configured is not None:
            configured_port = urlsplit(self.configured).port or (443 if self.configured.startswith("https") else 80)
            if urlsplit(url).port != configured_port and self._warned_log != url:
                self._warned_log = url
                log.warning(
                    "the log says llama-server listens on %s, but --llama.url is %s: check --llama.url "
                    "(llama-server's default port is 9931 from b11549 on, 8080 before)",
                    listening,
                    redact(self.configured),
                )
            return
        self._probing = False
        if url != self._now[0] or not self._now[1].startswith("from the log"):
            self._now = (url, f"from the log's 'listening on {listening}' line")
            log.info("polling llama-server at %s", self.describe())

    def unreachable(self, url: str) -> None:
        """Nothing listens at ``url`` (the connection was refused or timed out)."""
        if self._probing and url == self._now[0]:
            i = self._candidates.index(url) if url in self._candidates else -1
            self._now = (self._candidates[(i + 1) % len(self._candidates)], self._trying())

    def answered(self, url: str) -> None:
        """llama-server (or something) answered at ``url``."""
        if self._probing and url == self._now[0]:
            self._probing = False
            port = urlsplit(url).port
            self._now = (url, f"no --llama.url given: it answered on llama-server's default port {port}")
            log.info("polling llama-server at %s", self.describe())
