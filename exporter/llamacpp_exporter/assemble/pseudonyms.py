"""Conversation ids to pseudonyms: a client's X-Conversation-Id (or a lineage root) becomes a
salted HMAC before anything else sees it, so no label, record or file holds the raw id."""

from __future__ import annotations

import hashlib
import hmac
import secrets
from typing import Final

MAX_RECENT: Final = 1024  # ids whose pseudonym is kept (a few hundred kB at most)


class Pseudonymizer:
    """HMAC-SHA256 of the raw id under a salt, 12 hex digits. Without a configured salt a
    random one is drawn at start: pseudonyms are then stable only for this process."""

    def __init__(self, salt: str | None = None) -> None:
        self.random_salt = not salt
        self._key = (salt or secrets.token_hex(32)).encode()
        # the last ids' pseudonyms, in memory only: a conversation's every turn arrives with the
        # same id, and the HMAC (run in the interpreter) was a twentieth of the hot path's time
        self._recent: dict[str, str] = {}

    def __call__(self, raw: str) -> str:
        known = self._recent.get(raw)
        if known is not None:
            return known
        # hmac.new with hashlib's constructor, not hmac.digest(..., "sha256"): the one-shot call
        # made scrapes while the exporter caught up twice as slow at p99 (BENCHMARKS.md)
        name = "c" + hmac.new(self._key, raw.encode("utf-8", "replace"), hashlib.sha256).hexdigest()[:12]
        if len(self._recent) >= MAX_RECENT:
            del self._recent[next(iter(self._recent))]  # the longest known
        self._recent[raw] = name
        return name
