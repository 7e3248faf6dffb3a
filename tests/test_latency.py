"""Queue time, time to first token and end-to-end latency, from the log: checked against what
the clients of the recorded runs measured themselves (each truth line holds the client's send
and answer times, t_start and t_end, and the response's own timings)."""

from __future__ import annotations

import json
from types import SimpleNamespace
from typing import Any, cast

import pytest
from support import LOGS, log_lines, match, replay_records
from workload import Truth

from llamacpp_exporter.pipeline import Pipeline

# the recorded runs whose clients timed each request (several with queues of many seconds)
TIMED = [
    "lv4-np1-cache-full-healthy",
    "lv4-np1-cache-thrashing",
    "lv4-np2-impatient-ids",
    "lv4-np2-impatient-ids-starved",
    "lv4-np2-jsonl",
    "lv4-np2-lora-events",
    "lv4-np2-no-ids",
    "lv4-np2-slow-machine",
    "lv4-np2-starved",
    "lv4-np2-text",
]


def _pairs(name: str) -> tuple[list[tuple[Any, dict[str, Any]]], Pipeline]:
    truths = [SimpleNamespace(**json.loads(x)) for x in (LOGS / f"{name}.truth.jsonl").read_text().splitlines()]
    recs, pl = replay_records(log_lines(f"{name}.log"))
    return match([r.to_event() for r in recs], [cast(Truth, t) for t in truths if hasattr(t, "t_start")]), pl


@pytest.mark.parametrize("name", TIMED)
def test_end_to_end_latency_is_what_the_client_measured(name: str) -> None:
    pairs, _ = _pairs(name)
    known = [(t, r) for t, r in pairs if r["queue_seconds"] is not None]
    for t, r in known:
        e2e = r["queue_seconds"] + (r["end_us"] - r["start_us"]) / 1e6
        client = t.t_end - t.t_start
        # the client also waits for HTTP and JSON on both ends (a few ms); the arrival is pinned
        # to within 25 ms and the log prints milliseconds
        assert -0.03 <= client - e2e <= 0.06, (name, r["task"], client, e2e)
        ttft = r["queue_seconds"] + r["prefill_seconds"]
        assert r["prefill_seconds"] <= ttft <= e2e
    # a request is left unknown only where several arrived together and the ids do not say
    # which was which (the starved run, whose requests wait tens of seconds beside new clients'
    # requests, the join leaves uncertain most: 13 of 34 known)
    assert len(known) >= 0.35 * len(pairs), f"{name}: {len(known)} of {len(pairs)} known"


def test_the_unknowns_are_rare_and_long_queues_are_measured() -> None:
    known = total = 0
    longest = 0.0
    for name in TIMED:
        pairs, _ = _pairs(name)
        total += len(pairs)
        q = [r["queue_seconds"] for _, r in pairs if r["queue_seconds"] is not None]
        known += len(q)
        longest = max([longest, *q])
    print(f"queue time known for {known} of {total} timed requests; longest {longest:.1f} s")
    assert known >= 0.85 * total
    assert longest > 20  # the starved runs queued requests for tens of seconds


def test_latency_histograms_count_what_is_known_and_the_rest_as_unknown() -> None:
    recs, pl = replay_records(log_lines("lv4-np2-impatient-ids-starved.log"))
    done = [
        r for r in recs if r.kind == "completion" and not ((r.cancelled or r.failed) and r.generated_tokens is None)
    ]
    known = [r for r in done if r.queue_seconds is not None]
    get = pl.registry.get_sample_value
    assert get("llamacpp_time_to_first_token_seconds_count", {"model": ""}) == len(known)
    assert get("llamacpp_request_queue_seconds_count", {"model": ""}) == len(known)
    assert get("llamacpp_request_duration_seconds_count", {"model": ""}) == len(known)
    assert get("llamacpp_request_latency_unknown_total", {"model": ""}) == len(done) - len(known) > 0
    assert get("llamacpp_time_to_first_token_seconds_sum", {"model": ""}) == pytest.approx(
        sum((r.queue_seconds or 0.0) + (r.prefill_seconds or 0.0) for r in known)  # known: neither is None
    )


def test_below_lv4_no_arrival_is_seen_and_every_request_is_unknown() -> None:
    recs, pl = replay_records(log_lines("lv3-np2-text.log"))
    assert recs and all(r.queue_seconds is None for r in recs)
    assert pl.registry.get_sample_value("llamacpp_request_latency_unknown_total", {"model": ""}) == len(recs)
