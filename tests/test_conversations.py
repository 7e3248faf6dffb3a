"""Conversations: the header join and cache lineage on recorded real logs, the salted
pseudonyms, and the bounded cost store behind the top-N metrics."""

from __future__ import annotations

import re
from typing import cast

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from support import SALT, by_timings, grouping_accuracy, log_lines, replay, truths

from llamacpp_exporter.assemble.pseudonyms import Pseudonymizer
from llamacpp_exporter.export.conversations import ConversationCosts
from llamacpp_exporter.pipeline import Pipeline
from llamacpp_exporter.records import MissCause, RequestRecord


def test_header_join_matches_every_request_of_the_recorded_runs() -> None:
    ps = Pseudonymizer(SALT)
    for log in ("lv4-np2-text", "lv4-np2-jsonl"):
        recs = replay(log_lines(log + ".log"), ps)
        for t in truths(log + ".truth.jsonl"):
            r = by_timings(recs, t)
            assert r.conversation == ps("id:" + t["conv"]) and r.conversation_source == "header", t
    # in these runs deferred tasks launched out of id order (task 5 before task 4): a join by
    # launch order would have failed, the join by task-id rank does not


def test_header_join_across_a_request_cancelled_before_it_launched() -> None:
    """Recorded: one slot busy with a long request, a client without an id gives up while its
    request waits (task 2: "cancel task", never launched), another gives up too late (task 5
    launches anyway), then three requests with ids queue behind.

    A "cancel task" line is logged alike for a queued completion and for a /slots or /metrics
    request that gave up, and this first request never reached the slot search: the log does
    not prove that the first id-less request took its id before the three that followed. So
    those three are uncertain, never named after the wrong request; the long request before
    it and the id-less request after it are proven."""
    ps = Pseudonymizer(SALT)
    lines = log_lines("lv4-np1-cancelled.log")
    assert sum("cancel task, id_task = 2" in ln for ln in lines) == 1
    recs = replay(lines, ps)
    for t in truths("lv4-np1-cancelled.truth.jsonl"):
        r = by_timings(recs, t)
        assert r.conversation in (ps("id:" + t["conv"]), None), t
        assert (r.conversation is None) == (r.conversation_source == "uncertain")
    assert by_timings(recs, truths("lv4-np1-cancelled.truth.jsonl")[0]).conversation_source == "header"
    abandoned = next(r for r in recs if r.task == 5)
    assert abandoned.conversation_source == "lineage"  # it sent no id, proven
    assert [r.conversation_source for r in recs if r.task in (20, 30, 40)] == ["uncertain"] * 3


def test_lineage_groups_conversations_without_ids() -> None:
    for log in ("lv4-np2-text", "lv4-np2-jsonl"):
        lines = [re.sub(r"conv_id=[^ \\\"]+ \(empty=0\)", "conv_id= (empty=1)", ln) for ln in log_lines(log + ".log")]
        recs = replay(lines)
        pairs = [(t["conv"], by_timings(recs, t).conversation) for t in truths(log + ".truth.jsonl")]
        assert all(by_timings(recs, t).conversation_source == "lineage" for t in truths(log + ".truth.jsonl"))
        assert grouping_accuracy(cast(list[tuple[str, str]], pairs)) == 1.0
        assert len({g for _, g in pairs}) == 6


def test_pseudonyms_are_salted_and_never_the_raw_id() -> None:
    a, b = Pseudonymizer("salt-a"), Pseudonymizer("salt-b")
    for raw in ("conv-1-0", "user@example.com", ""):
        assert a(raw) != raw and (not raw or raw not in a(raw))
        assert a(raw) == a(raw) and a(raw) != b(raw)
        assert re.fullmatch(r"c[0-9a-f]{12}", a(raw))
    assert Pseudonymizer().random_salt and not a.random_salt


def test_a_kept_pseudonym_is_the_one_computed_afresh_and_the_kept_ones_are_bounded() -> None:
    from llamacpp_exporter.assemble.pseudonyms import MAX_RECENT

    kept, fresh = Pseudonymizer("salt-a"), Pseudonymizer("salt-a")
    ids = [f"conv-{i % (MAX_RECENT + 7)}" for i in range(3 * MAX_RECENT)]  # more ids than are kept, again and again
    assert [kept(raw) for raw in ids] == [Pseudonymizer("salt-a")(raw) for raw in ids]
    assert len(kept._recent) == MAX_RECENT
    assert kept("conv-1") == fresh("conv-1") != Pseudonymizer("salt-b")("conv-1")


def test_raw_ids_appear_nowhere_in_the_exposition_or_records() -> None:
    reg = CollectorRegistry()
    recs: list[RequestRecord] = []
    pl = Pipeline(reg, on_record=recs.append, clock=lambda: 0.0, pseudonymize=Pseudonymizer(SALT))
    for line in log_lines("lv4-np2-text.log"):
        pl.process_line(line, 0.0)
    pl.flush()
    text = generate_latest(reg).decode()
    assert "conv-1-" not in text
    assert not any("conv-1-" in str(r.to_event()) for r in recs)


def rec(conv: str, prefill: float = 1.0, wasted: int = 0, cause: str | None = None) -> RequestRecord:
    r = RequestRecord(
        epoch=0,
        slot=0,
        task=1,
        conversation=conv,
        prefill_seconds=prefill,
        wasted_prompt_tokens=wasted,
        miss_cause=cast(MissCause | None, cause),
        outcome="miss" if cause else None,
    )
    return r


def test_cost_store_top_n_and_other() -> None:
    now = [1000.0]
    costs = ConversationCosts(window_seconds=600, top_n=2, clock=lambda: now[0])
    for name, cost in (("ca", 5.0), ("cb", 1.0), ("cc", 3.0), ("cd", 0.5)):
        costs.record(rec(name, wasted=100))
        costs.cost(name, cost)
    rows = costs.snapshot()
    assert [r["conversation"] for r in rows] == ["ca", "cc", "cb", "cd"]
    from llamacpp_exporter.export.conversations import ConversationCollector

    reg = CollectorRegistry()
    reg.register(ConversationCollector(costs))
    assert reg.get_sample_value("llamacpp_conversation_cost_to_others_seconds", {"conversation": "ca"}) == 5.0
    assert reg.get_sample_value("llamacpp_conversation_cost_to_others_seconds", {"conversation": "other"}) == 1.5
    assert reg.get_sample_value("llamacpp_conversation_cost_to_others_seconds", {"conversation": "cb"}) is None
    now[0] += 700  # the window has passed
    assert costs.snapshot() == []


def test_cost_store_is_bounded() -> None:
    costs = ConversationCosts(max_conversations=100)
    for i in range(1000):
        costs.record(rec(f"c{i}"))
    assert len(costs.snapshot()) == 100


def test_cost_store_forgets_conversations_last_seen_before_the_window() -> None:
    """A server that sees thousands of one-request conversations (a batch job) keeps only
    those of the window, not max_conversations of them: the memory follows the window."""
    now = [1000.0]
    costs = ConversationCosts(window_seconds=120, max_conversations=10_000, clock=lambda: now[0])
    for i in range(3000):
        now[0] += 0.5  # 2 per second: 240 conversations in a window of 120 s
        costs.record(rec(f"c{i}"))
    assert 240 <= len(costs._convs) <= 240 + 2 * 60  # the window, and the minute it is cut at
    assert len(costs.snapshot()) == len(costs._convs)
    costs.record(rec("c0"))  # one forgotten comes back: counted afresh
    assert next(r for r in costs.snapshot() if r["conversation"] == "c0")["requests"] == 1


def test_an_arrival_without_a_task_is_dropped_at_the_next_idle_moment() -> None:
    # invented lines, shaped like -lv 4 output: a request rejected before its task existed
    # (HTTP 400: conv_id= logged, no task), then, 20 s later, two requests with ids
    def task(ts: str, tid: int, n: int) -> list[str]:
        return [
            f"0.{ts}.000.000 I slot get_availabl: id  0 | task -1 | selected slot by LRU, t_last = -1",
            f"0.{ts}.000.001 I slot launch_slot_: id  0 | task {tid} | processing task, is_child = 0",
            f"0.{ts}.000.002 I slot   operator(): id  0 | task {tid} | new prompt, n_ctx_slot = 8192, n_keep = 0, task.n_tokens = {n}",
            f"0.{ts}.000.003 I slot   operator(): id  0 | task {tid} | cached n_tokens = 0, memory_seq_rm [0, end)",
            f"0.{ts}.500.000 I slot print_timing: id  0 | task {tid} | prompt eval time =     400.00 ms /   {n} tokens (    4.00 ms per token,   250.00 tokens per second)",
            f"0.{ts}.500.001 I slot print_timing: id  0 | task {tid} |        eval time =     100.00 ms /     5 tokens (   25.00 ms per token,    40.00 tokens per second)",
            f"0.{ts}.500.002 I slot      release: id  0 | task {tid} | stop processing: n_tokens = {n + 4}, truncated = 0",
        ]

    lines = [
        "0.00.000.100 I srv  llama_server: initializing ...",
        "0.00.920.046 I srv    load_model: initializing, n_slots = 1, n_ctx_slot = 8192, kv_unified = 'false'",
        "0.01.000.000 I srv  server_strea: conv_id=first (empty=0)",
        *task("01", 0, 100),
        "0.02.000.000 I srv  server_strea: conv_id=rejected (empty=0)",
        *task("20", 5, 100)[:0],  # nothing: the rejected request never got a task
        "0.30.000.000 I srv  server_strea: conv_id=second (empty=0)",
        *task("30", 7, 120),
        "0.40.000.000 I srv  server_strea: conv_id=third (empty=0)",
        *task("40", 9, 140),
    ]
    ps = Pseudonymizer(SALT)
    reg = CollectorRegistry()
    recs: list[RequestRecord] = []
    pl = Pipeline(reg, on_record=recs.append, clock=lambda: 0.0, pseudonymize=ps)
    for line in lines:
        pl.process_line(line, 0.0)
    pl.flush()
    assert [r.conversation for r in recs] == [ps("id:first"), ps("id:second"), ps("id:third")]
    assert reg.get_sample_value("llamacpp_exporter_conversation_arrivals_dropped_total", {"model": ""}) == 1


# ---------------------------------------------------------------- lineage keeps conversations apart


def invented_task(sec: int, task: int, select: str, conv: str | None, n: int = 100) -> list[str]:
    """INVENTED lines, shaped like -lv 4 output: one chat request (conv_id= and its chat format
    line), its slot selection, launch, prefill and decode on slot 0, release."""
    ts = f"0.{sec:02d}"
    return [
        f"{ts}.000.000 I srv  server_strea: conv_id={conv or ''} (empty={0 if conv else 1})",
        f"{ts}.000.100 I srv    operator(): chat format: peg-native",
        f"{ts}.000.200 I slot get_availabl: id  0 | task -1 | {select}",
        f"{ts}.000.300 I slot launch_slot_: id  0 | task {task} | processing task, is_child = 0",
        f"{ts}.000.400 I slot   operator(): id  0 | task {task} | new prompt, n_ctx_slot = 8192, n_keep = 0, task.n_tokens = {n}",
        f"{ts}.000.500 I slot   operator(): id  0 | task {task} | cached n_tokens = 0, memory_seq_rm [0, end)",
        f"{ts}.400.000 I slot print_timing: id  0 | task {task} | prompt eval time =     399.00 ms /   {n} tokens (    4.00 ms per token,   250.00 tokens per second)",
        f"{ts}.500.000 I slot print_timing: id  0 | task {task} |        eval time =     100.00 ms /     5 tokens (   20.00 ms per token,    50.00 tokens per second)",
        f"{ts}.500.100 I slot      release: id  0 | task {task} | stop processing: n_tokens = {n + 4}, truncated = 0",
    ]


LRU = "selected slot by LRU, t_last = -1"
PINNED = "selected slot by id (0)"


def lcp(f_keep: float) -> str:
    return f"selected slot by LCP similarity, f_sim_best = 0.900 (> 0.100 thold), f_keep = {f_keep:.3f}"


def conversations_of(*tasks: list[str]) -> list[tuple[str | None, str | None]]:
    lines = [
        "0.00.000.100 I srv  llama_server: initializing ...",
        "0.00.000.200 I srv          init: initializing, n_slots = 1, n_ctx_slot = 8192",
    ]
    for t in tasks:
        lines += t
    return [(r.conversation, r.conversation_source) for r in sorted(replay(lines), key=lambda r: r.task)]


def test_lineage_follows_an_id_less_conversation_that_continues_its_state() -> None:
    (a, sa), (b, sb) = conversations_of(invented_task(1, 0, LRU, None), invented_task(2, 1, lcp(1.0), None))
    assert sa == sb == "lineage" and a == b


def test_lineage_never_extends_a_conversation_that_sent_an_id() -> None:
    # an id-less request (a health probe, another client) continuing a header conversation's state
    (a, sa), (b, sb) = conversations_of(invented_task(1, 0, LRU, "conv-a"), invented_task(2, 1, lcp(1.0), None))
    assert (sa, sb) == ("header", "lineage") and a != b


def test_lineage_does_not_merge_conversations_that_only_share_a_prefix() -> None:
    # a second id-less client with the same long system prompt: it keeps 60% of the slot's state
    (a, _), (b, _) = conversations_of(invented_task(1, 0, LRU, None), invented_task(2, 1, lcp(0.6), None))
    assert a != b


def test_a_pinned_request_is_not_a_continuation_of_the_slot_it_asked_for() -> None:
    # id_slot says nothing about how much of the slot's state the request keeps
    (a, _), (b, _) = conversations_of(invented_task(1, 0, LRU, None), invented_task(2, 1, PINNED, None))
    assert a != b


def test_a_client_reusing_a_conversation_prefix_under_its_own_id_keeps_its_id() -> None:
    (a, sa), (b, sb) = conversations_of(invented_task(1, 0, LRU, "conv-a"), invented_task(2, 1, lcp(1.0), "conv-b"))
    ps = Pseudonymizer(SALT)
    assert (a, sa, b, sb) == (ps("id:conv-a"), "header", ps("id:conv-b"), "header")


def test_the_scrapes_top_and_other_equal_the_sums_of_every_conversations_buckets() -> None:
    """The scrape reads running window totals (lazily expired) instead of summing every
    bucket of every conversation; over random traffic, clock steps, expiry and evictions they
    must equal the full sums of the snapshot."""
    import random

    rnd = random.Random(5)
    now = [10_000.0]
    costs = ConversationCosts(window_seconds=300, top_n=3, max_conversations=25, clock=lambda: now[0])
    for step in range(3000):
        now[0] += rnd.choice((0.5, 3.0, 20.0, 90.0 if step % 97 == 0 else 1.0))
        name = f"c{rnd.randrange(40)}"
        if rnd.random() < 0.7:
            costs.record(rec(name, wasted=rnd.randrange(50)))
        else:
            costs.cost(name, rnd.random() * 2)
        if step % 50 == 0:
            rows = costs.snapshot()
            top, rest = costs.top()
            assert [r["conversation"] for r in top] == [r["conversation"] for r in rows[:3]]
            for key in ("prefill_seconds", "cost_to_others_seconds", "wasted_prompt_tokens", "requests"):
                assert rest[key] == pytest.approx(sum(r[key] for r in rows[3:]), abs=1e-6 * len(rows)), key  # rounding
            full = {r["conversation"]: r for r in rows}
            for name_, c in costs._convs.items():
                if name_ in full:
                    want = [sum(b[i] for b in c.buckets) for i in (1, 2, 3, 4)]
                    assert c.totals == pytest.approx(want, abs=1e-9)
