"""Who slowed everyone down, against a real llama-server on a machine made slow and busy by
the test itself: the server pinned to one CPU next to a busy loop, a long conversation that
misses the cache on every turn next to short chats, clients that give up while queued, an
id-less health probe and another client polling /slots. No request may be attributed to
another conversation; those that sent an id must be attributed to it; the cost figure must
agree with what the responses' own timings imply."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from realserver import BusyLoop, LlamaServer, wait_for
from support import grouping_accuracy, match, samples, start_exporter, wait_records
from workload import LONG_CONV, Contention, Truth, contention_workload

from llamacpp_exporter.assemble.pseudonyms import Pseudonymizer

pytestmark = pytest.mark.real_server
SALT = "a-test-salt-of-enough-length"


def wait_matched(path: Path, truths: list[Truth], timeout: float = 60.0) -> list[dict[str, Any]]:
    """The events file once every response has its record. Counting lines is not enough: the
    impatient clients' tasks have records too, and a record is written only once the prefills
    it overlapped have the server's timings, so the last responses' records can come later."""

    def matched() -> list[dict[str, Any]]:
        recs = wait_records(path, len(truths), 1.0)  # AssertionError while fewer
        match(recs, truths)  # AssertionError until every response has its record
        return recs

    return wait_for(matched, "a record for every response", timeout, 0.2, ignore=(AssertionError,))


def run(parts: tuple[Path, Path, Path], workdir: Path, send_ids: bool, cpu: str) -> tuple[Any, ...]:
    salt_file = workdir / "salt"
    workdir.mkdir(parents=True, exist_ok=True)
    salt_file.write_text(SALT + "\n")
    with BusyLoop(cpu=cpu):
        srv = LlamaServer(*parts, workdir=workdir, n_parallel=2, threads=1, cpus=cpu, extra=["-b", "512", "-ub", "512"])
        srv.start(timeout=120)
        exp = None
        try:
            exp = start_exporter(srv, workdir, "--conversations.salt-file", str(salt_file))
            # a long system prompt of 700 words (about 1,400 tokens with its first turn): on a
            # starved CPU its prefill outlasts the short chats' turns and catches the impatient clients
            truths, extra = contention_workload(srv.url, send_ids=send_ids, long_turns=2, long_words=700)
            (workdir / "truth.jsonl").write_text("".join(json.dumps(t.__dict__) + "\n" for t in truths + extra.probes))
            recs = wait_matched(workdir / "events.jsonl", truths + extra.probes)
            top = subprocess.run(
                [sys.executable, "-m", "llamacpp_exporter", "top", "--url", exp.url, "--once", "--format", "json"],
                capture_output=True,
                text=True,
                timeout=30,
            )
            table = subprocess.run(
                [sys.executable, "-m", "llamacpp_exporter", "top", "--url", exp.url, "--once"],
                capture_output=True,
                text=True,
                timeout=30,
            ).stdout
            metrics = exp.metrics_text()
        finally:
            if exp:
                exp.stop()
            srv.stop()
    assert top.returncode == 0, top.stderr
    return (
        truths,
        extra,
        recs,
        json.loads(top.stdout),
        table,
        metrics,
        srv.log_path.read_text(errors="replace"),
        exp,
    )


@pytest.fixture(scope="module")
def runs(parts: tuple[Path, Path, Path], tmp_path_factory: pytest.TempPathFactory) -> dict[bool, tuple[Any, ...]]:
    """The workload with ids and without, at once: each server pinned to a CPU of its own next to
    a busy loop (one CPU, both on it, where the machine has only one)."""
    cpus = ("0", "1") if (os.cpu_count() or 1) > 1 else ("0", "0")
    with ThreadPoolExecutor(2) as pool:
        futures = {
            send_ids: pool.submit(run, parts, tmp_path_factory.mktemp(f"ids-{send_ids}"), send_ids, cpu)
            for send_ids, cpu in zip((True, False), cpus, strict=True)
        }
        return {send_ids: f.result() for send_ids, f in futures.items()}


def implied_cost_to_others(truths: list[Truth], conv: str) -> float:
    """Seconds the long conversation's prefills overlapped the others' decoding, from the
    responses' own timings (client clock: prefill ends when decoding starts)."""

    def prefill(t: Truth) -> tuple[float, float]:
        end = t.t_end - t.predicted_ms / 1000
        return end - t.prompt_ms / 1000, end

    def decode(t: Truth) -> tuple[float, float]:
        return t.t_end - t.predicted_ms / 1000, t.t_end

    total = 0.0
    for lt in (t for t in truths if t.conv == conv):
        a, b = prefill(lt)
        for ot in (t for t in truths if t.conv != conv):
            c, d = decode(ot)
            total += max(0.0, min(b, d) - max(a, c))
    return total


def attribution(
    truths: list[Truth], extra: Contention, recs: list[dict[str, Any]], ps: Pseudonymizer
) -> tuple[int, int, int]:
    """(right, uncertain, wrong) over the requests that sent an id. Also wrong: a request sent
    without an id (probe, impatient client) that is attributed to an id."""
    pairs = match(recs, truths)
    right = sum(r["conversation"] == ps("id:" + t.conv) and r["conversation_source"] == "header" for t, r in pairs)
    uncertain = sum(r["conversation_source"] == "uncertain" and r["conversation"] is None for t, r in pairs)
    wrong = len(pairs) - right - uncertain
    id_less = [r for _, r in match(recs, extra.probes)]
    id_less += [r for r in recs if r not in [x for _, x in pairs] and r not in id_less]  # impatient clients
    wrong += sum(r["conversation_source"] not in ("lineage", "uncertain") for r in id_less)
    return right, uncertain, wrong


def test_long_conversation_is_named_as_the_top_cost(runs: dict[bool, tuple[Any, ...]]) -> None:
    truths, extra, recs, top, table, metrics, server_log, exp = runs[True]
    ps = Pseudonymizer(SALT)
    long_id = ps("id:" + LONG_CONV)
    right, uncertain, wrong = attribution(truths, extra, recs, ps)
    print(
        f"header attribution: {right} right, {uncertain} uncertain, {wrong} wrong of {len(truths)} requests with an "
        f"id; {len(extra.probes)} id-less probes, {extra.gave_up} clients gave up while queued, "
        f"{server_log.count('cancel task')} cancel lines, {extra.slots_polls} /slots polls by another client"
    )
    assert extra.gave_up >= 1 and extra.probes and extra.slots_polls  # the contention happened
    assert wrong == 0
    assert right / len(truths) >= 0.99
    # the top cost, in the API (and `top`) and in the metrics
    assert top["conversations"][0]["conversation"] == long_id
    assert top["conversations"][0]["last_miss_cause"] == "lora_discard"
    costs = samples(metrics, "llamacpp_conversation_cost_to_others_seconds")
    named = {dict(k)["conversation"]: v for k, v in costs.items() if dict(k)["conversation"] != "other"}
    assert max(named, key=lambda k: named[k]) == long_id
    # the cost agrees with the timings the server returned
    implied = implied_cost_to_others(truths + extra.probes, LONG_CONV)
    reported = top["conversations"][0]["cost_to_others_seconds"]
    print(f"cost to others of the long conversation: reported {reported:.3f} s, implied by timings {implied:.3f} s")
    assert implied > 1.0
    assert abs(reported - implied) <= 0.10 * implied
    # the seed's table, in `top`
    assert top["contention"]["while_other_slot_prefills"]["requests"] > 0
    assert "generation while another slot prefills" in table and long_id in table
    # no raw id anywhere
    for out in (
        metrics,
        json.dumps(top),
        table,
        (exp.workdir / "events.jsonl").read_text(),
        exp.stderr_path.read_text(),
    ):
        for raw in (LONG_CONV, "short-0", "health check"):
            assert raw not in out


def test_lineage_groups_conversations_without_ids(runs: dict[bool, tuple[Any, ...]]) -> None:
    truths, extra, recs, top, table, metrics, server_log, exp = runs[False]
    pairs = match(recs, truths)
    assert all(r["conversation_source"] == "lineage" for _, r in pairs)
    share = grouping_accuracy([(t.conv, r["conversation"]) for t, r in pairs])
    print(f"lineage grouping: {share:.1%} of {len(pairs)} requests in their conversation's group")
    assert share >= 0.95
    long_groups = {r["conversation"] for t, r in pairs if t.conv == LONG_CONV}
    assert len(long_groups) == 1 and top["conversations"][0]["conversation"] in long_groups
    # the probes and the impatient clients are not merged into any conversation's group
    chat_groups = {r["conversation"] for _, r in pairs}
    assert not {r["conversation"] for _, r in match(recs, extra.probes)} & chat_groups
