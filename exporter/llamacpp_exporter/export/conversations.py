"""Conversations: what each one costs the others.

A conversation is named by the client's X-Conversation-Id header or, without one, by cache
lineage (see assemble/attribution.py). Either way only its pseudonym (assemble/pseudonyms.py)
leaves this process.

``ConversationCosts`` keeps, per conversation, one-minute buckets of prefill seconds,
prompt tokens re-processed although the cache had offered them, and the decode time its
prefills overlapped on other slots. It is bounded (conversations and buckets) and serves
the top-N metrics, the JSON API and ``llamacpp-exporter top``.
"""

from __future__ import annotations

import heapq
import threading
import time
from collections import OrderedDict, deque
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any, Final

from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from ..records import ConversationProof, RequestRecord

OTHER: Final = "other"
BUCKET_SECONDS: Final = 60


@dataclass(slots=True)
class _Conversation:
    # [minute, prefill_s, cost_s, wasted, requests]; a list, not a deque: at most a window's
    # minutes, and a deque's block costs ~600 bytes more for each of thousands of conversations
    buckets: list[list[Any]] = field(default_factory=list)
    # the sums of the buckets still in the window (prefill_s, cost_s, wasted, requests): a
    # scrape reads them instead of summing every bucket of every conversation
    totals: list[Any] = field(default_factory=lambda: [0.0, 0.0, 0, 0])
    slot: int | None = None
    prompt_tokens: int | None = None
    reused_tokens: int | None = None
    miss_cause: str | None = None
    last_seen: float = 0.0


def _bucket(conv: _Conversation, now: float) -> list[Any]:
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
        self._convs: OrderedDict[str, _Conversation] = OrderedDict()  # least recently seen first
        self._all: deque[list[Any]] = deque()  # the tracked conversations' buckets summed per minute
        self._tpot: dict[str, deque[list[Any]]] = {"prefill": deque(), "none": deque()}  # [minute, sum_s, n]

    # ------------------------------------------------------------ updates (pipeline thread)
    def _conv(self, name: str, now: float) -> _Conversation:
        c = self._convs.get(name)
        if c is None:
            self._forget_idle(now)
            c = self._convs[name] = _Conversation()
            while len(self._convs) > self.max_conversations:
                _, gone = self._convs.popitem(last=False)
                for b in gone.buckets:  # no longer tracked: out of "other" too
                    g = next((x for x in self._all if x[0] == b[0]), None)
                    if g is not None:
                        for i in range(1, 5):
                            g[i] -= b[i]
        else:
            self._convs.move_to_end(name)
        c.last_seen = now
        return c

    def _forget_idle(self, now: float) -> None:
        """Conversations last seen before the window hold nothing a scrape shows: the memory
        follows the conversations of the window, not the bound, on a server that sees many."""
        oldest = self._oldest(now)
        while self._convs:
            first = next(iter(self._convs.values()))  # the least recently seen
            if int(first.last_seen // BUCKET_SECONDS) >= oldest:
                return
            self._convs.popitem(last=False)

    def _add(self, c: _Conversation, now: float, i: int, amount: float) -> None:
        """Add to field i (1 prefill_s, 2 cost_s, 3 wasted, 4 requests) of this minute."""
        b = _bucket(c, now)
        b[i] += amount
        c.totals[i - 1] += amount
        g = self._all
        if not g or g[-1][0] < b[0]:
            g.append([b[0], 0.0, 0.0, 0, 0])
        g[-1][i] += amount

    def record(self, rec: RequestRecord) -> None:
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
            if rec.conversation is not None:
                self._count(rec.conversation, rec, now)

    def proven(self, rec: RequestRecord, proof: ConversationProof) -> None:
        """A record that went out "uncertain" turned out to be this conversation's request."""
        now = self.clock()
        with self._lock:
            self._count(proof.conversation, rec, now)

    def _count(self, conversation: str, rec: RequestRecord, now: float) -> None:
        c = self._conv(conversation, now)
        self._add(c, now, 1, rec.prefill_seconds or 0.0)
        self._add(c, now, 3, rec.wasted_prompt_tokens or 0)
        self._add(c, now, 4, 1)
        c.slot, c.prompt_tokens, c.reused_tokens = rec.slot, rec.prompt_tokens, rec.reused_tokens
        if rec.miss_cause:
            c.miss_cause = rec.miss_cause
        self._expire_conv(c, self._oldest(now))

    def cost(self, conversation: str, seconds: float) -> None:
        now = self.clock()
        with self._lock:
            c = self._conv(conversation, now)
            self._add(c, now, 2, seconds)
            self._expire_conv(c, self._oldest(now))

    def _oldest(self, now: float) -> int:
        return int((now - self.window) // BUCKET_SECONDS)

    def _expire(self, buckets: deque[list[Any]], now: float) -> None:
        oldest = self._oldest(now)
        while buckets and buckets[0][0] < oldest:
            buckets.popleft()

    @staticmethod
    def _expire_conv(c: _Conversation, oldest: int) -> None:
        while c.buckets and c.buckets[0][0] < oldest:
            b = c.buckets.pop(0)
            for i in range(4):
                c.totals[i] -= b[i + 1]

    def _active(self, now: float) -> Iterator[tuple[str, _Conversation]]:
        """The conversations with a bucket in the window, most recently seen first, their
        totals brought up to date; stops at the first one seen before the window."""
        oldest = self._oldest(now)
        while self._all and self._all[0][0] < oldest:
            self._all.popleft()
        for name in reversed(self._convs):
            c = self._convs[name]
            if int(c.last_seen // BUCKET_SECONDS) < oldest:
                return
            self._expire_conv(c, oldest)
            yield name, c

    def top(self) -> tuple[list[dict[str, Any]], dict[str, float]]:
        """The top_n conversations by cost to the others (then prefill time, then name), and
        the rest summed: what a scrape needs, without summing every conversation's buckets."""
        now = self.clock()
        with self._lock:
            ranked = heapq.nsmallest(
                self.top_n, ((-c.totals[1], -c.totals[0], name, c) for name, c in self._active(now))
            )
            rows = [self._row(name, c, now) for _, _, name, c in ranked]
            every = [sum(b[i] for b in self._all) for i in range(1, 5)]
        rest = {
            key: max(0.0, round(every[i] - sum(r[key] for r in rows), 6))
            for i, key in enumerate(("prefill_seconds", "cost_to_others_seconds", "wasted_prompt_tokens", "requests"))
        }
        return rows, rest

    @staticmethod
    def _row(name: str, c: _Conversation, now: float) -> dict[str, Any]:
        return {
            "conversation": name,
            "slot": c.slot,
            "requests": int(c.totals[3]),
            "prompt_tokens": c.prompt_tokens,
            "reused_tokens": c.reused_tokens,
            "prefill_seconds": round(c.totals[0], 6),
            "wasted_prompt_tokens": int(c.totals[2]),
            "cost_to_others_seconds": round(c.totals[1], 6),
            "last_miss_cause": c.miss_cause,
            "last_seen_seconds_ago": round(now - c.last_seen, 1),
        }

    # ------------------------------------------------------------ reads (any thread)
    def snapshot(self) -> list[dict[str, Any]]:
        """Every conversation active in the window, most costly to the others first."""
        now = self.clock()
        with self._lock:
            rows = [self._row(name, c, now) for name, c in self._active(now)]
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
            top, rest = self.costs.top()
        except Exception:
            top, rest = [], {}
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
        for key, fam in fams.items():
            for r in top:
                fam.add_metric([r["conversation"]], r[key])
            fam.add_metric([OTHER], rest.get(key, 0.0))
        return list(fams.values())
