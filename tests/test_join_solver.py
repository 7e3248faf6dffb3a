"""The joint search over a window's tasks (join_solver): INVENTED candidate sets, each the shape
of a case the recorded runs show."""

from __future__ import annotations

import functools
import itertools
import random

from llamacpp_exporter.assemble.join_solver import Link, names_by_assignment

FIRST_SEEN = {"a": 0, "b": 0, "c": 0, "new": 500}


def new_since(name: str, at: int) -> bool:
    return not name or FIRST_SEEN.get(name, at) >= at


def solve(
    cands: dict[int, tuple[int, ...]],
    names: list[str],
    links: list[Link] = (),  # type: ignore[assignment]
    share: bool = False,
    targets: set[int] | None = None,
    outside: dict[int, set[str]] | None = None,
    budget: int = 100_000,
    clusters: list[int] | None = None,
) -> dict[int, set[str]] | None:
    return names_by_assignment(
        cands,
        names,
        (lambda a, b: True) if share else None,
        list(links),
        new_since,
        lambda t: (outside or {}).get(t),
        targets if targets is not None else set(cands),
        budget,
        clusters,
    )


def test_a_chain_takes_the_one_name_every_member_can_carry() -> None:
    # turn 1 (task 1) can be arrival 0 (a) or 1 (b); turn 2 (task 2) holds turn 1's exchange and
    # can be arrival 2 (a) or 3 (c): a and b are old names, so turn 2 carries turn 1's name
    names = ["a", "b", "a", "c"]
    got = solve({1: (0, 1), 2: (2, 3)}, names, [Link(2, (1,), 100)])
    assert got == {1: {"a"}, 2: {"a"}}


def test_a_branch_under_a_new_id_stays_possible() -> None:
    # the same, but arrival 3 carries a name first seen after turn 1's answer: a front end may
    # have branched the conversation under it, so neither task is named
    names = ["a", "b", "a", "new"]
    got = solve({1: (0, 1), 2: (2, 3)}, names, [Link(2, (1,), 100)])
    assert got == {1: {"a", "b"}, 2: {"a", "new"}}


def test_each_request_one_task_leaves_the_last_arrival_to_the_third() -> None:
    # tasks 1 and 2 can each be arrival 0 or 1; task 3 can be any: only arrival 2 is left to it
    got = solve({1: (0, 1), 2: (0, 1), 3: (0, 1, 2)}, ["a", "b", "c"])
    assert got is not None and got[3] == {"c"} and got[1] == {"a", "b"}


def test_tasks_that_may_be_one_request_share_an_arrival() -> None:
    # the same when the tasks may be one request's (a /completion with several prompts): no
    # arrival is left to anyone
    got = solve({1: (0, 1), 2: (0, 1), 3: (0, 1, 2)}, ["a", "b", "c"], share=True)
    assert got is not None and len(got[3]) > 1  # not named: a, b or c


def test_a_name_ruled_out_by_an_owner_outside_the_window() -> None:
    # task 2 holds task 9's exchange; task 9 (outside the search) can carry only b
    got = solve({2: (0, 1)}, ["a", "b"], [Link(2, (9,), 100)], outside={9: {"b"}})
    assert got == {2: {"b"}}


def test_no_assignment_at_all_narrows_nothing() -> None:
    # two tasks, one arrival, each request one task: a rule did not hold here
    assert solve({1: (0,), 2: (0,)}, ["a"]) is None


def test_a_search_out_of_budget_leaves_every_name_possible() -> None:
    cands = {t: tuple(range(12)) for t in range(12)}
    names = [f"n{k}" for k in range(12)]
    got = solve(cands, names, targets={0}, budget=5)
    assert got is not None and len(got[0]) > 1  # not named


def test_tasks_that_may_share_with_none_need_an_arrival_each() -> None:
    # nine tasks (0-8) that may share an arrival with no other, eight arrivals named a for them
    # all, and a ninth (b) only task 0 can be; two more tasks (20, 21) may be one request's. Task
    # 0 is b: the eight others fill the a's. Shown by counting, not by trying every order of the
    # eight (40,320, past the budget: the search before this counted only where no task may share)
    cands: dict[int, tuple[int, ...]] = {t: tuple(range(8)) for t in range(1, 9)}
    cands[0] = tuple(range(9))
    cands[20] = cands[21] = (9, 10)
    names = ["a"] * 8 + ["b", "c", "c"]
    share = {(20, 21), (21, 20)}
    got = names_by_assignment(
        cands, names, lambda a, b: (a, b) in share, [], new_since, lambda t: None, {0, 20}, 100_000, None
    )
    assert got == {0: {"b"}, 20: {"c"}}


def test_a_task_with_two_names_possible_is_not_searched_further() -> None:
    # each task can be any of six arrivals with six names: two seen are all a caller needs
    cands = {t: tuple(range(6)) for t in range(6)}
    got = solve(cands, [f"n{k}" for k in range(6)])
    assert got is not None and all(2 <= len(v) < 6 for v in got.values())


def test_only_the_tasks_asked_about_are_answered() -> None:
    got = solve({1: (0, 1), 2: (0, 1), 3: (2,)}, ["a", "b", "c"], targets={3})
    assert got == {3: {"c"}}


def test_ids_grow_from_one_cluster_to_the_next() -> None:
    # tasks 5 and 9 can each be arrival 0 (a) or 1 (b). Arrival 0 took its id before arrival 1
    # came (different clusters): the smaller id is a's. Within one cluster either order holds.
    assert solve({5: (0, 1), 9: (0, 1)}, ["a", "b"], clusters=[0, 1]) == {5: {"a"}, 9: {"b"}}
    assert solve({5: (0, 1), 9: (0, 1)}, ["a", "b"], clusters=[0, 0]) == {5: {"a", "b"}, 9: {"a", "b"}}


def test_id_order_reaches_tasks_that_share_no_arrival() -> None:
    # task 5 can be arrival 0 (a, cluster 0) or 2 (c, cluster 2); task 9 (a larger id) can only be
    # arrival 1 (b, cluster 1): task 5 took its id before b arrived, so it is a. Nothing but the
    # order ties the two (no shared arrival, no link).
    assert solve({5: (0, 2), 9: (1,)}, ["a", "b", "c"], clusters=[0, 1, 2]) == {5: {"a"}, 9: {"b"}}


def test_id_order_lets_one_request_hold_several_ids() -> None:
    # where a request may have several tasks, two ids may share one arrival: the order only
    # keeps a later cluster from a smaller id
    got = solve({5: (0, 1), 9: (0,)}, ["a", "b"], share=True, clusters=[0, 1])
    assert got == {5: {"a"}, 9: {"a"}}


def test_no_order_of_ids_fits_narrows_nothing() -> None:
    # the smaller id can only be the later cluster's arrival, the larger only the earlier's
    assert solve({5: (1,), 9: (0,)}, ["a", "b"], clusters=[0, 1]) is None


def _shared(share: set[tuple[int, int]], a: int, b: int) -> bool:
    return (a, b) in share


def _every_assignment(
    cands: dict[int, tuple[int, ...]],
    names: list[str],
    links: list[Link],
    share: set[tuple[int, int]],
    clusters: list[int] | None,
    outside: dict[int, set[str]],
) -> dict[int, set[str]] | None:
    """Per task, the names the assignments the rules allow give it, by trying every assignment."""
    tasks = sorted(cands)
    seen: dict[int, set[str]] = {t: set() for t in tasks}
    found = False
    for pick in itertools.product(*(cands[t] for t in tasks)):
        at = dict(zip(tasks, pick, strict=True))
        if any(at[a] == at[b] and (a, b) not in share for a in tasks for b in tasks if a != b):
            continue
        if clusters is not None and any(clusters[at[a]] > clusters[at[b]] for a in tasks for b in tasks if a < b):
            continue
        ok = True
        for link in links:
            name = names[at[link.holder]]
            if name and not new_since(name, link.after_us):
                ok = ok and any(
                    names[at[o]] == name if o in at else name in outside.get(o, {name}) for o in link.owners
                )
        if not ok:
            continue
        found = True
        for t in tasks:
            seen[t].add(names[at[t]])
    return seen if found else None


def test_named_as_every_assignment_names() -> None:
    # INVENTED random windows, small enough to try every assignment: the search (with the
    # assignments it changes in one place instead of searching again) names a task exactly where
    # every assignment gives it one name
    rng = random.Random(55)
    for _ in range(600):
        n_tasks, n_arrivals = rng.randint(2, 6), rng.randint(2, 7)
        names = [rng.choice(["a", "b", "c", "", "new"]) for _ in range(n_arrivals)]
        tasks = rng.sample(range(1, 20), n_tasks)
        cands = {t: tuple(sorted(rng.sample(range(n_arrivals), rng.randint(1, n_arrivals)))) for t in tasks}
        share = {(a, b) for a in tasks for b in tasks if a != b and rng.random() < 0.2}
        share |= {(b, a) for a, b in share}
        clusters = sorted(rng.randint(0, 3) for _ in range(n_arrivals)) if rng.random() < 0.5 else None
        links = []
        for t in tasks:
            if rng.random() < 0.4:
                owners = tuple(sorted(rng.sample([o for o in tasks if o != t] + [90, 91], rng.randint(1, 2))))
                links.append(Link(t, owners, rng.choice([100, 1000])))
        outside = {90: {"a"}, 91: {"b", "c"}}
        want = _every_assignment(cands, names, links, share, clusters, outside)
        got = names_by_assignment(
            cands,
            names,
            functools.partial(_shared, share),
            links,
            new_since,
            outside.get,
            set(cands),
            1_000_000,
            clusters,
        )
        if want is None:
            assert got is None
            continue
        assert got is not None
        for t in cands:
            assert got[t] <= want[t]
            assert (len(got[t]) == 1) == (len(want[t]) == 1), (cands, names, links, share, clusters, t)
