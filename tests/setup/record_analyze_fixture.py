"""Record tests/fixtures/logs/lv4-np2-lora-events.{log,events.jsonl,truth.jsonl}: a real
llama-server's -lv 4 log, the exporter's events file of the same run (its records carry the
LoRA state from /slots, which the log alone lacks) and each response's timings as ground truth.

Run once (it is not part of the test command): .venv/bin/python tests/setup/record_analyze_fixture.py
The workload: the concurrent LoRA chat twice (12 conversations of 5 turns on 2 slots) with the
LoRA restore scenario between them, so that both LoRA states, restores and discards occur."""

from __future__ import annotations

import dataclasses
import json
import shutil
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from realserver import MODELS, LlamaServer, llama_server_binary, model_files  # noqa: E402
from support import start_exporter, wait_records  # noqa: E402
from workload import chat_workload, seed_scenario  # noqa: E402

OUT = Path(__file__).resolve().parent.parent / "fixtures" / "logs"
NAME = "lv4-np2-lora-events"


def main() -> None:
    work = Path(tempfile.mkdtemp())
    model, lora = model_files()
    server = LlamaServer(llama_server_binary(), model, lora, work, n_parallel=2).start()
    exp = None
    try:
        exp = start_exporter(server, work)
        truths = chat_workload(server.url, n_convs=6, turns=5, seed=21)
        truths += seed_scenario(server.url, seed=22)
        truths += chat_workload(server.url, n_convs=6, turns=5, seed=23)
        wait_records(work / "events.jsonl", len(truths), timeout=120)
    finally:
        if exp is not None:
            exp.stop()
        server.stop()
    (OUT / f"{NAME}.log").write_text(server.log_path.read_text(errors="replace").replace(str(MODELS), "/models"))
    shutil.copy(work / "events.jsonl", OUT / f"{NAME}.events.jsonl")
    with open(OUT / f"{NAME}.truth.jsonl", "w") as fh:
        for t in truths:
            fh.write(json.dumps(dataclasses.asdict(t)) + "\n")
    print(NAME, len(truths), "requests")
    shutil.rmtree(work)


if __name__ == "__main__":
    main()
