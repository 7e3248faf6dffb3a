"""Finding llama-server without --llama.url: the address of the log's `listening on` line (a
recorded 11434 log, and a b11549 one on that build's default port 9931), else its default ports
8080 and then 9931, whichever answers; always said in the start line and in /-/ready."""

from __future__ import annotations

import logging
import socket
from pathlib import Path

import httpx
import pytest
from prometheus_client import CollectorRegistry
from realserver import ExporterProcess, LlamaServer, llama_server_binary, model_files, wait_for
from support import samples

from llamacpp_exporter.pipeline import Pipeline
from llamacpp_exporter.sources.server_address import DEFAULT_PORTS, ServerAddress, polled_url

LOGS = Path(__file__).parent / "fixtures" / "logs"


@pytest.mark.parametrize(
    ("line", "url"),
    [
        ("http://127.0.0.1:8080", "http://127.0.0.1:8080"),
        ("http://0.0.0.0:9931", "http://127.0.0.1:9931"),  # bound to every interface: loopback reaches it
        ("http://[::]:9931", "http://[::1]:9931"),
        ("http://10.1.2.3:8081", "http://10.1.2.3:8081"),
        ("https://llama.internal:443", "https://llama.internal:443"),
        ("unix:///run/llama.sock", None),
        ("http://127.0.0.1", None),  # no port: not what llama-server writes
        ("http://127.0.0.1:99999", None),
    ],
)
def test_the_polled_url_of_a_listening_line(line: str, url: str | None) -> None:
    assert polled_url(line) == url


def test_without_a_url_the_default_ports_are_tried_in_turn_until_one_answers(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO)
    a = ServerAddress(None)
    assert DEFAULT_PORTS == (8080, 9931)
    assert a.url == "http://127.0.0.1:8080" and "trying llama-server's default ports" in a.describe()
    a.unreachable("http://127.0.0.1:8080")
    assert a.url == "http://127.0.0.1:9931"
    a.unreachable("http://127.0.0.1:8080")  # a poll that started before the switch changes nothing
    assert a.url == "http://127.0.0.1:9931"
    a.unreachable("http://127.0.0.1:9931")
    assert a.url == "http://127.0.0.1:8080"  # and round again
    a.unreachable("http://127.0.0.1:8080")
    a.answered("http://127.0.0.1:9931")
    assert (
        a.describe() == "http://127.0.0.1:9931 (no --llama.url given: it answered on llama-server's default port 9931)"
    )
    a.unreachable("http://127.0.0.1:9931")  # found: a server that goes down stays where it was
    assert a.url == "http://127.0.0.1:9931"
    a.from_log("http://127.0.0.1:18080")  # the log knows better, and a restart on another port too
    assert a.describe() == "http://127.0.0.1:18080 (from the log's 'listening on http://127.0.0.1:18080' line)"
    a.from_log("http://0.0.0.0:18081")
    assert a.url == "http://127.0.0.1:18081"
    assert caplog.text.count("polling llama-server at") == 3


def test_a_given_url_is_kept_and_a_log_that_disagrees_is_warned_about_once(caplog: pytest.LogCaptureFixture) -> None:
    a = ServerAddress("http://user:secret@127.0.0.1:8080/")
    assert a.describe() == "http://user:xxxxx@127.0.0.1:8080 (given by --llama.url)"
    a.unreachable(a.url)
    a.from_log("http://127.0.0.1:9931")
    a.from_log("http://127.0.0.1:9931")
    assert a.url == "http://user:secret@127.0.0.1:8080"
    assert caplog.text.count("the log says llama-server listens on http://127.0.0.1:9931") == 1
    assert "secret" not in caplog.text
    a.from_log("http://0.0.0.0:8080")  # the same port: nothing to say
    assert caplog.text.count("the log says") == 1


@pytest.mark.parametrize(
    ("log", "listening"),
    [("builds/b11434-lv4-text.log", "http://127.0.0.1:52285"), ("builds/b11549-lv4-text.log", "http://127.0.0.1:9931")],
)
def test_the_pipeline_hands_over_the_servers_listening_line_not_a_childs(log: str, listening: str) -> None:
    seen: list[str] = []
    lines = (LOGS / log).read_text().splitlines()
    assert sum("listening on" in line for line in lines) == 1
    pl = Pipeline(CollectorRegistry(), clock=lambda: 0.0, on_server_listening=seen.append)
    pl.process_lines(lines)
    assert seen == [listening]
    router: list[str] = []
    pl = Pipeline(CollectorRegistry(), clock=lambda: 0.0, on_server_listening=router.append)
    pl.process_lines((LOGS / "router-two-models.log").read_text().splitlines())
    assert router == ["http://127.0.0.1:28150"]  # the router's own; its children's are on theirs


@pytest.mark.integration
@pytest.mark.parametrize(
    ("log", "url"),
    [("builds/b11434-lv4-text.log", "http://127.0.0.1:52285"), ("builds/b11549-lv4-text.log", "http://127.0.0.1:9931")],
)
def test_with_no_url_the_exporter_polls_where_the_log_says_and_tells_why(tmp_path: Path, log: str, url: str) -> None:
    exp = ExporterProcess(["--llama.log-path", str(LOGS / log), "--llama.log-from-start"], tmp_path).start()
    try:
        why = f"polling llama-server at {url} (from the log's 'listening on {url}' line)"

        def ready_says() -> str:
            text = httpx.get(exp.url + "/-/ready", timeout=5).text
            return text if why in text else ""

        wait_for(ready_says, f"/-/ready naming {url}", 20, 0.1)
        start = next(line for line in exp.stderr_path.read_text().splitlines() if "listening on 127.0.0.1" in line)
        # the reason as it stood when the exporter started: before or after the log's line was read
        reason = f"{url} (from the log's 'listening on {url}' line)"
        assert "trying llama-server's default ports, 8080 and 9931" in start or reason in start, start
        assert why in exp.stderr_path.read_text()
    finally:
        exp.stop()


def _port_free(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) != 0


@pytest.mark.real_server
def test_with_no_url_and_no_log_a_server_on_9931_is_found_and_polled(tmp_path: Path) -> None:
    """b11549 and later listen on 9931 by default: a real llama-server there, nothing on 8080."""
    assert _port_free(8080) and _port_free(9931), "this test needs ports 8080 and 9931 free on 127.0.0.1"
    model, lora = model_files()
    server = LlamaServer(llama_server_binary(), model, lora, tmp_path / "server", n_parallel=1, ctx=2048, port=9931)
    server.start()
    try:
        exp = ExporterProcess(["--llama.poll-interval", "0.2", "--llama.timeout", "0.5"], tmp_path / "exp").start()
        try:
            want = "http://127.0.0.1:9931 (no --llama.url given: it answered on llama-server's default port 9931)"
            wait_for(lambda: want in httpx.get(exp.url + "/-/ready", timeout=5).text, "/-/ready naming 9931", 30, 0.2)
            wait_for(
                lambda: samples(exp.metrics_text(), "llamacpp_up").get((("endpoint", "slots"),)) == 1,
                "/slots polled on 9931",
                30,
                0.2,
            )
            assert f"polling llama-server at {want}" in exp.stderr_path.read_text()
        finally:
            exp.stop()
    finally:
        server.stop()
