"""The prefill timeline on small invented sequences (times in microseconds); the recorded logs
check it against the server's own timings in tests/test_assemble.py."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from llamacpp_exporter.assemble.timeline import (
    MAX_OVERLAPPED_PREFILLS,
    MAX_PREFILL_HISTORY,
    Overlap,
    PrefillTimeline,
    overlapped_prefills,
    union_us,
)


def during(t: PrefillTimeline, slot: int, start: int, end: int) -> list[tuple[int, int, int]]:
    """(task, from, to) of the other slots' prefills between start and end."""
    return [(o.task, o.lo, o.hi) for o in t.overlapping(slot, start, end)]


def test_a_prefill_runs_from_its_first_batch_to_its_end_and_overlaps_other_slots() -> None:
    t = PrefillTimeline()
    t.launched(0, task=1, at=100, begin_logged=False)
    t.first_batch(0, task=1, at=150)  # waited for another slot's batch before its own
    assert during(t, 1, 0, 1000) == [(1, 150, 1000)]  # still running: open to the end
    t.ended(0, at=400)
    assert during(t, 1, 0, 1000) == [(1, 150, 400)]
    assert during(t, 0, 0, 1000) == []  # a slot never overlaps itself
    assert not t.settled_before(1, 1000)  # not exact yet: a record decoding until 1000 waits
    assert t.settled_before(1, 150)  # ... but not one that ended before it began


def test_the_servers_timings_fix_the_interval_and_the_release_settles_it() -> None:
    t = PrefillTimeline()
    t.launched(0, task=1, at=100, begin_logged=False)
    t.ended(0, at=420)
    t.timed(0, task=1, start=130, end=410)  # counted back from the eval line
    assert during(t, 1, 0, 1000) == [(1, 130, 410)] and t.settled_before(1, 1000)
    t.launched(0, task=2, at=500, begin_logged=False)
    assert t.released(0, task=2, at=600) is True  # cancelled mid-prefill: closed at the release
    assert during(t, 1, 550, 1000) == [(2, 550, 600)] and t.settled_before(1, 1000)


def test_where_first_batches_are_logged_a_prefill_not_begun_overlaps_nothing_and_holds_nothing() -> None:
    """-lv 4: llama-server starts a prompt's clock and logs "new prompt" in one step, so a
    launched task whose line has not come yet has computed nothing (a task stuck before its
    first batch must not hold or slow down the records of the other slots)."""
    t = PrefillTimeline()
    t.launched(0, task=1, at=100, begin_logged=True)
    assert t.settled_before(1, 500)  # a record on slot 1 ending at 500 (the last line read) goes out
    assert during(t, 1, 0, 500) == [] and t.largest_overlapping(1, 0, 500) == 0
    t.first_batch(0, task=1, at=600)
    assert during(t, 1, 0, 1000) == [(1, 600, 1000)] and not t.settled_before(1, 1000)
    t.released(0, task=1, at=700)
    t.launched(0, task=2, at=800, begin_logged=True)
    assert t.released(0, task=2, at=900) is True  # given up before its first batch: computed nothing
    assert during(t, 1, 750, 1000) == [] and t.settled_before(1, 1000)
    # below -lv 4 a prefill is taken from its launch: an upper bound, and records wait for it
    t.launched(0, task=3, at=1000, begin_logged=False)
    assert during(t, 1, 1000, 1100) == [(3, 1000, 1100)] and not t.settled_before(1, 1100)
    # a "prompt done" without its first batch (the line was lost): from the launch, as below -lv 4
    t.launched(2, task=4, at=1200, begin_logged=True)
    t.ended(2, at=1300)
    assert during(t, 1, 1150, 1400) == [(3, 1150, 1400), (4, 1200, 1300)]


def test_an_overlap_names_the_prefilling_request_by_its_records_key() -> None:
    """The slot, task and launch of the prefill: its record's key, which a trace links to."""
    t = PrefillTimeline()
    t.launched(2, task=7, at=100, begin_logged=True)
    t.first_batch(2, task=7, at=180)
    t.timed(2, task=7, start=180, end=400, tokens=900)
    assert list(t.overlapping(0, 0, 1000)) == [Overlap(2, 7, 100, 180, 400)]
    t.timed(2, task=8, start=500, end=600)  # timings of a task whose launch was not read
    assert list(t.overlapping(0, 450, 1000)) == [Overlap(2, 8, None, 500, 600)]


def test_the_overlapped_prefills_are_grouped_by_request_most_first_and_bounded() -> None:
    overlaps = [Overlap(1, 5, 10, 0, 200_000), Overlap(2, 6, 20, 0, 500_000), Overlap(1, 5, 10, 300_000, 400_000)]
    assert overlapped_prefills(overlaps) == ((2, 6, 20, 0.5), (1, 5, 10, 0.3))
    assert overlapped_prefills([Overlap(1, 5, None, 0, 9)]) == ()  # no launch: no record to name
    many = [Overlap(1, i, i, 0, i + 1) for i in range(MAX_OVERLAPPED_PREFILLS + 4)]
    kept = overlapped_prefills(many)
    assert len(kept) == MAX_OVERLAPPED_PREFILLS and kept[0][1] == MAX_OVERLAPPED_PREFILLS + 3


def test_history_is_bounded_and_union_counts_overlaps_once() -> None:
    t = PrefillTimeline()
    for i in range(MAX_PREFILL_HISTORY + 5):
        t.launched(0, task=i, at=i * 10, begin_logged=False)
        t.ended(0, at=i * 10 + 5)
    assert len(t.slots[0]) == MAX_PREFILL_HISTORY
    assert union_us([(0, 10), (5, 15), (20, 30)]) == 25
    assert union_us([]) == 0


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.tuples(st.sampled_from(["launched", "first_batch", "ended", "timed", "released"]), st.integers(0, 1)),
        max_size=400,  # past MAX_PREFILL_HISTORY launches on a slot
    ),
    st.integers(0, 3000),
    st.booleans(),
)
def test_settled_before_agrees_with_every_prefill_being_checked(
    ops: list[tuple[str, int]], end: int, begin_logged: bool
) -> None:
    """settled_before keeps only the prefills not yet exact; it must answer as a scan of all
    of them would, whatever the order of events (and past the history cap)."""
    t = PrefillTimeline()
    task = 0
    for i, (op, slot) in enumerate(ops):
        at = i * 10
        if op == "launched":
            task += 1
            t.launched(slot, task, at, begin_logged)
        elif op == "first_batch":
            t.first_batch(slot, task, at)
        elif op == "ended":
            t.ended(slot, at)
        elif op == "timed":
            t.timed(slot, task, at - 5, at)
        else:
            t.released(slot, task, at)
        for s in range(2):
            brute = all(p.exact or p.start >= end or not p.begun for sid, pf in t.slots.items() if sid != s for p in pf)
            assert t.settled_before(s, end) == brute


def test_the_largest_overlapping_prefill_is_the_biggest_other_slot_prefill_in_the_span() -> None:
    t = PrefillTimeline()
    t.launched(1, 10, 0, False)
    t.timed(1, 10, 0, 100, tokens=4000)  # slot 1: a large prefill 0-100
    t.launched(2, 11, 150, False)
    t.timed(2, 11, 150, 200, tokens=300)  # slot 2: a small one 150-200
    t.launched(3, 12, 400, False)  # slot 3: running, size not known yet
    assert t.largest_overlapping(0, 50, 180) == 4000
    assert t.largest_overlapping(0, 120, 300) == 300
    assert t.largest_overlapping(0, 210, 390) == 0  # nothing ran
    assert t.largest_overlapping(0, 300, 500) is None  # the running one's size is unknown
    assert t.largest_overlapping(1, 50, 180) == 300  # its own slot does not count


def test_the_first_prefill_starting_at_a_time_is_found_as_bisect_finds_it() -> None:
    """timeline._first_starting_at is bisect_left with the start as key, written out to be
    compiled natively: random prefills in start order (repeats too), every time around them."""
    import bisect
    import random

    from llamacpp_exporter.assemble.timeline import Prefill, _first_starting_at

    rng = random.Random(3)
    for _ in range(300):
        starts = sorted(rng.randint(0, 40) for _ in range(rng.randint(0, 12)))
        pf = [Prefill(s, None, i, None) for i, s in enumerate(starts)]
        for at in range(-1, 43):
            assert _first_starting_at(pf, at) == bisect.bisect_left(starts, at)
