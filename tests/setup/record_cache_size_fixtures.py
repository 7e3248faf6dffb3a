"""Record tests/fixtures/logs/lv4-np1-cache-size-{,swa-full-}{small,large}.{log,truth.jsonl}: one
workload run twice against a real llama-server, with a small --cache-ram and with a larger one
(and both again with --swa-full), to check
analyze's cache-size curve (what the small run predicts at the larger size) against what the
larger run measured.

Run once (it is not part of the test command): .venv/bin/python tests/setup/record_cache_size_fixtures.py
The workload, on one slot (each request saves the previous request's state, so the schedule is
the same in both runs): conversations with X-Conversation-Id that come back after 1 to 6 other
requests, and one-shot conversations in between, in a fixed order repeated four times. With the
small cache only the nearest returns keep their entry; with the larger one the middle ones do
too; the farthest miss in both.
"""

from __future__ import annotations

import dataclasses
import json
import random
import shutil
import sys
import tempfile
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from realserver import MODELS, LlamaServer, llama_server_binary, model_files  # noqa: E402
from workload import Truth, _truth, text  # noqa: E402

OUT = Path(__file__).resolve().parent.parent / "fixtures" / "logs"
# entries of about 16 MiB (363 tokens with two checkpoints): the small cache holds two, the
# larger one five, away from the sizes the returns need (about 46, 63-66, 76-81 and 104-124 MiB)
SIZES_MIB = {"small": 40, "large": 96}
# the same with --swa-full: no context checkpoints, entries of 6-12 MiB (the returns need about
# 20-25, 29 and 32-40 MiB) whose size does not
# depend on restores (with checkpoints, a restored entry keeps them and grows)
SWA_FULL_SIZES_MIB = {"swa-full-small": 20, "swa-full-large": 30}
# one period: "far" comes back after 6 others, "mid" after 3 and 2, "near" after 1 and 4; x: a
# one-shot conversation
PERIOD = ["far", "mid", "near", "x", "near", "mid", "x"]
PERIODS = 4
WORDS = 300


def workload(url: str) -> list[Truth]:
    rng = random.Random(11)
    systems = {name: f"conversation {name}. " + text(rng, WORDS) for name in ("far", "mid", "near")}
    history = {name: [{"role": "system", "content": s}] for name, s in systems.items()}
    out: list[Truth] = []
    one_shots = 0
    with httpx.Client(base_url=url) as c:
        for period in range(PERIODS):
            for name in PERIOD:
                if name == "x":
                    one_shots += 1
                    conv, messages = (
                        f"once-{one_shots}",
                        [{"role": "system", "content": f"one-shot {one_shots}. " + text(rng, WORDS)}],
                    )
                else:
                    conv, messages = name, history[name]
                messages.append({"role": "user", "content": text(rng, 10)})
                body = {"messages": messages, "max_tokens": 4, "temperature": 0, "cache_prompt": True}
                t0 = time.time()
                r = c.post("/v1/chat/completions", json=body, headers={"X-Conversation-Id": conv}, timeout=600)
                r.raise_for_status()
                res = r.json()
                messages.append({"role": "assistant", "content": res["choices"][0]["message"]["content"] or "ok"})
                out.append(_truth(conv, period, False, res["timings"], t0))
    return out


def main() -> None:
    binary = llama_server_binary()
    model, _ = model_files()
    for run, mib in {**SIZES_MIB, **SWA_FULL_SIZES_MIB}.items():
        if sys.argv[1:] and run not in sys.argv[1:]:  # e.g. ... large: record that run only
            continue
        work = Path(tempfile.mkdtemp())
        extra = ["--swa-full"] if run.startswith("swa-full") else []
        server = LlamaServer(binary, model, None, work, n_parallel=1, ctx=4096, cache_ram=mib, extra=extra).start()
        try:
            truth = workload(server.url)
        finally:
            server.stop()
        name = f"lv4-np1-cache-size-{run}"
        (OUT / f"{name}.log").write_text(server.log_path.read_text(errors="replace").replace(str(MODELS), "/models"))
        with open(OUT / f"{name}.truth.jsonl", "w") as fh:
            for t in truth:
                fh.write(json.dumps(dataclasses.asdict(t)) + "\n")
        print(name, len(truth), "requests,", sum(t.cache_n == 0 for t in truth), "computed whole")
        shutil.rmtree(work)


if __name__ == "__main__":
    main()
