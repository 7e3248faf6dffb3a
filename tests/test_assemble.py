"""The assembler replaying recorded real logs, checked request by request against the
responses' ground truth, and on the edge cases that a live stream brings."""

from __future__ import annotations

from typing import Any

import pytest
from prometheus_client import CollectorRegistry
from support import by_timings, log_lines, replay_records, truths, value

from llamacpp_exporter import parse as p
from llamacpp_exporter.assemble.assembler import Assembler
from llamacpp_exporter.assemble.finish import AssemblySettings
from llamacpp_exporter.pipeline import Pipeline
from llamacpp_exporter.records import RequestRecord, SlotsSnapshot, SlotState


@pytest.mark.parametrize("log", ["lv4-np2-text", "lv4-np2-jsonl"])
def test_lv4_every_request_matches_ground_truth(log: str) -> None:
    recs, _ = replay_records(log_lines(log + ".log"))
    tr = truths(log + ".truth.jsonl")
    assert len(recs) == len(tr)
    for t in tr:
        r = by_timings(recs, t)
        assert r.prompt_tokens == t["prompt_n"] + t["cache_n"]
        assert r.reused_tokens == t["cache_n"]
        assert r.prefill_tokens == t["prompt_n"]
        assert r.generated_tokens == t["predicted_n"]
        assert r.lora == "unknown"  # no /slots in a bare replay: never guessed


def test_lv4_sample_shows_the_lora_discards_of_conv_1_2() -> None:
    recs, _ = replay_records(log_lines("lv4-np2-text.log"))
    tr = truths("lv4-np2-text.truth.jsonl")
    conv12 = [by_timings(recs, t) for t in tr if t["conv"] == "conv-1-2"]
    later = conv12[1:]
    assert later and all(r.ram_restored and r.lora_cache_cleared for r in later)
    # without the LoRA of the saving task the discard is reported, not classified
    assert all(r.restore_result == "discarded_lora_unknown" for r in later)
    assert all(r.reused_tokens == 0 for r in later)


def test_lv3_prefill_and_decode_exact_reuse_unknown() -> None:
    recs, pl = replay_records(log_lines("lv3-np2-text.log"))
    tr = truths("lv3-np2-text.truth.jsonl")
    for t in tr:
        r = by_timings(recs, t)
        assert r.prefill_tokens == t["prompt_n"]
        assert r.generated_tokens == t["predicted_n"]
        assert r.reused_tokens is None and r.prompt_tokens is None and r.outcome is None
        assert r.restore_result is None
    assert value(pl.registry, "llamacpp_exporter_cache_diagnostics_available") == 0


def snapshot(
    slot: int,
    task: int,
    lora: tuple[tuple[int, float], ...] | None,
    processing: bool = True,
    cache: int | None = None,
    processed: int = 0,
    decoded: int = 0,
) -> SlotsSnapshot:
    return SlotsSnapshot((SlotState(slot, task, processing, None, processed, cache, decoded, lora),))


def test_seed_scenario_with_slots_classifies_the_discard_as_wrongful() -> None:
    """Replay the recorded seed scenario with the /slots answers the poller would have
    delivered (tasks 0 and 12 sent lora scale 0.5, task 6 none: it ran with the global scale,
    1.0 on the server recorded)."""
    recs: list[RequestRecord] = []
    pl = Pipeline(CollectorRegistry(), on_record=recs.append, slots_polled=True, clock=lambda: 0.0)
    pl.process_adapters(__import__("llamacpp_exporter.records", fromlist=["LoraAdapters"]).LoraAdapters(((0, 1.0),)))
    lora = {0: ((0, 0.5),), 6: (), 12: ((0, 0.5),)}
    for line in log_lines("lv4-np1-seed-scenario.log"):
        pl.process_line(line, 0.0)
        ev = p.parse_line(line).event
        if isinstance(ev, p.TaskLaunched):
            pl.process_snapshot(snapshot(0, ev.task, lora[ev.task]))
    for _ in range(3):
        pl.process_snapshot(snapshot(0, 12, lora[12], processing=False))
    pl.flush()
    assert [r.task for r in recs] == [0, 6, 12]
    assert [r.lora for r in recs] == ["active", "active", "active"]
    third = recs[2]
    assert third.restore_result == "discarded_lora_wrongful"
    assert third.restored_entry_lora_config == third.lora_config == "0:0.5"
    assert recs[1].lora_config == "0:1"  # no lora field: the global list applies


def test_a_global_scale_logged_by_post_lora_adapters_labels_requests_without_a_list() -> None:
    """The seed scenario with an INVENTED line (b11434's wording and layout, recorded after a POST
    /lora-adapters at -lv 4) before task 6 (which sent no lora list): it runs without the adapter, and is labelled so without
    any /lora-adapters poll; a restart forgets the scale (the new process has its own)."""
    lines = log_lines("lv4-np1-seed-scenario.log")
    at = next(i for i, line in enumerate(lines) if "| task 6 |" in line)
    stamp = lines[at].split(" ", 1)[0]
    lines[at:at] = [f"{stamp} I srv  process_sing: set lora adapter idx=0 scale=0.000000"]
    recs: list[RequestRecord] = []
    pl = Pipeline(CollectorRegistry(), on_record=recs.append, slots_polled=True, clock=lambda: 0.0)
    lora = {0: ((0, 0.5),), 6: (), 12: ((0, 0.5),)}
    for line in lines + log_lines("lv4-np1-seed-scenario.log"):
        pl.process_line(line, 0.0)
        ev = p.parse_line(line).event
        if isinstance(ev, p.TaskLaunched):
            pl.process_snapshot(snapshot(0, ev.task, lora[ev.task]))
    for _ in range(3):
        pl.process_snapshot(snapshot(0, 12, lora[12], processing=False))
    pl.flush()
    assert [(r.epoch, r.task) for r in recs] == [(0, 0), (0, 6), (0, 12), (1, 0), (1, 6), (1, 12)]
    assert [r.lora for r in recs] == ["active", "none", "active", "active", "unknown", "active"]
    assert recs[1].lora_config == "none" and recs[4].lora_config == "global"


def test_restart_starts_a_new_epoch_and_joins_nothing_across_it() -> None:
    lines = log_lines("lv4-np1-seed-scenario.log")
    recs, pl = replay_records(lines + lines)
    assert [r.epoch for r in recs] == [0, 0, 0, 1, 1, 1]
    assert [r.task for r in recs] == [0, 6, 12, 0, 6, 12]
    assert value(pl.registry, "llamacpp_exporter_server_restarts_total") == 1
    assert recs[3].ram_restored is False  # the second process's cache starts empty


def test_restart_without_timestamps_is_seen_by_the_initializing_line() -> None:
    lines = [ln.split(" ", 2)[2] if ln[:1].isdigit() else ln for ln in log_lines("lv4-np1-seed-scenario.log")]
    recs, pl = replay_records(lines + lines)
    assert [r.epoch for r in recs] == [0, 0, 0, 1, 1, 1]


def test_overlap_of_another_slots_prefill_with_decoding() -> None:
    # From lv4-np2-text.log: task 2 (slot 0) decodes for 556.46 ms ending at 4.638258 s, all of
    # it while task 0 on slot 1 prefills (1.108522 s until 6.625 s).
    recs, _ = replay_records(log_lines("lv4-np2-text.log"))
    r = next(r for r in recs if r.task == 2)
    assert r.decode_seconds == pytest.approx(0.55646)
    assert r.overlap_seconds == pytest.approx(0.55646, abs=2e-6)
    assert r.contention == "prefill"
    first = next(r for r in recs if r.task == 0)
    assert first.overlap_seconds == 0 and first.contention == "none"


def test_outcome_thresholds_are_configurable() -> None:
    lines = log_lines("lv4-np2-text.log")
    default, _ = replay_records(lines)
    low, _ = replay_records(lines, AssemblySettings(min_prompt_tokens=100))
    assert sum(r.outcome is not None for r in low) > sum(r.outcome is not None for r in default)
    for r in low:
        if r.outcome == "hit":
            assert r.reused_tokens is not None and r.prompt_tokens
            assert r.reused_tokens / r.prompt_tokens >= 0.9
        elif r.outcome == "miss":
            assert r.reused_tokens is not None and r.prompt_tokens
            assert r.reused_tokens / r.prompt_tokens < 0.1 and r.miss_cause


def test_small_task_takeover() -> None:
    # invented lines, shaped like lv4 output: a 2-token probe selected by LCP on a slot that
    # held a 1,500-token conversation (the seed's health probe)
    lines = [
        "0.00.000.100 I srv  llama_server: initializing ...",
        "0.01.000.000 I slot launch_slot_: id  0 | task 1 | processing task, is_child = 0",
        "0.01.000.100 I slot   operator(): id  0 | task 1 | new prompt, n_ctx_slot = 8192, n_keep = 0, task.n_tokens = 1500",
        "0.01.000.200 I slot   operator(): id  0 | task 1 | cached n_tokens = 0, memory_seq_rm [0, end)",
        "0.05.000.000 I slot print_timing: id  0 | task 1 | prompt eval time =    3900.00 ms /  1500 tokens (    2.60 ms per token,   384.62 tokens per second)",
        "0.05.000.001 I slot print_timing: id  0 | task 1 |        eval time =     100.00 ms /     5 tokens (   25.00 ms per token,    40.00 tokens per second)",
        "0.05.000.002 I slot      release: id  0 | task 1 | stop processing: n_tokens = 1504, truncated = 0",
        "0.06.000.000 I slot get_availabl: id  0 | task -1 | selected slot by LCP similarity, f_sim_best = 0.500 (> 0.100 thold), f_keep = 0.001",
        "0.06.000.001 I slot launch_slot_: id  0 | task 4 | processing task, is_child = 0",
        "0.06.000.002 I slot   operator(): id  0 | task 4 | new prompt, n_ctx_slot = 8192, n_keep = 0, task.n_tokens = 2",
        "0.06.000.003 I slot   operator(): id  0 | task 4 | cached n_tokens = 1, memory_seq_rm [1, end)",
        "0.06.010.000 I slot print_timing: id  0 | task 4 | prompt eval time =       5.00 ms /     1 tokens (    5.00 ms per token,   200.00 tokens per second)",
        "0.06.010.001 I slot print_timing: id  0 | task 4 |        eval time =       5.00 ms /     1 tokens (    0.00 ms per token,     0.00 tokens per second)",
        "0.06.010.002 I slot      release: id  0 | task 4 | stop processing: n_tokens = 2, truncated = 0",
    ]
    recs, pl = replay_records(lines)
    assert [r.small_task_takeover for r in recs] == [False, True]
    assert recs[1].path == "slot" and recs[1].slot_tokens_before == 1504
    assert recs[1].time_per_output_token_seconds is None  # one generated token: no per-token time
    assert value(pl.registry, "llamacpp_small_task_slot_takeovers_total") == 1


def test_lora_unknown_when_slots_never_showed_the_task() -> None:
    recs: list[RequestRecord] = []
    pl = Pipeline(CollectorRegistry(), on_record=recs.append, slots_polled=True, clock=lambda: 0.0)
    for line in log_lines("lv4-np1-seed-scenario.log"):
        pl.process_line(line, 0.0)
    assert recs == []  # waiting for /slots
    for _ in range(3):  # polls after the releases that show other tasks
        pl.process_snapshot(snapshot(0, 99, ((0, 0.5),), processing=False))
    assert [r.lora for r in recs] == ["unknown"] * 3


def test_state_is_bounded_under_endless_tasks() -> None:
    """20000 tasks on 4 slots of one server process, each released and seen in /slots with a
    LoRA list, no client ever sending an id: every per-task map stays at its cap."""
    from llamacpp_exporter.assemble import attribution, finish, lora, timeline

    a = Assembler(sink=_NullSink(), slots_polled=True)

    def ts(us: int) -> str:
        return f"{us // 60_000_000}.{us // 1_000_000 % 60:02d}.{us // 1000 % 1000:03d}.{us % 1000:03d}"

    for task in range(20000):
        us = task * 2000
        for line in (
            f"{ts(us)} I slot launch_slot_: id  {task % 4} | task {task} | processing task, is_child = 0",
            f"{ts(us + 1000)} I slot      release: id  {task % 4} | task {task} | stop processing: n_tokens = 5, truncated = 0",
        ):
            a.feed(p.parse_line(line), 0)
        a.feed_snapshot(snapshot(task % 4, task, ((0, 0.5),), processing=False))
    assert a.epoch == 0
    assert len(a.finisher.pending) <= finish.MAX_PENDING
    assert all(len(pf) <= timeline.MAX_PREFILL_HISTORY for pf in a.prefills.slots.values())
    assert len(a.lora._by_task) <= lora.MAX_TASKS
    att = a.attribution
    assert len(att._conv) <= attribution.MAX_TASKS and len(att._lineage_parent) <= attribution.MAX_TASKS


class _NullSink:
    def __getattr__(self, name: str) -> Any:
        return lambda *args, **kw: None


def test_continuation_lines_do_not_move_the_clock() -> None:
    """A multi-line message's continuation has no timestamp; it must not replace the log's own
    clock with the reader's wall clock (records would look a day old and be emitted early)."""
    a = Assembler(sink=_NullSink())
    a.feed(p.parse_line("0.01.000.000 I srv  llama_server: initializing ..."), 0)
    a.feed(p.parse_line("\trepeat_last_n = 64, repeat_penalty = 1.000"), 1_800_000_000_000_000)
    assert a.clock.now == 1_000_000


@pytest.mark.parametrize("log", ["lv4-np2-text", "lv4-np2-jsonl", "lv4-np2-slow-machine", "lv4-np4-stuck-embeddings"])
def test_overlap_agrees_with_the_servers_own_timings(log: str) -> None:
    """Each record's overlap with other slots' prefills, against an independent reading of the
    log's print_timing lines (decode ends at the eval line; decode and prefill times are the
    server's). A record must wait until the prefills it overlaps have their exact times. The
    child tasks of an `n > 1` request print their parent's prompt time: they computed nothing.
    A task that never printed its timings is left out: in lv4-np4-stuck-embeddings three
    embedding tasks launched and never logged their first batch, so they computed nothing and
    the records decoding meanwhile must show no overlap with them (and must not wait for them)."""
    tasks: dict[int, dict[str, Any]] = {}
    children = set()
    for line in log_lines(log + ".log"):
        pl = p.parse_line(line)
        ev = pl.event
        if isinstance(ev, p.TaskLaunched) and ev.is_child:
            children.add(ev.task)
        elif isinstance(ev, p.PromptTiming):
            tasks.setdefault(ev.task, {}).update(slot=ev.slot, prefill_ms=ev.ms)
        elif isinstance(ev, p.EvalTiming):
            tasks.setdefault(ev.task, {}).update(slot=ev.slot, end=pl.ts_us, decode_ms=ev.ms)
    spans = {}
    for task, t in tasks.items():
        if task in children:
            continue
        decode_start = t["end"] - int(t["decode_ms"] * 1000)
        spans[task] = (t["slot"], decode_start - int(t["prefill_ms"] * 1000), decode_start, t["end"])

    def expected(task: int) -> float:
        slot, _, d0, d1 = spans[task]
        cuts = sorted(
            (max(a, d0), min(b, d1)) for s, a, b, _ in spans.values() if s != slot and min(b, d1) > max(a, d0)
        )
        total, lo, hi = 0, None, None
        for a, b in cuts:
            if hi is None or a > hi:
                total += (hi - lo) if hi is not None else 0
                lo, hi = a, b
            else:
                hi = max(hi, b)
        return (total + ((hi - lo) if hi is not None else 0)) / 1e6

    recs, _ = replay_records(log_lines(log + ".log"))
    checked = [(r.task, r.overlap_seconds, expected(r.task)) for r in recs if r.task in spans]
    assert len(checked) >= 19 and sum(e for _, _, e in checked) > 0.5
    for task, got, want in checked:
        assert abs(got - want) < 1e-6, (task, got, want)


def _by_turn(name: str) -> list[tuple[dict[str, Any], RequestRecord]]:
    """Sequential requests on one slot: the n-th record is the n-th response."""
    recs, _ = replay_records(log_lines(f"{name}.log"))
    rows = truths(f"{name}.truth.jsonl")
    recs.sort(key=lambda r: r.task)
    assert len(recs) == len(rows)
    for r, t in zip(recs, rows, strict=True):
        assert (r.reused_tokens, r.prompt_tokens) == (t["cache_n"], t["cache_n"] + t["prompt_n"]), t
        assert r.conversation_source == "header"
    return list(zip(rows, recs, strict=True))


def test_a_conversation_evicted_before_it_came_back_misses_with_cause_evicted() -> None:
    """Recorded: three conversations take turns on one slot with a RAM cache that holds two of
    their entries, so each comes back after its entry was pushed out."""
    pairs = _by_turn("lv4-np1-cache-thrashing")
    evicted = [t for t, r in pairs if r.miss_cause == "evicted"]
    came_back_empty = [t for t, r in pairs if t["turn"] > 0 and t["cache_n"] == 0]
    assert came_back_empty and evicted == came_back_empty
    assert {r.miss_cause for t, r in pairs if t["turn"] == 0} == {"no_cache_entry"}  # never saved yet


def test_a_full_cache_that_evicts_only_what_is_not_needed_again_is_not_thrashing() -> None:
    """Recorded: one conversation comes back between one-shot conversations; the cache is full
    and evicts (one-shots), and the conversation hits every time."""
    recs, pl = replay_records(log_lines("lv4-np1-cache-full-healthy.log"))
    assert value(pl.registry, "llamacpp_prompt_cache_evictions_total") > 0
    pairs = _by_turn("lv4-np1-cache-full-healthy")
    returning = [(t, r) for t, r in pairs if t["turn"] > 0]
    assert returning and all(r.outcome == "hit" and t["cache_n"] > 0 for t, r in returning)
    assert all(r.miss_cause != "evicted" for _, r in pairs)


def test_equal_length_cache_entries_do_not_break_lineage() -> None:
    """Recorded (the contention test without ids): pinned probes make llama-server save states of
    equal length (29 tokens, two of 1224) and then remove one of them as obsolete, a line that
    gives only the length. Which one went is read from the next list of the entries; the long
    conversation's three turns stay one lineage group and its restore's source is known."""
    recs, _ = replay_records(log_lines("lv4-np2-no-ids.log"))
    rows = [t for t in truths("lv4-np2-no-ids.truth.jsonl") if t["conv"] == "long-conversation"]
    long = [by_timings(recs, t) for t in rows]
    assert len(rows) == 3 and len({r.conversation for r in long}) == 1
    assert {r.conversation_source for r in long} == {"lineage"}


def test_a_stray_line_with_a_later_timestamp_is_not_a_restart() -> None:
    """Invented from a recorded log: a late line of the server (an ignored one) appears in the
    middle, far ahead of its neighbours; then time is back where it was. That line was the
    stray: no new epoch, no request cancelled, the same records as without it."""
    lines = log_lines("lv4-np2-text.log")
    clean, _ = replay_records(lines)
    late = next(ln for ln in reversed(lines) if "total time" in ln)  # from the log's end
    stray = lines[: len(lines) // 2] + [late] + lines[len(lines) // 2 :]
    recs, pl = replay_records(stray)
    assert value(pl.registry, "llamacpp_exporter_server_restarts_total") == 0
    assert value(pl.registry, "llamacpp_exporter_log_lines_out_of_order_total") == 1
    key = lambda r: (r.epoch, r.task, r.cancelled, r.prompt_tokens, r.reused_tokens, r.prefill_seconds)  # noqa: E731
    assert sorted(map(key, recs)) == sorted(map(key, clean))


def test_a_stray_line_with_an_earlier_timestamp_is_not_a_restart() -> None:
    """Invented from a recorded log: one early line repeated in the middle (another writer, a
    replayed line). Time goes back for one line only: no new epoch, no request cancelled,
    the same records as without it."""
    lines = log_lines("lv4-np2-text.log")
    clean, _ = replay_records(lines)
    stray = lines[: len(lines) // 2] + [lines[300]] + lines[len(lines) // 2 :]
    recs, pl = replay_records(stray)
    assert value(pl.registry, "llamacpp_exporter_server_restarts_total") == 0
    assert value(pl.registry, "llamacpp_exporter_log_lines_out_of_order_total") == 1
    key = lambda r: (r.epoch, r.task, r.cancelled, r.prompt_tokens, r.reused_tokens, r.prefill_seconds)  # noqa: E731
    assert sorted(map(key, recs)) == sorted(map(key, clean))
    # two stray lines in a row are still noise; a restart without its banner needs three lines
    two = lines[: len(lines) // 2] + lines[300:302] + lines[len(lines) // 2 :]
    assert value(replay_records(two)[1].registry, "llamacpp_exporter_server_restarts_total") == 0
    restarted = lines + [ln for ln in lines if "initializing ..." not in ln]
    assert value(replay_records(restarted)[1].registry, "llamacpp_exporter_server_restarts_total") == 1


def test_a_task_stuck_before_its_first_batch_holds_no_other_record() -> None:
    """b11434 with chat and embeddings on 4 slots left three embedding tasks launched and never
    begun (no first batch, no release, for minutes: recorded). Every other request's record must
    still go out as its task ends, not when the server restarts or the holding bound gives up."""
    lines = log_lines("lv4-np4-stuck-embeddings.log")
    released: dict[int, int] = {}
    for line in lines:
        pl = p.parse_line(line)
        if isinstance(pl.event, p.TaskReleased) and pl.ts_us is not None:
            released[pl.event.task] = pl.ts_us
    last = max(released.values())
    recs: list[RequestRecord] = []
    pipeline = Pipeline(CollectorRegistry(), on_record=recs.append, clock=lambda: 0.0)
    for line in lines:
        pipeline.process_line(line, 0.0)  # no flush: the log goes on
    out = {r.task for r in recs}
    stuck_since = 65_819_068  # the first of them launched (task 1363)
    late = [t for t, at in released.items() if stuck_since < at < last - 5_000_000]
    assert len(late) >= 15
    assert [t for t in late if t not in out] == []


def test_a_restart_at_lv3_after_lv4_takes_a_task_without_timings_for_a_completion() -> None:
    """Whether launches show "sampler chain" (TRACE) is the run's own: after a restart at -lv 3
    a task that ended without timings cannot be told from an embedding, and is a completion.
    Recorded runs of b11434, one after the other in one log; task 0's timing lines deleted."""
    lv3 = [x for x in log_lines("builds/b11434-lv3-text.log") if not ("task 0 |" in x and "print_timing" in x)]
    recs, _ = replay_records([*log_lines("builds/b11434-lv4-text.log"), *lv3])
    after = [r for r in recs if r.epoch == 1]
    assert len(after) >= 3 and {r.kind for r in recs if r.epoch == 0} == {"completion"}
    assert [(r.task, r.kind) for r in after if r.generated_tokens is None] == [(0, "completion")]
