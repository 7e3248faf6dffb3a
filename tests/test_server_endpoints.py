"""llama-server's endpoints: the pure parsers on recorded answers, and the poller and the
exporter against servers that are down, slow, unauthorised or answer garbage."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest
import support
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import Metric
from prometheus_client.registry import Collector
from realserver import ExporterProcess, free_port, wait_for

from llamacpp_exporter.records import SlotsSnapshot
from llamacpp_exporter.sources.llama_server import ServerPoller
from llamacpp_exporter.sources.server_answers import parse_lora_adapters, parse_slots, rename_server_metrics

FIX = Path(__file__).parent / "fixtures" / "server"


def test_parse_slots_recorded() -> None:
    snap = parse_slots(json.loads((FIX / "slots.json").read_text()))
    assert [(s.id, s.id_task, s.lora) for s in snap.slots] == [(0, 563, ((0, 0.5),)), (1, 612, ())]
    assert not snap.slots[0].is_processing and snap.slots[0].n_decoded == 0


def test_parse_slots_ignores_text_and_odd_elements() -> None:
    obj = [
        {"id": 0, "prompt": "secret", "generated": "secret", "params": {"lora": [{"id": "x"}]}},
        "junk",
        {"no": "id"},
    ]
    snap = parse_slots(obj)
    assert len(snap.slots) == 1 and "secret" not in repr(snap)
    with pytest.raises(ValueError):
        parse_slots({"error": "nope"})


def test_parse_lora_adapters() -> None:
    assert parse_lora_adapters([{"id": 0, "path": "/m/a.gguf", "scale": 1.0}]).scales == ((0, 1.0),)


class _Families(Collector):
    def __init__(self, fams: list[Metric]) -> None:
        self.fams = fams

    def collect(self) -> list[Metric]:
        return self.fams


@pytest.mark.integration
def test_rename_server_metrics_recorded_and_promtool_clean() -> None:
    fams = rename_server_metrics((FIX / "metrics.txt").read_text())
    names = {s.name for f in fams for s in f.samples}
    assert "llamacpp_server_prompt_tokens_cached_total" in names
    assert not any(":" in n for n in names)
    types = {f.name: f.type for f in fams}
    assert types["llamacpp_server_n_tokens_max"] == "gauge"  # declared counter, a high-water mark
    reg = CollectorRegistry()
    reg.register(_Families(fams))
    text = generate_latest(reg).decode()
    assert "llamacpp_server_prompt_tokens_cached_total 14519.0" in text
    promtool = shutil.which("promtool")
    assert promtool
    res = subprocess.run([promtool, "check", "metrics"], input=text, capture_output=True, text=True)
    assert res.returncode == 0, res.stdout + res.stderr


def test_server_metrics_help_says_what_our_poll_does_and_which_prompt_count_this_build_has() -> None:
    recorded = (FIX / "metrics.txt").read_text()  # b11434: cached tokens counted apart (PR #26920)
    docs = {f.name: f.documentation for f in rename_server_metrics(recorded)}
    assert "cache excluded" in docs["llamacpp_server_prompt_tokens"]
    for gauge in ("llamacpp_server_prompt_tokens_seconds", "llamacpp_server_predicted_tokens_seconds"):
        assert "since the exporter's previous poll" in docs[gauge] and "rate()" in docs[gauge]
    # invented from the recorded one: an older build, without the cached-tokens counter
    older = "\n".join(line for line in recorded.splitlines() if "prompt_tokens_cached" not in line) + "\n"
    docs = {f.name: f.documentation for f in rename_server_metrics(older)}
    assert "cache included" in docs["llamacpp_server_prompt_tokens"]


class FakeBehaviour:
    delay = 0.0
    status = 200
    slots_body = b"[]"
    drip: set[str] = set()  # paths answered one byte at a time, drip_interval apart
    drip_interval = 0.2
    hits: list[str] = []


def serve(behaviour: type[FakeBehaviour]) -> tuple[ThreadingHTTPServer, str]:
    """A real HTTP server standing in for a misbehaving llama-server (bad-input tests only)."""

    class H(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802
            behaviour.hits.append(self.path)
            time.sleep(behaviour.delay)
            body = {
                "/slots": behaviour.slots_body,
                "/metrics": (FIX / "metrics.txt").read_bytes(),
                "/health": b'{"status":"ok"}',
                "/lora-adapters": b"[]",
            }.get(self.path, b"{}")
            self.send_response(behaviour.status)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            try:
                if self.path in behaviour.drip:
                    for i in range(len(body)):
                        self.wfile.write(body[i : i + 1])
                        self.wfile.flush()
                        time.sleep(behaviour.drip_interval)
                else:
                    self.wfile.write(body)
            except OSError:
                pass

        def log_message(self, format: str, *a: Any) -> None:
            pass

    srv = ThreadingHTTPServer(("127.0.0.1", 0), H)
    srv.daemon_threads = True
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    return srv, f"http://127.0.0.1:{srv.server_address[1]}"


def poller_for(url: str, timeout: float = 0.3) -> tuple[ServerPoller, CollectorRegistry, list[Any]]:
    reg = CollectorRegistry()
    got: list[Any] = []
    return (
        ServerPoller(
            url,
            api_key=None,
            timeout=timeout,
            interval=1,
            poll_slots=True,
            poll_metrics=True,
            registry=reg,
            on_snapshot=got.append,
            on_adapters=got.append,
        ),
        reg,
        got,
    )


@pytest.mark.integration
@pytest.mark.parametrize("poll_slots", [True, False])
def test_a_requested_slots_poll_is_taken_once_and_the_poller_then_waits(poll_slots: bool) -> None:
    """Every task launch asks for a /slots poll. Once handled, the request is cleared, with
    /slots polled or not (--no-llama.slots): a request left standing made the poller spin at
    100% CPU."""
    poller, _, _ = poller_for(f"http://127.0.0.1:{free_port()}")
    poller.poll_slots = poll_slots
    poller.interval = 3600  # only a request wakes it
    stop = threading.Event()
    t = threading.Thread(target=poller.run, args=(stop,))
    t.start()
    try:
        for _ in range(3):
            poller.request_slots_poll()
            wait_for(lambda: not poller._wake.is_set(), "the slots-poll request handled")
    finally:
        stop.set()
        poller.request_slots_poll()
        t.join(10)
    assert not t.is_alive()


@pytest.mark.integration
def test_a_task_costs_one_slots_poll_unless_its_reused_tokens_must_come_from_slots() -> None:
    """At -lv 4 the log gives the reused tokens: one /slots poll gives the task's LoRA (each
    poll is also a task queued inside llama-server). Below -lv 4 the poller keeps asking until
    the prefill has begun, when /slots's reused-token count can be trusted."""
    slot = {"id": 0, "id_task": 7, "is_processing": True, "n_prompt_tokens_processed": 0, "n_decoded": 0}

    class Starting(FakeBehaviour):
        slots_body = json.dumps([slot]).encode()
        hits: list[str] = []

    srv, url = serve(Starting)
    poller, _, _ = poller_for(url)
    poller.interval = 3600  # only a request wakes it
    poller._next_adapters = float("inf")

    def run(requests: Callable[[], None]) -> int:
        stop = threading.Event()
        t = threading.Thread(target=poller.run, args=(stop,))
        t.start()
        try:
            wait_for(lambda: "/slots" in Starting.hits, "the first full poll")
            Starting.hits.clear()
            requests()
        finally:
            stop.set()
            poller.request_slots_poll()
            t.join(10)
        assert not t.is_alive()
        return Starting.hits.count("/slots")

    def three_lora_polls() -> None:
        for _ in range(3):
            poller.request_slots_poll(until_prefill_started=False)
            wait_for(lambda: not poller._wake.is_set(), "the request handled")
        wait_for(lambda: Starting.hits.count("/slots") >= 3, "three polls")

    def one_reuse_poll() -> None:
        poller.request_slots_poll(until_prefill_started=True)
        wait_for(lambda: Starting.hits.count("/slots") >= 10, "polls until the prefill begins")

    try:
        assert run(three_lora_polls) == 3
        assert run(one_reuse_poll) >= 10
    finally:
        srv.shutdown()


@pytest.mark.integration
def test_poller_dead_server_sets_up_zero_and_counts_errors() -> None:
    poller, reg, got = poller_for(f"http://127.0.0.1:{free_port()}")
    poller.poll_all_once()
    assert reg.get_sample_value("llamacpp_up", {"endpoint": "health"}) == 0
    assert reg.get_sample_value("llamacpp_exporter_scrape_errors_total", {"endpoint": "slots"}) == 1
    assert got == [SlotsSnapshot(())]  # an empty snapshot: waiting records are released as unknown
    assert poller.collect_server_families() == []


@pytest.mark.integration
def test_poller_garbage_and_errors_are_counted_not_raised() -> None:
    class B(FakeBehaviour):
        slots_body = b"not json"

    srv, url = serve(B)
    try:
        poller, reg, got = poller_for(url)
        poller.poll_all_once()
        assert reg.get_sample_value("llamacpp_up", {"endpoint": "metrics"}) == 1
        assert reg.get_sample_value("llamacpp_exporter_scrape_errors_total", {"endpoint": "slots"}) == 1
        B.status = 401
        poller.poll_all_once()
        assert reg.get_sample_value("llamacpp_up", {"endpoint": "slots"}) == 0
    finally:
        srv.shutdown()


@pytest.mark.integration
def test_a_slots_answer_nested_too_deep_is_counted_and_polling_goes_on() -> None:
    class Deep(FakeBehaviour):
        slots_body = b"[" * 100_000 + b"]" * 100_000  # a parser's recursion limit, not a ValueError

    srv, url = serve(Deep)
    try:
        poller, reg, got = poller_for(url)
        stop = threading.Event()
        t = threading.Thread(target=poller.run, args=(stop,), daemon=True)
        t.start()
        for _ in range(3):  # woken polls, as at every task launch
            poller.request_slots_poll()
            time.sleep(0.2)
        wait_for(
            lambda: (reg.get_sample_value("llamacpp_exporter_scrape_errors_total", {"endpoint": "slots"}) or 0) >= 3,
            "deep /slots answers counted",
        )
        assert t.is_alive(), "the poller thread died"
        stop.set()
        t.join(5)
    finally:
        srv.shutdown()


@pytest.mark.integration
def test_slow_server_never_blocks_a_scrape_of_the_exporter(tmp_path: Path) -> None:
    class B(FakeBehaviour):
        delay = 60.0

    srv, url = serve(B)
    exp = ExporterProcess(
        ["--llama.url", url, "--llama.timeout", "30", "--llama.poll-interval", "0.2"], tmp_path
    ).start()
    try:
        for _ in range(5):
            t0 = time.monotonic()
            r = httpx.get(exp.url + "/metrics", timeout=30)
            # a scrape waiting on the server would take its 30 s timeout or more
            assert r.status_code == 200 and time.monotonic() - t0 < 10
            time.sleep(0.3)
        assert "llamacpp_requests_total" in r.text
    finally:
        exp.stop()
        srv.shutdown()


@pytest.mark.integration
def test_exporter_against_a_dead_server_serves_metrics_and_landing_page(tmp_path: Path) -> None:
    exp = ExporterProcess(
        ["--llama.url", f"http://127.0.0.1:{free_port()}", "--llama.poll-interval", "0.2"], tmp_path
    ).start()
    try:
        wait_for(lambda: 'llamacpp_up{endpoint="health"} 0.0' in exp.metrics_text(), "llamacpp_up 0", 5, 0.1)
        assert "/metrics" in httpx.get(exp.url + "/").text
        assert httpx.get(exp.url + "/nope").status_code == 404
        om = httpx.get(exp.url + "/metrics", headers={"Accept": "application/openmetrics-text; version=1.0.0"})
        assert om.headers["content-type"].startswith("application/openmetrics-text")
    finally:
        exp.stop()
    log = exp.stderr_path.read_text()
    assert "ConnectError" in log and "Traceback" not in log


@pytest.mark.integration
def test_exporter_conventions_build_info_process_metrics_and_ready(tmp_path: Path) -> None:
    exp = ExporterProcess(["--llama.url", f"http://127.0.0.1:{free_port()}"], tmp_path).start()
    try:
        text = exp.metrics_text()
        assert 'llamacpp_exporter_build_info{pythonversion="' in text
        assert "process_resident_memory_bytes" in text and "python_info{" in text
        r = httpx.get(exp.url + "/-/ready")
        assert r.status_code == 200, r.text  # a dead llama-server is not the exporter's failure
    finally:
        exp.stop()


@pytest.mark.integration
def test_ready_reports_a_stopped_log_follower(tmp_path: Path) -> None:
    from llamacpp_exporter.app import Exporter
    from llamacpp_exporter.cli import build_parser, config_from_args

    args = build_parser().parse_args(
        ["--llama.url", f"http://127.0.0.1:{free_port()}", "--web.listen-address", "127.0.0.1:0"]
    )
    cfg = config_from_args(args)
    exp = Exporter(cfg)
    exp.start()
    try:
        url = f"http://127.0.0.1:{exp.port}/-/ready"
        assert httpx.get(url).status_code == 200
        assert "llamacpp_exporter_ready 1.0" in httpx.get(f"http://127.0.0.1:{exp.port}/metrics").text
        exp._source_failed = True  # what _source() sets when the follower raised
        r = httpx.get(url)
        assert r.status_code == 503 and "log-source" in r.text
        assert "llamacpp_exporter_ready 0.0" in httpx.get(f"http://127.0.0.1:{exp.port}/metrics").text
    finally:
        exp.shutdown()


@pytest.mark.integration
@pytest.mark.parametrize("kind", ["directory", "fifo"])
def test_a_log_path_that_is_no_file_is_said_once_and_shown_in_readiness(tmp_path: Path, kind: str) -> None:
    import os

    log = tmp_path / "llama-server.log"
    if kind == "directory":
        log.mkdir()
    else:
        os.mkfifo(log)  # nobody writes to it: opening it would block forever
    exp = ExporterProcess(
        ["--llama.url", f"http://127.0.0.1:{free_port()}", "--llama.log-path", str(log), "--no-llama.slots"],
        tmp_path / "exp",
    ).start()
    try:
        wait_for(lambda: httpx.get(exp.url + "/-/ready").status_code == 503, "not ready")
        time.sleep(2)  # several polls of the follower
        r = httpx.get(exp.url + "/-/ready")
        assert r.status_code == 503 and ("directory" in r.text or "FIFO" in r.text), r.text
    finally:
        exp.stop()
    said = [line for line in exp.stderr_path.read_text().splitlines() if "cannot open log file" in line]
    assert len(said) == 1, said


@pytest.mark.integration
def test_a_loading_llama_server_is_loading_not_down(tmp_path: Path) -> None:
    """A real llama-server answers 503 on /health until its model is loaded: the exporter,
    started first and polling fast, sees llamacpp_loading 1 (not a down server), then up."""
    from realserver import LlamaServer, llama_server_binary, model_files

    binary = llama_server_binary()
    model, lora = model_files()
    port = free_port()
    exp = ExporterProcess(
        ["--llama.url", f"http://127.0.0.1:{port}", "--llama.poll-interval", "0.05", "--no-llama.slots"], tmp_path / "e"
    ).start()
    server = LlamaServer(binary, model, lora, tmp_path / "s", port=port, n_parallel=1, ctx=2048)
    seen = []
    stop = threading.Event()

    def watch() -> None:
        while not stop.is_set():
            try:
                t = exp.metrics_text()
            except httpx.HTTPError:
                continue
            seen.append(("llamacpp_loading 1.0" in t, 'llamacpp_up{endpoint="health"} 1.0' in t))
            time.sleep(0.02)

    w = threading.Thread(target=watch)
    w.start()
    try:
        server.start()
        wait_for(lambda: bool(seen) and seen[-1] == (False, True), "the exporter seeing the server up")
    finally:
        stop.set()
        w.join()
        server.stop()
        exp.stop()
    loading = [i for i, (ld, _) in enumerate(seen) if ld]
    up = [i for i, (_, u) in enumerate(seen) if u]
    assert loading, "never saw the server loading"
    assert up and up[-1] > loading[-1] and not seen[-1][0]


def test_only_llama_server_families_are_re_exported() -> None:
    """An unprefixed family in llama-server's /metrics (a proxy's, a plugin's) is not re-exported
    next to our own series of the same name."""
    text = (FIX / "metrics.txt").read_text() + (
        "# HELP llamacpp_requests_total not ours\n# TYPE llamacpp_requests_total counter\nllamacpp_requests_total 5\n"
        "# TYPE process_cpu_seconds_total counter\nprocess_cpu_seconds_total 1\n"
    )
    names = {f.name for f in rename_server_metrics(text)}
    assert names and all(n.startswith("llamacpp_server_") for n in names)


def test_slot_ids_are_bounded_by_what_the_server_has() -> None:
    """A /slots answer with 10,000 slots (or ids outside 0..n-1) adds no series."""
    with pytest.raises(ValueError, match="more than"):
        parse_slots([{"id": i} for i in range(10_000)])
    snap = parse_slots([{"id": 0}, {"id": 1}, {"id": 9999}])
    assert [s.id for s in snap.slots] == [0, 1]
    from support import log_lines, replay_records

    from llamacpp_exporter.pipeline import Pipeline
    from llamacpp_exporter.records import SlotState

    reg = CollectorRegistry()
    pl = Pipeline(reg, clock=lambda: 0.0)
    for line in log_lines("lv4-np2-text.log")[:400]:  # the banner says n_slots = 2
        pl.process_line(line, 0.0)
    pl.process_snapshot(
        SlotsSnapshot(tuple(SlotState(i, None, False, None, None, None, None, None) for i in range(50)))
    )
    slots = {s.labels["slot"] for f in reg.collect() for s in f.samples if "slot" in s.labels}
    assert slots == {"0", "1"}
    assert replay_records(log_lines("lv4-np2-text.log"))[0]  # unchanged elsewhere


@pytest.mark.integration
def test_credentials_in_the_url_are_never_logged(tmp_path: Path) -> None:
    exp = ExporterProcess(["--llama.url", f"http://admin:hunter2secret@127.0.0.1:{free_port()}"], tmp_path).start()
    try:
        exp.metrics_text()
    finally:
        exp.stop()
    log = exp.stderr_path.read_text()
    assert "hunter2secret" not in log and "admin:xxxxx@127.0.0.1" in log


@pytest.mark.integration
def test_an_oversized_answer_is_dropped_and_counted_not_buffered() -> None:
    class B(FakeBehaviour):
        slots_body = b"[" + b'{"id": 0, "x": "' + b"a" * (50 << 20) + b'"}]'

    srv, url = serve(B)
    try:
        poller, reg, got = poller_for(url, timeout=5)
        assert poller.poll_slots_once() is None
        assert reg.get_sample_value("llamacpp_exporter_answers_oversized_total", {"endpoint": "slots"}) == 1
        assert reg.get_sample_value("llamacpp_up", {"endpoint": "slots"}) == 0
        assert got == [SlotsSnapshot(())]
    finally:
        srv.shutdown()


@pytest.mark.integration
def test_a_server_that_answers_a_byte_at_a_time_is_down_within_the_deadline(monkeypatch: pytest.MonkeyPatch) -> None:
    """/health dripping a byte a second (15 s in all): down after the 1 s deadline, not when
    the answer ends. /slots dripping (60 s in all): given up after its own 5 s deadline, while
    /health, polled on its own thread, keeps reporting the truth. The scales are far apart so
    that a slow machine cannot blur them."""
    import llamacpp_exporter.sources.llama_server as server_mod

    monkeypatch.setattr(server_mod, "QUEUED_READ_TIMEOUT", 5.0)

    class B(FakeBehaviour):
        drip = {"/health"}
        drip_interval = 1.0

    srv, url = serve(B)
    try:
        poller, reg, _ = poller_for(url, timeout=1.0)
        t0 = time.monotonic()
        poller.poll_health_once()
        assert time.monotonic() - t0 < 10.0  # the deadline, not the 15 s answer
        assert reg.get_sample_value("llamacpp_up", {"endpoint": "health"}) == 0
        B.drip = {"/slots"}
        B.drip_interval = 0.2
        B.slots_body = b"[" + b" " * 300 + b"]"
        stop = threading.Event()
        threads = [
            threading.Thread(target=poller.run, args=(stop,)),
            threading.Thread(target=poller.run_health, args=(stop,)),
        ]
        for t in threads:
            t.start()

        def up(endpoint: str) -> float | None:
            return reg.get_sample_value("llamacpp_up", {"endpoint": endpoint})

        wait_for(lambda: up("health") == 1, "/health up")
        assert support.value(reg, "llamacpp_exporter_last_success_timestamp_seconds", {"endpoint": "health"}) > 0
        # /slots is still dripping: down once it has waited longer than the timeout (1 s),
        # not when the request ends (60 s), while /health is up all the same
        t0 = time.monotonic()
        wait_for(lambda: up("slots") == 0, "/slots down", timeout=40)
        assert time.monotonic() - t0 < 20 and up("health") == 1
        stop.set()
        for t in threads:
            t.join(5)
    finally:
        srv.shutdown()


@pytest.mark.integration
def test_a_dripping_metrics_endpoint_is_down_in_time_and_delays_no_slots_poll() -> None:
    class B(FakeBehaviour):
        drip = {"/metrics"}  # a byte every 0.2 s: minutes in all
        drip_interval = 0.2
        hits: list[str] = []

    srv, url = serve(B)
    try:
        poller, reg, got = poller_for(url, timeout=1.0)
        poller.metrics_on_own_thread = True
        stop = threading.Event()
        threads = [threading.Thread(target=f, args=(stop,), daemon=True) for f in (poller.run, poller.run_metrics)]
        for t in threads:
            t.start()
        t0 = time.monotonic()
        wait_for(lambda: reg.get_sample_value("llamacpp_up", {"endpoint": "metrics"}) == 0, "/metrics down")
        down_after = time.monotonic() - t0
        # meanwhile /slots is polled on, every second, and is up
        wait_for(lambda: B.hits.count("/slots") >= 3, "/slots polled while /metrics drips")
        assert reg.get_sample_value("llamacpp_up", {"endpoint": "slots"}) == 1
        print(f"/metrics dripping: down after {down_after:.1f} s; /slots polled {B.hits.count('/slots')} times")
        assert down_after < 10
        stop.set()
        for t in threads:
            t.join(5)
    finally:
        srv.shutdown()


@pytest.mark.integration
def test_a_burst_of_parallel_scrapes_is_answered(tmp_path: Path) -> None:
    """400 scrapes, 200 at a time (many Prometheus servers, a dashboard refresh storm)."""
    from concurrent.futures import ThreadPoolExecutor

    exp = ExporterProcess(["--llama.url", f"http://127.0.0.1:{free_port()}"], tmp_path).start()
    try:

        def scrape(_: int) -> int:
            with httpx.Client(timeout=120) as c:  # answered, however slowly: not a latency test
                return c.get(exp.url + "/metrics").status_code

        with ThreadPoolExecutor(200) as pool:
            codes = list(pool.map(scrape, range(400)))
    finally:
        exp.stop()
    assert codes.count(200) == 400


def test_a_server_family_with_too_many_series_is_cut_and_said() -> None:
    from llamacpp_exporter.sources.server_answers import MAX_SERVER_SERIES, TooManySeries

    text = "# TYPE llamacpp:requests_processing gauge\n" + "".join(
        f'llamacpp:requests_processing{{x="{i}"}} 1\n' for i in range(100_000)
    )
    with pytest.raises(TooManySeries) as e:
        rename_server_metrics(text)
    assert len(e.value.families[0].samples) == MAX_SERVER_SERIES


def test_a_slots_answer_of_countless_tiny_objects_is_refused_before_parsing() -> None:
    import resource

    from llamacpp_exporter.sources.server_answers import slots_json

    body = b"[" + b",".join([b"{}"] * 5_000_000) + b"]"  # 10 MB
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    with pytest.raises(ValueError, match="more than"):
        slots_json(body)
    grown_mib = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) / 1024
    assert grown_mib < 100, grown_mib


@pytest.mark.integration
def test_an_exporter_thread_that_dies_ends_the_process_to_be_restarted(tmp_path: Path) -> None:
    # fault injection: the poller's loop raising past its own guard (a bug); the process must
    # not live on with frozen values
    script = (
        "import sys, llamacpp_exporter.sources.llama_server as s\n"
        "def broken(self, stop):\n"
        "    raise RuntimeError('injected fault')\n"
        "s.ServerPoller.run = broken\n"
        "from llamacpp_exporter.cli import main\n"
        "sys.exit(main(sys.argv[1:]))\n"
    )
    res = subprocess.run(
        [sys.executable, "-c", script, "--llama.url", f"http://127.0.0.1:{free_port()}"]
        + ["--web.listen-address", f"127.0.0.1:{free_port()}"],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert res.returncode == 3, res.stderr[-2000:]
    assert "stopped unexpectedly: poller" in res.stderr
