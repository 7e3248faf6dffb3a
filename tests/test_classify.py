"""The classification of a finished request, case by case (pure functions, no log)."""

from __future__ import annotations

from typing import Any

import pytest

from llamacpp_exporter.assemble import classify as c

# cleared, forced, reused, reuse known, request LoRA, entry LoRA -> result, mismatch reuse
RESTORES = [
    (True, False, 0, True, "0:0.5", "0:0.5", "discarded_lora_wrongful", False),  # the LoRA restore bug
    (True, False, 0, True, "0:0.5", "none", "discarded_lora_correct", False),
    (True, False, 0, True, None, "none", "discarded_lora_unknown", False),  # /slots missed the request
    (True, False, 0, True, "none", None, "discarded_lora_unknown", False),  # ... or the entry's task
    (False, True, 0, True, "none", "none", "reprocessed", False),  # SWA: restored, recomputed
    (False, False, 0, True, "none", "none", "reprocessed", False),  # reused nothing
    (False, False, 0, False, "none", "none", "kept", False),  # reuse unknown (-lv 3): not proven recomputed
    (False, False, 900, True, "none", "none", "kept", False),
    (False, False, 900, True, "global", "0:1", "kept", True),  # another adapter's KV reused
    (False, False, 900, True, None, "0:1", "kept", False),  # unknown: not called a mismatch
]


@pytest.mark.parametrize("cleared, forced, reused, known, lora, entry, result, mismatch", RESTORES)
def test_restore_result(
    cleared: bool,
    forced: bool,
    reused: int,
    known: bool,
    lora: str | None,
    entry: str | None,
    result: str,
    mismatch: bool,
) -> None:
    got = c.restore_result(
        lora_cache_cleared=cleared,
        forced_reprocess=forced,
        reused_tokens=reused,
        reuse_known=known,
        lora_config=lora,
        entry_lora_config=entry,
    )
    assert got == (result, mismatch)


@pytest.mark.parametrize(
    "prompt, reused, expected",
    [
        (2000, 1800, "hit"),  # 90%
        (2000, 1799, "partial"),
        (2000, 200, "partial"),  # 10%
        (2000, 199, "miss"),
        (2000, 0, "miss"),
        (1023, 0, None),  # below min_prompt_tokens: not in the outcome metric
    ],
)
def test_outcome(prompt: int, reused: int, expected: str | None) -> None:
    assert c.outcome(prompt, reused, 1024, 0.9, 0.1) == expected


def test_is_miss_counts_any_length_but_a_single_token() -> None:
    assert c.is_miss(50, 0, 0.1) and not c.is_miss(1, 0, 0.1) and not c.is_miss(50, 5, 0.1)


# restore result, cleared, forced, offered enough, RAM consulted, restored, path, the
# conversation's entry evicted before it came -> cause
CAUSES = [
    ("discarded_lora_wrongful", True, False, True, True, True, "ram", False, "lora_discard"),
    (None, True, False, False, False, False, "slot", False, "lora_discard"),  # cleared on the slot's own KV
    ("reprocessed", False, True, True, True, True, "ram", False, "forced_reprocess"),
    (None, False, True, True, False, False, "slot", False, "forced_reprocess"),
    (None, False, True, False, True, False, "ram", False, "no_cache_entry"),  # forced on a template prefix
    (None, False, False, False, True, False, "ram", False, "no_cache_entry"),
    (None, False, False, False, True, False, "ram", True, "evicted"),  # its entry was evicted: capacity
    ("discarded_lora_wrongful", True, False, True, True, True, "ram", True, "lora_discard"),  # found, then cleared
    (None, False, False, False, False, False, "slot", True, "slot_prefix_mismatch"),  # the RAM cache not asked
    (None, False, False, False, False, False, "slot", False, "slot_prefix_mismatch"),
    (None, False, False, False, False, False, "pinned", False, "unknown"),
    (None, False, False, False, False, False, None, False, "unknown"),  # -lv 3: the selection was not seen
]


@pytest.mark.parametrize("result, cleared, forced, enough, consulted, restored, path, evicted, cause", CAUSES)
def test_miss_cause(
    result: Any,
    cleared: bool,
    forced: bool,
    enough: bool,
    consulted: bool,
    restored: bool,
    path: Any,
    evicted: bool,
    cause: str,
) -> None:
    got = c.miss_cause(
        restore_result=result,
        lora_cache_cleared=cleared,
        forced_reprocess=forced,
        offered_enough=enough,
        ram_consulted=consulted,
        ram_restored=restored,
        path=path,
        conversation_evicted=evicted,
    )
    assert got == cause


def test_offered_tokens_and_small_task_takeover() -> None:
    assert c.offered_tokens(None, None, 1000) is None
    assert c.offered_tokens(300, 0.5, 1000) == 500  # the larger of what the entry and the slot held
    assert c.offered_tokens(800, 0.5, 1000) == 800
    assert c.offered_tokens(None, 0.25, None) is None
    assert c.small_task_takeover(20, 5000, 256, 1024) and not c.small_task_takeover(20, None, 256, 1024)
    assert not c.small_task_takeover(300, 5000, 256, 1024)
