"""The verdict the project was founded on, both ways, on real servers: llama-server b11549 as
released (the LoRA comparison after a RAM-cache restore is with the previous request's adapters
on the slot) and the same build with that comparison fixed (tests/setup/patches). On the fixed
one `check-lora-restore` says "not affected", and on the seed's workload the exporter counts no
wrongful discard and no reuse of another adapter's entry, and counts the discard of an entry
computed under another adapter as correct. On the released one it still says "affected", and
counts the wrongful discards and the reuse."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from realserver import B11549, LORA_FIX, LlamaServer, llama_server_binary, model_files, wait_for
from support import samples, start_exporter
from workload import seed_scenario

pytestmark = pytest.mark.real_server

BUILDS = ["b11549", "b11549 with the LoRA comparison fixed"]


@pytest.fixture(params=BUILDS)  # a server each: the check's requests stay out of the counts
def server(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[dict[str, Any]]:
    fixed = request.param != BUILDS[0]
    binary = llama_server_binary(B11549, LORA_FIX if fixed else None)
    model, lora = model_files()
    work = tmp_path
    srv = LlamaServer(binary, model, lora, work / "srv", n_parallel=1, ctx=4096, cache_ram=256).start()
    try:
        yield {"srv": srv, "fixed": fixed, "work": work}
    finally:
        srv.stop()


def test_check_lora_restore_says_what_the_build_does(server: dict[str, Any]) -> None:
    srv = server["srv"]
    res = subprocess.run(
        [sys.executable, "-m", "llamacpp_exporter", "check-lora-restore", "--llama.url", srv.url, "--format", "json",
         "--llama.log-path", str(srv.log_path)],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    out = json.loads(res.stdout)
    print(f"fixed={server['fixed']}: exit {res.returncode}, {out['verdict']}, with the adapter {out['with_lora']}")
    if server["fixed"]:
        assert res.returncode == 0 and out["verdict"] == "not_affected", (res.returncode, out, res.stderr)
        # the restored entry kept: the response's own cache_n, and the log shows no discard
        assert out["with_lora"]["reused"] >= 0.9 * out["with_lora"]["prompt_tokens"]
        assert out["with_lora"]["discarded"] == 0
    else:
        assert res.returncode == 1 and out["verdict"] == "affected", (res.returncode, out, res.stderr)
        assert out["with_lora"]["reused"] == 0 and out["with_lora"]["discarded"] == 1


def restores(text: str) -> dict[str, float]:
    out: dict[str, float] = {}
    for k, v in samples(text, "llamacpp_prompt_cache_restores_total").items():
        out[dict(k)["result"]] = out.get(dict(k)["result"], 0.0) + v
    return out


def test_the_exporter_counts_the_discards_as_the_build_makes_them(server: dict[str, Any]) -> None:
    srv, fixed = server["srv"], server["fixed"]
    exp = start_exporter(srv, server["work"] / "exporter")
    try:
        # the seed's workload: A with the adapter, B without, A again with it (twice); then A
        # again without it: the entry restored was computed under another adapter. Seeds ten
        # apart: one sequence's B (seed + 1) is no prefix of another's A.
        sent = seed_scenario(srv.url, seed=21) + seed_scenario(srv.url, seed=31)
        other = seed_scenario(srv.url, seed=41, then_lora=False)
        sent += other

        def recorded() -> float:
            return sum(samples(exp.metrics_text(), "llamacpp_requests_total").values())

        wait_for(lambda: recorded() >= len(sent), "every request recorded", timeout=60)
        text = exp.metrics_text()
    finally:
        exp.stop()
    got = restores(text)
    mismatch = sum(samples(text, "llamacpp_prompt_cache_lora_mismatch_reuse_total").values())
    third = [sent[2], sent[5], other[2]]
    print(f"fixed={fixed}: restores {got}, mismatch reuses {mismatch}, third requests' cache_n "
          f"{[t.cache_n for t in third]} of {[t.prompt_n + t.cache_n for t in third]}")  # fmt: skip
    if fixed:
        assert got.get("discarded_lora_wrongful", 0) == 0 and mismatch == 0
        assert got.get("discarded_lora_correct", 0) == 1  # A without the adapter: its entry had it
        assert got.get("kept", 0) == 2  # A with the adapter, twice: its own entry, kept
        # the responses agree: the entry reused twice, and computed again without the adapter
        assert all(t.cache_n > 0.9 * (t.prompt_n + t.cache_n) for t in third[:2]) and third[2].cache_n == 0
    else:
        assert got.get("discarded_lora_wrongful", 0) == 2  # the seed's case, each time
        assert got.get("discarded_lora_correct", 0) == 0
        assert mismatch == 1  # A without the adapter reused the entry computed with it
        assert third[0].cache_n == third[1].cache_n == 0 and third[2].cache_n > 0.9 * (
            third[2].prompt_n + third[2].cache_n
        )
