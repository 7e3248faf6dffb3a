"""Record tests/fixtures/logs/lv4-np2-contention.{log,truth.jsonl}: a real llama-server's -lv 4
log (2 slots) in which short chats decode while one long conversation prefills on the other
slot, turn after turn, then go on alone; each response's timings as ground truth.

Run once (it is not part of the test command): .venv/bin/python tests/setup/record_contention_fixture.py
The workload: the long conversation sends a new 1,500-word prompt every turn (10 turns), so that
llama-server computes it whole each time; three short chats with X-Conversation-Id decode 48
tokens a turn meanwhile, and one of them as many turns again alone after it. (A long conversation under a LoRA
adapter does not do: its slot waited for the plain slots' batches, and the short chats never
left it a turn.)"""

from __future__ import annotations

import dataclasses
import json
import random
import shutil
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from realserver import MODELS, LlamaServer, llama_server_binary, model_files  # noqa: E402
from workload import Truth, _chat, _truth, text  # noqa: E402

OUT = Path(__file__).resolve().parent.parent / "fixtures" / "logs"
NAME = "lv4-np2-contention"


def main() -> None:
    work = Path(tempfile.mkdtemp())
    model, lora = model_files()
    server = LlamaServer(llama_server_binary(), model, lora, work, n_parallel=2).start()
    results: list[Truth] = []
    lock = threading.Lock()
    long_done = threading.Event()
    try:

        def long_conversation() -> None:
            # a new 1,500-word prompt every turn under the same conversation id: each turn is
            # computed whole (no LoRA: a slot with another adapter waits for the others' batch)
            rng = random.Random("long")
            with httpx.Client(base_url=server.url, headers={"X-Conversation-Id": "long-conversation"}) as c:
                for turn in range(10):
                    body = {
                        "messages": [
                            {"role": "system", "content": f"long-conversation {turn}. " + text(rng, 1500)},
                            {"role": "user", "content": text(rng, 12)},
                        ],
                        "max_tokens": 4,
                        "temperature": 0,
                    }
                    t0 = time.time()
                    r = c.post("/v1/chat/completions", json=body, timeout=600)
                    r.raise_for_status()
                    with lock:
                        results.append(_truth("long-conversation", turn, False, r.json()["timings"], t0))
                    time.sleep(0.3)
            long_done.set()

        def short(i: int) -> None:
            rng = random.Random(f"short-{i}")
            done = 0

            def one() -> None:
                nonlocal done
                _chat(
                    server.url,
                    f"short-{i}-{done}",
                    f"short chat {i} part {done}. " + text(rng, 40),
                    3,
                    48,
                    lambda turn: None,
                    rng,
                    results,
                    lock,
                    user_words=(10, 30),
                    pause=(0.1, 0.3),
                )
                done += 1

            while not long_done.is_set():  # while the long conversation prefills, turn after turn
                one()
            if i == 0:  # then one of them alone, as many again: decoding with no other prefill
                for _ in range(max(done, 6)):
                    one()

        threads = [threading.Thread(target=long_conversation)] + [
            threading.Thread(target=short, args=(i,)) for i in range(3)
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        server.stop()
    (OUT / f"{NAME}.log").write_text(server.log_path.read_text(errors="replace").replace(str(MODELS), "/models"))
    with open(OUT / f"{NAME}.truth.jsonl", "w") as fh:
        for truth in results:
            fh.write(json.dumps(dataclasses.asdict(truth)) + "\n")
    print(NAME, len(results), "requests")
    shutil.rmtree(work)


if __name__ == "__main__":
    main()
