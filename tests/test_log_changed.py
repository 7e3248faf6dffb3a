"""A build that rewords the lines the diagnosis reads is seen, never silently ignored: every
reworded line of llama-server's core loggers is counted unrecognized, by the logger and the
function that wrote it (llamacpp_exporter_log_lines_unrecognized_total), and no line of a tested
build is.

The reworded logs are recorded real logs with a few phrases replaced, as an upstream change
would reword them (INVENTED wording; everything else in them is the recording)."""

from __future__ import annotations

from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from support import samples

from llamacpp_exporter import parse
from llamacpp_exporter.pipeline import replay

LOGS = Path(__file__).parent / "fixtures" / "logs"

# what is reworded, and the logger and functions whose lines change (b11434 and b11549 alike)
REWORDINGS = {
    "the RAM-cache narrative": (
        [
            (" - found better prompt with", " - restoring prompt with"),
            ("updating prompt cache", "refreshing the prompt cache"),
            ("prompt cache update took", "prompt cache refresh took"),
        ],
        {("srv", "load"), ("srv", "get_availabl")},
    ),
    "the cache's candidates": ([("   - prompt with length", "   - candidate prompt, length")], {("srv", "load")}),
    "the timings": (
        [("prompt eval time =", "prompt processing time ="), ("       eval time =", "       generation time =")],
        {("slot", "print_timing")},
    ),
}
RECORDED = [
    "lv4-np1-seed-scenario.log",  # b11434: the LoRA workload whose restores the diagnosis is about
    "builds/b11434-lv4-jsonl.log",
    "builds/b11549-lv4-text.log",
    "builds/b11549-lv4-jsonl.log",
    "b11549-lv4-np4-pileups.log",
]


def reword(text: str, changes: list[tuple[str, str]]) -> tuple[str, int]:
    """The log with the phrases replaced, and how many lines changed."""
    out, changed = [], 0
    for line in text.splitlines():
        new = line
        for old, wording in changes:
            new = new.replace(old, wording)
        changed += new != line
        out.append(new)
    return "\n".join(out) + "\n", changed


def counts(path: Path) -> tuple[dict[str, int], dict[tuple[str, str], int], str]:
    reg = CollectorRegistry()
    pl = replay(str(path), reg)
    return pl.metrics.line_counts(), dict(pl.metrics.unrecognized_by), generate_latest(reg).decode()


@pytest.mark.parametrize("log", RECORDED)
def test_no_line_of_a_tested_build_is_unrecognized(log: str) -> None:
    lines, by_function, _ = counts(LOGS / log)
    assert lines["unrecognized"] == 0 and not by_function, by_function


@pytest.mark.parametrize("what", sorted(REWORDINGS))
@pytest.mark.parametrize("log", RECORDED)
def test_every_reworded_line_is_counted_by_its_function(log: str, what: str, tmp_path: Path) -> None:
    changes, functions = REWORDINGS[what]
    before, _, _ = counts(LOGS / log)
    text, changed = reword((LOGS / log).read_text(errors="replace"), changes)
    assert changed > 0, f"{log} has no line of {what}"
    reworded = tmp_path / "reworded.log"
    reworded.write_text(text)
    lines, by_function, exposition = counts(reworded)
    print(f"{log}, {what} reworded: {changed} lines changed, unrecognized by function {by_function}")
    # each changed line is unrecognized, none is taken for a line ignored on purpose
    assert lines["unrecognized"] == changed
    assert lines["ignored"] == before["ignored"]
    assert set(by_function) <= functions and sum(by_function.values()) == changed
    served = samples(exposition, "llamacpp_exporter_log_lines_unrecognized_total")
    assert {(dict(k)["logger"], dict(k)["function"]): v for k, v in served.items()} == by_function


def test_a_line_no_function_name_could_be_counts_as_other() -> None:
    # INVENTED: a server-shaped line whose function column holds no C++ name
    event = parse.parse_line("0.01.000.000 I srv  <b>weird</b>: something new").event
    assert event == parse.Unrecognized("srv", "other")


def finished(exposition: str) -> dict[str, float]:
    got = samples(exposition, "llamacpp_requests_finished_total")
    out: dict[str, float] = {}
    for k, v in got.items():
        reason = dict(k)["reason"]
        out[reason] = out.get(reason, 0.0) + v
    return out


@pytest.mark.parametrize("log", [*RECORDED, "lv4-np1-cancelled.log", "b11434-lv4-np4-pileups.log"])
def test_without_timing_lines_no_request_is_taken_for_a_failure(log: str, tmp_path: Path) -> None:
    """A build that stops logging its timings (moved to debug level, say): each request's ending
    is unknown, none is cancelled or failed but those the log says were."""
    text = (LOGS / log).read_text(errors="replace")
    _, _, before = counts(LOGS / log)
    kept = [line for line in text.splitlines() if "print_timing" not in line]
    (tmp_path / "no-timings.log").write_text("\n".join(kept) + "\n")
    _, _, after = counts(tmp_path / "no-timings.log")
    was, now = finished(before), finished(after)
    print(f"{log}: finished {was} with timing lines, {now} without")
    assert now.get("cancelled", 0) == was.get("cancelled", 0) and now.get("failed", 0) == was.get("failed", 0)
    assert now["unknown"] == was["stop"] + was.get("truncated", 0) > 0


def test_the_log_accounts_for_every_token_the_servers_own_counters_counted() -> None:
    """Recorded: a real llama-server's /metrics right after the workload whose log this is. The
    tokens the log accounts for (llamacpp_exporter_log_tokens_total) are the server's own."""
    _, _, exposition = counts(LOGS / "lv4-np2-jsonl.log")
    server = {}
    for line in (LOGS / "lv4-np2-jsonl.server-metrics.txt").read_text().splitlines():
        if line.startswith("llamacpp:") and " " in line:
            name, value = line.split(" ", 1)
            server[name] = float(value)
    log = {dict(k)["kind"]: v for k, v in samples(exposition, "llamacpp_exporter_log_tokens_total").items()}
    print(f"log {log}; server {server}")
    assert log == {
        "prompt_computed": server["llamacpp:prompt_tokens_total"],
        "prompt_cached": server["llamacpp:prompt_tokens_cached_total"],
        "generated": server["llamacpp:tokens_predicted_total"],
    }


def test_a_line_without_the_servers_prefix_keeps_no_word_of_it(tmp_path: Path) -> None:
    """INVENTED: a log written with --no-log-prefix at -lv 5, where a prompt's own line is shaped
    like a server line: counted, and its would-be function (a word of the prompt) is not kept."""
    log = tmp_path / "no-prefix.log"
    log.write_text("srv  secretword12: my account number is 1234\n")
    lines, by_function, exposition = counts(log)
    assert lines["unrecognized"] == 1 and by_function == {("srv", "other"): 1}
    assert "secretword12" not in exposition
