"""Who slowed everyone down, against a real llama-server: a long conversation that misses
the cache on every turn next to short chats, some clients giving up while they wait. The
exporter must name the long conversation as the top cost, attribute requests to the
conversations the clients sent (or, without ids, group them by cache lineage), and its
cost figure must agree with what the responses' own timings imply."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from realserver import LlamaServer
from test_conversations import grouping_accuracy
from test_real_server import match, samples, start_exporter, wait_records
from workload import LONG_CONV, Truth, contention_workload

from llamacpp_exporter.conversations import Pseudonymizer

pytestmark = pytest.mark.real_server
SALT = "a-test-salt-of-enough-length"


def run(parts, workdir: Path, send_ids: bool):
    salt_file = workdir / "salt"
    workdir.mkdir(parents=True, exist_ok=True)
    salt_file.write_text(SALT + "\n")
    srv = LlamaServer(*parts, workdir=workdir, n_parallel=2).start()
    exp = None
    try:
        exp = start_exporter(srv, workdir, "--conversations.salt-file", str(salt_file))
        truths, cancelled = contention_workload(srv.url, send_ids=send_ids)
        (workdir / "truth.jsonl").write_text("".join(json.dumps(t.__dict__) + "\n" for t in truths))
        recs = wait_records(workdir / "events.jsonl", len(truths))
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
        cancelled,
        recs,
        json.loads(top.stdout),
        table,
        metrics,
        srv.log_path.read_text(errors="replace"),
        exp,
    )


def implied_cost_to_others(truths: list[Truth], conv: str) -> float:
    """Seconds the long conversation's prefills overlapped the others' decoding, from the
    responses' own timings (client clock: prefill ends when decoding starts)."""

    def prefill(t: Truth):
        end = t.t_end - t.predicted_ms / 1000
        return end - t.prompt_ms / 1000, end

    def decode(t: Truth):
        return t.t_end - t.predicted_ms / 1000, t.t_end

    total = 0.0
    for lt in (t for t in truths if t.conv == conv):
        a, b = prefill(lt)
        for ot in (t for t in truths if t.conv != conv):
            c, d = decode(ot)
            total += max(0.0, min(b, d) - max(a, c))
    return total


def test_long_conversation_is_named_as_the_top_cost(parts, tmp_path):
    truths, cancelled, recs, top, table, metrics, server_log, exp = run(parts, tmp_path, send_ids=True)
    ps = Pseudonymizer(SALT)
    long_id = ps("id:" + LONG_CONV)
    pairs = match(recs, truths)
    right = sum(r["conversation"] == ps("id:" + t.conv) for t, r in pairs)
    uncertain = sum(r["conversation_source"] == "uncertain" for t, r in pairs)
    wrong = len(pairs) - right - uncertain
    print(
        f"header attribution: {right} right, {uncertain} uncertain, {wrong} wrong of {len(pairs)} requests; "
        f"{cancelled} clients gave up, {server_log.count('cancel task')} cancel lines"
    )
    assert wrong == 0
    assert right / len(pairs) >= 0.99
    assert cancelled >= 1  # clients gave up while their requests waited for a slot
    # the top cost, in the API (and `top`) and in the metrics
    assert top["conversations"][0]["conversation"] == long_id
    assert top["conversations"][0]["last_miss_cause"] == "lora_discard"
    costs = samples(metrics, "llamacpp_conversation_cost_to_others_seconds")
    named = {dict(k)["conversation"]: v for k, v in costs.items() if dict(k)["conversation"] != "other"}
    assert max(named, key=named.get) == long_id
    # the cost agrees with the timings the server returned
    implied = implied_cost_to_others(truths, LONG_CONV)
    reported = top["conversations"][0]["cost_to_others_seconds"]
    print(f"cost to others of the long conversation: reported {reported:.3f} s, implied by timings {implied:.3f} s")
    assert implied > 1.0
    assert abs(reported - implied) <= 0.10 * implied
    # the seed's table, in `top`
    assert top["contention"]["while_other_slot_prefills"]["requests"] > 0
    assert "generation while another slot prefills" in table and long_id in table
    # no raw id anywhere
    for out in (metrics, json.dumps(top), table, (tmp_path / "events.jsonl").read_text(), exp.stderr_path.read_text()):
        for raw in (LONG_CONV, "short-0", "impatient-0"):
            assert raw not in out


def test_lineage_groups_conversations_without_ids(parts, tmp_path):
    truths, cancelled, recs, top, table, metrics, server_log, exp = run(parts, tmp_path, send_ids=False)
    pairs = match(recs, truths)
    assert all(r["conversation_source"] == "lineage" for _, r in pairs)
    share = grouping_accuracy([(t.conv, r["conversation"]) for t, r in pairs])
    print(f"lineage grouping: {share:.1%} of {len(pairs)} requests in their conversation's group")
    assert share >= 0.95
    long_groups = {r["conversation"] for t, r in pairs if t.conv == LONG_CONV}
    assert len(long_groups) == 1 and top["conversations"][0]["conversation"] in long_groups
