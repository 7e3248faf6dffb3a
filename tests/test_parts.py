"""Unit tests of the assembler's parts, each on its own: small sequences invented for the case
(labelled so), no log file, no process, no sleep."""

from __future__ import annotations

from typing import Any

import pytest

from llamacpp_exporter import parse as p
from llamacpp_exporter.assemble.attribution import Attribution, lineage_parent
from llamacpp_exporter.assemble.draft import TaskDraft
from llamacpp_exporter.assemble.finish import AssemblySettings, Finisher
from llamacpp_exporter.assemble.join import DeferredQueue
from llamacpp_exporter.assemble.logclock import RESTART_CONFIRM_LINES, LogClock
from llamacpp_exporter.assemble.lora import LoraTracker, state
from llamacpp_exporter.assemble.promptcache import PromptCacheLog, Selection
from llamacpp_exporter.assemble.serverstate import ServerState
from llamacpp_exporter.assemble.timeline import Overlap
from llamacpp_exporter.records import RequestRecord, SlotState


class Calls:
    """Records every call made on it: a sink that remembers."""

    def __init__(self) -> None:
        self.calls: list[tuple[Any, ...]] = []

    def __getattr__(self, name: str) -> Any:
        return lambda *a: self.calls.append((name, *a))

    def named(self, name: str) -> list[tuple[Any, ...]]:
        return [c[1:] for c in self.calls if c[0] == name]


# ------------------------------------------------------------ lora
@pytest.mark.parametrize(
    ("request_scales", "global_scales", "config", "label"),
    [
        (None, ((0, 1.0),), None, "unknown"),  # /slots never showed the task
        (((0, 0.5),), ((0, 1.0),), "0:0.5", "active"),  # a list replaces the global scales
        (((0, 0.0),), ((0, 1.0),), "none", "none"),
        # an empty list leaves the global scales in force: the adapter runs at 1.0 (measured on
        # b11434 started with --lora-init-without-apply: the same tokens as scale 1.0)
        ((), ((0, 1.0),), "0:1", "active"),
        ((), ((0, 0.0),), "none", "none"),  # after POST /lora-adapters [{"id": 0, "scale": 0}]
        ((), None, "global", "unknown"),  # ... which are not known yet
        (((1, 0.5), (0, 0.25)), None, "0:0.25,1:0.5", "active"),  # sorted by adapter
    ],
)
def test_lora_config_compares_as_the_server_does(
    request_scales: tuple[tuple[int, float], ...] | None,
    global_scales: tuple[tuple[int, float], ...] | None,
    config: str | None,
    label: str,
) -> None:
    t = LoraTracker()
    if global_scales is not None:
        t.polled(global_scales, catching_up=False)
    t.launched((0, 1))
    assert t.config_of((0, 1), request_scales) == config
    assert state(t.config_of((0, 1), request_scales)) == label


def test_global_scales_are_those_at_a_tasks_launch_and_unknown_around_a_change_a_poll_found() -> None:
    t = LoraTracker()
    one, quarter = ((0, 1.0),), ((0, 0.25),)
    t.polled(one, catching_up=False)
    t.launched((0, 1))  # launched under 1.0
    t.polled(one, catching_up=False)
    t.launched((0, 2))  # the POST came after this launch, or before it: the next poll cannot tell
    t.polled(quarter, catching_up=False)
    t.launched((0, 3))  # the answer may have come before a launch line written earlier was read
    t.polled(quarter, catching_up=False)
    t.launched((0, 4))
    assert [t.config_of((0, k), ()) for k in (1, 2, 3, 4)] == ["0:1", "global", "global", "0:0.25"]
    # the log's own line is exact at its place: no task around it is in doubt
    t.global_scale_set(0, 0.0)
    t.launched((0, 5))
    assert [t.config_of((0, k), ()) for k in (4, 5)] == ["0:0.25", "none"]
    t.polled(((0, 0.0),), catching_up=False)  # agrees with the log: no change
    t.launched((0, 6))
    assert t.config_of((0, 6), ()) == "none"
    # a poll while the log is read from behind says nothing of the tasks read meanwhile
    t.polled(((0, 0.0),), catching_up=True)
    t.launched((0, 7))
    assert t.config_of((0, 7), ()) == "global"
    # a new server process: its own scales, unknown until polled (or logged)
    t.new_process()
    t.launched((1, 1))
    t.polled(one, catching_up=False)
    t.launched((1, 2))
    assert [t.config_of((1, k), ()) for k in (1, 2)] == ["global", "0:1"]
    assert t.config_of((1, 2), ((0, 0.5),)) == "0:0.5"  # a list of its own replaces them


def test_lora_per_task_is_bounded_and_keeps_the_newest() -> None:
    from llamacpp_exporter.assemble.lora import MAX_TASKS

    t = LoraTracker()
    for task in range(MAX_TASKS + 10):
        t.task_seen((0, task), ((0, 0.5),))
    assert t.of_task((0, 0)) is None and t.of_task((0, MAX_TASKS + 9)) == ((0, 0.5),)
    assert t.of_task(None) is None


# ------------------------------------------------------------ logclock
def line(ts: int | None, ev: p.Event | None = None) -> p.ParsedLine:
    return p.ParsedLine(ts, ev if ev is not None else p.Ignored())


def test_clock_keeps_the_log_time_and_continuation_lines_do_not_move_it() -> None:
    c = LogClock()
    c.advance(5_000_000, now_us=123)
    c.advance(None, now_us=9_999_999_999)  # a continuation line: keeps the log's time
    assert c.now == 5_000_000


def test_clock_without_timestamps_uses_the_read_time_and_never_goes_back() -> None:
    c = LogClock()
    c.advance(None, 2_000)
    c.advance(None, 1_000)
    assert c.now == 2_000


def test_time_going_back_is_a_restart_only_when_confirmed() -> None:
    c = LogClock()
    c.advance(60_000_000, 0)
    assert not c.went_back(59_999_500)  # within the jitter of queue-time stamps
    assert c.went_back(1_000)
    results = [c.hold(line(1_000 + i), 0) for i in range(RESTART_CONFIRM_LINES)]
    assert results == [False] * (RESTART_CONFIRM_LINES - 1) + [True]
    assert len(c.take_held()) == RESTART_CONFIRM_LINES and c.held == []
    assert c.hold(line(500, p.ServerStarting()), 0)  # the start banner proves it at once


# ------------------------------------------------------------ serverstate
def test_server_state_says_when_only_lineage_can_group_requests() -> None:
    sink, changes = Calls(), []
    s = ServerState(sink, lambda: changes.append(1))
    assert not s.lineage_only  # nothing known yet: the join may try
    s.verbosity_read(p.Verbosity(3))
    assert s.lineage_only and sink.named("diagnostics") == [(False, 3)]
    s = ServerState(Calls(), lambda: None)
    s.set_diagnostics(True)
    assert not s.lineage_only
    s.set_diagnostics(False)  # a whole task without its -lv 4 lines
    assert s.lineage_only


def test_server_state_announces_each_slot_once_and_within_the_banner() -> None:
    sink = Calls()
    s = ServerState(sink, lambda: None)
    s.slots_initialized(p.SlotsInitialized(2, 4096))
    s.announce_slots([0, 1, 7])  # slot 7 is not one of the server's: no label for it
    assert sink.named("slots_known") == [([0, 1],)] and s.slots() == 2


def test_debug_logging_is_reported_once() -> None:
    sink = Calls()
    s = ServerState(sink, lambda: None)
    s.verbosity_read(p.Verbosity(5))
    s.debug_seen(p.DebugLine())
    assert len(sink.named("debug_logging_seen")) == 1


# ------------------------------------------------------------ promptcache
def test_a_restore_names_the_task_that_computed_the_entry() -> None:
    """Invented sequence: task 3's state saved, then a lookup restores it for a selection."""
    evicted: list[Any] = []
    cache = PromptCacheLog(Calls(), evicted.append, lambda: None)
    cache.idle_slot_saving((0, 3))
    cache.prompt_saved(p.PromptSaved(900, 10.0))
    cache.before(p.Ignored())  # the save is pushed
    sel = Selection(0, "lru", None)
    cache.selected(sel, (0, 5))
    cache.update_started(p.CacheUpdateStarted())
    cache.candidate(p.CacheCandidate(900, 880, "1.000", "0.950"))
    cache.restored(p.CacheRestored("1.000", "0.950"))
    assert sel.ram_consulted and sel.restored_tokens == 900 and sel.restored_source == (0, 3)
    assert sel.best_f_sim == 0.95 and sel.restored_lcp == 880
    d = TaskDraft(epoch=0, slot=0, task=6, start_us=0)
    sel.hand_over(d)
    assert (d.path, d.ram_restored, d.entry_source, d.offered_tokens) == ("ram", True, (0, 3), 880)


def test_cache_lines_after_the_launch_belong_to_no_selection() -> None:
    cache = PromptCacheLog(Calls(), lambda s: None, lambda: None)
    sel = Selection(1, "lcp", 100)
    cache.selected(sel, None)
    cache.launched(sel)
    cache.candidate(p.CacheCandidate(50, 10, "0.100", "0.100"))
    assert sel.candidates is None


def test_cache_figures_go_to_the_sink_in_bytes() -> None:
    sink = Calls()
    cache = PromptCacheLog(sink, lambda s: None, lambda: None)
    cache.state(p.CacheState(2, 1.5, 90.0))
    cache.evicted(p.CacheEvicted(0.5, True))
    assert sink.named("cache_state") == [(2, 1.5 * 1048576, 90.0 * 1048576)]
    assert sink.named("cache_evicted") == [(0.5 * 1048576,)]


# ------------------------------------------------------------ attribution
class FakeClock:
    now = 0


def attribution(sink: Any = None) -> tuple[Attribution, FakeClock]:
    clock = FakeClock()
    att = Attribution(sink or Calls(), lambda s: "c-" + s, lambda: clock.now, lambda: True)
    return att, clock


def test_lineage_follows_the_slot_or_the_restored_entry_only_when_kept_whole() -> None:
    lcp = Selection(0, "lcp", 100, f_keep=1.0)
    assert lineage_parent(lcp, 2, 7) == (2, 7)
    assert lineage_parent(Selection(0, "lcp", 100, f_keep=0.5), 2, 7) is None  # shared system prompt
    ram = Selection(0, "lru", 100, restored_source=(1, 4), restored_f_keep=0.95)
    assert lineage_parent(ram, 2, 7) == (1, 4)
    assert lineage_parent(Selection(0, "id", 100), 2, 7) is None  # pinned: not a continuation by itself
    assert lineage_parent(None, 2, 7) is None


def test_below_lv4_a_continuation_joins_the_conversation_it_continues() -> None:
    att, _ = attribution()
    att.lineage_only = True
    att.launched(1, None)
    att.launched(2, (0, 1))
    first, second = att.conversation_now(0, 1), att.conversation_now(0, 2)
    assert first == ("c-lineage:0:1", "lineage") and second == first


def test_an_eviction_counts_for_the_next_request_of_its_conversation_once() -> None:
    """Invented: task 1 of conversation A (by header) loses its RAM-cache entry; A comes back."""
    att, clock = attribution()
    att._conv[(0, 1)] = ("A", "header")  # as the join would have proven it
    clock.now = 10
    att.entry_evicted((0, 1))
    assert not att.came_back_after_eviction("A", start_us=5)  # started before the eviction
    assert att.came_back_after_eviction("A", start_us=20)
    assert not att.came_back_after_eviction("A", start_us=30)  # consumed


def test_overlap_is_charged_to_the_prefilling_conversations() -> None:
    sink = Calls()
    att, _ = attribution(sink)
    att._conv[(0, 1)] = ("A", "header")
    att._conv[(0, 2)] = ("B", "header")
    att._conv[(0, 3)] = (None, "uncertain")
    slowed_by = att.charge(
        [Overlap(1, 1, 0, 0, 1_000_000), Overlap(2, 2, 0, 0, 3_000_000), Overlap(3, 3, 0, 0, 9_000_000)]
    )
    assert slowed_by == "B" and sorted(sink.named("conversation_cost")) == [("A", 1.0), ("B", 3.0)]


# ------------------------------------------------------------ finish
class Records(list[RequestRecord]):
    """The finisher's sink: the records that left, in order."""

    def record(self, record: RequestRecord) -> None:
        self.append(record)


def finisher(slots_polled: bool = False) -> tuple[Finisher, list[RequestRecord]]:
    out = Records()
    att, _ = attribution()
    att.lineage_only = True
    return Finisher(out, AssemblySettings(), LoraTracker(), att, slots_polled), out


def test_a_released_task_waits_for_its_lora_until_a_later_poll_missed_it() -> None:
    f, out = finisher(slots_polled=True)
    f.attribution.launched(1, None)
    f.add(TaskDraft(epoch=0, slot=0, task=1, start_us=0, end_us=10))
    f.try_finish(20)
    assert out == []  # the next /slots poll may still show its LoRA list
    f.slots_seen()  # two polls after the release did not show it
    f.slots_seen()
    f.try_finish(30)
    assert [r.lora for r in out] == ["unknown"]  # unknown, not a guess


def test_the_record_is_frozen_and_classified() -> None:
    f, out = finisher()
    f.attribution.launched(1, None)
    d = TaskDraft(epoch=0, slot=0, task=1, start_us=0, end_us=10, path="ram", prompt_tokens=2000, reused_tokens=0)
    d.ram_consulted, d.lora_request = True, ((0, 0.5),)
    f.add(d)
    f.try_finish(20)
    (rec,) = out
    assert (rec.outcome, rec.miss_cause, rec.lora, rec.conversation_source) == (
        "miss",
        "no_cache_entry",
        "active",
        "lineage",
    )
    with pytest.raises(AttributeError):
        rec.outcome = "hit"  # type: ignore[misc]


def test_pending_records_are_bounded() -> None:
    from llamacpp_exporter.assemble.finish import MAX_PENDING

    f, out = finisher(slots_polled=True)  # each waits for a poll that never comes
    for task in range(MAX_PENDING + 5):
        f.add(TaskDraft(epoch=0, slot=0, task=task, start_us=0, end_us=0))
    assert len(f.pending) == MAX_PENDING and [r.task for r in out] == list(range(5))


def test_slots_fill_in_what_the_log_lacks() -> None:
    d = TaskDraft(epoch=0, slot=0, task=1, start_us=0)
    d.seen_in_slots(SlotState(0, 1, True, 100, 0, 80, 0, ((0, 1.0),)))
    assert d.lora_request == ((0, 1.0),) and d.reused_tokens is None  # nothing processed yet: may be stale
    d.seen_in_slots(SlotState(0, 1, True, 100, 20, 80, 0, None))
    # mypy keeps the narrowing of the assert above across the call that changed them
    assert (d.reused_tokens, d.reuse_source) == (80, "slots")  # type: ignore[comparison-overlap]


# ------------------------------------------------------------ the join's deferred queue
def test_deferred_queue_mirrors_the_server_while_exact() -> None:
    q = DeferredQueue()
    assert q.attempt(None, 0, None, burst=1) == ((0, 0, 1),)  # deferred in the first try burst
    assert q.retry is False  # a new task in every way the queue can be
    assert q.attempt(None, 1, 1, burst=2) == ((0, 1, 2),)  # deferred, pinned to slot 1
    q.released(1)  # slot 1 frees: the task pinned to it goes first
    # it launches: its request is among the first two, first tried in the second burst
    assert q.attempt(5, 5, None, burst=3) == ((0, 1, 2),)
    assert q.retry is True
    assert q.count() == 1 and q.exact


def test_deferred_queue_keeps_every_world_an_uncertain_cancel_leaves() -> None:
    q = DeferredQueue()
    q.attempt(None, 0, None, burst=1)
    q.attempt(None, 1, None, burst=2)
    q.may_have_lost_one()  # took out the first, the second, or neither (another client's request)
    assert not q.exact and q.worlds is not None and len(q.worlds) == 3 and q.count() == 1 and not q.certainly_empty()
    q.released(0)  # one goes back to the front ...
    # ... and launches: the first or the second request, one triple for each way the queue can be
    assert q.attempt(7, 2, None, burst=3) == ((0, 0, 1), (0, 1, 2))
    assert q.count() == 0 and not q.certainly_empty()  # the other may still be waiting
    q.released(0)
    q.attempt(None, 3, None)  # a retry deferred again, or a new task deferred
    assert q.retry is None and q.count() == 1 and not q.certainly_empty()  # in every world one task waits


def test_deferred_queue_drops_a_world_the_lines_contradict() -> None:
    q = DeferredQueue()
    q.attempt(None, 0, 1)  # pinned to slot 1
    q.attempt(None, 1, None)
    q.may_have_lost_one()
    q.released(0)  # slot 0 frees: the oldest goes back (none is pinned to slot 0)
    q.attempt(None, 2, None)  # tried unpinned, deferred: the pinned task was not the one at the front
    assert q.worlds is not None and all(w.queue[0].pinned is None for w in q.worlds if w.sent_back == [])
    assert [d.pinned for d in q.worlds[0].queue] == [None]  # the pinned one was cancelled


def test_deferred_queue_keeps_bounds_past_its_worlds() -> None:
    q = DeferredQueue()
    for i in range(10):
        q.attempt(None, i, None)
    for _ in range(4):
        q.may_have_lost_one()  # 1 + 10 + 45 + 120 + 210 ways: past MAX_WORLDS
    assert q.worlds is None and (q.lo, q.hi) == (6, 10)
    q.released(0)
    q.attempt(11, 11, None)  # certainly a retry
    assert (q.lo, q.hi) == (5, 9)


def test_a_record_takes_its_drafts_facts_under_the_same_names_and_types() -> None:
    """The facts a draft collects become the record's by one generated list (FACTS_FROM_DRAFT):
    the two classes must agree on each one's type, and a record's other fields are its verdict."""
    import dataclasses
    import typing

    from llamacpp_exporter.assemble.finish import FACTS_FROM_DRAFT

    rec_types, draft_types = typing.get_type_hints(RequestRecord), typing.get_type_hints(TaskDraft)
    assert len(FACTS_FROM_DRAFT) >= 26
    for name in FACTS_FROM_DRAFT:  # the same type, or the record's may also be None (start_us)
        assert rec_types[name] in (draft_types[name], draft_types[name] | None), name
    verdict = {f.name for f in dataclasses.fields(RequestRecord)} - set(FACTS_FROM_DRAFT)
    assert {"outcome", "miss_cause", "restore_result", "lora", "contention", "queue_seconds"} <= verdict


def test_the_assembly_settings_are_the_configuration_keys_they_name() -> None:
    import dataclasses

    from llamacpp_exporter.assemble.finish import CONFIG_KEYS
    from llamacpp_exporter.config import Config, override

    names = {f.name for f in dataclasses.fields(AssemblySettings)}
    assert names - set(CONFIG_KEYS) == {"max_wait_us"}  # the assembler's own
    cfg = Config()
    assert AssemblySettings.from_config(cfg) == AssemblySettings()  # the defaults are the configuration's
    changed = override(cfg, "takeover", big_conversation_tokens=12345)
    assert AssemblySettings.from_config(changed).big_conversation_tokens == 12345
