"""The mirror of llama-server's RAM prompt cache, on small invented sequences (the recorded
logs exercise it through the assembler: tests/test_assemble.py)."""

from __future__ import annotations

from llamacpp_exporter.assemble.cachemirror import CacheMirror


def mirror():
    saved, evicted = [], []
    return CacheMirror(lambda: saved.append(1), evicted.append), saved, evicted


def save(m: CacheMirror, n: int, task: int) -> None:
    m.save_started(n, (0, task))
    m.commit_save()


def lengths(m: CacheMirror) -> list[tuple[int, tuple[int, int] | None]]:
    return [(e.n_tokens, e.source) for e in m.entries]


def test_saves_push_evictions_pop_the_oldest_restores_take_the_candidate():
    m, saved, evicted = mirror()
    save(m, 100, 1)
    save(m, 200, 2)
    m.save_started(300, (0, 3))
    m.evicted(making_room=True)  # alloc makes room before pushing
    assert evicted == [(0, 1)] and lengths(m) == [(200, (0, 2))]
    m.commit_save()
    assert m.restored([200, 300], 1) == (0, 3) and lengths(m) == [(200, (0, 2))]
    assert len(saved) == 3


def test_an_update_eviction_commits_the_pending_save_first():
    m, _, evicted = mirror()
    save(m, 100, 1)
    m.save_started(200, (0, 2))
    m.evicted(making_room=False)  # the update after the save: the oldest is the first entry
    assert evicted == [(0, 1)] and lengths(m) == [(200, (0, 2))]


def test_a_skipped_save_pushes_nothing():
    m, saved, _ = mirror()
    m.save_started(100, (0, 1))
    m.save_skipped()
    m.commit_save()
    assert m.entries == [] and saved == []


def test_equal_lengths_are_told_apart_by_the_next_ordered_list():
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


def test_when_the_order_cannot_tell_the_sources_become_unknown():
    m, _, _ = mirror()
    save(m, 29, 1)
    save(m, 29, 2)
    m.save_started(500, (0, 3))
    m.obsolete_removed(29)
    m.commit_save()
    assert m.restored([29, 500], 1) == (0, 3)  # the candidates settle the removal first
    assert lengths(m) == [(29, None)]  # which 29 is left: unknown, not a guess


def test_a_listing_that_does_not_match_starts_again_without_sources():
    m, _, _ = mirror()
    save(m, 100, 1)
    m.listing_started(2)
    m.listed(100)
    m.listed(250)  # a save the mirror never saw (joined mid-stream)
    m.close_listing()
    assert lengths(m) == [(100, None), (250, None)]
    assert m.restored([100, 999], 1) is False  # and a restore that does not match is not placed


def test_the_lookups_candidates_are_named_by_who_computed_them_only_when_the_mirror_matches():
    m = CacheMirror(lambda: None, lambda s: None)
    for n, task in ((100, 1), (200, 2), (100, 3)):
        m.save_started(n, (0, task))
        m.commit_save()
    assert m.sources([100, 200, 100]) == [(0, 1), (0, 2), (0, 3)]
    assert m.sources([100, 200]) is None  # the server lists other entries: no name is guessed
    m.obsolete_removed(100)  # which of the two 100-token entries went is not known yet
    assert m.sources([200, 100]) is None
