"""One GET of a llama-server endpoint, read under a size cap and a total deadline: a slow or
huge answer is refused, never buffered whole or waited for without end. Transport only: what
the answer means, and what the operator is told, is the poller's."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from typing import Any

import httpx


class Answer:
    """The part of an HTTP answer the poller uses, read under a size cap and a deadline."""

    def __init__(self, status_code: int, content: bytes) -> None:
        self.status_code = status_code
        self.content = content

    @property
    def text(self) -> str:
        return self.content.decode("utf-8", errors="replace")

    def json(self) -> Any:
        return json.loads(self.content)


@dataclass(frozen=True)
class Fetched:
    """What came of a GET: the answer (None: none read), the error (None: HTTP 200), whether
    nothing listened at the address, whether the answer was over the cap."""

    answer: Answer | None
    error: str | None
    unreachable: bool = False
    oversized: bool = False


def fetch(
    client: httpx.Client,
    url: str,
    params: dict[str, str] | None,
    deadline: float,
    connect_timeout: float,
    max_bytes: int,
) -> Fetched:
    t0 = time.monotonic()
    timeout = httpx.Timeout(deadline, connect=connect_timeout)
    try:
        with client.stream("GET", url, params=params, timeout=timeout) as resp:
            body = bytearray()
            for chunk in resp.iter_bytes():
                body += chunk
                if len(body) > max_bytes:
                    return Fetched(None, f"answer larger than {max_bytes} bytes", oversized=True)
                if time.monotonic() - t0 > deadline:
                    return Fetched(None, f"answer took longer than {deadline:g} s")
            answer = Answer(resp.status_code, bytes(body))
    except (httpx.ConnectError, httpx.ConnectTimeout) as e:
        return Fetched(None, type(e).__name__, unreachable=True)
    except httpx.HTTPError as e:
        return Fetched(None, type(e).__name__)
    return Fetched(answer, None if answer.status_code == 200 else f"HTTP {answer.status_code}")
