"""The log sources on real files, a real pipe and a real command: rotation, copytruncate,
llama-server's truncate-on-restart, a file that appears later, partial and oversized lines."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import pytest
from realserver import wait_for
from support import value

from llamacpp_exporter.pipeline import Lines, Pipeline
from llamacpp_exporter.sources.command import follow_command
from llamacpp_exporter.sources.file import FileFollower, run_start
from llamacpp_exporter.sources.lines import LineSplitter, SourceStats
from llamacpp_exporter.sources.stream import follow_stream


class Collect:
    def __init__(self, max_line_bytes: int = 1 << 20) -> None:
        self.lines: list[str] = []
        self.oversized = 0
        self.splitter = LineSplitter(self, max_line_bytes)

    def process_line(self, line: str) -> None:
        self.lines.append(line)

    def oversized_line(self) -> None:
        self.oversized += 1


def follower(path: Path, c: Collect, from_start: bool = False) -> tuple[FileFollower, SourceStats]:
    stats = SourceStats()
    return FileFollower(str(path), c.splitter, stats, from_start=from_start), stats


def append(path: Path, text: str) -> None:
    with open(path, "a") as fh:
        fh.write(text)


def test_starts_at_end_by_default_and_from_start_on_request(tmp_path: Path) -> None:
    f = tmp_path / "s.log"
    f.write_text("old 1\nold 2\n")
    c = Collect()
    fol, _ = follower(f, c)
    fol.poll_once()
    append(f, "new\n")
    fol.poll_once()
    assert c.lines == ["new"]
    c2 = Collect()
    fol2, _ = follower(f, c2, from_start=True)
    fol2.poll_once()
    assert c2.lines == ["old 1", "old 2", "new"]


def test_started_on_a_running_server_it_reads_the_run_again_from_its_start_banner(tmp_path: Path) -> None:
    # INVENTED lines: an earlier run, then the current one, whose lines before the exporter
    # started are read again first, bracketed so that the pipeline counts none of them twice
    f = tmp_path / "s.log"
    f.write_text(
        "0.00.001 I srv  llama_server: initializing ...\nrun 1\n0.00.002 I srv  llama_server: initializing ...\nrun 2 a\nrun 2 b\n"
    )
    c = Collect()
    marks: list[tuple[bool, int]] = []
    fol = FileFollower(
        str(f), c.splitter, SourceStats(), on_catch_up=lambda started: marks.append((started, len(c.lines)))
    )
    fol.poll_once()
    append(f, "new\n")
    fol.poll_once()
    assert c.lines == ["0.00.002 I srv  llama_server: initializing ...", "run 2 a", "run 2 b", "new"]
    assert marks == [(True, 0), (False, 3)]


def test_catching_up_reads_at_most_its_limit_from_a_line_start(tmp_path: Path) -> None:
    f = tmp_path / "s.log"
    f.write_text("".join(f"line {i:04d}\n" for i in range(1000)))  # no start banner: 10 bytes a line
    c = Collect()
    fol = FileFollower(str(f), c.splitter, SourceStats(), on_catch_up=lambda started: None, catch_up_bytes=95)
    fol.poll_once()
    assert c.lines == [f"line {i:04d}" for i in range(991, 1000)]  # whole lines within the last 95 bytes


def test_run_start_finds_the_banner_across_chunks_and_at_the_file_start(tmp_path: Path) -> None:
    f = tmp_path / "s.log"
    f.write_bytes(b"x llama_server: initializing ...\n" + b"y" * 3_000_000 + b"\nz\n")
    with open(f, "rb") as fh:
        assert run_start(fh, f.stat().st_size, 64 << 20) == 0
        # no banner within the last MiB: from the first line that starts in it ("z")
        assert run_start(fh, f.stat().st_size, 1 << 20) == f.stat().st_size - 2
        # the banner is not whole before offset 20, and the limit reaches the file's start
        assert run_start(fh, 20, 64 << 20) == 0


def test_run_start_of_a_router_is_the_routers_banner_not_a_childs(tmp_path: Path) -> None:
    # the recorded router log: its own banner first, then each child's, prefixed [port]
    src = LOGS / "router-two-models.log"
    f = tmp_path / "router.log"
    data = src.read_bytes()
    f.write_bytes(data)
    with open(f, "rb") as fh:
        assert run_start(fh, len(data), 64 << 20) == 0
    # a chunk boundary between the router's banner and the children's (a tiny search step)
    padded = data + b"[37851] 9.00.000.000 I srv  llama_server: initializing ...\n" * 3
    f.write_bytes(b"y" * 2_000_000 + b"\n" + padded)
    with open(f, "rb") as fh:
        assert run_start(fh, f.stat().st_size, 64 << 20) == 2_000_001


def test_partial_last_line_waits_for_its_newline(tmp_path: Path) -> None:
    f = tmp_path / "s.log"
    f.write_text("")
    c = Collect()
    fol, _ = follower(f, c)
    fol.poll_once()
    append(f, "0.01.000.000 I slot launch_sl")
    fol.poll_once()
    assert c.lines == []
    append(f, "ot_: id  0 | task 1 | processing task, is_child = 0\n")
    fol.poll_once()
    assert c.lines == ["0.01.000.000 I slot launch_slot_: id  0 | task 1 | processing task, is_child = 0"]


def test_rename_rotation_reads_the_rest_of_the_old_file_then_the_new(tmp_path: Path) -> None:
    f = tmp_path / "s.log"
    f.write_text("")
    c = Collect()
    fol, stats = follower(f, c)
    fol.poll_once()
    append(f, "a\n")
    fol.poll_once()
    append(f, "b\n")  # written after our last read, before the rotation
    f.rename(tmp_path / "s.log.1")
    fol.poll_once()  # old file still open, new one not there yet
    f.write_text("c\n")
    fol.poll_once()
    fol.poll_once()
    assert c.lines == ["a", "b", "c"]
    assert stats.rotations == 1


def test_copytruncate(tmp_path: Path) -> None:
    f = tmp_path / "s.log"
    f.write_text("")
    c = Collect()
    fol, stats = follower(f, c)
    fol.poll_once()
    append(f, "a\nb\n")
    fol.poll_once()
    with open(f, "r+") as fh:
        fh.truncate(0)
    append(f, "c\n")
    fol.poll_once()
    fol.poll_once()
    assert c.lines == ["a", "b", "c"]
    assert stats.truncations == 1


def test_truncation_and_rewrite_past_the_old_offset_is_detected(tmp_path: Path) -> None:
    # llama-server --log-file opens with "w" at every start; by the next poll the new
    # process may have written more than we had read of the old one.
    f = tmp_path / "s.log"
    f.write_text("0.00.003.331 I srv  llama_server: initializing ...\n")
    c = Collect()
    fol, stats = follower(f, c, from_start=True)
    fol.poll_once()
    f.write_text("0.00.002.981 I srv  llama_server: initializing ...\n" + "0.00.010.000 I srv  line\n" * 5)
    fol.poll_once()
    fol.poll_once()
    assert stats.truncations == 1
    assert c.lines[1] == "0.00.002.981 I srv  llama_server: initializing ..."
    assert len(c.lines) == 7


def test_file_that_does_not_exist_yet_is_read_from_its_start(tmp_path: Path) -> None:
    f = tmp_path / "later.log"
    c = Collect()
    fol, _ = follower(f, c)
    assert fol.poll_once() == 0
    f.write_text("first\n")
    fol.poll_once()
    assert c.lines == ["first"]


def test_oversized_line_is_dropped_and_counted_the_next_line_survives(tmp_path: Path) -> None:
    f = tmp_path / "s.log"
    f.write_text("")
    c = Collect(max_line_bytes=1024)
    fol, _ = follower(f, c)
    fol.poll_once()
    append(f, "x" * 5000)
    fol.poll_once()
    append(f, "y" * 100 + "\nok\n")
    fol.poll_once()
    assert c.lines == ["ok"] and c.oversized == 1


def test_invalid_utf8_is_replaced_not_fatal(tmp_path: Path) -> None:
    f = tmp_path / "s.log"
    f.write_bytes(b"")
    c = Collect()
    fol, _ = follower(f, c)
    fol.poll_once()
    with open(f, "ab") as fh:
        fh.write(b"bad \xff\xfe bytes\n")
    fol.poll_once()
    assert c.lines == ["bad \ufffd\ufffd bytes"]


@pytest.mark.integration
def test_stdin_stream() -> None:
    proc = subprocess.Popen([sys.executable, "-c", "print('one'); print('two', end='')"], stdout=subprocess.PIPE)
    c = Collect()
    assert proc.stdout is not None
    follow_stream(proc.stdout, c.splitter, threading.Event())
    proc.wait()
    assert c.lines == ["one", "two"]


@pytest.mark.integration
def test_command_is_followed_and_restarted(tmp_path: Path) -> None:
    marker = tmp_path / "runs"
    cmd = f"echo run >> {marker}; echo line-$(wc -l < {marker}); echo err 1>&2"
    c = Collect()
    stats = SourceStats()
    stop = threading.Event()
    t = threading.Thread(target=follow_command, args=(cmd, c.splitter, stats, stop), daemon=True)
    t.start()
    wait_for(lambda: stats.command_restarts >= 2, "two restarts")
    stop.set()
    t.join(5)
    assert c.lines[:3] == ["line-1", "err", "line-2"]
    assert stats.command_restarts >= 2


def _run_exporter_on(source_args: list[str], stdin_bytes: bytes | None, tmp_path: Path) -> str:
    import httpx
    from realserver import free_port

    port = free_port()
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "llamacpp_exporter",
            "--web.listen-address",
            f"127.0.0.1:{port}",
            "--llama.url",
            f"http://127.0.0.1:{free_port()}",
            "--no-llama.slots",
            *source_args,
        ],
        stdin=subprocess.PIPE if stdin_bytes is not None else subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        if stdin_bytes is not None:
            assert proc.stdin is not None
            proc.stdin.write(stdin_bytes)
            proc.stdin.close()

        def all_counted() -> str:
            text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=1).text
            return text if 'llamacpp_requests_total{lora="unknown",model="",path="ram"} 30.0' in text else ""

        return wait_for(all_counted, "30 requests counted", 90, 0.1, ignore=(httpx.HTTPError,))
    finally:
        proc.terminate()
        proc.wait(10)


LOG = Path(__file__).parent / "fixtures" / "logs" / "lv4-np2-text.log"


@pytest.mark.integration
def test_exporter_reads_standard_input(tmp_path: Path) -> None:
    text = _run_exporter_on(["--llama.log-path", "-"], LOG.read_bytes(), tmp_path)
    assert 'llamacpp_requests_total{lora="unknown",model="",path="ram"} 30.0' in text


@pytest.mark.integration
def test_exporter_follows_a_command(tmp_path: Path) -> None:
    text = _run_exporter_on(["--llama.log-command", f"cat {LOG}; sleep 60"], None, tmp_path)
    assert 'llamacpp_requests_total{lora="unknown",model="",path="ram"} 30.0' in text


@pytest.mark.integration
def test_directory_watch_wakes_on_append(tmp_path: Path) -> None:
    from llamacpp_exporter.sources.file import DirectoryWatch

    f = tmp_path / "s.log"
    f.write_text("")
    w = DirectoryWatch(str(f))
    assert w.fd >= 0, "inotify is available on Linux"
    threading.Timer(0.1, lambda: append(f, "x\n")).start()
    t0 = time.monotonic()
    w.wait(120.0, threading.Event())
    assert time.monotonic() - t0 < 60.0  # woken by the write, not by the 120 s timeout
    w.close()


def test_copytruncate_of_a_writer_without_append_skips_the_hole(tmp_path: Path) -> None:
    """llama-server opens --log-file with fopen("w"): after a copytruncate it writes on at its
    old offset, so the file starts with a hole that reads as zeros. No line is lost, nothing
    is oversized, and the hole is not read."""
    path = tmp_path / "llama.log"
    c = Collect(max_line_bytes=1 << 16)
    writer = open(path, "w", buffering=1)  # no O_APPEND, as llama-server
    f, stats = follower(path, c, from_start=True)
    old = [f"line {i} " + "x" * 1000 for i in range(2000)]  # 2 MB: the hole will be larger than a line
    for line in old:
        writer.write(line + "\n")
    f.poll_once()
    assert c.lines == old
    os.truncate(path, 0)  # rotate.sh's `: > LOG`
    f.poll_once()  # sees the truncation before the writer writes again
    writer.write("after 1\n")
    writer.write("after 2\n")
    f.poll_once()
    assert c.lines[len(old) :] == ["after 1", "after 2"] and c.oversized == 0
    assert stats.truncations == 1
    assert os.stat(path).st_size > 2_000_000 and f.pos == os.stat(path).st_size
    os.truncate(path, 0)  # again, this time the writer writes before the follower looks
    writer.write("after 3\n")
    f.poll_once()
    assert c.lines[len(old) :] == ["after 1", "after 2", "after 3"] and c.oversized == 0
    writer.close()


def _at_least(counting: _CountingPipeline, end: int) -> bool:
    return counting.lines >= end


def _replayed_past(stats: SourceStats, n: int) -> bool:
    return stats.replayed_lines >= n


class _CountingPipeline:
    """The whole pipeline behind a command, with the number of lines it has processed."""

    def __init__(self) -> None:
        from prometheus_client import CollectorRegistry

        from llamacpp_exporter.pipeline import Pipeline

        self.recs: list[Any] = []
        self.pl = Pipeline(CollectorRegistry(), on_record=self.recs.append, clock=lambda: 0.0)
        self.lines = 0

    def process_line(self, line: str) -> None:
        self.lines += 1
        self.pl.process_line(line)

    def oversized_line(self) -> None:
        self.pl.oversized_line()


def _records_through_command(
    cmd: str, during: Callable[[SourceStats, Any], None]
) -> tuple[list[Any], SourceStats, Pipeline]:
    """Follow cmd until during(stats, counting) returns; every wait in during is on a condition
    the source or the pipeline reports, never on a guess at time."""
    counting = _CountingPipeline()
    stats = SourceStats()
    stop = threading.Event()
    splitter = LineSplitter(counting, 1 << 20)
    t = threading.Thread(target=follow_command, args=(cmd, splitter, stats, stop), daemon=True)
    t.start()
    try:
        during(stats, counting)
    finally:
        stop.set()
        t.join(10)
    counting.pl.flush()
    return counting.recs, stats, counting.pl


LOGS = Path(__file__).parent / "fixtures" / "logs"


@pytest.mark.integration
def test_a_command_that_replays_its_history_at_every_restart_counts_each_request_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """`docker logs -f` / `journalctl -f` print history when started again. A command that
    prints a recorded 32-request log and exits, run three times: still 32 requests."""
    log = LOGS / "lv4-np2-text.log"
    n = len(log.read_text().splitlines())

    def two_restarts_read(stats: SourceStats, counting: _CountingPipeline) -> None:
        wait_for(lambda: stats.command_restarts >= 2 and counting.lines + stats.replayed_lines >= 3 * n, "3 runs read")

    caplog.set_level("WARNING", logger="llamacpp_exporter.sources.command")
    recs, stats, pl = _records_through_command(f"cat {log}", two_restarts_read)
    restarts = [r.getMessage() for r in caplog.records if "restarting in" in r.getMessage()]
    assert restarts[:2] == [
        "log command exited with status 0; restarting in 1 s",
        "log command exited with status 0; restarting in 2 s",  # backoff, not a tight loop
    ]
    assert len(recs) == 32 and not any(r.cancelled for r in recs)
    assert value(pl.registry, "llamacpp_exporter_server_restarts_total") == 0
    assert stats.replayed_lines >= 2 * n - 10


@pytest.mark.integration
def test_tail_killed_between_writes_counts_nothing_twice_and_no_false_restart(tmp_path: Path) -> None:
    """`tail -n 10 -F` killed three times while llama-server's recorded log is written in four
    parts: each restart prints the last 10 lines again (earlier timestamps: a false restart and
    requests cut short before). They are dropped; the records are those of the log read once."""
    import signal

    from support import replay_records

    src = (LOGS / "lv4-np2-text.log").read_text().splitlines(keepends=True)
    path = tmp_path / "llama.log"
    path.write_text("")
    expected, _ = replay_records([ln.rstrip("\n") for ln in src])
    step = len(src) // 4 + 1

    def tail_pids() -> list[int]:
        out = subprocess.run(["pgrep", "-f", f"tail -n 10 -F {path}"], capture_output=True, text=True).stdout
        return [int(p) for p in out.split()]

    def tail_following() -> bool:
        # tail has the file open and sleeps (waits for more): what is appended now is printed
        for pid in tail_pids():
            try:
                fds = [os.readlink(f"/proc/{pid}/fd/{fd}") for fd in os.listdir(f"/proc/{pid}/fd")]
                state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
            except OSError:
                continue
            if str(path) in fds and state == "S":
                return True
        return False

    def write_and_kill(stats: SourceStats, counting: _CountingPipeline) -> None:
        for i in range(0, len(src), step):
            wait_for(tail_following, "tail following the log")
            with open(path, "a") as fh:
                fh.writelines(src[i : i + step])
            part_end = min(i + step, len(src))
            wait_for(partial(_at_least, counting, part_end), f"the first {part_end} lines processed")
            if part_end < len(src):
                replayed = stats.replayed_lines
                for pid in tail_pids():
                    os.kill(pid, signal.SIGKILL)
                # the restart (after its backoff) has printed the last 10 lines and they were
                # dropped: only then the next part is written, however slow the machine
                wait_for(partial(_replayed_past, stats, replayed + 10), "the restarted tail's 10 lines dropped")

    recs, stats, pl = _records_through_command(f"tail -n 10 -F {path}", write_and_kill)
    assert stats.command_restarts == 3 and stats.replayed_lines == 30
    assert value(pl.registry, "llamacpp_exporter_server_restarts_total") == 0
    key = lambda r: (r.task, r.cancelled, r.prompt_tokens, r.reused_tokens)  # noqa: E731
    assert sorted(map(key, recs)) == sorted(map(key, expected))


def test_a_log_without_timestamps_rewritten_past_our_offset_while_paused_is_read_again(tmp_path: Path) -> None:
    """llama-server restarted with --log-file and --no-log-prefix while the exporter was paused:
    the new run's first lines read exactly like the old run's and the file is already longer
    than the old offset. The bytes just before the offset changed: read from the start."""

    def untimed(name: str) -> list[str]:
        return [ln.split(" ", 2)[2] + "\n" for ln in (LOGS / name).read_text().splitlines() if ln[:1].isdigit()]

    old, new = untimed("lv4-np1-seed-scenario.log"), untimed("lv4-np1-cancelled.log")
    old = old[: len(old) // 2]
    assert old[0] == new[0] and sum(map(len, new)) > sum(map(len, old))  # same start, longer
    path = tmp_path / "llama.log"
    path.write_text("".join(old))
    c = Collect()
    f, stats = follower(path, c, from_start=True)
    f.poll_once()
    assert len(c.lines) == len(old)
    with open(path, "w") as fh:  # the restart truncates and the new run writes past our offset
        fh.writelines(new)
    assert os.path.getsize(path) > f.pos
    f.poll_once()
    assert stats.truncations == 1
    assert c.lines[len(old) :] == [ln.rstrip("\n") for ln in new]


def test_the_exporter_queues_the_lines_of_a_read_as_batches_in_order() -> None:
    # one queue item per read (at most LINE_BATCH lines), an oversized line's mark between the
    # lines before and after it, a partial last line held until its newline or a flush
    from llamacpp_exporter.app import LINE_BATCH, _LineBatches
    from llamacpp_exporter.pipeline import OversizedLine

    items: list[object] = []
    batches = _LineBatches(items.append, max_line_bytes=100)

    def seen() -> list[Any]:
        return [i.lines if isinstance(i, Lines) else type(i).__name__ for i in items]

    many = "".join(f"line {i}\n" for i in range(LINE_BATCH + 3))
    batches.feed(many.encode())
    got = seen()
    assert [len(i) for i in got] == [LINE_BATCH, 3]
    assert got[0][0] == "line 0" and got[1][-1] == f"line {LINE_BATCH + 2}"
    items.clear()
    batches.feed(b"before\n" + b"x" * 200 + b"\nafter\npart")
    assert seen() == [["before"], OversizedLine.__name__, ["after"]]
    items.clear()
    batches.feed(b"ial\n")
    batches.feed(b"no newline yet")
    batches.flush()
    assert seen() == [["partial"], ["no newline yet"]]


class _Items:
    """The exporter's own splitter (lines handed on in batches, as to the pipeline's queue)."""

    def __init__(self) -> None:
        from llamacpp_exporter.app import _LineBatches

        self.items: list[Any] = []
        self.lock = threading.Lock()
        self.splitter = _LineBatches(self._put, 1 << 20)

    def _put(self, item: object) -> None:
        with self.lock:
            self.items.append(item)

    def lines(self) -> list[str]:
        with self.lock:
            return [line for item in self.items if isinstance(item, Lines) for line in item.lines]


def _follow(cmd: str, items: _Items) -> tuple[threading.Event, threading.Thread]:
    stop = threading.Event()
    t = threading.Thread(target=follow_command, args=(cmd, items.splitter, SourceStats(), stop), daemon=True)
    t.start()
    return stop, t


def _runs(tmp_path: Path, *scripts: str) -> str:
    """A command that runs the next script each time it is started (a restarted journalctl)."""
    for i, body in enumerate(scripts):
        (tmp_path / f"run{i}.sh").write_text(body)
    (tmp_path / "n").write_text("0")
    return f"n=$(cat {tmp_path}/n); echo $((n+1)) > {tmp_path}/n; exec sh {tmp_path}/run$n.sh"


@pytest.mark.integration
def test_a_restarted_command_hands_on_its_new_lines_before_a_quiet_spell(tmp_path: Path) -> None:
    history = "".join(f"line {i}\\n" for i in range(5))
    cmd = _runs(tmp_path, f"printf '{history}'", f"printf '{history}line 5\\nline 6\\n'; sleep 60")
    items = _Items()
    stop, t = _follow(cmd, items)
    try:
        # the new lines arrive although the command then says nothing for a minute
        wait_for(lambda: items.lines()[-1:] == ["line 6"], "the restarted command's new lines", timeout=15)
    finally:
        stop.set()
        t.join(10)
    assert items.lines() == [f"line {i}" for i in range(7)]


@pytest.mark.integration
def test_a_restarted_command_on_a_server_that_never_pauses_counts_on(tmp_path: Path) -> None:
    history = "".join(f"line {i}\\n" for i in range(5))
    busy = "i=5; while true; do echo line $i; i=$((i+1)); sleep 0.05; done"  # a line every 50 ms
    cmd = _runs(tmp_path, f"printf '{history}'", f"printf '{history}'; {busy}")
    items = _Items()
    stop, t = _follow(cmd, items)
    try:
        wait_for(lambda: "line 20" in items.lines(), "lines while the server never pauses", timeout=15)
    finally:
        stop.set()
        t.join(10)
    got = items.lines()
    assert got[:21] == [f"line {i}" for i in range(21)] and len(got) == len(set(got))


@pytest.mark.integration
def test_a_command_killed_mid_line_is_matched_again_on_restart(tmp_path: Path) -> None:
    # the first run ends in the middle of a line; the restart prints the whole history again
    cmd = _runs(
        tmp_path, "printf 'line 0\\nline 1\\nline 2\\nli'", "printf 'line 0\\nline 1\\nline 2\\nline 3\\n'; sleep 60"
    )
    items = _Items()
    stop, t = _follow(cmd, items)
    try:
        wait_for(lambda: items.lines()[-1:] == ["line 3"], "the whole last line", timeout=15)
    finally:
        stop.set()
        t.join(10)
    assert items.lines() == ["line 0", "line 1", "line 2", "line 3"]
