"""Late proofs: a record that went out before its conversation was proven still reaches the
conversation series once the join proves it (or gives up at the horizon). A pass looks only at
the waiting records whose conversation can have changed (attribution.LateIndex); these tests
hold it to a look at every waiting record, as the pass was before, on random sequences of what
the join settles, and on the two cases the recorded logs hold too rarely to be sure of."""

from __future__ import annotations

import random
from typing import Any

import pytest

from llamacpp_exporter.assemble import attribution
from llamacpp_exporter.assemble.attribution import LATE_PROOF_US, Attribution
from llamacpp_exporter.assemble.join import HEADER, NONE, UNCERTAIN
from llamacpp_exporter.assemble.timeline import Overlap
from llamacpp_exporter.records import RequestRecord


class Join:
    """What the attribution reads of the header join: its results, what is pending, the tasks
    settled since it last asked. Driven by the test."""

    def __init__(self) -> None:
        self.version = 0
        self.settled: list[int] = []
        self.results: dict[int, tuple[str, str]] = {}
        self.open: set[int] = set()
        self.dropped_arrivals = self.never_started = 0
        self.n_slots: int | None = None

    def launched(self, task: int, now_us: int, all_idle: bool, holds: Any = None) -> None:
        self.open.add(task)

    def result(self, task: int) -> tuple[str, str] | None:
        return self.results.get(task)

    def pending(self, task: int) -> bool:
        return task in self.open

    def settle(self, task: int, res: tuple[str, str]) -> tuple[str, str]:
        self.open.discard(task)
        self.results[task] = res
        self.version += 1
        self.settled.append(task)
        return res

    def give_up(self, task: int) -> tuple[str, str]:
        return self.results.get(task) or self.settle(task, (UNCERTAIN, ""))

    def take_settled(self) -> list[int]:
        settled, self.settled = self.settled, []
        return settled


class Sink:
    def __init__(self) -> None:
        self.calls: list[tuple[Any, ...]] = []

    def conversation_cost(self, conversation: str, seconds: float) -> None:
        self.calls.append(("cost", conversation, seconds))

    def join_cost(self, source: str, seconds: float) -> None:
        self.calls.append(("join_cost", source, seconds))

    def conversation_arrival_dropped(self) -> None:
        pass

    def request_never_started(self) -> None:
        pass

    def conversation_proven(self, record: RequestRecord, conversation: str, source: str) -> None:
        self.calls.append(("proven", record.task, conversation, source))


class EveryRecord(Attribution):
    """The pass as it was: a look at every waiting record and cost, in the order they began."""

    def _prove_late(self) -> None:
        self.late_version = self.join.version
        horizon = self.now() - LATE_PROOF_US
        for key, rec in list(self.late.items()):
            conv = self.conversation(*key)
            if conv is None:
                if (rec.end_us or 0) < horizon:
                    del self.late[key]
                    self.join.give_up(key[1])
                continue
            del self.late[key]
            if conv[0] is not None:
                self.sink.conversation_proven(rec, conv[0], conv[1])
        for key, seconds in list(self.late_costs.items()):
            conv = self.conversation(*key)
            if conv is not None:
                del self.late_costs[key]
                if conv[0] is not None:
                    self.sink.conversation_cost(conv[0], seconds)
                self.sink.join_cost(conv[1], seconds)
            elif not self.join.pending(key[1]):
                del self.late_costs[key]
                self.sink.join_cost("uncertain", seconds)


def made(cls: type[Attribution], clock: list[int]) -> tuple[Attribution, Join, Sink]:
    sink = Sink()
    att = cls(sink, lambda raw: f"p({raw})", lambda: clock[0], lambda: False)
    join = Join()
    att.join = join  # type: ignore[assignment]
    return att, join, sink


def went_out(att: Attribution, task: int, end_us: int) -> None:
    att.went_out(RequestRecord(epoch=0, slot=0, task=task, end_us=end_us, conversation_source="uncertain"), False)


def test_a_record_whose_task_was_settled_before_it_went_out_is_proven_with_its_lineage() -> None:
    """Task 2 sent no id: its conversation is its lineage parent's (task 1), not proven yet when
    its record goes out. When task 1 is proven, task 2's record is too, though the join settled
    task 2 before its record began to wait."""
    clock = [1_000_000]
    att, join, sink = made(Attribution, clock)
    att.launched(1, None)
    att.launched(2, (0, 1))
    join.settle(2, (NONE, ""))
    att.maybe_prove_late()  # a pass with nothing waiting yet
    went_out(att, 2, 900_000)
    assert att.late
    join.settle(1, (NONE, ""))
    att.maybe_prove_late()
    assert sink.calls == [("proven", 2, "p(lineage:0:1)", "lineage")]


def test_a_give_up_at_the_horizon_decides_a_later_record_of_its_lineage_in_the_same_pass() -> None:
    """Task 5's record is past the horizon and unproven: the pass gives it up (uncertain), and
    task 6, which continued it without an id and began to wait later, is then a lineage root:
    proven in that same pass, as a look at every record in turn does."""
    clock = [1_000_000]
    att, join, sink = made(Attribution, clock)
    att.launched(5, None)
    att.launched(6, (0, 5))
    went_out(att, 5, 500_000)
    join.settle(6, (NONE, ""))
    went_out(att, 6, 900_000)
    clock[0] = 500_000 + LATE_PROOF_US + 1
    join.settle(99, (NONE, ""))  # anything settled: a pass
    att.maybe_prove_late()
    assert sink.calls == [("proven", 6, "p(lineage:0:6)", "lineage")]
    assert not att.late


@pytest.mark.parametrize("seed", range(100))
def test_a_pass_over_what_changed_proves_what_a_look_at_every_record_proves(seed: int) -> None:
    rng = random.Random(seed)
    clock = [1_000_000]
    pair = [made(EveryRecord, clock), made(Attribution, clock)]
    launched: list[int] = []
    for _ in range(400):
        roll = rng.random()
        if roll < 0.25 or not launched:
            task = len(launched)
            # chains of requests without an id: a parent among the last few tasks
            parent = (0, rng.choice(launched[-4:])) if launched and rng.random() < 0.8 else None
            launched.append(task)
            for att, _, _ in pair:
                att.launched(task, parent)
        elif roll < 0.5:
            task = rng.choice(launched)
            if task in pair[0][1].open:
                res = rng.choice([(HEADER, f"c{rng.randrange(5)}"), (NONE, ""), (NONE, ""), (UNCERTAIN, "")])
                for _, join, _ in pair:
                    join.settle(task, res)
        elif roll < 0.7:
            task = rng.choice(launched)
            end = clock[0] - rng.randrange(0, 2 * LATE_PROOF_US)
            for att, _, _ in pair:
                if (0, task) not in att.late and att.conversation(0, task) is None:
                    went_out(att, task, end)
        elif roll < 0.8:
            task, hi = rng.choice(launched), rng.randrange(1, 10_000)
            for att, _, _ in pair:
                att.charge([Overlap(0, task, 0, 0, hi)])
        elif roll < 0.9:
            clock[0] += rng.randrange(0, LATE_PROOF_US // 3)
        elif roll < 0.905:
            # the server logs below -lv 4 from now on: every waiting record is a lineage's (one
            # way only: back at -lv 4, a conversation found in between stays found, and the old
            # pass found it for more tasks, its parents too)
            for att, _, _ in pair:
                att.server_changed(True, None)
        for att, _, _ in pair:
            att.maybe_prove_late()
        assert pair[1][2].calls == pair[0][2].calls
        assert list(pair[1][0].late) == list(pair[0][0].late)
        assert pair[1][0].late_costs == pair[0][0].late_costs
    assert pair[1][2].calls, "the sequence proved nothing"


def test_the_check_mode_catches_a_record_left_out(monkeypatch: pytest.MonkeyPatch) -> None:
    """The recorded logs' test (test_many_slots) relies on _check_late: it does report a pass
    that leaves out a record the join proved."""
    monkeypatch.setattr(attribution, "_CHECK_LATE", True)
    attribution.LATE_FAILURES.clear()
    clock = [1_000_000]
    att, join, _ = made(Attribution, clock)
    att.launched(1, None)
    went_out(att, 1, 900_000)
    join.results[1] = (HEADER, "x")  # proven without telling the attribution: no settled task
    join.version += 1
    att.maybe_prove_late()
    assert attribution.LATE_FAILURES == ["record (0, 1) left out"]
