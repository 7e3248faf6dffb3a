"""Fuzzing the parser and the assembler (hypothesis, bounded in time): arbitrary text and
mutations of real lines. The inner parser itself raises on nothing (its guard, parse_line,
would hide a bug as an unrecognized line), no exception escapes the pipeline or the /slots
path, none is counted as an internal error, and every line is accounted for once, as parsed,
ignored, unreadable or unrecognized."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry
from support import value

from llamacpp_exporter import parse as p
from llamacpp_exporter.pipeline import Pipeline
from llamacpp_exporter.records import SlotsSnapshot, SlotState
from llamacpp_exporter.sources.lines import LineSplitter

LOGS = Path(__file__).parent / "fixtures" / "logs"
REAL = [
    ln
    for name in ("lv4-np2-text.log", "lv4-np2-jsonl.log", "lv4-np1-seed-scenario.log", "lv4-np1-cache-thrashing.log")
    for ln in (LOGS / name).read_text(errors="replace").splitlines()
]
RESULTS = ("parsed", "ignored", "unrecognized", "unreadable", "oversized")
FUZZ = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@st.composite
def mutated_line(draw: st.DrawFn) -> str:
    line = draw(st.sampled_from(REAL))
    for _ in range(draw(st.integers(0, 4))):
        i = draw(st.integers(0, len(line)))
        op = draw(st.sampled_from(["insert", "delete", "replace", "cut", "digits"]))
        if op == "insert":
            line = line[:i] + draw(st.text(max_size=5)) + line[i:]
        elif op == "delete":
            line = line[:i] + line[i + draw(st.integers(1, 5)) :]
        elif op == "replace":
            line = line[:i] + draw(st.characters()) + line[i + 1 :]
        elif op == "cut":
            line = line[:i]
        else:  # numbers are where parsers break: huge, negative, odd
            line = line[:i] + draw(st.sampled_from(["-1", "99999999999999999999", "1e308", "nan", "0"])) + line[i:]
    return line


def counted(pl: Pipeline) -> float:
    return sum(value(pl.registry, "llamacpp_exporter_log_lines_total", {"result": r}) for r in RESULTS)


@FUZZ
@given(st.text(max_size=300))
def test_the_inner_parser_never_raises_on_any_text(line: str) -> None:
    # _parse_line, not parse_line: the guard around it turns any exception into a line counted
    # unrecognized, so only the inner function can show a parser bug
    assert p._parse_line(line).event is not None


@FUZZ
@given(mutated_line())
def test_the_inner_parser_never_raises_on_mutated_real_lines(line: str) -> None:
    assert p._parse_line(line).event is not None


@FUZZ
@given(mutated_line())
def test_the_usual_line_is_read_as_the_general_path_reads_it(line: str) -> None:
    """parse._usual_line reads the usual line a character at a time; on any line without
    control characters (which only the general path looks for) it must give what the general
    path's regular expressions give: the timestamp, the level, the tag, the ids and the event."""
    assume(p._CONTROL.search(line) is None and "\ufffd" not in line and "\x1b" not in line)
    general = p._parse_general(line)
    assert p._parse_line(line) == general
    for read in (p._usual_line, p._usual_line_by_regex):  # compiled, and in the interpreter
        got = read(line)
        assert got is None or got == general, read.__name__


def test_every_one_character_edit_of_the_usual_line_is_read_as_the_general_path_reads_it() -> None:
    """Every edit of one character of the prefix (dropped, doubled, or replaced by a digit, the
    characters either side of the digits, a space, a sign, a dot, a letter, a tab, a newline or
    a non-ASCII digit) of a real line of each shape: where reading a character at a time would
    slip, at a boundary of the prefix."""
    shapes = [  # real lines (lv4-np2-text.log, lv3-np2-text.log)
        "0.13.964.349 I slot launch_slot_: id  0 | task 34 | processing task, is_child = 0",
        "0.14.943.252 I slot      release: id  0 | task 34 | stop processing: n_tokens = 368, truncated = 0",
        "0.01.118.912 I slot get_availabl: id  1 | task -1 | selected slot by LRU, t_last = -1",
        "0.01.108.192 I srv        update:  - cache state: 0 prompts, 0.000 MiB (limits: 512.000 MiB, 16384 tokens, "
        "536870912 est)",
        "0.00.007.754 W srv  llama_server: security: no API key is set and CORS allows all origins",
    ]
    for line in shapes:
        assert p._usual_line(line) is not None  # the real shape takes the usual path
        assert p._usual_line_by_regex(line) is not None
        prefix = line.index(" | ", line.index("task")) + 3 if "task" in line else line.index(": ") + 2
        for i in range(min(prefix + 2, len(line))):
            for edited in (
                line[:i] + line[i + 1 :],
                line[:i] + line[i] + line[i:],
                *(line[:i] + c + line[i + 1 :] for c in "0/: -.x\t\n\u0663"),
            ):
                general = p._parse_general(edited)
                assert p._parse_line(edited) == general, edited
                for read in (p._usual_line, p._usual_line_by_regex):
                    got = read(edited)
                    assert got is None or got == general, (read.__name__, edited)


def test_a_failing_snapshot_is_counted_as_an_internal_error(monkeypatch: pytest.MonkeyPatch) -> None:
    """What the snapshot fuzzing asserts can fail: an exception there is counted, not only logged."""
    from llamacpp_exporter.assemble.assembler import Assembler

    def broken(self: object, snap: object) -> None:
        raise ValueError("a bug")

    monkeypatch.setattr(Assembler, "feed_snapshot", broken)
    pl = Pipeline(CollectorRegistry(), clock=lambda: 0.0)
    pl.process_snapshot(SlotsSnapshot(()))
    assert value(pl.registry, "llamacpp_exporter_internal_errors_total") == 1


@FUZZ
@given(st.lists(mutated_line(), min_size=1, max_size=60))
def test_pipeline_accounts_for_every_mutated_line_and_never_raises(lines: list[str]) -> None:
    pl = Pipeline(CollectorRegistry(), clock=lambda: 0.0)
    for i, line in enumerate(lines):
        pl.process_line(line, i * 0.01)
    pl.flush()
    assert counted(pl) == len(lines)
    assert value(pl.registry, "llamacpp_exporter_internal_errors_total") == 0


@FUZZ
@given(st.lists(st.sampled_from(REAL), min_size=20, max_size=200), st.data())
def test_pipeline_with_real_lines_out_of_order_and_snapshots_never_raises(
    lines: list[str], data: st.DataObject
) -> None:
    pl = Pipeline(CollectorRegistry(), clock=lambda: 0.0)
    for i, line in enumerate(lines):
        pl.process_line(line, i * 0.01)
        if data.draw(st.booleans()):
            ids = data.draw(st.lists(st.integers(-5, 600), max_size=4))
            pl.process_snapshot(
                SlotsSnapshot(tuple(SlotState(s, data.draw(st.integers(-1, 50)), True, 5, 1, 0, 1, ()) for s in ids))
            )
    pl.flush()
    assert counted(pl) == len(lines)
    assert value(pl.registry, "llamacpp_exporter_internal_errors_total") == 0


@FUZZ
@given(st.binary(max_size=4000), st.integers(16, 512))
def test_splitter_accounts_for_every_byte_line(data: bytes, max_line: int) -> None:
    pl = Pipeline(CollectorRegistry(), clock=lambda: 0.0)
    splitter = LineSplitter(pl, max_line)
    splitter.feed(data)
    splitter.flush()
    pieces = data.replace(b"\0", b"").split(b"\n")
    if pieces and pieces[-1] == b"":
        pieces.pop()
    assert counted(pl) == len(pieces)
