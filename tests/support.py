"""Helpers shared by the tests: replaying recorded logs, ground truth, matching records to
responses, reading metrics. Test files import from here, never from each other."""

from __future__ import annotations

import dataclasses
import json
import logging
import re
from collections.abc import Iterable
from pathlib import Path
from typing import Any, cast

from prometheus_client import CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families
from realserver import ExporterProcess, LlamaServer, wait_for
from workload import Truth

from llamacpp_exporter.assemble.classify import outcome
from llamacpp_exporter.assemble.finish import AssemblySettings
from llamacpp_exporter.assemble.pseudonyms import Pseudonymizer
from llamacpp_exporter.offline.analyze import read_events
from llamacpp_exporter.pipeline import Pipeline
from llamacpp_exporter.records import JoinSource, RequestRecord


def value(registry: CollectorRegistry, name: str, labels: dict[str, str] | None = None) -> float:
    """A sample's value through the public API (0 when the series does not exist yet). A
    series of a server process or of requests without a model given: a plain server's ("")."""
    labels = labels or {}
    v = registry.get_sample_value(name, labels)
    if v is None and "model" not in labels:
        v = registry.get_sample_value(name, {"model": "", **labels})
    return 0.0 if v is None else v


ROOT = Path(__file__).resolve().parent.parent
LOGS = Path(__file__).parent / "fixtures" / "logs"


def by_timings(recs: list[RequestRecord], t: dict[str, Any]) -> RequestRecord:
    m = [
        r
        for r in recs
        if r.prefill_seconds is not None
        and r.decode_seconds is not None
        and abs(r.prefill_seconds * 1000 - t["prompt_ms"]) <= 0.0051
        and abs(r.decode_seconds * 1000 - t["predicted_ms"]) <= 0.0051
    ]
    assert len(m) == 1, t
    return m[0]


def log_lines(name: str) -> list[str]:
    return (LOGS / name).read_text(errors="replace").splitlines()


def replay_records(
    lines: Iterable[str], settings: AssemblySettings | None = None
) -> tuple[list[RequestRecord], Pipeline]:
    recs: list[RequestRecord] = []
    pl = Pipeline(CollectorRegistry(), settings, on_record=recs.append, clock=lambda: 0.0)
    for line in lines:
        pl.process_line(line, 0.0)
    pl.flush()
    return recs, pl


def truths(name: str) -> list[dict[str, Any]]:
    return [json.loads(x) for x in (LOGS / name).read_text().splitlines()]


SALT = "test-salt"


def grouping_accuracy(pairs: list[tuple[str, str]]) -> float:
    """Share of requests whose group's first request belongs to their own conversation."""
    first: dict[str, str] = {}
    for conv, group in pairs:
        first.setdefault(group, conv)
    return sum(first[g] == c for c, g in pairs) / len(pairs)


def replay(lines: Iterable[str], ps: Pseudonymizer | None = None, proven: bool = True) -> list[RequestRecord]:
    """The records of a log; with ``proven``, each as the conversation series and analyze see
    it: a conversation proven after its record went out (the record said "uncertain") applied."""
    recs: list[RequestRecord] = []
    proofs: dict[tuple[Any, ...], tuple[str, str]] = {}
    pl = Pipeline(
        CollectorRegistry(),
        on_record=recs.append,
        on_proof=lambda p: proofs.__setitem__((p.epoch, p.key.task), (p.conversation, p.source)),
        clock=lambda: 0.0,
        pseudonymize=ps or Pseudonymizer(SALT),
    )
    for line in lines:
        pl.process_line(line, 0.0)
    pl.flush()
    if proven:
        recs = [
            dataclasses.replace(r, conversation=proofs[k][0], conversation_source=cast(JoinSource, proofs[k][1]))
            if (k := (r.epoch, r.task)) in proofs
            else r
            for r in recs
        ]
    return recs


def exported_families() -> dict[str, str]:
    """Every family the exporter itself can serve, by the name its samples start with (a
    counter's with _total), and its type: the pipeline's, the poller's, the source's, the
    application's own (ready, build info), a router's."""
    from prometheus_client import CollectorRegistry

    from llamacpp_exporter.pipeline import Pipeline
    from llamacpp_exporter.sources.lines import SourceStats
    from llamacpp_exporter.sources.llama_server import PollerMetrics

    reg = CollectorRegistry()  # what the exporter registers: the pipeline's, the poller's, the source's
    pl = Pipeline(reg, events_path="unused.jsonl")  # the events file is opened at the first record only
    pl.router.mode = True  # a router's own families too
    PollerMetrics(reg)
    SourceStats(reg)
    from llamacpp_exporter.app import Exporter
    from llamacpp_exporter.config import Config

    logging.getLogger("llamacpp_exporter").disabled = True  # its warning about the missing salt
    try:
        app = Exporter(Config())
    finally:
        logging.getLogger("llamacpp_exporter").disabled = False
    families = [*reg.collect(), *app.registry.collect()]
    return {f.name + ("_total" if f.type == "counter" else ""): f.type for f in families}


def exported_metric_names() -> set[str]:
    """Every sample name the exporter can serve: its own families (with their _total,
    _bucket, _sum, _count samples) and llama-server's re-exported ones."""
    suffixes = {"histogram": ["_bucket", "_sum", "_count"]}
    names = {name + sfx for name, kind in exported_families().items() for sfx in suffixes.get(kind, [""])}
    for line in (ROOT / "tests" / "fixtures" / "server" / "metrics.txt").read_text().splitlines():
        if line and not line.startswith("#"):
            names.add(re.split(r"[{ ]", line, maxsplit=1)[0].replace("llamacpp:", "llamacpp_server_"))
    return names


def match(records: list[dict[str, Any]], truths: list[Truth]) -> list[tuple[Truth, dict[str, Any]]]:
    """Pair each response with its record by the server's own prefill and decode times
    (printed to 0.01 ms in the log, returned unrounded in the response)."""
    pairs = []
    for t in truths:
        cands = [
            r
            for r in records
            if r["prefill_seconds"] is not None
            and r["decode_seconds"] is not None
            and abs(r["prefill_seconds"] * 1000 - t.prompt_ms) <= 0.0051
            and abs(r["decode_seconds"] * 1000 - t.predicted_ms) <= 0.0051
        ]
        assert len(cands) == 1, f"{len(cands)} records match response {t}"
        pairs.append((t, cands[0]))
    return pairs


def samples(text: str, name: str) -> dict[tuple[Any, ...], float]:
    """A family's samples by their labels; an empty label is no label, as Prometheus stores it
    (a plain server's model="")."""
    out = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            if s.name == name:
                out[tuple(sorted((k, v) for k, v in s.labels.items() if v != ""))] = s.value
    return out


def start_exporter(server: LlamaServer, workdir: Path, *extra: str) -> ExporterProcess:
    exp = ExporterProcess(
        [
            "--llama.url",
            server.url,
            "--llama.log-path",
            str(server.log_path),
            "--llama.log-from-start",
            "--events.path",
            str(workdir / "events.jsonl"),
            "--llama.poll-interval",
            "0.5",
            *extra,
        ],
        workdir,
    ).start()
    exp.wait_polled()  # the global LoRA scales known before the workload starts
    return exp


def wait_records(path: Path, n: int, timeout: float = 30.0) -> list[dict[str, Any]]:
    def enough() -> list[dict[str, Any]]:
        # the records, each with a conversation proven after it was written (a proof line)
        recs = [json.loads(json.dumps(r.to_event())) for r in read_events([str(path)])[0]] if path.exists() else []
        return recs if len(recs) >= n else []

    return wait_for(enough, f"{n} records in {path}", timeout, 0.2)


def expected_from_truth(rows: list[dict[str, Any]], settings: AssemblySettings) -> dict[str, Any]:
    """The report's figures computed from the responses alone, independently of the exporter."""
    out: dict[str, Any] = {"total": len(rows), "prompt": 0, "reused": 0, "with_outcome": 0, "misses": 0}
    out.update({"chh_considered": 0, "chh_misses": 0, "first_of_conversation": 0, "prefix_changed": 0})
    out["conversation_unknown"] = 0  # rows whose conv is None: the log could not prove it
    by_lora: dict[str, list[int]] = {}
    previous: dict[str, dict[str, Any]] = {}
    for t in sorted(rows, key=lambda t: t["t_start"]):
        prompt = t["cache_n"] + t["prompt_n"]
        out["prompt"] += prompt
        out["reused"] += t["cache_n"]
        o = outcome(prompt, t["cache_n"], settings.min_prompt_tokens, settings.hit_ratio, settings.miss_ratio)
        prev = previous.get(t["conv"])
        if t["conv"] is not None:
            previous[t["conv"]] = t
        if o is None:
            continue
        out["with_outcome"] += 1
        out["misses"] += o == "miss"
        counts = by_lora.setdefault(t.get("lora", "unknown"), [0, 0])
        counts[0] += o == "miss"
        counts[1] += 1
        if t["conv"] is None:
            out["conversation_unknown"] += 1
        elif prev is None:
            out["first_of_conversation"] += 1
        elif prompt < prev["cache_n"] + prev["prompt_n"]:
            out["prefix_changed"] += 1
        else:
            out["chh_considered"] += 1
            out["chh_misses"] += o == "miss"
    out["by_lora"] = by_lora
    return out
