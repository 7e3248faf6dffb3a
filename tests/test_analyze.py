"""`llamacpp-exporter analyze`: every count and rate of its JSON report against the ground
truth recorded with each real log (the responses' cache_n and prompt_n, the conversation each
request belonged to), the report's rules on invented records, and its inputs (rotated and .gz
files, events files, bad lines)."""

from __future__ import annotations

import gzip
import io
import json
import os
import re
import shutil
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import httpx
import matplotlib.image
import pytest
from promql import Prometheus, dashboard_expressions
from realserver import ExporterProcess, free_port, wait_for
from support import expected_from_truth, samples, truths

from llamacpp_exporter.assemble.classify import outcome
from llamacpp_exporter.assemble.finish import AssemblySettings
from llamacpp_exporter.assemble.pseudonyms import Pseudonymizer
from llamacpp_exporter.export.concern import RATE_PATHS, fmt_rate, rate
from llamacpp_exporter.offline import analyze, plots, report
from llamacpp_exporter.records import LORA_STATES, MISS_CAUSES, PATHS, RESTORE_RESULTS, RequestRecord

LOGS = Path(__file__).parent / "fixtures" / "logs"
# recorded runs in which every request has its ground truth and sent its conversation id
WITH_TRUTH = [
    "lv4-np2-text",
    "lv4-np2-jsonl",
    "lv4-np1-cache-thrashing",
    "lv4-np1-cache-full-healthy",
    "lv4-np2-lora-events",
]


def json_report(paths: list[str], settings: AssemblySettings, events: list[str] | None = None) -> dict[str, Any]:
    result = analyze.analyze(analyze.Inputs(paths, events or []), settings)
    return dict(report.build(result.records, conversations=result.conversations, sources=result.sources))


@pytest.mark.parametrize("min_prompt_tokens", [1, 1024])
@pytest.mark.parametrize("name", WITH_TRUTH)
def test_every_count_and_rate_equals_the_ground_truth(name: str, min_prompt_tokens: int) -> None:
    settings = AssemblySettings(min_prompt_tokens=min_prompt_tokens)
    want = expected_from_truth(truths(f"{name}.truth.jsonl"), settings)
    rep = json_report([str(LOGS / f"{name}.log")], settings)
    rq = rep["requests"]
    assert (rq["total"], rq["prompt_tokens"], rq["reused_tokens"]) == (want["total"], want["prompt"], want["reused"])
    every = rep["miss_rate"]["all"]["all"]
    assert (every["numerator"], every["denominator"]) == (want["misses"], want["with_outcome"])
    ch = rep["could_have_hit"]
    assert ch["excluded"]["first_of_conversation"] == want["first_of_conversation"]
    assert ch["excluded"]["prefix_changed"] == want["prefix_changed"]
    assert ch["excluded"]["conversation_unknown"] == 0
    chh = ch["miss_rate"]["all"]["all"]
    assert (chh["numerator"], chh["denominator"]) == (want["chh_misses"], want["chh_considered"])
    # a bare log does not know the LoRA: every request is unknown, and the report says why
    assert rep["miss_rate"]["all"]["unknown"] == every
    assert any(u["what"] == "LoRA state" and "--events" in u["why"] for u in rep["unknown"])


def test_below_lv4_the_cache_figures_are_unknown_with_the_reason() -> None:
    rep = json_report([str(LOGS / "lv3-np2-text.log")], AssemblySettings(min_prompt_tokens=1))
    assert rep["requests"]["total"] == len(truths("lv3-np2-text.truth.jsonl"))
    whats = {u["what"]: u for u in rep["unknown"]}
    diag = next(u for w, u in whats.items() if w.startswith("RAM-cache diagnostics"))
    assert diag["requests"] == rep["requests"]["finished"] and "-lv 4" in diag["why"]
    # without /slots the reused tokens are unknown below -lv 4: no outcome is made up
    assert rep["miss_rate"]["all"]["all"]["denominator"] == 0
    assert whats["cache outcome"]["requests"] == rep["requests"]["finished"]


@pytest.mark.parametrize("min_prompt_tokens", [1, 1024])
def test_with_the_exporters_events_file_the_rates_by_lora_equal_the_ground_truth(
    tmp_path: Path, min_prompt_tokens: int
) -> None:
    """A recorded run: a real llama-server's log, the events file the exporter wrote while it
    polled /slots, and the responses. The log and the events file together, and the events
    file alone, give every rate by LoRA state as the responses do."""
    name = "lv4-np2-lora-events"
    settings = AssemblySettings(min_prompt_tokens=min_prompt_tokens)
    events = tmp_path / "events.jsonl"
    wrong_type = json.dumps({"epoch": 0, "slot": 0, "task": 1, "prompt_tokens": "many"})
    events.write_text((LOGS / f"{name}.events.jsonl").read_text() + "not a record\n" + wrong_type + "\n")
    want = expected_from_truth(truths(f"{name}.truth.jsonl"), settings)
    assert set(want["by_lora"]) == {"active", "none"}
    both = json_report([str(LOGS / f"{name}.log")], settings, [str(events)])
    alone = json_report([], settings, [str(events)])
    for rep in (both, alone):
        for lora, (misses, total) in want["by_lora"].items():
            got = rep["miss_rate"]["all"][lora]
            assert (got["numerator"], got["denominator"]) == (misses, total), lora
        ch = rep["could_have_hit"]
        assert (ch["miss_rate"]["all"]["all"]["numerator"], ch["considered"]) == (
            want["chh_misses"],
            want["chh_considered"],
        )
        assert ch["excluded"]["first_of_conversation"] == want["first_of_conversation"]
        assert rep["requests"]["by_lora"]["unknown"] == 0
        assert not any(u["what"] == "LoRA state" for u in rep["unknown"])
    assert both["sources"]["events_matched_to_log"] == want["total"]
    assert both["sources"]["events_lines_not_records"] == 2
    # the LoRA restore bug shows as it did in the case that started this project
    assert both["restores"]["active"]["discarded_lora_wrongful"] > 0
    assert both["restores"]["none"]["discarded_lora_wrongful"] == 0


def test_rotated_and_compressed_files_are_read_oldest_first_as_one_log(tmp_path: Path) -> None:
    lines = (LOGS / "lv4-np2-text.log").read_text().splitlines(keepends=True)
    third = len(lines) // 3
    (tmp_path / "llama.log").write_text("".join(lines[2 * third :]))
    (tmp_path / "llama.log.1").write_text("".join(lines[third : 2 * third]))
    with gzip.open(tmp_path / "llama.log.2.gz", "wt") as fh:
        fh.write("".join(lines[:third]))
    given = [str(tmp_path / n) for n in ("llama.log", "llama.log.1", "llama.log.2.gz")]
    assert analyze.rotation_order(given) == given[::-1]
    dated = ["x.log", "x.log-20261129.gz", "x.log-20261128"]
    assert analyze.rotation_order(dated) == ["x.log-20261128", "x.log-20261129.gz", "x.log"]
    settings = AssemblySettings(min_prompt_tokens=1)
    whole = json_report([str(LOGS / "lv4-np2-text.log")], settings)
    split = json_report(given, settings)
    for key in ("requests", "miss_rate", "could_have_hit", "miss_causes", "restores", "prefill_seconds"):
        assert split[key] == whole[key], key


def test_several_server_runs_in_one_log(tmp_path: Path) -> None:
    """Two runs of the server appended to one file (its start banner again): the second run's
    first requests could not have hit, whatever their conversation."""
    log = tmp_path / "two-runs.log"
    with log.open("w") as out:
        for _ in range(2):
            shutil.copyfileobj((LOGS / "lv4-np2-text.log").open(), out)
    settings = AssemblySettings(min_prompt_tokens=1)
    one = json_report([str(LOGS / "lv4-np2-text.log")], settings)
    two = json_report([str(log)], settings)
    assert two["requests"]["server_runs"] == 2
    assert two["requests"]["total"] == 2 * one["requests"]["total"]
    ex1, ex2 = one["could_have_hit"]["excluded"], two["could_have_hit"]["excluded"]
    assert ex2["first_of_conversation"] == ex1["first_of_conversation"]
    assert ex2["after_server_restart"] == ex1["first_of_conversation"]


# ------------------------------------------------------------------ the rules, on invented records
def rec(
    conv: str | None,
    start_s: float,
    end_s: float,
    prompt: int,
    reused: int,
    epoch: int = 0,
    lora: Any = "none",
    path: Any = "ram",
) -> RequestRecord:
    """An invented record (only the fields the rules read)."""
    o = outcome(prompt, reused, 1, 0.9, 0.1)
    return RequestRecord(
        epoch=epoch,
        slot=0,
        task=0,
        conversation=conv,
        start_us=int(start_s * 1e6),
        end_us=int(end_s * 1e6),
        prompt_tokens=prompt,
        reused_tokens=reused,
        outcome=o,
        lora=lora,
        path=path,
        reuse_source="log",
    )


def test_each_request_that_could_not_have_hit_is_excluded_under_one_reason() -> None:
    records = [
        rec("a", 0, 1, 1000, 0),  # first of a
        rec("a", 2, 3, 1200, 1100),  # considered, hit
        rec("a", 4, 5, 300, 0),  # history shrank (summarised)
        rec("a", 4000, 4001, 400, 0),  # after a long gap
        rec("a", 4002, 4003, 500, 0),  # considered, miss
        rec(None, 5, 6, 800, 0),  # no conversation
        rec("a", 1, 2, 600, 0, epoch=1),  # after a server restart
    ]
    kept, excluded = report.could_have_hit(records, gap_seconds=1800)
    assert excluded == {
        "conversation_unknown": 1,
        "first_of_conversation": 1,
        "after_server_restart": 1,
        "prefix_changed": 1,
        "after_long_gap": 1,
    }
    assert [(r.start_us, r.outcome) for r in kept] == [(2_000_000, "hit"), (4_002_000_000, "miss")]


def test_rates_are_written_with_their_counts_and_small_samples_are_flagged() -> None:
    assert fmt_rate(rate(61, 79)) == "77% (61/79)"
    assert fmt_rate(rate(3, 8)) == "38% (3/8) *"
    assert fmt_rate(rate(0, 0)) == "-"


@pytest.mark.parametrize("fmt", ["text", "markdown", "csv", "json"])
def test_every_format_renders_the_same_report(fmt: str, capsys: pytest.CaptureFixture[str]) -> None:
    path = str(LOGS / "lv4-np2-text.log")
    assert analyze.main([path, "--format", fmt, "--min-prompt-tokens", "1"]) == 0
    out = capsys.readouterr().out
    rep = json_report([path], AssemblySettings(min_prompt_tokens=1))
    every = fmt_rate(rep["miss_rate"]["all"]["all"])
    if fmt == "json":
        assert json.loads(out)["miss_rate"] == rep["miss_rate"]
    elif fmt == "csv":
        m = rep["miss_rate"]["all"]["all"]
        assert f"miss_rate,all,all,miss,{m['numerator']},{m['denominator']}," in out
    else:
        assert every in out
        assert "unknown: LoRA state" in out


def test_a_file_that_is_not_a_llama_server_log_is_said_to_be_one_and_fails(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # a real file that is no llama-server log: the ground truth of a recorded run
    other = LOGS / "lv4-np2-text.truth.jsonl"
    assert analyze.main([str(other), "--format", "json"]) == 1
    captured = capsys.readouterr()
    assert captured.out == ""
    lines = len(other.read_text().splitlines())
    assert f"none of the {lines} lines read from {other} is a line of llama-server's log" in captured.err


def test_plot_without_matplotlib_gives_an_install_hint_that_works_from_a_clone(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(plots, "available", lambda: False)
    assert analyze.main([str(LOGS / "lv4-np2-text.log"), "--plot", "charts"]) == 2
    err = capsys.readouterr().err
    assert "pip install matplotlib" in err and "[plot]" not in err


def test_bad_arguments_are_clear_errors(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert analyze.main([]) == 2
    assert analyze.main([str(tmp_path / "missing.log")]) == 2
    assert analyze.main([str(LOGS / "lv4-np2-text.log"), "--gap", "nan"]) == 2
    err = capsys.readouterr().err
    assert "no such file" in err and "--gap" in err


# ------------------------------------------------------------------ live exporter and analyze agree
def live_vs_report(metrics_text: str, rep: dict[str, Any]) -> list[tuple[str, float, float]]:
    """(what, live counter, analyze's figure) for every request counter the exporter exports."""
    pairs = []

    def total(name: str, **want: str) -> float:
        return sum(
            v for k, v in samples(metrics_text, name).items() if all(dict(k).get(a) == b for a, b in want.items())
        )

    rq = rep["requests"]
    for path in PATHS:
        live = total("llamacpp_requests_total", path=path) + total("llamacpp_requests_cancelled_total", path=path)
        pairs.append((f"requests path={path}", live, rq["by_path"][path]))
    for lora in LORA_STATES:
        live = total("llamacpp_requests_total", lora=lora) + total("llamacpp_requests_cancelled_total", lora=lora)
        pairs.append((f"requests lora={lora}", live, rq["by_lora"][lora]))
        for cause in MISS_CAUSES:
            pairs.append(
                (f"misses {lora} {cause}", total("llamacpp_prompt_cache_misses_total", lora=lora, cause=cause),
                 rep["miss_causes"][lora][cause])
            )  # fmt: skip
        for res in RESTORE_RESULTS:
            pairs.append(
                (f"restores {lora} {res}", total("llamacpp_prompt_cache_restores_total", lora=lora, result=res),
                 rep["restores"][lora][res])
            )  # fmt: skip
        for path in PATHS:
            m = rep["miss_rate"][path][lora]
            pairs.append(
                (
                    f"misses {path} {lora}",
                    total("llamacpp_prompt_cache_outcomes_total", path=path, lora=lora, outcome="miss"),
                    m["numerator"],
                )
            )
            pairs.append(
                (
                    f"outcomes {path} {lora}",
                    total("llamacpp_prompt_cache_outcomes_total", path=path, lora=lora),
                    m["denominator"],
                )
            )
    pairs.append(("cancelled", total("llamacpp_requests_cancelled_total"), rq["cancelled_or_failed"]))
    pairs.append(("prompt tokens", total("llamacpp_prompt_tokens_total"), rq["prompt_tokens"]))
    pairs.append(("reused tokens", total("llamacpp_prompt_tokens_reused_total"), rq["reused_tokens"]))
    pairs.append(("takeovers", total("llamacpp_small_task_slot_takeovers_total"), rep["small_task_takeovers"]))
    for path in PATHS:
        pairs.append(
            (
                f"prefills {path}",
                total("llamacpp_prefill_duration_seconds_count", path=path),
                rep["prefill_seconds"][path]["count"],
            )
        )
    tp = rep["time_per_output_token_seconds"]
    pairs.append(
        (
            "tpot prefill",
            total("llamacpp_time_per_output_token_seconds_count", contention="prefill"),
            tp["while_another_slot_prefilled"]["count"],
        )
    )
    pairs.append(
        (
            "tpot none",
            total("llamacpp_time_per_output_token_seconds_count", contention="none"),
            tp["no_concurrent_prefill"]["count"],
        )
    )
    return pairs


@pytest.mark.integration
@pytest.mark.parametrize(
    "name", ["lv4-np2-text", "lv4-np1-cancelled", "lv3-np2-text", "lv4-np2-starved", "lv4-np2-lora-events"]
)
def test_the_live_exporter_and_analyze_count_the_same(name: str, tmp_path: Path) -> None:
    log = tmp_path / "llama-server.log"
    shutil.copy(LOGS / f"{name}.log", log)
    n = sum(1 for _ in log.open(errors="replace"))
    exp = ExporterProcess(
        ["--llama.url", f"http://127.0.0.1:{free_port()}", "--llama.log-path", str(log), "--llama.log-from-start"]
        + ["--no-llama.slots"],
        tmp_path / "exporter",
    ).start()
    try:
        exp.wait_lines_processed(n)
        done = subprocess.run(
            [sys.executable, "-m", "llamacpp_exporter", "analyze", str(log), "--format", "json"],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert done.returncode == 0, done.stderr
        rep = json.loads(done.stdout)
        # the exporter emits a record when nothing more can change it; at the end of a log
        # analyze flushes: wait until the exporter holds every record analyze has
        wait_for(
            lambda: (
                sum(samples(exp.metrics_text(), "llamacpp_requests_total").values())
                + sum(samples(exp.metrics_text(), "llamacpp_requests_cancelled_total").values())
                >= rep["requests"]["total"]
            ),
            "every request counted live",
            timeout=90,
        )
        text = exp.metrics_text()
    finally:
        exp.stop()
    assert rep["requests"]["total"] > 0
    differ = [(what, live, ours) for what, live, ours in live_vs_report(text, rep) if live != ours]
    assert not differ


# ------------------------------------------------------------------ history into Prometheus
@pytest.mark.integration
def test_backfilled_history_answers_the_dashboards_query_in_a_real_prometheus(tmp_path: Path) -> None:
    """analyze --openmetrics -> promtool tsdb create-blocks-from openmetrics -> a real
    Prometheus on those blocks answers the overview's RAM-path miss ratio over that history
    with analyze's own figure."""
    log = tmp_path / "llama-server.log"
    shutil.copy(LOGS / "lv4-np2-text.log", log)
    last_line = time.time() - 2 * 3600  # the log was written two hours ago
    os.utime(log, (last_line, last_line))
    om = tmp_path / "history.om"
    done = subprocess.run(
        [sys.executable, "-m", "llamacpp_exporter", "analyze", str(log), "--format", "json"]
        + ["--openmetrics", str(om), "--openmetrics-step", "5"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    rep = json.loads(done.stdout)
    text = om.read_text()
    assert text.endswith("# EOF\n") and "_created" not in text and "llamacpp_conversation_" not in text
    data = tmp_path / "prometheus" / "data"
    blocks = subprocess.run(
        [shutil.which("promtool") or "promtool", "tsdb", "create-blocks-from", "openmetrics", str(om), str(data)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert blocks.returncode == 0, blocks.stdout + blocks.stderr
    prom = Prometheus(tmp_path / "prometheus", {"global": {"scrape_interval": "1h"}, "scrape_configs": []})
    try:

        def at(promql: str, t: float) -> list[dict[str, Any]]:
            r = httpx.get(prom.url + "/api/v1/query", params={"query": promql, "time": t}, timeout=30)
            r.raise_for_status()
            series: list[dict[str, Any]] = r.json()["data"]["result"]
            return series

        t = last_line + 60
        total = at('sum(llamacpp_requests_total{job="llamacpp"}) + sum(llamacpp_requests_cancelled_total)', t)
        assert float(total[0]["value"][1]) == rep["requests"]["total"]
        panel = next(
            e for e in dashboard_expressions() if "RAM-path miss ratio, 15 min" in e.where and "outcome" in e.expr
        )
        got = at(panel.promql, t)
        want = rep["miss_rate"]["ram"]["all"]
        assert got, f"no data for {panel.where}"
        assert float(got[0]["value"][1]) == pytest.approx(want["numerator"] / want["denominator"])
        assert not at(panel.promql, last_line - 3 * 3600), "nothing before the log began"
    finally:
        prom.stop()


def test_a_run_followed_by_another_in_the_same_file_is_not_dated_by_a_guess(tmp_path: Path) -> None:
    """Only the last run in a file is dated (by the file's modification time): the earlier
    run's samples are left out and counted, not placed at an invented time."""
    log = tmp_path / "two-runs.log"
    with log.open("w") as out:
        for _ in range(2):
            shutil.copyfileobj((LOGS / "lv4-np2-text.log").open(), out)
    result = analyze.analyze(analyze.Inputs([str(log)], []), history_step=5.0)
    assert result.history is not None
    buf = io.StringIO()
    w = result.history.write_openmetrics(buf, analyze.wall_clock(result.file_ends), {"job": "llamacpp"})
    assert w.runs_without_time == {0}
    assert w.samples > 0 and w.samples_without_time > 0 and w.samples_out_of_order == 0
    mtime = log.stat().st_mtime
    stamps = {float(line.rsplit(" ", 1)[1]) for line in buf.getvalue().splitlines() if not line.startswith("#")}
    assert max(stamps) == pytest.approx(mtime, abs=0.002)
    assert min(stamps) >= mtime - 60  # the recorded run lasts 45 s


def test_the_backfill_has_the_buckets_the_live_exporter_was_given(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """With the exporter's own bucket flags, --openmetrics continues its histograms with the same
    bounds (a query over the backfill and the live series then sums like with like)."""
    log = str(LOGS / "lv4-np2-text.log")

    def bounds(*flags: str) -> set[str]:
        om = tmp_path / "out.om"
        assert analyze.main([log, "--openmetrics", str(om), "--no-progress", *flags]) == 0
        return set(re.findall(r'^llamacpp_request_queue_seconds_bucket\{[^}]*le="([^"]+)"', om.read_text(), re.M))

    assert "7.0" not in bounds() and "10.0" in bounds()
    assert bounds("--metrics.latency-buckets", "1,7,30") == {"1.0", "7.0", "30.0", "+Inf"}
    capsys.readouterr()
    assert analyze.main([log, "--openmetrics", str(tmp_path / "x.om"), "--metrics.latency-buckets", "5,1"]) == 2
    assert "--metrics.latency-buckets: bounds must increase" in capsys.readouterr().err


# ------------------------------------------------------------------ windows and comparisons
def run_json(capsys: pytest.CaptureFixture[str], *argv: str) -> dict[str, Any]:
    assert analyze.main([*argv, "--format", "json", "--min-prompt-tokens", "1"]) == 0
    rep: dict[str, Any] = json.loads(capsys.readouterr().out)
    return rep


def test_two_windows_split_every_count_of_the_whole(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    log = tmp_path / "llama-server.log"
    shutil.copy(LOGS / "lv4-np2-text.log", log)
    os.utime(log, (1_800_000_000, 1_800_000_000))  # its last line: 2027-01-15T08:00:00Z
    whole = run_json(capsys, str(log))
    split = "2027-01-15T07:59:40+00:00"  # 20 s before the end of a 45 s run
    both = run_json(capsys, str(log), "--compare-at", split)
    a, b = both["a"], both["b"]
    assert a["requests"]["total"] > 0 and b["requests"]["total"] > 0
    assert a["requests"]["total"] + b["requests"]["total"] == whole["requests"]["total"]
    for path in RATE_PATHS:
        for key in ("numerator", "denominator"):
            assert (
                a["miss_rate"][path]["all"][key] + b["miss_rate"][path]["all"][key]
                == (whole["miss_rate"][path]["all"][key])
            )
    # a conversation begun before the window is not "first" inside it: the exclusions split too
    ca, cb, cw = (r["could_have_hit"] for r in (a, b, whole))
    assert ca["considered"] + cb["considered"] == cw["considered"]
    assert (
        ca["excluded"]["first_of_conversation"] + cb["excluded"]["first_of_conversation"]
        == (cw["excluded"]["first_of_conversation"])
    )
    # --since/--until give the same windows
    assert run_json(capsys, str(log), "--until", split)["miss_rate"] == a["miss_rate"]
    assert run_json(capsys, str(log), "--since", split)["miss_rate"] == b["miss_rate"]
    assert run_json(capsys, str(log), "--since", "2027-01-15T08:00:01+00:00")["requests"]["total"] == 0


def test_requests_that_cannot_be_dated_are_left_out_of_a_window_and_counted(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    log = tmp_path / "two-runs.log"
    with log.open("w") as out:
        for _ in range(2):
            shutil.copyfileobj((LOGS / "lv4-np2-text.log").open(), out)
    rep = run_json(capsys, str(log), "--since", "2000-01-01")
    assert rep["requests"]["total"] == 32  # the last run only
    time_unknown = next(u for u in rep["unknown"] if u["what"] == "time")
    assert time_unknown["requests"] == 32


def test_two_log_sets_compared_side_by_side(capsys: pytest.CaptureFixture[str]) -> None:
    first, second = str(LOGS / "lv4-np2-text.log"), str(LOGS / "lv4-np1-cache-thrashing.log")
    both = run_json(capsys, first, "--compare-with", second)
    assert both["a"]["miss_rate"] == run_json(capsys, first)["miss_rate"]
    assert both["b"]["miss_rate"] == run_json(capsys, second)["miss_rate"]
    assert analyze.main([first, "--compare-with", second]) == 0
    text = capsys.readouterr().out
    assert fmt_rate(both["b"]["miss_rate"]["all"]["all"]) in text


# ------------------------------------------------------------------ charts
def test_the_miss_rate_chart_plots_the_reports_counts() -> None:
    result = analyze.analyze(
        analyze.Inputs([str(LOGS / "lv4-np2-text.log")], []), AssemblySettings(min_prompt_tokens=1)
    )
    dated = analyze.dated(result)
    xs, _ = plots.time_axis(dated)
    bins = plots.miss_rate_bins(xs, [r for _, r in dated])
    rep = report.build(result.records)
    for lora in LORA_STATES:
        want = rep["miss_rate"]["all"][lora]
        assert (sum(b[1] for b in bins[lora]), sum(b[2] for b in bins[lora])) == (
            want["numerator"],
            want["denominator"],
        )
    assert len(bins["unknown"]) > 1


def test_plot_writes_the_three_charts(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "charts"
    assert analyze.main([str(LOGS / "lv4-np2-text.log"), "--plot", str(out), "--min-prompt-tokens", "1"]) == 0
    for name in ("miss-rate.png", "prefill.png", "time-per-output-token.png"):
        image = matplotlib.image.imread(out / name)
        assert image.shape[0] >= 400 and image.shape[1] >= 700, name
    assert "chart written" in capsys.readouterr().err


def test_the_readmes_report_is_what_analyze_prints(capsys: pytest.CaptureFixture[str]) -> None:
    readme = (Path(__file__).parent.parent / "README.md").read_text()
    blocks = readme.split("A part of the report of a recorded run", 1)[1].split("```\n")
    found, tables = blocks[1], blocks[3]  # its findings, then a part of its tables
    name = LOGS / "lv4-np2-lora-events"
    assert analyze.main([f"{name}.log", "--events", f"{name}.events.jsonl", "--min-prompt-tokens", "1"]) == 0
    out = capsys.readouterr().out
    assert out.startswith(found) and found.count("[critical]") == 2
    assert tables in out


def test_a_large_input_shows_its_progress_on_a_terminal(capsys: pytest.CaptureFixture[str]) -> None:
    bar = analyze._Progress(analyze.PROGRESS_BYTES * 2, enabled=True)
    bar.show(analyze.PROGRESS_BYTES)
    bar.close()
    assert "50.0% of" in capsys.readouterr().err
    quiet = analyze._Progress(analyze.PROGRESS_BYTES // 2, enabled=True)  # small input: no bar
    quiet.show(1)
    assert capsys.readouterr().err == ""


@pytest.mark.parametrize("name", ["lv4-np2-text", "lv4-np2-slow-machine", "lv4-np2-lora-events"])
def test_the_size_of_a_concurrent_prefill_is_one_the_server_reported(name: str) -> None:
    """Each record's largest concurrent prefill is the prompt_n of another response."""
    result = analyze.analyze(analyze.Inputs([str(LOGS / f"{name}.log")], []))
    sizes = {t["prompt_n"] for t in truths(f"{name}.truth.jsonl")}
    seen = [r.overlapping_prefill_tokens for r in result.records if r.overlapping_prefill_tokens]
    assert seen and set(seen) <= sizes
    rep = report.build(result.records)
    tp = rep["time_per_output_token_seconds"]
    assert tp["while_a_large_prefill_ran"]["count"] <= tp["while_another_slot_prefilled"]["count"]


def test_unreadable_and_foreign_input_is_reported_never_a_crash(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A file that is not gzip, a .gz cut short (a rotation caught mid-write), random bytes,
    an empty file, an unwritable output: a clear message, what could be read is kept."""
    whole = (LOGS / "lv4-np2-text.log").read_bytes()
    cut = tmp_path / "cut.log.gz"
    cut.write_bytes(gzip.compress(whole)[: len(gzip.compress(whole)) // 2])
    not_gzip = tmp_path / "not.gz"
    not_gzip.write_bytes(b"secret prompt text, not gzip\n")
    noise = tmp_path / "noise.log"
    noise.write_bytes(bytes(range(256)) * 400)
    empty = tmp_path / "empty.log"
    empty.write_bytes(b"")
    rep = run_json(capsys, str(cut))
    assert 0 < rep["requests"]["total"] < 32  # the requests before the cut
    assert any(str(cut) in u["why"] for u in rep["unknown"])
    for path in (not_gzip, noise, empty):
        # no empty report that reads as "all is well": it says the file is no llama-server log
        assert analyze.main([str(path), "--format", "json", "--min-prompt-tokens", "1"]) == 1
        out = capsys.readouterr()
        assert "(b'" not in out.out + out.err  # gzip's own message quotes the file's first bytes
        assert "secret" not in out.out + out.err
        assert out.out == "" and f"read from {path} is a line of llama-server's log" in out.err, out.err
    analyze.main([str(noise)])
    assert "not text" in capsys.readouterr().err
    missing = tmp_path / "no-such-dir" / "x.om"
    assert analyze.main([str(LOGS / "lv4-np2-text.log"), "--openmetrics", str(missing)]) == 1
    assert "cannot write" in capsys.readouterr().err


def test_a_prompt_that_leaves_its_conversations_own_state_early_changed_its_prefix() -> None:
    """Invented records: the server compared the prompt with the previous request's own state
    (state_source_task) and kept less than 90% of the previous prompt."""

    def pair(reused: int, source: int | None, **extra: Any) -> list[RequestRecord]:
        first = replace(rec("a", 0, 1, 2000, 0), task=7)
        second = replace(rec("a", 2, 3, 2600, reused), task=8, state_source_task=source, **extra)
        return [first, second]

    def reason(records: list[RequestRecord]) -> dict[str, int]:
        return report.could_have_hit(records, gap_seconds=1800)[1]

    assert reason(pair(300, 7))["prefix_changed"] == 1  # rewritten: only 300 of 2000 in common
    assert reason(pair(1999, 7))["prefix_changed"] == 0  # continues it (all but the last token)
    assert reason(pair(300, 5))["prefix_changed"] == 0  # compared with another task's state: unknown
    assert reason(pair(300, 7, lora_cache_cleared=True))["prefix_changed"] == 0  # a LoRA discard
    assert reason(pair(300, 7, forced_reprocess=True))["prefix_changed"] == 0  # SWA: not the prompt's doing
    # its own entry was only looked at in the RAM cache (the slot held another's state)
    assert reason(pair(0, 5, compared_entries=((7, 40), (5, 10))))["prefix_changed"] == 1
    assert reason(pair(0, 5, compared_entries=((7, 1990),)))["prefix_changed"] == 0


def test_a_conversation_proven_after_its_record_is_applied_and_a_bad_proof_is_counted(tmp_path: Path) -> None:
    """The events file's proof lines: a record that went out "uncertain" takes the conversation
    proven later (matched by slot, task and start); a proof line that is not one is counted."""
    recorded = json.loads((LOGS / "lv4-np2-lora-events.events.jsonl").read_text().splitlines()[0])
    base = dict(recorded, slot=1, task=7, start_us=100, conversation=None, conversation_source="uncertain")
    other = dict(base, task=8)
    lines = [
        json.dumps(base),
        json.dumps(other),
        json.dumps(
            {
                "proof": "conversation",
                "epoch": 0,
                "slot": 1,
                "task": 7,
                "start_us": 100,
                "conversation": "c0123456789ab",
                "conversation_source": "header",
            }
        ),
        json.dumps(
            {
                "proof": "conversation",
                "slot": 1,
                "task": "8",
                "start_us": 100,
                "conversation": "c0123456789ab",
                "conversation_source": "header",
            }
        ),
    ]
    path = tmp_path / "events.jsonl"
    path.write_text("\n".join(lines) + "\n")
    recs, bad = analyze.read_events([str(path)])
    by_task = {r.task: r for r in recs}
    assert (by_task[7].conversation, by_task[7].conversation_source) == ("c0123456789ab", "header")
    assert (by_task[8].conversation, by_task[8].conversation_source) == (None, "uncertain")
    assert len(recs) == 2 and bad == 1


def test_analyze_of_a_log_applies_the_conversations_proven_after_their_records() -> None:
    # the starved impatient-id recording: 16 conversations are proven after their record went out
    from support import log_lines, replay

    from llamacpp_exporter.assemble.pseudonyms import Pseudonymizer

    name = "lv4-np2-impatient-ids-starved.log"
    late = replay(log_lines(name), proven=False)
    proven = replay(log_lines(name), proven=True)
    assert sum(r.conversation_source == "uncertain" for r in late) > sum(
        r.conversation_source == "uncertain" for r in proven
    )  # the case this test is about
    recs = analyze.analyze(analyze.Inputs([str(LOGS / name)], []), pseudonymize=Pseudonymizer("test-salt")).records
    got = {(r.slot, r.task): (r.conversation, r.conversation_source) for r in recs}
    assert got == {(r.slot, r.task): (r.conversation, r.conversation_source) for r in proven}


def test_the_sources_count_the_server_restarts_in_the_log(tmp_path: Path) -> None:
    """A log of two server runs: one restart (the figure once read a sample without its model
    label and said 0)."""
    run = (Path(__file__).parent / "fixtures" / "logs" / "lv4-np2-text.log").read_text()
    log = tmp_path / "two-runs.log"
    log.write_text(run + run)
    res = analyze.analyze(analyze.Inputs([str(log)], []), AssemblySettings(), Pseudonymizer("salt"))
    assert res.sources["server_restarts_seen"] == 1
    assert len({r.epoch for r in res.records}) == 2
