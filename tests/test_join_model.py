"""The header join against a model of llama-server: never a wrong name.

INVENTED: a small discrete-event model of what llama-server b11434 does between a request's
``conv_id=`` line and its launch (the rules in join.py): HTTP threads tokenize concurrently
and take ids in the order they finish, chat requests log ``chat format`` after their id,
other clients' /slots and /metrics requests take ids silently (and sometimes log a cancel),
the main loop tries queued tasks between batches of random length, defers tasks that find
their slots busy (logging the busy-slot lines), sends one deferred task back per release
(preferring one pinned to the released slot), and removes queued tasks whose clients gave up
(logging ``cancel task``), and logs ``all slots are idle`` when an iteration that tried
the queue finds nothing running (server-context.cpp:3023). Some requests are rejected before or
after taking their id. A named request's prompt may contain its conversation's last finished
state whole (the RAM cache or the slot offers it: the ``continues`` share of the mix).

The join sees exactly what the log would show and must never name a request's task after
another request; the test also reports how many tasks it could name.
"""

from __future__ import annotations

import heapq
import random
from dataclasses import dataclass, field
from typing import Any

import pytest

from llamacpp_exporter.assemble.join import HEADER, ID_DELAY_US, NONE, UNCERTAIN, HeaderJoin

MS = 1000


@dataclass
class Req:
    name: str
    chat: bool
    pinned: int | None
    work: int  # main-loop iterations it runs
    gives_up_us: int | None  # client gives up this long after posting, if still queued
    reject: str | None  # None, "before_id", "after_id"
    task: int | None = None
    done: bool = False
    prefilled: bool = False


@dataclass(order=True)
class Ev:
    t: int
    seq: int
    kind: str = field(compare=False)
    obj: Any = field(compare=False, default=None)


@dataclass
class Mix:
    """What the clients and the server do, as shares of requests."""

    chat: float = 0.7  # chat requests (a "chat format" line after the id); the rest /completion
    pinned: float = 0.2  # id_slot
    gives_up: float = 0.15  # clients that give up; cancelled if still queued
    rejected: float = 0.04  # rejected before or after taking the id (half each)
    long_tokenizing: float = 0.03  # up to ID_DELAY_US instead of up to 50 ms
    other_cancels: float = 0.2  # other clients' /slots or /metrics requests that log a cancel
    mean_gap_ms: int = 1000
    continues: float = 0.0  # a named request whose prompt contains its conversation's last state


STRESS = Mix()
CHAT = Mix(chat=1.0, gives_up=0.0, rejected=0.0, long_tokenizing=0.0, other_cancels=0.0)
CHAT_CANCELS = Mix(chat=1.0, gives_up=0.05, rejected=0.0, long_tokenizing=0.0, other_cancels=0.0)
# A multi-user server as issue 18 describes it: chat clients with and without ids (a fifth of the
# traffic is /completion), some pinned, a tenth giving up while queued, other clients polling
# /slots (some of whose polls time out: cancel lines), and conversations that continue their
# last state (the RAM cache or the slot offers it whole) on most turns.
MIXED = Mix(chat=0.8, pinned=0.1, gives_up=0.1, rejected=0.0, long_tokenizing=0.0, other_cancels=0.1, continues=0.8)


def simulate(
    seed: int, n_slots: int = 2, mix: Mix = STRESS, n_requests: int = 60, details: dict[str, Any] | None = None
) -> Tally:
    rng = random.Random(seed)
    j = HeaderJoin()
    j.n_slots = n_slots
    j.start_of_process()
    evs: list[Ev] = []
    seq = [0]

    def at(t: int, kind: str, obj: Any = None) -> None:
        seq[0] += 1
        heapq.heappush(evs, Ev(t, seq[0], kind, obj))

    next_id = [0]
    queue: list[Any] = []  # tasks posted, in order (front first): Req or "metrics"
    last_done: dict[str, int] = {}  # conversation -> its last finished task
    busy_before = [False]
    deferred: list[Req] = []
    slots: list[Req | None] = [None] * n_slots
    truth: dict[int, str] = {}
    names = ["", "a", "b", "c", "d"]

    t = 0
    for _ in range(n_requests):
        t += int(rng.expovariate(1 / mix.mean_gap_ms) * MS)
        at(
            t,
            "arrive",
            Req(
                name=rng.choice(names),
                chat=rng.random() < mix.chat,
                pinned=rng.randrange(n_slots) if rng.random() < mix.pinned else None,
                work=rng.randint(1, 6),
                gives_up_us=int(rng.uniform(0.2, 3) * 1e6) if rng.random() < mix.gives_up else None,
                reject=rng.choice(["before_id", "after_id"]) if rng.random() < mix.rejected else None,
            ),
        )
    for _ in range(n_requests // 2):  # other clients' /slots and /metrics requests
        at(rng.randrange(t + 1), "metrics", rng.random() < mix.other_cancels)
    at(0, "main")

    def idle() -> bool:
        return all(s is None for s in slots)

    def attempt(r: Req) -> None:
        if r.pinned is not None:
            j.slot_selected(r.pinned, True, now)
            if slots[r.pinned] is not None:
                j.slot_busy(r.pinned, now)
                deferred.append(r)
                return
            slot = r.pinned
        else:
            free = [s for s in range(n_slots) if slots[s] is None]
            for s in range(n_slots):
                if slots[s] is not None:
                    j.slot_busy(s, now)
            if not free:
                deferred.append(r)
                return
            slot = free[0]
            j.slot_selected(slot, False, now)
        all_idle = idle()
        slots[slot] = r
        # the RAM cache or the slot offers the conversation's last state, contained whole
        cont = r.name and r.name in last_done and rng.random() < mix.continues
        assert r.task is not None
        j.launched(r.task, now, all_idle, (last_done[r.name],) if cont else ())

    while evs:
        ev = heapq.heappop(evs)
        now = ev.t
        if ev.kind == "arrive":
            r = ev.obj
            j.arrival(r.name, now, idle())
            if r.reject != "before_id":
                # tokenizing: milliseconds, now and then long (under ID_DELAY_US, the rule)
                tok = (
                    rng.randint(0, ID_DELAY_US // MS - 1) if rng.random() < mix.long_tokenizing else rng.randint(0, 50)
                )
                at(now + tok * MS, "take_id", r)
        elif ev.kind == "take_id":
            r = ev.obj
            r.task = next_id[0]
            next_id[0] += 1
            truth[r.task] = r.name
            if r.chat:
                at(now + rng.randint(0, 2) * MS, "chat_format", r)
            elif r.reject != "after_id":
                at(now + rng.randint(0, 2) * MS, "post", r)
        elif ev.kind == "chat_format":
            j.params_read(now)
            if ev.obj.reject != "after_id":
                at(now + rng.randint(0, 2) * MS, "post", ev.obj)
        elif ev.kind == "post":
            r = ev.obj
            queue.append(r)
            if r.gives_up_us is not None:
                at(now + r.gives_up_us, "give_up", r)
        elif ev.kind == "give_up":
            r = ev.obj
            if r in queue or r in deferred:  # noticed while still waiting: cancelled
                (queue if r in queue else deferred).remove(r)
                j.cancelled(r.task)
                next_id[0] += 1  # the cancel task's own id
        elif ev.kind == "metrics":
            task = next_id[0]
            next_id[0] += 1
            if ev.obj:  # its client timed out while the main loop was busy: a cancel line
                j.cancelled(task)
                next_id[0] += 1
            else:
                queue.append("metrics")  # the main loop wakes for it
        elif ev.kind == "main":
            woke = bool(queue) or busy_before[0]
            while queue:
                item = queue.pop(0)
                if item != "metrics":
                    attempt(item)
            if idle() and woke:  # update_slots finds nothing to run (server-context.cpp:3023)
                j.all_slots_idle(now)
            busy_before[0] = not idle()
            duration = (rng.randint(50, 3000) if rng.random() < 0.1 else rng.randint(5, 50)) * MS
            at(now + duration, "end_batch")
        elif ev.kind == "end_batch":
            if any(r is not None and not r.prefilled for r in slots):
                j.batch_line()  # a prompt batch logs its progress (update_slots)
            for s in range(n_slots):
                r = slots[s]
                if r is not None:
                    r.prefilled = True
                    r.work -= 1
                    if r.work <= 0:
                        slots[s] = None
                        r.done = True
                        if r.name and r.task is not None:
                            last_done[r.name] = r.task
                        j.released(s, now)
                        if deferred:  # one deferred task back to the front of the queue
                            k = next((i for i, d in enumerate(deferred) if d.pinned == s), 0)
                            queue.insert(0, deferred.pop(k))
            if evs or queue or deferred or any(slots):
                at(now + rng.randint(0, 5) * MS, "main")
    j.tick(now + 60_000_000, True)

    tally = Tally()
    for task, name in truth.items():
        res = j.result(task)
        if res is None:
            continue  # never launched (cancelled or rejected)
        source, got = res
        if source == UNCERTAIN:
            tally.uncertain[bool(name)] += 1
        elif (source == HEADER and got == name and name) or (source == NONE and name == ""):
            tally.right[bool(name)] += 1
        else:
            tally.wrong += 1
            if details is not None:
                details.setdefault("wrong", []).append((task, name, res))
    if details is not None:
        details["truth"] = truth
    return tally


@dataclass
class Tally:
    """Launched tasks by what the join said, [without an id, with an id]."""

    right: list[int] = field(default_factory=lambda: [0, 0])
    uncertain: list[int] = field(default_factory=lambda: [0, 0])
    wrong: int = 0

    def add(self, other: Tally) -> None:
        for k in (0, 1):
            self.right[k] += other.right[k]
            self.uncertain[k] += other.uncertain[k]
        self.wrong += other.wrong

    def coverage(self, with_id: bool | None = None) -> float:
        """Share named right: of the tasks whose request sent an id (True), sent none (False), all (None)."""
        ks = (0, 1) if with_id is None else (int(with_id),)
        right = sum(self.right[k] for k in ks)
        return right / max(1, right + sum(self.uncertain[k] for k in ks))

    def __str__(self) -> str:
        return (
            f"with an id {self.right[1]} named right, {self.uncertain[1]} uncertain ({self.coverage(True):.1%}); "
            f"without {self.right[0]} right, {self.uncertain[0]} uncertain ({self.coverage(False):.1%}); "
            f"{self.wrong} wrong"
        )


def run_seeds(n_slots: int, mix: Mix, seeds: int = 150) -> Tally:
    """Over many seeds; fails on any wrong name."""
    total = Tally()
    for seed in range(seeds):
        t = simulate(seed, n_slots, mix)
        assert t.wrong == 0, f"seed {seed}: {t.wrong} tasks named after another request"
        total.add(t)
    return total


# Floors: what these seeds give today (printed), less about a point (the model is deterministic:
# a change that lowers one changes what the join can prove, to be looked at, not a flake).
@pytest.mark.parametrize("n_slots,floor", [(1, 0.13), (2, 0.16), (4, 0.15)])
def test_the_join_never_names_the_wrong_request(n_slots: int, floor: float) -> None:
    """Everything at once: /completion requests (no line after their id), pinned requests,
    clients giving up, rejected requests, slow tokenizing, other clients' cancel lines, long
    batches, and no continuation to help. Most tasks cannot be proven; none may be named wrong."""
    t = run_seeds(n_slots, STRESS)
    print(f"stress, {n_slots} slots: {t}")
    assert t.coverage() >= floor


@pytest.mark.parametrize("n_slots", [1, 2, 4])
def test_chat_clients_are_named(n_slots: int) -> None:
    """Chat clients (every request logs "chat format" after its id), pinned requests, long
    batches, no continuation: what stays uncertain is requests that took their ids within each
    other's tokenizing (a cluster) with different ids and nothing else telling them apart."""
    t = run_seeds(n_slots, CHAT)
    print(f"chat clients, {n_slots} slots: {t}")
    assert t.coverage() >= 0.95


@pytest.mark.parametrize("continues,floor", [(0.0, 0.88), (0.8, 0.96)])
def test_cancelled_chat_requests_cost_little_coverage(continues: float, floor: float) -> None:
    """5% of clients give up and llama-server cancels their queued tasks: a cancel line may be
    another client's /slots request. Every way the deferred queue can then be is followed, the
    next "all slots are idle" line ends the doubt, and a task continuing a named one's state is
    named by it."""
    t = run_seeds(2, Mix(**{**CHAT_CANCELS.__dict__, "continues": continues}))
    print(f"chat clients, 5% cancelled, {continues:.0%} continuing: {t}")
    assert t.coverage() >= floor


CHAT_MIX = Mix(**{**MIXED.__dict__, "chat": 1.0})


@pytest.mark.parametrize("n_slots,floor", [(1, 0.92), (2, 0.96), (4, 0.96)])
def test_a_multi_user_chat_server_is_named(n_slots: int, floor: float) -> None:
    """Issue 18's server: chat clients with and without ids, some pinned, a tenth giving up
    while queued, other clients' /slots polls timing out, conversations continuing their state:
    on 2 and 4 slots over 96% of the requests that sent an id are named with it, none wrong.
    On one slot every request queues behind the others and give-ups leave more doubt (94%)."""
    t = run_seeds(n_slots, CHAT_MIX)
    print(f"multi-user chat server, {n_slots} slots: {t}")
    assert t.coverage(True) >= floor


@pytest.mark.parametrize("n_slots,floor", [(1, 0.67), (2, 0.71), (4, 0.74)])
def test_completion_clients_that_give_up_leave_doubt(n_slots: int, floor: float) -> None:
    """The same with a fifth of the traffic on /completion: such a request logs nothing after
    its id, so until its task is tried it may still be tokenizing (up to ID_DELAY_US), and a
    give-up's cancel line leaves the count of tried tasks short. Arrivals within that time form
    one cluster: about 70% of the requests with an id are named, none wrong (the README says
    what an operator can do)."""
    t = run_seeds(n_slots, MIXED)
    print(f"with /completion clients, {n_slots} slots: {t}")
    assert t.coverage(True) >= floor


# llama-server b11549 no longer logs "chat format" (nor anything else) between a request's id
# and its post (tools/server/server-context.cpp handle_completions_impl of xllamacpp
# 2026.10.11549): every request is then like a /completion one above. Floors: what these seeds
# give today, less about a point. The join stays never wrong; what it names falls by about
# two thirds, because while the main loop runs a batch nothing shows which arrival took which id.
@pytest.mark.parametrize(
    "mix,n_slots,floor",
    [(CHAT, 2, 0.33), (CHAT_CANCELS, 2, 0.22), (MIXED, 1, 0.41), (MIXED, 2, 0.47), (MIXED, 4, 0.46)],
    ids=["chat-2", "chat-cancels-2", "mixed-1", "mixed-2", "mixed-4"],
)
def test_without_chat_format_lines_as_b11549_logs_never_wrong_and_named_above_the_floor(
    mix: Mix, n_slots: int, floor: float
) -> None:
    t = run_seeds(n_slots, Mix(**{**mix.__dict__, "chat": 0.0}))
    print(f"without chat-format lines (b11549), {n_slots} slots: {t}")
    assert t.coverage(True) >= floor
