"""The exporter's memory on a server with many slots, over a long run (issue 55, item 4).

A real llama-server b11434 run at a GPU's speed, recorded once by benchmarks/many_slots.py (128
slots, 4 conversations a slot: 512 conversations in flight at once, a third with the adapter, a
third with it off, a third with no list, and clients giving up), read again and again as one
server run that never goes idle: each copy's timestamps and task ids shifted past the last, and
its conversation ids made new (`conv_id=X` -> `conv_id=X-k`), so that every structure kept per
request, per task and per conversation fills as on a busy server that sees new users all day.
The pipeline reads it in the live exporter's batches of 512 lines, in a process of its own,
which prints its resident memory (VmRSS) after each copy.

What grows with requests is capped (the records waiting for their conversation, the join's
window and results, the answers and tasks kept, the conversations whose costs are kept, ...);
this shows where the RSS levels off and checks it against the bound the README gives.

    .venv/bin/python benchmarks/many_slots_memory.py [--slots 128] [--per-slot 4] [--copies 6] [--compiled]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "tests" / "setup"))
from build_compiled import installed_package  # noqa: E402
from many_slots import record  # noqa: E402

BOUND_MIB = 128  # README: the live exporter's RSS on up to 128 slots, whatever is in flight
# the live exporter's RSS at start (42 MiB: HTTP server, client, config; many_slots_live.py) less
# this reading process's (30 MiB)
LIVE_START_EXTRA_MIB = 12

# the child: reads the recording `copies` times as one run, prints a JSON line after each copy
CHILD = """
import json, re, sys
sys.path.insert(0, {here!r})
from throughput_vs_mtail import _TS, _TASK, _us, _stamp
from prometheus_client import CollectorRegistry
from llamacpp_exporter.assemble.pseudonyms import Pseudonymizer
from llamacpp_exporter.pipeline import Pipeline
import llamacpp_exporter.parse

src, copies = sys.argv[1], int(sys.argv[2])
CONV = re.compile(r"conv_id=(\\S+)")

def rss_mib():
    for line in open("/proc/self/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024

records = [0]
def count(_):
    records[0] += 1
pl = Pipeline(CollectorRegistry(), on_record=count, clock=lambda: 0.0, pseudonymize=Pseudonymizer("salt"))
print(json.dumps({{"copy": 0, "rss": rss_mib(), "compiled": llamacpp_exporter.parse.__file__.endswith(".so")}}), flush=True)
t_end = task_end = 0
lines = 0
for k in range(copies):
    t_shift, task_shift, top = t_end + 1_000_000, task_end + 1, task_end
    first_ts = None
    batch = []
    with open(src, errors="replace", newline="\\n") as fh:
        started = k > 0
        for ln in fh:
            if not started:  # the first copy keeps the start banner
                started = "conv_id=" in ln or "launch_slot_" in ln
            elif k > 0 and first_ts is None and not ("conv_id=" in ln or "launch_slot_" in ln):
                continue  # later copies: the request part only
            m = _TS.match(ln)
            if m:
                us = _us(m)
                if first_ts is None:
                    first_ts = us
                t = us - first_ts + t_shift
                t_end = max(t_end, t)
                ln = _stamp(t) + ln[m.end():]
            if "task" in ln:
                def shift(mt):
                    global top
                    v = int(mt.group(2)) + task_shift
                    top = max(top, v)
                    return mt.group(1) + str(v)
                ln = _TASK.sub(shift, ln)
            if "conv_id=" in ln:
                ln = CONV.sub(lambda mt: f"conv_id={{mt.group(1)}}-{{k}}", ln)
            batch.append(ln.rstrip("\\r\\n"))
            if len(batch) == 512:
                pl.process_lines(batch, 0.0)
                batch = []
                lines += 512
    if batch:
        pl.process_lines(batch, 0.0)
        lines += len(batch)
    task_end = top
    print(json.dumps({{"copy": k + 1, "rss": rss_mib(), "records": records[0], "lines": lines}}), flush=True)
"""


def run(log: Path, copies: int, pythonpath: Path) -> list[dict[str, float]]:
    env = dict(os.environ, PYTHONPATH=str(pythonpath))
    proc = subprocess.Popen(
        [sys.executable, "-c", CHILD.format(here=str(HERE)), str(log), str(copies)],
        stdout=subprocess.PIPE,
        text=True,
        env=env,
    )
    assert proc.stdout is not None
    out = []
    for line in proc.stdout:
        row = json.loads(line)
        out.append(row)
        print(f"  {json.dumps(row)}", file=sys.stderr, flush=True)
    if proc.wait() != 0:
        raise SystemExit(f"the reading process failed ({proc.returncode})")
    return out


def full_caps_extra(conversations: int) -> tuple[float, str]:
    """What the two caps a run of a few thousand conversations leaves far from full would add
    when full: the conversations whose first arrival the join keeps (MAX_NAMES) and those whose
    costs are kept (--conversations.max-tracked, each with a bucket for each of 15 minutes)."""
    import secrets
    import tracemalloc
    from collections import OrderedDict

    from llamacpp_exporter.assemble.join import MAX_NAMES
    from llamacpp_exporter.export.conversations import ConversationCosts
    from llamacpp_exporter.records import RequestRecord

    tracemalloc.start()
    names: OrderedDict[str, int] = OrderedDict()
    for i in range(MAX_NAMES - conversations):
        names["c" + secrets.token_hex(6)] = 1_796_527_511_688_401 + i
    first_seen = tracemalloc.get_traced_memory()[0] / 2**20
    del names
    tracemalloc.reset_peak()
    base = tracemalloc.get_traced_memory()[0]
    now = [0.0]
    costs = ConversationCosts(clock=lambda: now[0])
    kept = ["c" + secrets.token_hex(6) for _ in range(costs.max_conversations)]
    for minute in range(15):
        now[0] = minute * 60.0
        for name in kept:
            costs.record(RequestRecord(epoch=0, slot=0, task=1, conversation=name, prefill_seconds=1.0))
    per_conversation = (tracemalloc.get_traced_memory()[0] - base) / costs.max_conversations
    tracemalloc.stop()
    cost_extra = per_conversation * max(0, costs.max_conversations - conversations) / 2**20
    return first_seen + cost_extra, (
        f"first arrivals kept: {conversations:,} of {MAX_NAMES:,} (+{first_seen:.1f} MiB full); "
        f"conversation costs kept: {conversations:,} of {costs.max_conversations:,} "
        f"(+{cost_extra:.1f} MiB full, {per_conversation / 1024:.1f} KiB each with 15 minutes of buckets)"
    )


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--slots", type=int, default=128)
    ap.add_argument("--per-slot", type=int, default=4, help="conversations a slot in the recording")
    ap.add_argument("--copies", type=int, default=6)
    ap.add_argument("--compiled", action="store_true", help="also the package compiled, as `pip install .` builds it")
    args = ap.parse_args()
    log, truth = record(args.slots, per_slot=args.per_slot)
    conversations = len({json.loads(line)["conv"] for line in open(truth)})
    builds = {"pure": HERE.parent / "exporter"}
    if args.compiled:
        builds["compiled"] = installed_package(compiler=True)
    print(
        f"{args.slots} slots, {conversations} conversations in the recording ({log.name}), read {args.copies} times "
        f"as one run with new conversation ids each time; the reading process's RSS after each copy (MiB)\n"
    )
    rows = {name: run(log, args.copies, path) for name, path in builds.items()}
    print(
        "| build | at start | "
        + " | ".join(f"after copy {k}" for k in range(1, args.copies + 1))
        + " | highest | records | lines |"
    )
    print("|---|---|" + "---|" * args.copies + "---|---|---|")
    for name, got in rows.items():
        highest = max(r["rss"] for r in got)
        print(
            f"| {name} | {got[0]['rss']:.1f} | "
            + " | ".join(f"{r['rss']:.1f}" for r in got[1:])
            + f" | {highest:.1f} | {int(got[-1]['records']):,} | {int(got[-1]['lines']):,} |"
        )
    extra, how = full_caps_extra(conversations * args.copies)
    worst = max(max(r["rss"] for r in got) for got in rows.values()) + extra + LIVE_START_EXTRA_MIB
    ok = worst <= BOUND_MIB
    print(f"\nnot full in this run: {how}")
    print(
        f"the live exporter with every cap full, at most: highest here + {extra:.1f} + {LIVE_START_EXTRA_MIB} "
        f"(its start) = {worst:.1f} MiB; within the bound ({BOUND_MIB} MiB): {'yes' if ok else 'NO'}"
    )
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
