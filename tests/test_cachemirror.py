"""The mirror of llama-server's RAM prompt cache, on small invented sequences (the recorded
logs exercise it through the assembler: tests/test_assemble.py)."""

from __future__ import annotations

from typing import Any

from llamacpp_exporter.assemble.cachemirror import CacheMirror


def mirror() -> tuple[CacheMirror, list[int], list[Any]]:
    saved: list[int] = []
    evicted: list[Any] = []
    return CacheMirror(lambda: saved.append(1), evicted.append), saved, evicted


def needed(m: CacheMirror, source: tuple[int, int]) -> float:
    need = m.returned(source)
    assert need is not None
    return need.needed_bytes


def save(m: CacheMirror, n: int, task: int) -> None:
    m.save_started(n, (0, task))
    m.commit_save()


def lengths(m: CacheMirror) -> list[tuple[int, tuple[int, int] | None]]:
    return [(e.n_tokens, e.source) for e in m.entries]


def test_saves_push_evictions_pop_the_oldest_restores_take_the_candidate() -> None:
    m, saved, evicted = mirror()
    save(m, 100, 1)
    save(m, 200, 2)
    m.save_started(300, (0, 3))
    m.evicted(making_room=True)  # alloc makes room before pushing
    assert evicted == [(0, 1)] and lengths(m) == [(200, (0, 2))]
    m.commit_save()
    assert m.restored([200, 300], 1) == (0, 3) and lengths(m) == [(200, (0, 2))]
    assert len(saved) == 3


def test_an_update_eviction_commits_the_pending_save_first() -> None:
    m, _, evicted = mirror()
    save(m, 100, 1)
    m.save_started(200, (0, 2))
    m.evicted(making_room=False)  # the update after the save: the oldest is the first entry
    assert evicted == [(0, 1)] and lengths(m) == [(200, (0, 2))]


def test_a_skipped_save_pushes_nothing() -> None:
    m, saved, _ = mirror()
    m.save_started(100, (0, 1))
    m.save_skipped()
    m.commit_save()
    assert m.entries == [] and saved == []


def test_equal_lengths_are_told_apart_by_the_next_ordered_list() -> None:
    """Two entries of 1224 tokens; the save of 1355 removes the one it contains (the line says
    only the length). The listing's order shows it was the second."""
    m, _, _ = mirror()
    save(m, 1224, 4)
    save(m, 29, 7)
    save(m, 1224, 9)
    m.save_started(1355, (0, 9))
    m.obsolete_removed(1224)
    m.commit_save()
    m.listing_started(3)
    for n in (1224, 29, 1355):
        m.listed(n)
    m.close_listing()
    assert lengths(m) == [(1224, (0, 4)), (29, (0, 7)), (1355, (0, 9))]


def test_when_the_order_cannot_tell_the_sources_become_unknown() -> None:
    m, _, _ = mirror()
    save(m, 29, 1)
    save(m, 29, 2)
    m.save_started(500, (0, 3))
    m.obsolete_removed(29)
    m.commit_save()
    assert m.restored([29, 500], 1) == (0, 3)  # the candidates settle the removal first
    assert lengths(m) == [(29, None)]  # which 29 is left: unknown, not a guess


def test_a_listing_that_does_not_match_starts_again_without_sources() -> None:
    m, _, _ = mirror()
    save(m, 100, 1)
    m.listing_started(2)
    m.listed(100)
    m.listed(250)  # a save the mirror never saw (joined mid-stream)
    m.close_listing()
    assert lengths(m) == [(100, None), (250, None)]
    assert m.restored([100, 999], 1) is False  # and a restore that does not match is not placed


def test_the_lookups_candidates_are_named_by_who_computed_them_only_when_the_mirror_matches() -> None:
    m = CacheMirror(lambda: None, lambda s: None)
    for n, task in ((100, 1), (200, 2), (100, 3)):
        m.save_started(n, (0, task))
        m.commit_save()
    assert m.sources([100, 200, 100]) == [(0, 1), (0, 2), (0, 3)]
    assert m.sources([100, 200]) is None  # the server lists other entries: no name is guessed
    m.obsolete_removed(100)  # which of the two 100-token entries went is not known yet
    assert m.sources([200, 100]) is None


# --------------------------------------------------------------- a larger cache (invented sequences)
MIB = 1048576.0


def update(m: CacheMirror, limit_mib: float) -> None:
    """The update's cache-state line and listing, from the mirror's own entries."""
    m.listing_started(len(m.entries), sum(e.size_bytes for e in m.entries), limit_mib * MIB)
    for e in list(m.entries):
        m.listed(e.n_tokens, e.size_bytes)
    m.close_listing()


def push(m: CacheMirror, task: int, mib: float, limit_mib: float) -> None:
    """A save of `mib` into a cache of `limit_mib`: oldest first out while it does not fit, as
    server_prompt_cache::alloc does, then the update."""
    m.save_started(100 + task, (0, task), mib * MIB)
    while m.entries and sum(e.size_bytes for e in m.entries) + mib * MIB > limit_mib * MIB:
        m.evicted(making_room=True, size_bytes=m.entries[0].size_bytes)
    m.commit_save()
    update(m, limit_mib)


def test_an_evicted_entry_needs_itself_and_every_younger_entry_until_it_comes_back() -> None:
    m, _, evicted = mirror()
    for task in (1, 2, 3):  # 10 MiB each in a 25 MiB cache: the third save evicts the first
        push(m, task, 10, 25)
    assert evicted == [(0, 1)]
    push(m, 4, 10, 25)  # the second goes too; the first would need 40 MiB by now
    need = m.returned((0, 1))
    assert need is not None and need.needed_bytes == 40 * MIB and need.limit_bytes == 25 * MIB
    assert need.entry_tokens == 101
    assert m.returned((0, 1)) is None  # consumed: one return per eviction


def test_a_younger_ghost_whose_conversation_came_back_frees_its_room() -> None:
    m, _, _ = mirror()
    for task in (1, 2, 3, 4):
        push(m, task, 10, 25)  # 1 and 2 evicted
    # 2's conversation came back: in the larger cache it would have restored (and erased) 2
    assert needed(m, (0, 2)) == 30 * MIB  # 2, 3 and 4
    push(m, 5, 10, 25)  # 3 evicted: 1 needs itself, 3, 4 and 5, no longer 2
    assert needed(m, (0, 1)) == 40 * MIB


def test_a_restore_after_the_push_still_counts_at_the_push() -> None:
    m, _, _ = mirror()
    push(m, 1, 10, 25)
    push(m, 2, 10, 25)
    m.save_started(103, (0, 3), 10 * MIB)
    m.evicted(making_room=True, size_bytes=10 * MIB)  # entry 1 out
    m.commit_save()
    assert m.restored([102, 103], 0) == (0, 2)  # then the lookup restores entry 2
    update(m, 25)  # the listing shows 3 alone: at the push 2 and 3 were both held
    assert needed(m, (0, 1)) == 30 * MIB


def test_entries_beyond_four_times_the_limit_are_known_to_need_more() -> None:
    m, _, _ = mirror()
    for task in range(1, 12):
        push(m, task, 10, 25)
    assert all(g.needed_bytes <= 100 * MIB for g in m.ghosts)
    need = m.returned((0, 1))  # dropped from the ghosts, remembered as beyond the curve
    assert need is not None and need.needed_bytes > 4 * 25 * MIB
