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

Only whether a task is left one name matters to the join, so a task's search stops once two of
its names are possible. The search narrows the arrivals left to every task at each placement
(forward checking), counts the tasks that may share with no other against their arrivals (a
matching), and tries one of each set of arrivals alike in every respect that matters (swapping
two such arrivals maps one branch onto the other).

Bounded: the search stops after ``budget`` steps (an arrival looked at), and then nothing is
narrowed by it.
Pure: no I/O, no clock.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Final

BUDGET: Final = 100_000  # arrivals looked at per call; past it every name not ruled out stays possible
PER_NAME: Final = 5_000  # arrivals looked at to rule one name in or out for one task
MAX_FOUND: Final = 4  # assignments kept to be changed in one place before a new search


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
    an arrival (positions in ``names``): all of them, or at least two when it has more. Only the
    tasks linked to a target (by a shared candidate or a link) are searched. ``may_share``:
    whether two tasks may be one request's (None: never); ``new_since(name, t)``: the name was
    first seen at or after t (or is empty); ``outside(task)``: the names an owner outside
    ``cands`` can carry (None: any); ``clusters``: per arrival, its cluster (None: no id order is
    known). None when there is no assignment at all (a rule did not hold: judge nothing by it).
    A name whose search ran out of budget stays possible."""
    if clusters is not None:
        bounded = _in_id_order(cands, clusters)
        if bounded is None:
            return None
        cands = bounded
    steps = [0, budget]  # left for this search, left for the call
    by_holder: dict[int, list[Link]] = {}
    for link in links:
        if link.holder in cands:
            by_holder.setdefault(link.holder, []).append(link)
    out: dict[int, set[str]] = {}
    for component in _components(cands, links):
        asked = [t for t in component if t in targets]
        if not asked:
            continue
        seen = _solve(component, asked, cands, names, may_share, by_holder, new_since, outside, clusters, steps)
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
    new_since: Callable[[str, int], bool],
    outside: Callable[[int], set[str] | None],
    clusters: Sequence[int] | None,
    steps: list[int],
) -> dict[int, set[str]] | None:
    """Per task of ``asked`` (all in ``tasks``, one component), its names: every name it carries
    in some assignment, or at least two of them (which is all a caller can act on: a task with
    two names possible is not named). None when no assignment exists."""
    search = _Search(tasks, cands, names, may_share, by_holder, new_since, outside, clusters, steps)
    unsure: dict[int, set[str]] = {t: set() for t in asked}  # searches that ran out of budget
    for task in asked:
        seen = search.seen[task]
        for name in sorted({names[k] for k in cands[task]}):
            if len(seen) + len(unsure[task]) > 1:
                break  # two names possible: not named by this window, whatever the rest
            if name in seen:
                continue
            if search.repaired(task, name):
                continue
            if steps[1] <= 0:
                unsure[task].add(name)
                continue
            steps[0] = min(PER_NAME, steps[1])
            try:
                search.run(task, name)
            except _OutOfBudget:
                unsure[task].add(name)
            finally:
                steps[1] -= min(PER_NAME, steps[1]) - max(steps[0], 0)
    out = {t: search.seen[t] | unsure[t] for t in asked}
    if any(not s for s in out.values()):
        return None  # no assignment at all: a rule did not hold here
    return out


class _Search:
    """Depth-first search over one component's assignments. Each placement narrows the arrivals
    left to every unplaced task by the rules it touches (forward checking), so a step is one
    arrival looked at; a task whose arrivals a placement cannot touch keeps its list at the cost
    of one step."""

    def __init__(
        self,
        tasks: list[int],
        cands: dict[int, tuple[int, ...]],
        names: Sequence[str],
        may_share: Callable[[int, int], bool] | None,
        by_holder: dict[int, list[Link]],
        new_since: Callable[[str, int], bool],
        outside: Callable[[int], set[str] | None],
        clusters: Sequence[int] | None,
        steps: list[int],
    ) -> None:
        self.tasks = tasks
        self.cands = cands
        self.names = names
        self.new_since = new_since
        self.clusters = clusters
        self.steps = steps
        self.by_holder = by_holder
        self.seen: dict[int, set[str]] = {t: set() for t in tasks}
        self.assigned: dict[int, int] = {}
        self.users: dict[int, list[int]] = {}
        # the tasks each may share an arrival with (asked once: the rule is costly to ask)
        self.partners: dict[int, frozenset[int]] = {
            t: frozenset(o for o in tasks if o != t and may_share is not None and may_share(t, o)) for t in tasks
        }
        self.known_outside: dict[int, set[str] | None] = {}  # an owner outside the window: its names
        self.between: dict[tuple[int, int], list[Link]] = {}  # (task, other task): the links both are in
        for links in by_holder.values():
            for link in links:
                for o in link.owners:
                    if o not in cands and o not in self.known_outside:
                        self.known_outside[o] = outside(o)
                members = [link.holder, *(o for o in link.owners if o in cands)]
                for a in members:
                    for b in members:
                        if a != b:
                            self.between.setdefault((a, b), []).append(link)
        self.found: list[dict[int, int]] = []  # the last assignments found, newest last
        self.takers: dict[int, set[int]] = {}  # arrival -> the tasks whose search domain holds it
        self.alike: dict[int, tuple[str, int, tuple[int, ...]]] = {}

    def repaired(self, task: int, name: str) -> bool:
        """Whether an assignment found before gives ``task`` ``name`` once changed in one place:
        the task moved to an arrival of that name, and the one task on that arrival, if any, to
        another of its own (the task's old one first). Checked against every rule as the search would; a witness found so
        costs a few comparisons instead of a search."""
        for before in reversed(self.found):
            old = before[task]
            for k in self.cands[task]:
                if self.names[k] != name:
                    continue
                after = dict(before)
                after[task] = k
                if self._holds_all(after, (task,)):
                    self._record(after)
                    return True
                users = [u for u, uk in before.items() if uk == k and u != task]
                if len(users) != 1:
                    continue
                moved = users[0]
                for k2 in sorted(self.cands[moved], key=lambda x: x != old):
                    if k2 == k:
                        continue
                    after[moved] = k2
                    if self._holds_all(after, (task, moved)):
                        self._record(after)
                        return True
        return False

    def _holds_all(self, assignment: dict[int, int], changed: tuple[int, ...]) -> bool:
        """Whether an assignment that held every rule still does with ``changed`` moved: each on
        an arrival of its own (or shared with a partner both ways), in id order with every other
        task, and every link of the component kept."""
        clusters = self.clusters
        for c in changed:
            kc = assignment[c]
            if kc not in self.cands[c]:
                return False
            for o, ko in assignment.items():
                if o == c:
                    continue
                if ko == kc and not (o in self.partners[c] and c in self.partners[o]):
                    return False
                if clusters is not None and ((clusters[ko] < clusters[kc]) if o > c else (clusters[ko] > clusters[kc])):
                    return False
        saved = self.assigned
        self.assigned = assignment
        try:
            return all(self._link_ok(link) for t in assignment for link in self.by_holder.get(t, ()))
        finally:
            self.assigned = saved

    def _record(self, assignment: dict[int, int]) -> None:
        for t, k in assignment.items():
            self.seen[t].add(self.names[k])
        self.found.append(assignment)
        if len(self.found) > MAX_FOUND:
            del self.found[0]

    def run(self, task: int, name: str) -> bool:
        """Search for an assignment giving ``task`` ``name``; every assignment found adds each
        task's name to ``seen``."""
        domains = dict(self.cands)
        domains[task] = tuple(k for k in self.cands[task] if self.names[k] == name)
        self.takers = {}
        for t in self.tasks:
            for k in domains[t]:
                self.takers.setdefault(k, set()).add(t)
        self.alike = {
            k: (self.names[k], self.clusters[k] if self.clusters is not None else 0, tuple(sorted(ts)))
            for k, ts in self.takers.items()
        }
        self.assigned.clear()
        self.users.clear()
        dom: dict[int, list[int]] = {}
        for t in self.tasks:
            free = self._first_free(t, domains[t])
            if not free:
                return False
            dom[t] = free
        return self._search(dom, {t: self._span(free) for t, free in dom.items()})

    def _step(self) -> None:
        self.steps[0] -= 1
        if self.steps[0] < 0:
            raise _OutOfBudget

    def _span(self, free: list[int]) -> tuple[int, int]:
        """The earliest and latest cluster of these arrivals (0, 0 when none is known)."""
        if self.clusters is None:
            return 0, 0
        clusters = self.clusters
        low = high = clusters[free[0]]
        for k in free:
            c = clusters[k]
            if c < low:
                low = c
            elif c > high:
                high = c
        return low, high

    def _link_ok(self, link: Link) -> bool:
        """False only when every task of the link is placed and the rule fails."""
        assigned = self.assigned
        if link.holder not in assigned:
            return True
        name = self.names[assigned[link.holder]]
        if not name or self.new_since(name, link.after_us):
            return True
        for o in link.owners:
            if o in self.cands:
                if o not in assigned:
                    return True
                if self.names[assigned[o]] == name:
                    return True
            else:
                known = self.known_outside[o]
                if known is None or name in known:
                    return True
        return False

    def _fits(self, task: int, k: int, links: list[Link]) -> bool:
        self.assigned[task] = k
        ok = all(self._link_ok(li) for li in links)
        del self.assigned[task]
        return ok

    def _first_free(self, task: int, domain: tuple[int, ...]) -> list[int]:
        """The arrivals of ``domain`` the task can take with nothing placed: those its own
        links (to owners outside the window) allow."""
        holds = self.by_holder.get(task, [])
        out: list[int] = []
        for k in domain:
            self._step()
            if not holds or self._fits(task, k, holds):
                out.append(k)
        return out

    def _narrowed(
        self, placed: int, k: int, dom: dict[int, list[int]], spans: dict[int, tuple[int, int]]
    ) -> tuple[dict[int, list[int]], dict[int, tuple[int, int]]] | None:
        """Every other unplaced task's arrivals, less those ``placed`` taking k rules out: k
        itself (unless the two may share it), arrivals of clusters out of id order with k's,
        those a link between the two forbids. None when a task is left with none."""
        clusters = self.clusters
        c = clusters[k] if clusters is not None else 0
        takers = self.takers[k]
        partners = self.partners[placed]
        out: dict[int, list[int]] = {}
        out_spans: dict[int, tuple[int, int]] = {}
        for u, free in dom.items():
            if u == placed:
                continue
            self._step()
            shared = u not in takers or u in partners
            later = u > placed
            low, high = spans[u]
            in_order = clusters is None or ((low >= c) if later else (high <= c))
            links = self.between.get((u, placed))
            if shared and in_order and not links:
                out[u] = free
                out_spans[u] = spans[u]
                continue
            # every arrival of the list is looked at: counted at once
            self.steps[0] -= len(free)
            if self.steps[0] < 0:
                raise _OutOfBudget
            if in_order and not links:  # k alone goes (it cannot be shared)
                keep = [k2 for k2 in free if k2 != k]
                if not keep:
                    return None
                out[u] = keep
                # the span moves only when k was of its first or last cluster
                out_spans[u] = spans[u] if clusters is None or low < c < high or low == high else self._span(keep)
                continue
            keep = []
            for k2 in free:
                if k2 == k and not shared:
                    continue
                if clusters is not None and ((clusters[k2] < c) if later else (clusters[k2] > c)):
                    continue
                if links and not self._fits(u, k2, links):
                    continue
                keep.append(k2)
            if not keep:
                return None
            out[u] = keep
            out_spans[u] = self._span(keep)
        return out, out_spans

    def _search(
        self, dom: dict[int, list[int]], spans: dict[int, tuple[int, int]], matched: dict[int, int] | None = None
    ) -> bool:
        """``matched``: the matching found one placement up, from which this one's is grown."""
        if not dom:
            self._record(dict(self.assigned))
            return True
        by_size = sorted(dom, key=lambda t: len(dom[t]))
        # tasks none of which may share with another need an arrival each
        apart: dict[int, list[int]] = {}
        for t in by_size:
            if self.partners[t].isdisjoint(apart):
                apart[t] = dom[t]
        held = _matching(apart, matched)
        if held is None:
            return False  # more tasks than arrivals for them: no way on from here
        best = by_size[0]  # the task with the fewest arrivals left first
        tried: set[tuple[tuple[str, int, tuple[int, ...]], tuple[int, ...]]] = set()
        for k in dom[best]:
            # an arrival like one tried (same name, cluster, tasks that can take it and tasks on
            # it) leads where that one led: swapping the two maps one search onto the other
            like = (self.alike[k], tuple(self.users.get(k, [])))
            if like in tried:
                continue
            tried.add(like)
            self.assigned[best] = k
            self.users.setdefault(k, []).append(best)
            rest = self._narrowed(best, k, dom, spans)
            found = rest is not None and self._search(rest[0], rest[1], held)
            self.users[k].pop()
            del self.assigned[best]
            if found:
                return True
        return False


def _matching(left: dict[int, list[int]], start: dict[int, int] | None) -> dict[int, int] | None:
    """An arrival of its own for every task (task -> arrival), or None when there is none. Grown
    from ``start`` (a matching of a search one placement up: most of it still holds, so a
    placement costs an augmenting path or two, not a matching anew): any matching grows to a
    complete one by augmenting paths when a complete one exists (Berge)."""
    holder: dict[int, int] = {}
    held: dict[int, int] = {}
    if start is not None:
        for t, k in start.items():
            free = left.get(t)
            if free is not None and k not in holder and k in free:
                holder[k] = t
                held[t] = k
    for t in left:
        if t not in held and not augment(t, left, holder, held):
            return None
    return held


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
