"""Conversations: pseudonymous identity, and what each one costs the others.

A conversation is named by the client's X-Conversation-Id header or, without one, by cache
lineage (see assemble.py). Either way only a salted HMAC of the name leaves this process.

``ConversationCosts`` keeps, per conversation, one-minute buckets of prefill seconds,
prompt tokens re-processed although the cache had offered them, and the decode time its
prefills overlapped on other slots. It is bounded (conversations and buckets) and serves
the top-N metrics, the JSON API and ``llamacpp-exporter top``.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import threading
import time
from collections import OrderedDict, deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from .records import RequestRecord

OTHER = "other"
BUCKET_SECONDS = 60


class Pseudonymizer:
    """HMAC-SHA256 of the raw id under a salt, 12 hex digits. Without a configured salt a
    random one is drawn at start: pseudonyms are then stable only for this process."""

    def __init__(self, salt: str | None = None) -> None:
        self.random_salt = not salt
        self._key = (salt or secrets.token_hex(32)).encode()

    def __call__(self, raw: str) -> str:
        return "c" + hmac.new(self._key, raw.encode("utf-8", "replace"), hashlib.sha256).hexdigest()[:12]


@dataclass(slots=True)
class _Conversation:
    buckets: deque = field(default_factory=deque)  # [minute, prefill_s, cost_s, wasted, requests]
    slot: int | None = None
    prompt_tokens: int | None = None
    reused_tokens: int | None = None
    miss_cause: str | None = None
    last_seen: float = 0.0


def _bucket(conv: _Conversation, now: float) -> list:
    minute = int(now // BUCKET_SECONDS)
    if not conv.buckets or conv.buckets[-1][0] != minute:
        conv.buckets.append([minute, 0.0, 0.0, 0, 0])
    return conv.buckets[-1]


class ConversationCosts:
    def __init__(
        self,
        window_seconds: float = 900.0,
        top_n: int = 10,
        max_conversations: int = 10000,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.window = window_seconds
        self.top_n = top_n
        self.max_conversations = max_conversations
        self.clock = clock
        self._lock = threading.Lock()
        self._convs: OrderedDict[str, _Conversation] = OrderedDict()
        self._tpot: dict[str, deque] = {"prefill": deque(), "none": deque()}  # [minute, sum_s, n]

    # ------------------------------------------------------------ updates (pipeline thread)
    def _conv(self, name: str, now: float) -> _Conversation:
        c = self._convs.get(name)
        if c is None:
            c = self._convs[name] = _Conversation()
            while len(self._convs) > self.max_conversations:
                self._convs.popitem(last=False)
        else:
            self._convs.move_to_end(name)
        c.last_seen = now
        return c

    def request(self, rec: RequestRecord) -> None:
        now = self.clock()
        with self._lock:
            if rec.time_per_output_token_seconds is not None and rec.contention in self._tpot:
                d = self._tpot[rec.contention]
                minute = int(now // BUCKET_SECONDS)
                if not d or d[-1][0] != minute:
                    d.append([minute, 0.0, 0])
                d[-1][1] += rec.time_per_output_token_seconds
                d[-1][2] += 1
                self._expire(d, now)
            if rec.conversation is None:
                return
            c = self._conv(rec.conversation, now)
            b = _bucket(c, now)
            b[1] += rec.prefill_seconds or 0.0
            b[3] += rec.wasted_prompt_tokens or 0
            b[4] += 1
            c.slot, c.prompt_tokens, c.reused_tokens = rec.slot, rec.prompt_tokens, rec.reused_tokens
            if rec.miss_cause:
                c.miss_cause = rec.miss_cause
            self._expire(c.buckets, now)

    def cost(self, conversation: str, seconds: float) -> None:
        now = self.clock()
        with self._lock:
            c = self._conv(conversation, now)
            _bucket(c, now)[2] += seconds
            self._expire(c.buckets, now)

    def _expire(self, buckets: deque, now: float) -> None:
        oldest = int((now - self.window) // BUCKET_SECONDS)
        while buckets and buckets[0][0] < oldest:
            buckets.popleft()

    # ------------------------------------------------------------ reads (any thread)
    def snapshot(self) -> list[dict[str, Any]]:
        """Every conversation active in the window, most costly to the others first."""
        now = self.clock()
        oldest = int((now - self.window) // BUCKET_SECONDS)
        rows = []
        with self._lock:
            for name, c in self._convs.items():
                bs = [b for b in c.buckets if b[0] >= oldest]
                if not bs:
                    continue
                rows.append(
                    {
                        "conversation": name,
                        "slot": c.slot,
                        "requests": sum(b[4] for b in bs),
                        "prompt_tokens": c.prompt_tokens,
                        "reused_tokens": c.reused_tokens,
                        "prefill_seconds": round(sum(b[1] for b in bs), 6),
                        "wasted_prompt_tokens": sum(b[3] for b in bs),
                        "cost_to_others_seconds": round(sum(b[2] for b in bs), 6),
                        "last_miss_cause": c.miss_cause,
                        "last_seen_seconds_ago": round(now - c.last_seen, 1),
                    }
                )
        rows.sort(key=lambda r: (-r["cost_to_others_seconds"], -r["prefill_seconds"], r["conversation"]))
        return rows

    def contention(self) -> dict[str, Any]:
        """Time per output token while another slot prefills vs while none does."""
        now = self.clock()
        oldest = int((now - self.window) // BUCKET_SECONDS)
        out = {}
        with self._lock:
            for label, d in self._tpot.items():
                s = sum(b[1] for b in d if b[0] >= oldest)
                n = sum(b[2] for b in d if b[0] >= oldest)
                mean = s / n if n else None
                out[label] = {
                    "requests": n,
                    "mean_time_per_output_token_seconds": round(mean, 6) if mean else None,
                    "tokens_per_second": round(1 / mean, 2) if mean else None,
                }
        return {"window_seconds": self.window, "while_other_slot_prefills": out["prefill"], "otherwise": out["none"]}


class ConversationCollector(Collector):
    """Top-N conversations by cost to the others over the window, the rest summed as "other".
    Computed at scrape time from the bounded store; never raises."""

    def __init__(self, costs: ConversationCosts) -> None:
        self.costs = costs

    def collect(self) -> Iterable[GaugeMetricFamily]:
        try:
            rows = self.costs.snapshot()
        except Exception:
            rows = []
        w = int(self.costs.window)
        fams = {
            "cost_to_others_seconds": GaugeMetricFamily(
                "llamacpp_conversation_cost_to_others_seconds",
                f"Decode seconds of other slots overlapped by this conversation's prefills over the last {w} s "
                "(top conversations by this cost, the rest as other).",
                labels=["conversation"],
            ),
            "prefill_seconds": GaugeMetricFamily(
                "llamacpp_conversation_prefill_seconds",
                f"Prefill seconds of the conversation over the last {w} s.",
                labels=["conversation"],
            ),
            "wasted_prompt_tokens": GaugeMetricFamily(
                "llamacpp_conversation_wasted_prompt_tokens",
                f"Prompt tokens the slot or the RAM cache offered but that were computed again, over the last {w} s.",
                labels=["conversation"],
            ),
            "requests": GaugeMetricFamily(
                "llamacpp_conversation_requests",
                f"Requests of the conversation over the last {w} s.",
                labels=["conversation"],
            ),
        }
        top, rest = rows[: self.costs.top_n], rows[self.costs.top_n :]
        for key, fam in fams.items():
            for r in top:
                fam.add_metric([r["conversation"]], r[key])
            fam.add_metric([OTHER], sum(r[key] for r in rest))
        return list(fams.values())
