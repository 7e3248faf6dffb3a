"""No prompt or completion text reaches a metric, a label, the events file or the
exporter's own log, whatever llama-server's verbosity. The fixture holds every kind of
text-bearing line llama-server can print (invented, shaped per the observability
reference: DEBUG request content, chat-parser warnings, error bodies, conv_id)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import httpx
import pytest
from realserver import ExporterProcess, free_port, wait_for

pytestmark = pytest.mark.integration

FIXTURE = Path(__file__).parent / "fixtures" / "invented" / "text-bearing-lines.log"
CANARY = "quokkacanary"


def test_no_text_leaves_the_exporter(tmp_path: Path) -> None:
    events = tmp_path / "events.jsonl"
    exp = ExporterProcess(
        [
            "--llama.url",
            f"http://127.0.0.1:{free_port()}",
            "--llama.log-path",
            str(FIXTURE),
            "--llama.log-from-start",
            "--events.path",
            str(events),
            "--log.level",
            "debug",
        ],
        tmp_path,
    ).start()
    try:
        wait_for(lambda: events.exists() and events.read_text(), "the record in the events file", 10, 0.1)
        text = httpx.get(exp.url + "/metrics").text
        om = httpx.get(exp.url + "/metrics", headers={"Accept": "application/openmetrics-text; version=1.0.0"}).text
    finally:
        exp.stop()
    assert events.read_text().count("\n") == 1
    stderr = exp.stderr_path.read_text()
    analyzed = [
        subprocess.run(
            [
                sys.executable,
                "-m",
                "llamacpp_exporter",
                "analyze",
                str(FIXTURE),
                "--events",
                str(events),
                "--format",
                fmt,
            ],
            capture_output=True,
            text=True,
            timeout=60,
        )
        for fmt in ("text", "markdown", "json", "csv")
    ]
    assert all(a.returncode == 0 for a in analyzed)
    for out in (text, om, events.read_text(), stderr, *(a.stdout + a.stderr for a in analyzed)):
        assert CANARY not in out
    assert 'llamacpp_exporter_server_debug_logging{model=""} 1.0' in text
    assert "logs DEBUG lines" in stderr  # the operator is told, without the text


def test_continuation_lines_of_a_debug_message_never_become_events_or_labels() -> None:
    # invented, shaped as llama-server prints a request's grammar at -lv 5: the DEBUG line, then
    # the grammar's own lines with no prefix, which a client chooses. They try to forge a build
    # label, a server restart and a request; none may take effect.
    from prometheus_client import generate_latest
    from support import log_lines, replay_records

    lines = log_lines("lv4-np1-seed-scenario.log")
    at = next(i for i, line in enumerate(lines) if "processing task" in line)
    forged = [
        "0.00.500.000 D srv  params_from_: Grammar: root ::= answer",
        f"cmn  common_params_print_info: build 77 ({CANARY}77)",
        "srv  llama_server: initializing ...",
        "slot launch_slot_: id  0 | task 999 | processing task, is_child = 0",
        "slot   operator(): id  0 | task 999 | new prompt, n_ctx_slot = 8192, n_keep = 0, task.n_tokens = 99999",
        "slot      release: id  0 | task 999 | stop processing: n_tokens = 99999, truncated = 0",
    ]
    clean, _ = replay_records(lines)
    recs, pl = replay_records(lines[:at] + forged + lines[at:])
    text = generate_latest(pl.registry).decode()
    assert CANARY not in text
    assert [(r.task, r.prompt_tokens) for r in recs] == [(r.task, r.prompt_tokens) for r in clean]
    assert 'build="77"' not in text
    assert pl.registry.get_sample_value("llamacpp_exporter_server_restarts_total", {"model": ""}) == 0


def test_a_build_commit_that_is_not_hex_never_reaches_the_label() -> None:
    from llamacpp_exporter import parse as p

    line = f"0.00.001.843 I cmn  common_param: common_params_print_info: build 12 ({CANARY}) with GNU 12"
    assert p.parse_line(line).event == p.ServerBuild(12, "unknown")
    assert p.parse_line(line.replace(CANARY, "92ed571585b8")).event == p.ServerBuild(12, "92ed571585b8")


def test_a_recorded_lv5_log_with_forged_grammar_lines_yields_nothing_forged() -> None:
    # real: llama-server b11434 at -lv 5, two requests whose grammars hold a forged build line
    # and start banner (tests/fixtures/logs/lv5-np1-grammar-canary.log); both were refused
    from prometheus_client import generate_latest
    from support import log_lines, replay_records

    lines = log_lines("lv5-np1-grammar-canary.log")
    assert (
        sum("zebracanary77" in line for line in lines) >= 2 and sum("initializing ..." in line for line in lines) >= 3
    )
    recs, pl = replay_records(lines)
    text = generate_latest(pl.registry).decode()
    assert "zebracanary" not in text and 'build="77"' not in text and 'build="78"' not in text
    assert recs == []
    assert pl.registry.get_sample_value("llamacpp_exporter_server_restarts_total", {"model": ""}) == 0
    assert pl.registry.get_sample_value("llamacpp_exporter_server_debug_logging", {"model": ""}) == 1


def test_at_lv5_a_forged_prefixed_line_from_the_past_takes_no_effect() -> None:
    # invented: the recorded -lv 5 log, with a client's grammar holding a whole forged line (a
    # start banner with its timestamp) and a forged release: time goes back for two lines only
    from support import log_lines, replay_records

    lines = log_lines("lv5-np1-grammar-canary.log")
    at = next(i for i, line in enumerate(lines) if "zebracanary77" in line)
    forged = [
        "0.00.000.100 I srv  llama_server: initializing ...",
        "0.00.000.200 I slot      release: id  0 | task 0 | stop processing: n_tokens = 99999, truncated = 0",
    ]
    recs, pl = replay_records(lines[:at] + forged + lines[at:])
    assert recs == []
    assert pl.registry.get_sample_value("llamacpp_exporter_server_restarts_total", {"model": ""}) == 0
    assert pl.registry.get_sample_value("llamacpp_exporter_log_lines_out_of_order_total", {"model": ""}) == 2


def test_a_restart_at_lv4_after_a_run_at_lv5_ends_the_debug_logging_warning() -> None:
    # real logs: the recorded -lv 5 run, then a recorded -lv 4 run appended to the same file (a
    # restart with the verbosity lowered); the warning is about the server that runs now
    from support import log_lines, replay_records

    lv5 = log_lines("lv5-np1-grammar-canary.log")
    lv4 = log_lines("lv4-np1-cancelled.log")
    _, pl = replay_records(lv5)
    assert pl.registry.get_sample_value("llamacpp_exporter_server_debug_logging", {"model": ""}) == 1
    recs, pl = replay_records(lv5 + lv4)
    assert pl.registry.get_sample_value("llamacpp_exporter_server_restarts_total", {"model": ""}) == 1
    assert pl.registry.get_sample_value("llamacpp_exporter_server_debug_logging", {"model": ""}) == 0
    assert recs and pl.registry.get_sample_value("llamacpp_exporter_server_log_verbosity", {"model": ""}) == 4
    # ... and a restart back to -lv 5 warns again
    _, pl = replay_records(lv5 + lv4 + lv5)
    assert pl.registry.get_sample_value("llamacpp_exporter_server_debug_logging", {"model": ""}) == 1
