"""The exporter's cost per log line on a server with many slots (issue 55), against a 4-slot one.

A real llama-server b11434 at a GPU's speed (the tiny random-weight llama model, so a request
ends in a fraction of a second, its random adapter loaded with the global scale 1.0), `-np N`,
`--cache-ram 256`, `-lv 4`; 3 conversations a slot, each 5 turns with X-Conversation-Id,
starting unsynchronised: a third with the adapter (`lora` scale 0.5), a third with it explicitly
off (scale 0), a third with no list (the global 1.0); beside them two clients (one at 4 slots)
sending short requests every 0.2-1.5 s that give up after 50-300 ms. Each run's log and the responses' timings are recorded once under
$LLAMACPP_EXPORTER_CACHE/many-slots/ (a run takes from 20 s at 4 slots to a few minutes at 128).

Then, for each log: the pipeline's CPU per line (the whole hot path, in the live exporter's
batches of 512 lines; pure Python, and compiled as `pip install .` builds it, with --compiled),
best of --runs, its ratio to the 4-slot log's; and the records against the responses (analyze,
late proofs applied): every answered request's record exact in prompt, reused and generated
tokens, its conversation named right, uncertain or wrong.

    .venv/bin/python benchmarks/many_slots.py [--slots 4,16,64,128] [--compiled] [--runs 2]
    .venv/bin/python benchmarks/many_slots.py --rerecord       # the logs afresh
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import httpx

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "tests" / "setup"))
from realserver import CACHE, MODELS, LlamaServer, llama_server_binary, tiny_llama_with_lora  # noqa: E402
from workload import CANARY, text  # noqa: E402

RUNS_DIR = CACHE / "many-slots"
TURNS = 5
BATCH = 512  # the live exporter's lines per queue item (app.LINE_BATCH)
# the lora list of each third of the conversations: the adapter at 0.5, explicitly off, none sent
LORA_MODES: list[list[dict[str, Any]] | None] = [[{"id": 0, "scale": 0.5}], [{"id": 0, "scale": 0.0}], None]


def lora_state(mode: int) -> str:
    """What the server ran: a request with no list runs with the global scale (1.0 here)."""
    return "none" if mode == 1 else "active"


def workload(
    url: str, slots: int, seed: int, stop_impatient: threading.Event, per_slot: int = 3
) -> tuple[list[dict[str, Any]], int]:
    """``per_slot`` conversations a slot, unsynchronised, and impatient clients beside them.
    Returns each answered request's truth and how many clients gave up."""
    out: list[dict[str, Any]] = []
    lock = threading.Lock()
    errors: list[BaseException] = []
    gave_up = [0]

    def conversation(i: int) -> None:
        rng = random.Random(f"{seed}-{i}")
        name = f"many-{seed}-{i}"
        mode = i % 3
        messages = [{"role": "system", "content": f"conversation {i}. " + text(rng, rng.randint(30, 300))}]
        try:
            time.sleep(rng.uniform(0.0, 3.0))
            with httpx.Client(base_url=url, headers={"X-Conversation-Id": name}, timeout=600) as c:
                for turn in range(TURNS):
                    messages.append({"role": "user", "content": text(rng, rng.randint(10, 40))})
                    body: dict[str, Any] = {"messages": messages, "max_tokens": rng.randint(4, 16), "temperature": 0}
                    if LORA_MODES[mode] is not None:
                        body["lora"] = LORA_MODES[mode]
                    t0 = time.time()
                    r = c.post("/v1/chat/completions", json=body)
                    r.raise_for_status()
                    res = r.json()
                    t = res["timings"]
                    answer = res["choices"][0]["message"]["content"] or "ok"
                    messages.append({"role": "assistant", "content": answer.replace(CANARY, "")})
                    with lock:
                        out.append(
                            {
                                "conv": name,
                                "turn": turn,
                                "lora": lora_state(mode),
                                "cache_n": int(t["cache_n"]),
                                "prompt_n": int(t["prompt_n"]),
                                "prompt_ms": float(t["prompt_ms"]),
                                "predicted_n": int(t["predicted_n"]),
                                "predicted_ms": float(t["predicted_ms"]),
                                "t_start": t0,
                                "t_end": time.time(),
                            }
                        )
                    time.sleep(rng.uniform(0.0, 1.0))
        except BaseException as e:  # noqa: BLE001 - surfaced by the caller
            errors.append(e)

    def impatient(k: int) -> None:
        rng = random.Random(f"{seed}-impatient-{k}")
        n = 0
        while not stop_impatient.wait(rng.uniform(0.2, 1.5)):
            n += 1
            body = {"messages": [{"role": "user", "content": text(rng, 200)}], "max_tokens": 32, "temperature": 0}
            try:
                httpx.post(
                    url + "/v1/chat/completions",
                    json=body,
                    headers={"X-Conversation-Id": f"impatient-{seed}-{k}-{n}"},
                    timeout=rng.uniform(0.05, 0.3),
                )
            except httpx.TimeoutException:
                with lock:
                    gave_up[0] += 1

    convs = [threading.Thread(target=conversation, args=(i,)) for i in range(per_slot * slots)]
    side = [threading.Thread(target=impatient, args=(k,)) for k in range(min(2, max(1, slots // 8)))]
    for t in [*convs, *side]:
        t.start()
    for t in convs:
        t.join()
    stop_impatient.set()
    for t in side:
        t.join()
    if errors:
        raise errors[0]
    return out, gave_up[0]


def server_for(slots: int, workdir: Path) -> LlamaServer:
    model, adapter = tiny_llama_with_lora()
    return LlamaServer(
        llama_server_binary(),
        model,
        None,
        workdir,
        n_parallel=slots,
        ctx=2048 * slots,
        cache_ram=256,
        extra=["--lora", str(adapter)],  # the global scale 1.0: what a request with no list runs with
    )


def record(slots: int, seed: int = 55, per_slot: int = 3) -> tuple[Path, Path]:
    """The run's log and truth, recorded once (cached)."""
    RUNS_DIR.mkdir(parents=True, exist_ok=True)
    name = f"np{slots}" if per_slot == 3 else f"np{slots}x{per_slot}"
    log, truth = RUNS_DIR / f"{name}.log", RUNS_DIR / f"{name}.truth.jsonl"
    if log.exists() and truth.exists():
        return log, truth
    with tempfile.TemporaryDirectory() as tmp:
        server = server_for(slots, Path(tmp)).start(timeout=120)
        try:
            t0 = time.monotonic()
            truths, gave_up = workload(server.url, slots, seed, threading.Event(), per_slot)
            took = time.monotonic() - t0
            time.sleep(1.0)  # the last releases written
        finally:
            server.stop()
        tmp_log = log.with_suffix(".tmp")
        tmp_log.write_bytes(server.log_path.read_bytes().replace(str(MODELS).encode(), b"/models"))
        with open(truth, "w") as fh:
            for t in truths:
                fh.write(json.dumps(t) + "\n")
        tmp_log.rename(log)
        n = sum(1 for _ in open(log, "rb"))
        print(
            f"recorded {slots} slots: {len(truths)} answered, {gave_up} gave up, {n} lines in {took:.0f} s "
            f"({n / took:.0f} lines/s)",
            file=sys.stderr,
        )
    return log, truth


# The pipeline alone over a log, in a process of its own (PYTHONPATH: the pure source or the
# compiled package): CPU seconds and lines.
TIMED = """
import sys, time
from prometheus_client import CollectorRegistry
from llamacpp_exporter.pipeline import Pipeline
lines = open(sys.argv[1], errors="replace").read().splitlines()
pl = Pipeline(CollectorRegistry(), on_record=lambda r: None, clock=lambda: 0.0)
t0 = time.thread_time()
for i in range(0, len(lines), {batch}):
    pl.process_lines(lines[i : i + {batch}])
pl.flush()
print(len(lines), time.thread_time() - t0)
"""


# The parse alone, by the kind of line (the logger and function that wrote it): what the lines
# that list whole caches and slots cost against the rest.
PARSE_BY_KIND = """
import sys, time
from llamacpp_exporter import parse
kinds = {"srv update:": [], "slot get_availabl:": [], "srv load:": [], "the rest": []}
for line in open(sys.argv[1], errors="replace").read().splitlines():
    tag = " ".join(line.split(None, 4)[2:4])
    kinds.get(tag, kinds["the rest"]).append(line)
for kind, lines in kinds.items():
    t0 = time.thread_time()
    for line in lines:
        parse.parse_line(line)
    dt = time.thread_time() - t0
    print(kind.rstrip(":"), len(lines), dt / max(1, len(lines)) * 1e6, sep="\t")
"""


def parse_by_kind(log: Path, pythonpath: str) -> list[tuple[str, int, float]]:
    env = dict(os.environ, PYTHONPATH=pythonpath)
    out = subprocess.run(
        [sys.executable, "-c", PARSE_BY_KIND, str(log)], capture_output=True, text=True, env=env, check=True
    ).stdout
    return [(k, int(n), float(us)) for k, n, us in (line.split("\t") for line in out.splitlines())]


def cpu_per_line(log: Path, pythonpath: str, runs: int) -> float:
    env = dict(os.environ, PYTHONPATH=pythonpath)
    best = float("inf")
    for _ in range(runs):
        out = subprocess.run(
            [sys.executable, "-c", TIMED.format(batch=BATCH), str(log)],
            capture_output=True,
            text=True,
            env=env,
            check=True,
        ).stdout.split()
        best = min(best, float(out[1]) / int(out[0]))
    return best * 1e6


def check(log: Path, truth: Path) -> dict[str, int]:
    """Each answered request's record against its response (analyze, late proofs applied)."""
    from llamacpp_exporter.assemble.finish import AssemblySettings
    from llamacpp_exporter.assemble.pseudonyms import Pseudonymizer
    from llamacpp_exporter.offline import analyze
    from llamacpp_exporter.offline.analyze import Inputs

    ps = Pseudonymizer("many-slots")
    result = analyze.analyze(Inputs([str(log)], []), AssemblySettings(), ps)
    try:
        recs = list(result.records)
    finally:
        result.close()
    by_times: dict[tuple[int, int], list[Any]] = {}
    for r in recs:
        if r.prefill_seconds is not None and r.decode_seconds is not None:
            by_times.setdefault((round(r.prefill_seconds * 1e5), round(r.decode_seconds * 1e5)), []).append(r)
    c = {"answered": 0, "exact": 0, "not exact": 0, "no record": 0, "ambiguous": 0}
    c.update({"named right": 0, "uncertain": 0, "named wrong": 0})
    for line in truth.read_text().splitlines():
        t = json.loads(line)
        c["answered"] += 1
        # the log prints the times to 0.01 ms, the response gives them unrounded
        pk, dk = round(t["prompt_ms"] * 100), round(t["predicted_ms"] * 100)
        cands = [
            r
            for a in (pk - 1, pk, pk + 1)
            for b in (dk - 1, dk, dk + 1)
            for r in by_times.get((a, b), [])
            if abs(r.prefill_seconds * 1000 - t["prompt_ms"]) <= 0.0051
            and abs(r.decode_seconds * 1000 - t["predicted_ms"]) <= 0.0051
        ]
        cands = [
            r
            for r in cands
            if r.prompt_tokens == t["cache_n"] + t["prompt_n"] and r.generated_tokens == t["predicted_n"]
        ] or cands
        if not cands:
            c["no record"] += 1
            continue
        if len(cands) > 1:
            c["ambiguous"] += 1
            continue
        r = cands[0]
        exact = r.prompt_tokens == t["cache_n"] + t["prompt_n"] and r.reused_tokens == t["cache_n"]
        exact = exact and r.generated_tokens == t["predicted_n"]
        c["exact" if exact else "not exact"] += 1
        if r.conversation_source == "uncertain" or r.conversation is None:
            c["uncertain"] += 1
        elif r.conversation == ps("id:" + t["conv"]):
            c["named right"] += 1
        else:
            c["named wrong"] += 1
    return c


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--slots", default="4,16,64,128")
    ap.add_argument("--runs", type=int, default=2)
    ap.add_argument("--compiled", action="store_true", help="also time the pipeline compiled with mypyc")
    ap.add_argument("--rerecord", action="store_true", help="record the runs afresh")
    ap.add_argument("--no-check", action="store_true", help="time only")
    ap.add_argument(
        "--before", metavar="CHECKOUT", help="also time another checkout's pure package (e.g. a git worktree)"
    )
    args = ap.parse_args()
    slots = [int(s) for s in args.slots.split(",")]
    if 4 not in slots:
        slots.insert(0, 4)  # the reference
    if args.rerecord:
        for s in slots:
            for f in RUNS_DIR.glob(f"np{s}.*"):
                f.unlink()
    logs = {s: record(s) for s in slots}
    builds = {"pure": str(ROOT / "exporter")}
    if args.before:
        builds["before (pure)"] = str(Path(args.before).resolve() / "exporter")
    if args.compiled:
        from build_compiled import installed_package

        builds["compiled"] = str(installed_package(compiler=True))
    head = "| slots | conversations | log lines | lines a request |"
    head += "".join(f" {b} CPU per line | vs 4 slots |" for b in builds)
    if not args.no_check:
        head += " records exact | named right / uncertain / wrong |"
    print(head)
    print("|" + "---|" * (head.count("|") - 1))
    ref: dict[str, float] = {}
    for s, (log, truth) in logs.items():
        n = sum(1 for _ in open(log, "rb"))
        answered = sum(1 for _ in open(truth))
        row = f"| {s} | {3 * s} | {n:,} | {n / max(1, answered):.0f} |"
        for b, path in builds.items():
            us = cpu_per_line(log, path, args.runs)
            ref.setdefault(b, us)
            row += f" {us:.1f} us | {us / ref[b]:.2f}x |"
        if not args.no_check:
            c = check(log, truth)
            unmatched = c["no record"] + c["ambiguous"]
            row += f" {c['exact']} of {c['answered']} ({c['not exact']} not, {unmatched} unmatched) |"
            row += f" {c['named right']} / {c['uncertain']} / {c['named wrong']} |"
        print(row, flush=True)
    biggest = max(logs)
    print(f"\nthe parse alone by kind of line, {biggest} slots (CPU per line):\n")
    print("| line | lines |" + "".join(f" {b} |" for b in builds))
    print("|---|---|" + "---|" * len(builds))
    by_build = {b: parse_by_kind(logs[biggest][0], path) for b, path in builds.items()}
    for i, (kind, n, _) in enumerate(by_build["pure"]):
        print(f"| {kind} | {n:,} |" + "".join(f" {by_build[b][i][2]:.2f} us |" for b in builds))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
