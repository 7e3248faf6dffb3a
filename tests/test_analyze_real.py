"""`analyze` on a real llama-server's log where clients rewrite their history: every rewritten
request, and only those, is excluded from the could-have-hit rates as a changed prefix."""

from __future__ import annotations

from pathlib import Path

import pytest
from realserver import LlamaServer
from workload import rewritten_history

from llamacpp_exporter.assemble.finish import AssemblySettings
from llamacpp_exporter.offline import analyze, report

pytestmark = pytest.mark.real_server


@pytest.mark.parametrize("n_parallel", [1, 2])
def test_a_rewritten_history_is_a_changed_prefix_never_a_miss_that_could_have_hit(
    parts: tuple[Path, Path, Path], tmp_path: Path, n_parallel: int
) -> None:
    """One slot: each conversation's state comes back from the RAM cache; two slots: it
    stays on its slot. Either way the server compares the new prompt with the conversation's
    own previous state, and the log shows how early it left it."""
    srv = LlamaServer(*parts, workdir=tmp_path, n_parallel=n_parallel).start()
    try:
        truths, rewritten = rewritten_history(srv.url)
    finally:
        srv.stop()
    result = analyze.analyze(analyze.Inputs([str(srv.log_path)], []), AssemblySettings(min_prompt_tokens=1))
    rep = report.build(result.records)
    assert rep["requests"]["total"] == len(truths)
    excluded = rep["could_have_hit"]["excluded"]
    print(f"{rewritten} rewritten of {len(truths)}; excluded {excluded}")
    assert excluded["prefix_changed"] == rewritten
    assert excluded["first_of_conversation"] == 2
    assert rep["could_have_hit"]["considered"] == len(truths) - rewritten - 2
    # the responses agree: every rewritten request reused little, every continuation a lot
    rewritten_turns = [t for t in truths if t.turn in (3, 5)]
    assert all(t.cache_n < 0.9 * (t.cache_n + t.prompt_n) for t in rewritten_turns)
