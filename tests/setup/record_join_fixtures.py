"""Record, with a newer llama-server build, the workloads the conversation join is tested on, as
tests/fixtures/logs/b<build>-*.log with each response's timings as ground truth:

- ``impatient-ids``: six chats with X-Conversation-Id (LoRA on half) and clients, also with ids,
  that give up while queued (``impatient_ids_workload``), on 2 slots with 2 threads;
- ``impatient-ids-starved``: the same with the server pinned to one CPU next to a busy loop
  (``-t 1 -b 512 -ub 512``), as tests/test_attribution_real.py runs it;
- ``chats``: six concurrent multi-turn chats with ids (``chat_workload``).

Run once per build, never in the test command (it builds no server):
LLAMA_SERVER_SDIST=xllamacpp==2026.10.11549 .venv/bin/python tests/setup/record_join_fixtures.py
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
from workload import chat_workload, impatient_ids_workload  # noqa: E402

OUT = Path(__file__).resolve().parent.parent / "fixtures" / "logs"


def record(name: str, starved: bool, run: Callable[..., Any]) -> None:
    binary = llama_server_binary()
    model, lora = model_files()
    work = Path(tempfile.mkdtemp())
    extra = ["-b", "512", "-ub", "512"] if starved else []
    server = LlamaServer(
        binary, model, lora, work, n_parallel=2, threads=1 if starved else 2, cpus="0" if starved else None, extra=extra
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
    build = "b" + os.environ["LLAMA_SERVER_SDIST"].rsplit(".", 1)[1]
    record(f"{build}-lv4-np2-impatient-ids", False, lambda url: impatient_ids_workload(url)[0])
    record(f"{build}-lv4-np2-impatient-ids-starved", True, lambda url: impatient_ids_workload(url)[0])
    record(f"{build}-lv4-np2-chats", False, chat_workload)


if __name__ == "__main__":
    main()
