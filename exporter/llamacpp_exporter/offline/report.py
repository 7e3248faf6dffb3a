"""The investigation report of `analyze`: a ``ReportBuilder`` counts typed request records one at
a time (analyze streams them from its store, offline/store.py; ``build`` takes a list) into a
typed ``Report`` (export/report_types.py: the JSON output), rendered here as text, Markdown and CSV.

Each concern writes its own part (export/concerns.py: its sections, tables, CSV rows and headline
figures, beside its live metrics); the report around them holds what was read, the findings
(findings.py) and what the input could not tell.

Every rate carries its numerator and denominator. Where the records cannot tell (LoRA state
without /slots or an events file, cache diagnostics below -lv 4), the report counts the requests
as unknown and says why; it never guesses. Small samples are flagged.
"""

from __future__ import annotations

import csv
import io
import textwrap
from collections import defaultdict
from collections.abc import Iterable
from typing import Any, cast

from ..export.cache_outcome import EXCLUSIONS, CouldHaveHit
from ..export.concern import ConcernReport, ReportInputs, ReportSettings, Table, Values, cell, fmt_rate
from ..export.concerns import REPORT_PARTS
from ..export.report_types import Number, Rate, Report, Unknown
from ..records import RequestRecord
from .findings import findings

__all__ = ["ReportBuilder", "ValueLists", "build", "cell", "could_have_hit", "to_csv", "to_markdown", "to_text"]


def _start_order(records: Iterable[RequestRecord]) -> list[RequestRecord]:
    return sorted(records, key=lambda r: (r.epoch, r.start_us or 0))


def could_have_hit(
    records: list[RequestRecord], gap_seconds: float, history: list[RequestRecord] | None = None
) -> tuple[list[RequestRecord], dict[str, int]]:
    """The records that could have hit the cache, and how many each exclusion removed. history:
    all the records, when `records` is a time window of them (a conversation may begin before it)."""
    follower = CouldHaveHit(gap_seconds, keep=True)
    wanted = {id(r) for r in records}
    for r in _start_order(history or records):
        follower.follow(r, id(r) in wanted)
    assert follower.kept is not None
    return follower.kept, {k: follower.excluded[k] for k in EXCLUSIONS}


class ValueLists:
    """Values to take percentiles of, by group, in memory (StoredValues in store.py keeps them
    on disk)."""

    def __init__(self) -> None:
        self.lists: defaultdict[str, list[Number]] = defaultdict(list)

    def add(self, group: str, value: Number) -> None:
        self.lists[group].append(value)

    def ranked(self, group: str, ranks: Iterable[int]) -> tuple[int, dict[int, Number]]:
        vs = sorted(self.lists.get(group, ()))
        return len(vs), {k: vs[k] for k in ranks if 0 <= k < len(vs)}


class ReportBuilder:
    """The report, one record at a time: ``count`` each record of the report (any order, the
    same order for the same report), ``follow`` every record of the history in start order
    (see cache_outcome.CouldHaveHit), then ``result``. Each concern's part keeps its counts, one
    record per conversation, and the values for percentiles in ``values`` (in memory, or on disk)."""

    def __init__(self, gap_seconds: float, large_prefill_tokens: int, values: Values) -> None:
        settings = ReportSettings(gap_seconds, large_prefill_tokens, values)
        self.parts: list[ConcernReport] = [part(settings) for part in REPORT_PARTS]

    def count(self, r: RequestRecord) -> None:
        for part in self.parts:
            part.count(r)

    def follow(self, r: RequestRecord, in_report: bool) -> None:
        for part in self.parts:
            part.follow(r, in_report)

    def result(
        self,
        conversations: list[dict[str, Any]] | None = None,
        top: int = 10,
        sources: dict[str, Any] | None = None,
        join_costs: tuple[float, float] | None = None,
    ) -> Report:
        given = ReportInputs(sources or {}, conversations, top, join_costs)
        sections: dict[str, Any] = {"sources": given.sources, "findings": []}
        for part in self.parts:
            sections.update(part.result(given))
        rep = cast(Report, sections)
        rep["unknown"] = _input_unknowns(rep, given.sources) + [u for part in self.parts for u in part.unknowns(given)]
        rep["findings"] = findings(rep)
        return rep


def _input_unknowns(rep: Report, sources: dict[str, Any]) -> list[Unknown]:
    """What the input itself could not give: no request at all, a file read only partly."""
    out: list[Unknown] = []
    if not rep["requests"]["total"]:
        out.append(
            {
                "what": "requests",
                "requests": 0,
                "why": f"no request found in the input ({sources.get('log_lines', 0)} log lines read, "
                f"{sources.get('log_lines_unrecognized', 0)} unrecognized, {sources.get('log_lines_unreadable', 0)} "
                "not text): is it llama-server's log?",
            }
        )
    for problem in sources.get("files_not_read_to_the_end", []):
        out.append({"what": "input", "requests": 0, "why": f"read up to where it became unreadable: {problem}"})
    return out


def build(
    records: list[RequestRecord],
    *,
    gap_seconds: float = 1800.0,
    large_prefill_tokens: int = 1024,
    conversations: list[dict[str, Any]] | None = None,
    top: int = 10,
    sources: dict[str, Any] | None = None,
    history: list[RequestRecord] | None = None,
    join_costs: tuple[float, float] | None = None,
) -> Report:
    """The whole report from the records in memory (and, when the log was read, the pipeline's
    conversation costs). history: all the records, when `records` is a time window of them (a
    conversation may begin before it); analyze streams them from its store instead."""
    builder = ReportBuilder(gap_seconds, large_prefill_tokens, ValueLists())
    for r in records:
        builder.count(r)
    wanted = {id(r) for r in records}
    for r in _start_order(history if history else [r for r in records if r.kind == "completion"]):
        builder.follow(r, id(r) in wanted)
    return builder.result(conversations, top, sources, join_costs)


def _tables(rep: Report) -> list[Table]:
    """Every part's tables, in the order of concerns.py: the text and Markdown forms share them."""
    return [table for part in REPORT_PARTS for table in part.tables(rep)]


# ------------------------------------------------------------------ renderings
def _unknown_lines(rep: Report) -> list[str]:
    return [
        f"unknown: {u['what']} for {u['requests']} requests: {u['why']}" if u["requests"] else f"note: {u['why']}"
        for u in rep["unknown"]
    ]


def _evidence(value: Any) -> str:
    if isinstance(value, dict) and "denominator" in value:
        return fmt_rate(cast(Rate, value))
    if isinstance(value, float):
        return f"{value:.3f}"
    if isinstance(value, list):
        return ", ".join(" ".join(_evidence(v) for v in x.values()) if isinstance(x, dict) else str(x) for x in value)
    if isinstance(value, dict):
        return ", ".join(f"{k} {v}" for k, v in value.items())
    return "-" if value is None else str(value)


def finding_lines(rep: Report) -> list[str]:
    """The findings in words: each with its evidence and what to do."""
    out = []
    for f in rep.get("findings", []):
        out.append(f"[{f['severity'].replace('_', ' ')}] {f['summary']}")
        out.append(
            "  evidence: " + "; ".join(f"{k.replace('_', ' ')} {_evidence(v)}" for k, v in f["evidence"].items())
        )
        out.append(f"  what to do: {f['action']}")
    return out or ["none: no finding passed its threshold"]


def to_text(rep: Report) -> str:
    lines = ["Findings", "========"]
    for line in finding_lines(rep):  # wrapped: a finding is a paragraph
        indent = "    " if line.startswith("  ") else "  "
        lines.extend(textwrap.wrap(line, width=100, subsequent_indent=indent, break_on_hyphens=False))
    lines.append("")
    for title, header, rows, note in _tables(rep):
        lines.append(title)
        lines.append("=" * len(title))
        widths = [max(len(str(x)) for x in col) for col in zip(header, *rows, strict=True)]
        for row in [header, *rows]:
            lines.append("  ".join(str(c).ljust(w) for c, w in zip(row, widths, strict=True)).rstrip())
        if note:
            lines.append(note)
        lines.append("")
    lines.extend(_unknown_lines(rep))
    return "\n".join(lines).rstrip() + "\n"


def to_markdown(rep: Report) -> str:
    lines = ["### Findings\n"]
    for line in finding_lines(rep):
        lines.append(f"  - {line.strip()}" if line.startswith("  ") else f"- {line}")
    lines.append("")
    for title, header, rows, note in _tables(rep):
        lines.append(f"### {title}\n")
        lines.append("| " + " | ".join(header) + " |")
        lines.append("|" + "|".join("---" for _ in header) + "|")
        for row in rows:
            lines.append("| " + " | ".join(c.replace("|", "\\|") for c in row) + " |")
        if note:
            lines.append("\n" + note.replace("\n  ", "\n- "))
        lines.append("")
    lines.extend(f"- {u}" for u in _unknown_lines(rep))
    return "\n".join(lines).rstrip() + "\n"


def csv_rows(rep: Report) -> Iterable[list[Any]]:
    """section, path, lora, name, numerator, denominator, value: one row per figure."""
    yield ["section", "path", "lora", "name", "numerator", "denominator", "value"]
    for f in rep.get("findings", []):
        yield ["finding", "", "", f["finding"], f["severity"], "", f["summary"]]
    for part in REPORT_PARTS:
        yield from part.csv_rows(rep)
    for u in rep["unknown"]:
        yield ["unknown", "", "", u["what"], u["requests"], "", u["why"]]


def to_csv(rep: Report, set_name: str | None = None, header: bool = True) -> str:
    """One row per figure; with set_name (a comparison) a first column names the report."""
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    for i, row in enumerate(csv_rows(rep)):
        if i == 0 and not header:
            continue
        if set_name is not None:
            row = ["set" if i == 0 else set_name, *row]
        w.writerow(["" if v is None else v for v in row])
    return buf.getvalue()


# ------------------------------------------------------------------ two reports side by side
def comparison_rows(a: Report, b: Report) -> list[list[str]]:
    """The headline figures of two reports (two windows, or two log sets: before and after a
    fix), each with its counts."""
    return [row for part in REPORT_PARTS for row in part.comparison_rows(a, b)]


def comparison_text(a: Report, b: Report, names: tuple[str, str], markdown: bool) -> str:
    header = ["figure", *names]
    rows = comparison_rows(a, b)
    if markdown:
        lines = ["| " + " | ".join(header) + " |", "|---|---|---|"]
        lines += ["| " + " | ".join(r) + " |" for r in rows]
    else:
        widths = [max(len(x) for x in col) for col in zip(header, *rows, strict=True)]
        lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in [header, *rows]]
    lines.append("")
    lines.append("* small sample (fewer than 30 requests)")
    for n, rep in zip(names, (a, b), strict=True):
        lines.extend(f"{n}: [{f['severity'].replace('_', ' ')}] {f['summary']}" for f in rep.get("findings", []))
        lines.extend(f"{n}: {u}" for u in _unknown_lines(rep))
    return "\n".join(lines) + "\n"
