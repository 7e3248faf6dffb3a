"""What the conversation join names on every recorded run with conversation ids: requests (by
the truth file, right, uncertain, wrong), prefill seconds and "cost to others" seconds (by
`analyze`'s report, late proofs applied). Anyone can rerun it; it prints a Markdown table.
With --why, each request left uncertain and the requests the log leaves it (the conversations
of the truth file; "no answer": a request that got none, given up while queued).

    .venv/bin/python benchmarks/join_coverage.py [--why]
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from llamacpp_exporter.assemble.finish import AssemblySettings
from llamacpp_exporter.assemble.pseudonyms import Pseudonymizer
from llamacpp_exporter.offline import analyze
from llamacpp_exporter.offline.analyze import Inputs, Options
from llamacpp_exporter.offline.store import RecordStore

LOGS = Path(__file__).resolve().parent.parent / "tests" / "fixtures" / "logs"
RUNS = [
    ("b11434", "six chats with ids, clients with ids giving up while queued", "lv4-np2-impatient-ids"),
    ("b11434", "the same, the server starved on one busy CPU", "lv4-np2-impatient-ids-starved"),
    ("b11434", "the same, starved and never idle", "lv4-np2-impatient-ids-never-idle"),
    ("b11434", "six concurrent chats with ids", "lv4-np2-text"),
    (
        "b11434",
        "pile-ups: 8 conversations on 4 unified slots, together each round, impatient clients",
        "b11434-lv4-np4-pileups",
    ),
    ("b11434", "the same, starved", "b11434-lv4-np4-pileups-starved"),
    ("b11549", "six chats with ids, clients with ids giving up while queued", "b11549-lv4-np2-impatient-ids"),
    ("b11549", "the same, the server starved on one busy CPU", "b11549-lv4-np2-impatient-ids-starved"),
    ("b11549", "six concurrent chats with ids", "b11549-lv4-np2-chats"),
    (
        "b11549",
        "pile-ups: 8 conversations on 4 unified slots, together each round, impatient clients",
        "b11549-lv4-np4-pileups",
    ),
    ("b11549", "the same, starved", "b11549-lv4-np4-pileups-starved"),
]
SALT = "coverage-salt"


def _match(rec: Any, truth: dict[str, Any]) -> bool:
    return (
        rec.prefill_seconds is not None
        and rec.decode_seconds is not None
        and abs(rec.prefill_seconds * 1000 - truth["prompt_ms"]) <= 0.0051
        and abs(rec.decode_seconds * 1000 - truth["predicted_ms"]) <= 0.0051
    )


def coverage(name: str) -> dict[str, Any]:
    ps = Pseudonymizer(SALT)
    result = analyze.analyze(Inputs([str(LOGS / f"{name}.log")], []), AssemblySettings(), ps)
    try:
        recs = result.records
        rep = analyze.streamed_report(result, Options(), AssemblySettings(), None, None)
    finally:
        result.close()
    right = uncertain = wrong = 0
    for line in (LOGS / f"{name}.truth.jsonl").read_text().splitlines():
        t = json.loads(line)
        if not t.get("conv"):
            continue
        r = next(r for r in recs if _match(r, t))
        if r.conversation_source == "uncertain":
            uncertain += 1
        elif r.conversation == ps("id:" + t["conv"]) and r.conversation_source == "header":
            right += 1
        else:
            wrong += 1
    done = [r for r in recs if r.kind == "completion" and r.prefill_seconds]
    prefill = {
        "named": sum(r.prefill_seconds or 0.0 for r in done if r.conversation_source in ("header", "lineage")),
        "total": sum(r.prefill_seconds or 0.0 for r in done),
    }
    named = dict(rep.get("named") or {}, prefill_seconds=prefill)  # an older report has no "named"
    return {"right": right, "uncertain": uncertain, "wrong": wrong, "named": named}


def left_uncertain(name: str) -> list[str]:
    """Per request left uncertain: its conversation, turn, prefill, and the names the join still
    allows it at the end of the log."""
    ps = Pseudonymizer(SALT)
    truth = [json.loads(line) for line in (LOGS / f"{name}.truth.jsonl").read_text().splitlines()]
    conv_of = {ps("id:" + t["conv"]): t["conv"] for t in truth if t.get("conv")}
    store = RecordStore()
    try:
        reading = analyze.read_logs([str(LOGS / f"{name}.log")], AssemblySettings(), ps, store)
        (assembler,) = reading.pipeline.assemblers
        join = assembler.attribution.join
        recs = list(store.records())
        out = []
        for t in truth:
            r = next((r for r in recs if _match(r, t)), None)
            if not t.get("conv") or r is None or r.conversation_source != "uncertain":
                continue
            names = join.possible_names(r.task)
            told = (
                "any"
                if names is None
                else ", ".join(sorted(conv_of.get(n, "no answer") if n else "no id" for n in names))
            )
            out.append(
                f"task {r.task} ({t['conv']} turn {t['turn']}, prefill {r.prefill_seconds or 0.0:.1f} s): one of {told}"
            )
        return out
    finally:
        store.close()


def pct(share: dict[str, float] | None) -> str:
    if not share or not share["total"]:
        return "-"
    return f"{100 * share['named'] / share['total']:.0f}%"


def main() -> None:
    print(
        "| build | workload | requests named (right / uncertain / wrong) | prefill seconds named | cost to others named |"
    )
    print("|---|---|---|---|---|")
    for build, workload, name in RUNS:
        if not (LOGS / f"{name}.log").exists():
            continue
        c = coverage(name)
        n = c["right"] + c["uncertain"] + c["wrong"]
        named = c["named"] or {}
        print(
            f"| {build} | {workload} | {c['right']} of {n} ({c['right'] / n:.0%}; {c['uncertain']} uncertain, "
            f"{c['wrong']} wrong) | {pct(named.get('prefill_seconds'))} | {pct(named.get('cost_to_others_seconds'))} |"
        )
        sys.stdout.flush()
    if "--why" in sys.argv[1:]:
        for build, workload, name in RUNS:
            if (LOGS / f"{name}.log").exists():
                print(f"\n{build}, {workload} ({name}):")
                for line in left_uncertain(name):
                    print(f"- {line}")


if __name__ == "__main__":
    main()
