"""Which names a window's tasks can carry, jointly: every way of giving each task an arrival
of its own that the log allows, searched, not judged task by task.

The join (join.py) narrows each task's candidate arrivals one at a time: by time, rank, the
answers prompts hold and which arrival another task is proven to be. That misses what only
holds for the whole: a conversation is a chain of requests, each holding the one before's
exchange, and each request is one arrival. A name can then be possible for every member alone
and still leave no way to give the others theirs. This module searches the assignments
(tasks -> arrivals) under the same rules and keeps, per task, the names some assignment gives
it. A task with one name left is named; nothing is assumed beyond the rules the join proves:

- a task's request is one of its candidate arrivals;
- two tasks share an arrival only where ``may_share`` allows it (never, when each request is
  one task; otherwise only tasks first tried in one try burst);
- a prompt holding an earlier task's exchange (a ``Link``) carries that task's name, or no
  name, or a name first seen after that exchange existed (a branch or clone of it);
- ids grow with arrival across clusters (``clusters``: an arrival's cluster; every arrival of
  a cluster took its ids before the next cluster's first arrived, join.py): a task with a
  smaller id than another is not the request of an arrival of a later cluster than the other's.

Bounded: the search stops after ``budget`` steps, and then nothing is narrowed by it.
Pure: no I/O, no clock.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Final

BUDGET: Final = 100_000  # placements tried per call; past it every name not ruled out stays possible
PER_NAME: Final = 5_000  # placements tried to rule one name in or out for one task


@dataclass(frozen=True, slots=True)
class Link:
    """``holder``'s prompt holds the exchange of one of ``owners`` (twins: same prompt), whose
    answer existed from ``after_us``."""

    holder: int
    owners: tuple[int, ...]
    after_us: int


class _OutOfBudget(Exception):
    pass


def names_by_assignment(
    cands: dict[int, tuple[int, ...]],
    names: Sequence[str],
    may_share: Callable[[int, int], bool] | None,
    links: Sequence[Link],
    new_since: Callable[[str, int], bool],
    outside: Callable[[int], set[str] | None],
    targets: set[int],
    budget: int = BUDGET,
    clusters: Sequence[int] | None = None,
) -> dict[int, set[str]] | None:
    """Per task of ``targets``, the names it carries in at least one assignment of every task to
    an arrival (positions in ``names``); only the tasks linked to a target (by a shared candidate
    or a link) are searched. ``may_share``: whether two tasks may be one request's (None: never);
    ``new_since(name, t)``: the name was first seen at or after t (or is empty); ``outside(task)``:
    the names an owner outside ``cands`` can carry (None: any); ``clusters``: per arrival, its
    cluster (None: no id order is known). None when there is no assignment at all (a rule did
    not hold: judge nothing by it). A name whose search ran out of budget stays possible."""
    if clusters is not None:
        bounded = _in_id_order(cands, clusters)
        if bounded is None:
            return None
        cands = bounded
    steps = [0, budget]  # left for this search, left for the call
    by_holder: dict[int, list[Link]] = {}
    by_owner: dict[int, list[Link]] = {}
    for link in links:
        if link.holder in cands:
            by_holder.setdefault(link.holder, []).append(link)
            for o in link.owners:
                if o in cands:
                    by_owner.setdefault(o, []).append(link)
    out: dict[int, set[str]] = {}
    for component in _components(cands, links):
        asked = [t for t in component if t in targets]
        if not asked:
            continue
        seen = _solve(
            component, asked, cands, names, may_share, by_holder, by_owner, new_since, outside, clusters, steps
        )
        if seen is None:
            return None
        out.update(seen)
    return out


def _in_id_order(cands: dict[int, tuple[int, ...]], clusters: Sequence[int]) -> dict[int, tuple[int, ...]] | None:
    """Each task's arrivals, less those the id order rules out whatever the others are: a task
    is of no later cluster than the latest any larger id can be, and of no earlier one than the
    earliest any smaller id can be (bounds, over every task of the window; None: some task has
    none left)."""
    order = sorted(cands)
    free = {t: tuple(cands[t]) for t in order}
    changed = True
    while changed:
        changed = False
        low = -1  # the earliest cluster a task with a smaller id can be
        for t in order:
            kept = tuple(k for k in free[t] if clusters[k] >= low)
            if not kept:
                return None
            changed |= kept != free[t]
            free[t] = kept
            low = max(low, min(clusters[k] for k in kept))
        high = 1 << 60  # the latest cluster a task with a larger id can be
        for t in reversed(order):
            kept = tuple(k for k in free[t] if clusters[k] <= high)
            if not kept:
                return None
            changed |= kept != free[t]
            free[t] = kept
            high = min(high, max(clusters[k] for k in kept))
    return free


def _components(cands: dict[int, tuple[int, ...]], links: Sequence[Link]) -> list[list[int]]:
    """Tasks that share a candidate arrival or a link, grouped (each group searched alone)."""
    parent = {t: t for t in cands}

    def find(t: int) -> int:
        while parent[t] != t:
            parent[t] = parent[parent[t]]
            t = parent[t]
        return t

    def union(a: int, b: int) -> None:
        ra, rb = find(a), find(b)
        if ra != rb:
            parent[max(ra, rb)] = min(ra, rb)

    holder_of: dict[int, int] = {}
    for task, free in cands.items():
        for k in free:
            if k in holder_of:
                union(task, holder_of[k])
            else:
                holder_of[k] = task
    for link in links:
        if link.holder in cands:
            for o in link.owners:
                if o in cands:
                    union(link.holder, o)
    groups: dict[int, list[int]] = {}
    for task in sorted(cands):
        groups.setdefault(find(task), []).append(task)
    return list(groups.values())


def _solve(
    tasks: list[int],
    asked: list[int],
    cands: dict[int, tuple[int, ...]],
    names: Sequence[str],
    may_share: Callable[[int, int], bool] | None,
    by_holder: dict[int, list[Link]],
    by_owner: dict[int, list[Link]],
    new_since: Callable[[str, int], bool],
    outside: Callable[[int], set[str] | None],
    clusters: Sequence[int] | None,
    steps: list[int],
) -> dict[int, set[str]] | None:
    seen: dict[int, set[str]] = {t: set() for t in tasks}
    assigned: dict[int, int] = {}
    users: dict[int, list[int]] = {}

    def link_ok(link: Link) -> bool:
        """False only when every task of the link is placed and the rule fails."""
        if link.holder not in assigned:
            return True
        name = names[assigned[link.holder]]
        if not name or new_since(name, link.after_us):
            return True
        for o in link.owners:
            if o in cands:
                if o not in assigned:
                    return True
                if names[assigned[o]] == name:
                    return True
            else:
                known = outside(o)
                if known is None or name in known:
                    return True
        return False

    def fits(task: int, k: int) -> bool:
        steps[0] -= 1
        if steps[0] < 0:
            raise _OutOfBudget
        for other in users.get(k, ()):
            if may_share is None or not may_share(task, other):
                return False
        if clusters is not None:
            c = clusters[k]
            for other, at in assigned.items():
                if (clusters[at] > c) if other < task else (clusters[at] < c):
                    return False
        assigned[task] = k
        ok = all(link_ok(li) for li in by_holder.get(task, ())) and all(link_ok(li) for li in by_owner.get(task, ()))
        del assigned[task]
        return ok

    def search(order: list[int], domains: dict[int, tuple[int, ...]]) -> bool:
        if len(assigned) == len(order):
            for t, k in assigned.items():
                seen[t].add(names[k])
            return True
        # the unplaced task with the fewest arrivals left first
        best, best_free = None, None
        left: dict[int, list[int]] = {}
        for t in order:
            if t in assigned:
                continue
            free = [k for k in domains[t] if fits(t, k)]
            if not free:
                return False
            left[t] = free
            if best_free is None or len(free) < len(best_free):
                best, best_free = t, free
        assert best is not None and best_free is not None
        if may_share is None and not _matching_exists(left):
            return False  # more tasks than arrivals for them: no way on from here
        for k in best_free:
            assigned[best] = k
            users.setdefault(k, []).append(best)
            found = search(order, domains)
            users[k].pop()
            del assigned[best]
            if found:
                return True
        return False

    unsure: dict[int, set[str]] = {t: set() for t in asked}  # searches that ran out of budget
    for task in asked:
        for name in sorted({names[k] for k in cands[task]}):
            if name in seen[task]:
                continue
            if steps[1] <= 0:
                unsure[task].add(name)
                continue
            domains = dict(cands)
            domains[task] = tuple(k for k in cands[task] if names[k] == name)
            steps[0] = min(PER_NAME, steps[1])
            try:
                search(tasks, domains)
            except _OutOfBudget:
                unsure[task].add(name)
                assigned.clear()
                users.clear()
            finally:
                steps[1] -= min(PER_NAME, steps[1]) - max(steps[0], 0)
    out = {t: seen[t] | unsure[t] for t in asked}
    if any(not s for s in out.values()):
        return None  # no assignment at all: a rule did not hold here
    return out


def _matching_exists(left: dict[int, list[int]]) -> bool:
    """Whether every task can have an arrival of its own."""
    holder: dict[int, int] = {}
    held: dict[int, int] = {}
    return all(augment(t, left, holder, held) for t in sorted(left, key=lambda t: len(left[t])))


def augment(task: int, cands: Mapping[int, Sequence[int]], holder: dict[int, int], held: dict[int, int]) -> bool:
    """Find an arrival for ``task``, moving other tasks along an alternating path (breadth first)."""
    came_from: dict[
        int, tuple[int, int | None]
    ] = {}  # arrival -> (task that reaches it, the arrival that task gives up)
    queue: list[tuple[int, int | None]] = [(task, None)]
    seen_tasks = {task}
    while queue:
        nxt: list[tuple[int, int | None]] = []
        for t, gave in queue:
            for k in cands[t]:
                if k in came_from:
                    continue
                came_from[k] = (t, gave)
                if k not in holder:  # free: shift every task on the path
                    while True:
                        t_, gave_ = came_from[k]
                        holder[k] = t_
                        held[t_] = k
                        if gave_ is None:
                            return True
                        k = gave_
                t2 = holder[k]
                if t2 not in seen_tasks:
                    seen_tasks.add(t2)
                    nxt.append((t2, k))
        queue = nxt
    return False
