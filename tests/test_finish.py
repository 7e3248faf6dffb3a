"""How requests end, over recorded real logs: requests whose client gave up while they were
queued never start on a slot, and are counted as such once the log accounts for every arrival;
requests that ran are counted by how they ended."""

from __future__ import annotations

import pytest
from support import log_lines, replay_records, value

# recordings where clients with ids gave up while queued: some of their requests ran anyway
# (llama-server notices a gone client only when it wakes from a wait), the others never started
GAVE_UP = [
    "lv4-np2-impatient-ids",
    "lv4-np2-impatient-ids-starved",
    "lv4-np2-impatient-ids-never-idle",
    "b11549-lv4-np2-impatient-ids",
    "b11549-lv4-np2-impatient-ids-starved",
]


@pytest.mark.parametrize("name", GAVE_UP)
def test_requests_that_never_started_are_the_arrivals_without_a_task(name: str) -> None:
    lines = log_lines(name + ".log")
    recs, pl = replay_records(lines)
    arrivals = sum(1 for line in lines if "conv_id=" in line)
    ran = sum(1 for r in recs if r.kind == "completion")
    never = value(pl.registry, "llamacpp_requests_never_started_total")
    assert never == arrivals - ran > 0
    # each of them was cancelled while queued: the log has a cancel line for a task that never ran
    assert never <= sum(1 for line in lines if "cancel task" in line)
    finished = {r: value(pl.registry, "llamacpp_requests_finished_total", {"reason": r}) for r in ("stop", "cancelled")}
    assert finished["stop"] + finished["cancelled"] == ran


def test_no_request_is_counted_as_never_started_on_a_server_where_every_request_ran() -> None:
    for name in ("lv4-np2-text", "lv4-np2-contention", "router-two-models"):
        _, pl = replay_records(log_lines(name + ".log"))
        counted = [
            s.value
            for m in pl.registry.collect()
            for s in m.samples
            if s.name == "llamacpp_requests_never_started_total"
        ]
        assert counted and sum(counted) == 0, name  # a router's: one series per model
