"""--web.config.file: TLS and basic auth in the exporter-toolkit format, scraped by a real
Prometheus (its own TLS client and basic auth), with certificates made by openssl; and the front
door's bounds: idle, half-sent and stalled-TLS clients, and the open-file limit, with real
sockets."""

from __future__ import annotations

import json
import os
import shlex
import socket
import ssl
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import bcrypt
import httpx
import pytest
import yaml
from promql import Prometheus
from realserver import free_port, terminate, wait_for
from support import samples

from llamacpp_exporter.config import ConfigError
from llamacpp_exporter.export.http import HEADER_TIMEOUT
from llamacpp_exporter.export.web_config import load_web_config

pytestmark = pytest.mark.integration

PASSWORD = "correct horse battery staple"


def make_certs(d: Path) -> tuple[Path, Path, Path]:
    """A CA and a server certificate for 127.0.0.1 signed by it."""

    def run(*args: str) -> None:
        subprocess.run(["openssl", *args], check=True, capture_output=True, cwd=d)

    run("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj", "/CN=test-ca",
        "-keyout", "ca.key", "-out", "ca.crt")  # fmt: skip
    run("req", "-newkey", "rsa:2048", "-nodes", "-subj", "/CN=127.0.0.1", "-keyout", "tls.key", "-out", "tls.csr")
    (d / "san.ext").write_text("subjectAltName=IP:127.0.0.1\n")
    run("x509", "-req", "-in", "tls.csr", "-CA", "ca.crt", "-CAkey", "ca.key", "-CAcreateserial", "-days", "2",
        "-extfile", "san.ext", "-out", "tls.crt")  # fmt: skip
    return d / "ca.crt", d / "tls.crt", d / "tls.key"


def start_with_web_config(web: Path, stderr: Path) -> tuple[subprocess.Popen[Any], int]:
    """The exporter with --web.config.file, polling a llama-server that is not there."""
    port = free_port()
    err = open(stderr, "wb")
    proc = subprocess.Popen(
        [sys.executable, "-m", "llamacpp_exporter", "--web.listen-address", f"127.0.0.1:{port}",
         "--web.config.file", str(web), "--llama.url", f"http://127.0.0.1:{free_port()}"],
        stdout=err, stderr=err, stdin=subprocess.DEVNULL,
    )  # fmt: skip
    err.close()
    return proc, port


@pytest.fixture(scope="module")
def secured(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    d = tmp_path_factory.mktemp("web")
    ca, crt, key = make_certs(d)
    hashed = bcrypt.hashpw(PASSWORD.encode(), bcrypt.gensalt(rounds=10)).decode()
    web = d / "web.yml"
    web.write_text(
        yaml.safe_dump(
            {
                "tls_server_config": {"cert_file": str(crt), "key_file": str(key), "min_version": "TLS12"},
                "basic_auth_users": {"prometheus": hashed},
            }
        )
    )
    proc, port = start_with_web_config(web, d / "exporter.stderr")
    url = f"https://127.0.0.1:{port}"

    def answers() -> bool:
        assert proc.poll() is None, (d / "exporter.stderr").read_text()
        httpx.get(url + "/-/healthy", verify=ssl.create_default_context(cafile=str(ca)), timeout=1)
        return True

    wait_for(answers, "the exporter answering over TLS", 20, 0.1, ignore=(httpx.HTTPError,))
    yield {"url": url, "ca": ca, "port": port, "dir": d, "web": web}
    terminate(proc)
    assert "Traceback" not in (d / "exporter.stderr").read_text()


def test_tls_and_basic_auth_are_enforced(secured: dict[str, Any]) -> None:
    url, ca = secured["url"], ssl.create_default_context(cafile=str(secured["ca"]))
    assert httpx.get(url + "/metrics", verify=ca).status_code == 401
    assert httpx.get(url + "/metrics", verify=ca, auth=("prometheus", "wrong")).status_code == 401
    assert httpx.get(url + "/metrics", verify=ca, auth=("nobody", PASSWORD)).status_code == 401
    r = httpx.get(url + "/metrics", verify=ca, auth=("prometheus", PASSWORD))
    assert r.status_code == 200 and "llamacpp_exporter_build_info" in r.text
    with pytest.raises(httpx.HTTPError):  # plain HTTP on the TLS port
        httpx.get(f"http://127.0.0.1:{secured['port']}/metrics", timeout=3)


def test_top_reads_an_exporter_behind_tls_and_basic_auth(secured: dict[str, Any], tmp_path: Path) -> None:
    password = tmp_path / "password"
    password.write_text(PASSWORD + "\n")

    def top(*args: str) -> subprocess.CompletedProcess[Any]:
        return subprocess.run(
            [sys.executable, "-m", "llamacpp_exporter", "top", "--once", "--format", "json", "--url", secured["url"], *args],
            capture_output=True, text=True, timeout=30,
        )  # fmt: skip

    ok = top("--username", "prometheus", "--password-file", str(password), "--ca-file", str(secured["ca"]))
    assert ok.returncode == 0, ok.stderr
    assert json.loads(ok.stdout)["conversations"] == []
    no_auth = top("--ca-file", str(secured["ca"]))
    assert no_auth.returncode == 1 and "--username, --password-file" in no_auth.stderr
    untrusted = top("--username", "prometheus", "--password-file", str(password))
    assert untrusted.returncode == 1 and "CERTIFICATE_VERIFY_FAILED" in untrusted.stderr
    assert PASSWORD not in ok.stderr + no_auth.stderr + untrusted.stderr


def test_a_real_prometheus_scrapes_it_with_tls_and_basic_auth(secured: dict[str, Any], tmp_path: Path) -> None:
    target = f"127.0.0.1:{secured['port']}"
    job = {
        "scheme": "https",
        "tls_config": {"ca_file": str(secured["ca"])},
        "static_configs": [{"targets": [target]}],
    }
    prom = Prometheus(
        tmp_path / "prometheus",
        {
            "global": {"scrape_interval": "1s"},
            "scrape_configs": [
                {**job, "job_name": "llamacpp", "basic_auth": {"username": "prometheus", "password": PASSWORD}},
                {**job, "job_name": "wrong-password", "basic_auth": {"username": "prometheus", "password": "x"}},
            ],
        },
    )
    try:

        def scraped() -> dict[str, str]:
            targets = httpx.get(prom.url + "/api/v1/targets", timeout=5).json()["data"]["activeTargets"]
            health = {t["labels"]["job"]: t["health"] for t in targets}
            return health if set(health.values()) == {"up", "down"} else {}

        health = wait_for(scraped, "one target up, one down", 30, 0.5)
        assert health == {"llamacpp": "up", "wrong-password": "down"}, health
        res = prom.query('llamacpp_exporter_build_info{job="llamacpp"}')["data"]["result"]
        assert res and res[0]["metric"]["version"]
    finally:
        prom.stop()


def test_a_client_that_never_finishes_the_handshake_does_not_block_others(secured: dict[str, Any]) -> None:
    import socket

    stalled = socket.create_connection(("127.0.0.1", secured["port"]))
    try:
        r = httpx.get(
            secured["url"] + "/-/healthy", verify=ssl.create_default_context(cafile=str(secured["ca"])), timeout=5
        )
        assert r.status_code in (200, 401)
    finally:
        stalled.close()


def test_clients_that_hang_up_mid_answer_leave_no_traceback(secured: dict[str, Any]) -> None:
    """TLS clients that send a scrape and close without reading the answer (reset, no
    close_notify: the server's send raises SSLEOFError or a reset) are the client's doing: the
    exporter logs no traceback and keeps answering."""
    import base64
    import socket
    import struct

    ca = ssl.create_default_context(cafile=str(secured["ca"]))
    auth = base64.b64encode(f"prometheus:{PASSWORD}".encode()).decode()
    request = f"GET /metrics HTTP/1.1\r\nHost: x\r\nAuthorization: Basic {auth}\r\n\r\n".encode()
    for i in range(60):
        raw = socket.create_connection(("127.0.0.1", secured["port"]))
        tls = ca.wrap_socket(raw, server_hostname="127.0.0.1")
        tls.sendall(request)
        time.sleep(0.002 * (i % 10))  # before, while and after the server answers
        tls.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))  # reset on close
        tls.close()  # without close_notify: Python's close does not unwrap
    r = httpx.get(secured["url"] + "/metrics", verify=ca, auth=("prometheus", PASSWORD), timeout=5)
    assert r.status_code == 200
    stderr = (secured["dir"] / "exporter.stderr").read_text()
    assert "Traceback" not in stderr, stderr[-3000:]


@pytest.mark.parametrize(
    "doc, message",
    [
        ({"tls_server_config": {"cert_file": "x"}}, "cert_file and key_file are required"),
        ({"tls_server_config": {"cert_file": "x", "key_file": "y", "cipher_suites": []}}, "cipher_suites"),
        ({"http_server_config": {"headers": {"X-Powered-By": "me"}}}, "X-Powered-By is not one of"),
        ({"http_server_config": {"headers": {"X-Frame-Options": "allow"}}}, "one of deny, sameorigin"),
        ({"http_server_config": {"http3": True}}, "unsupported key(s): http3"),
        ({"tls_server_config": {"cert_file": 1, "key_file": "y"}}, "tls_server_config.cert_file: a string"),
        ({"tls_server_config": {"cert_file": "x", "key_file": "y", "min_version": ["TLS12"]}}, "min_version: a string"),
        ({"basic_auth_users": {"u": "plaintext"}}, "not a bcrypt hash"),
        ({"tls_server_config": {"cert_file": "/nope.crt", "key_file": "/nope.key"}}, "cannot load"),
    ],
)
def test_bad_web_config_is_a_clear_error(tmp_path: Path, doc: Any, message: str) -> None:
    f = tmp_path / "web.yml"
    f.write_text(yaml.safe_dump(doc))
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        load_web_config(str(f))


def test_a_web_config_that_is_not_text_is_a_clear_error(tmp_path: Path) -> None:
    f = tmp_path / "web.yml"
    f.write_bytes(b"\xff\xfe\x00binary")
    with pytest.raises(ConfigError, match="not text"):
        load_web_config(str(f))


def test_config_check_rejects_a_bad_web_config(tmp_path: Path) -> None:
    f = tmp_path / "web.yml"
    f.write_text("basic_auth_users: {u: plaintext}\n")
    res = subprocess.run(
        [sys.executable, "-m", "llamacpp_exporter", "--web.config.file", str(f), "--config.check"],
        capture_output=True,
        text=True,
    )
    assert res.returncode != 0 and "not a bcrypt hash" in res.stderr and "Traceback" not in res.stderr


def _basic(user: str, password: str) -> str:
    import base64

    return "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()


def test_an_unknown_user_costs_as_much_as_a_wrong_password(tmp_path: Path) -> None:
    # timing would otherwise tell which user names exist
    f = tmp_path / "web.yml"
    f.write_text(
        yaml.safe_dump({"basic_auth_users": {"prometheus": bcrypt.hashpw(b"pw", bcrypt.gensalt(10)).decode()}})
    )
    web = load_web_config(str(f))

    def took(header: str) -> float:
        t0 = time.perf_counter()
        assert not web.authorized(header)
        return time.perf_counter() - t0

    wrong = min(took(_basic("prometheus", "nope")) for _ in range(3))
    unknown = min(took(_basic("nobody", "nope")) for _ in range(3))
    print(f"wrong password {wrong * 1000:.1f} ms, unknown user {unknown * 1000:.1f} ms")
    assert unknown > wrong / 3, (unknown, wrong)
    assert web.authorized(_basic("prometheus", "pw"))


def test_a_flood_of_wrong_passwords_runs_few_bcrypt_checks_at_once(tmp_path: Path) -> None:
    import threading

    from llamacpp_exporter.export import web_config as webmod

    f = tmp_path / "web.yml"
    f.write_text(
        yaml.safe_dump({"basic_auth_users": {"prometheus": bcrypt.hashpw(b"pw", bcrypt.gensalt(10)).decode()}})
    )
    web = load_web_config(str(f))
    running, most = 0, 0
    lock = threading.Lock()
    real = bcrypt.checkpw

    def counting(pw: bytes, hashed: bytes) -> bool:
        nonlocal running, most
        with lock:
            running += 1
            most = max(most, running)
        try:
            return real(pw, hashed)
        finally:
            with lock:
                running -= 1

    bcrypt.checkpw = counting  # type: ignore[assignment]  # bcrypt declares its own parameter names
    try:
        threads = [threading.Thread(target=web.authorized, args=(_basic("prometheus", f"x{i}"),)) for i in range(12)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        bcrypt.checkpw = real
    assert 1 <= most <= webmod.BCRYPT_CONCURRENCY


def test_a_flood_of_idle_connections_never_spins_and_scrapes_are_answered_again(tmp_path: Path) -> None:
    """1,100 idle connections against the usual limit of 1,024 open files: the exporter
    closes what it cannot serve, does not spin on a full descriptor table, and answers scrapes
    again once the idle connections time out."""
    import socket

    port = free_port()
    err = open(tmp_path / "exporter.stderr", "wb")
    proc = subprocess.Popen(
        ["sh", "-c", f"ulimit -n 1024; exec {sys.executable} -m llamacpp_exporter --web.listen-address "
         f"127.0.0.1:{port} --llama.url http://127.0.0.1:{free_port()} --no-llama.slots"],
        stdout=err, stderr=err,
    )  # fmt: skip
    socks: list[socket.socket] = []
    try:
        wait_for(
            lambda: httpx.get(f"http://127.0.0.1:{port}/-/healthy", timeout=1).status_code == 200,
            "the exporter healthy",
            20,
            0.1,
            ignore=(httpx.HTTPError,),
        )
        for _ in range(1100):  # more than the descriptors left
            s = socket.create_connection(("127.0.0.1", port))
            socks.append(s)  # connected, sending nothing
        t0, cpu0 = time.monotonic(), _cpu_seconds(proc.pid)
        time.sleep(3)
        busy = (_cpu_seconds(proc.pid) - cpu0) / (time.monotonic() - t0)

        def scrape() -> float:
            r = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=2)
            return time.monotonic() - t0 if r.status_code == 200 else 0.0

        answered = wait_for(scrape, "a scrape answered", 30, 0.5, ignore=(httpx.HTTPError,))
        print(f"1100 idle connections: {busy:.0%} of a core, a scrape answered after {answered} s")
        assert busy < 0.5, busy
        assert answered is not None
    finally:
        for s in socks:
            s.close()
        terminate(proc)


def _cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _start_exporter(tmp_path: Path, *extra: str, nofile: int | None = None) -> tuple[subprocess.Popen[Any], int]:
    """The exporter with no llama-server, answering; ``nofile``: under that open-file limit."""
    port = free_port()
    err = open(tmp_path / "exporter.stderr", "wb")
    cmd = [sys.executable, "-m", "llamacpp_exporter", "--web.listen-address", f"127.0.0.1:{port}",
           "--llama.url", f"http://127.0.0.1:{free_port()}", "--no-llama.slots", *extra]  # fmt: skip
    if nofile is not None:
        cmd = ["sh", "-c", f"ulimit -n {nofile}; exec " + " ".join(shlex.quote(c) for c in cmd)]
    proc = subprocess.Popen(cmd, stdout=err, stderr=err)
    err.close()
    wait_for(lambda: httpx.get(f"http://127.0.0.1:{port}/-/healthy", timeout=1).status_code == 200, "healthy", 20,
             0.1, ignore=(httpx.HTTPError,))  # fmt: skip
    return proc, port


def _hold_slow_clients(port: int, n: int, tls: ssl.SSLContext | None = None) -> list[Any]:
    """n connections: half idle (a TLS one stalled in its handshake), half that send half a
    request header and then nothing (a TLS one after its handshake)."""
    import socket

    held = []
    for i in range(n):
        s = socket.create_connection(("127.0.0.1", port))
        if i % 2:
            if tls is not None:
                s = tls.wrap_socket(s, server_hostname="127.0.0.1")
            s.sendall(b"GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\nUser-Ag")
        held.append(s)
    return held


def _scrape_times(url: str, n: int, **kw: Any) -> list[float]:
    """n scrapes as Prometheus makes them (10 s timeout), one every 0.2 s: each one's seconds."""
    took = []
    for _ in range(n):
        t0 = time.monotonic()
        try:
            r = httpx.get(url + "/metrics", timeout=10, **kw)
            took.append(time.monotonic() - t0 if r.status_code == 200 else float("inf"))
        except httpx.HTTPError:
            took.append(float("inf"))
        time.sleep(0.2)
    return took


def _closed(text: str) -> dict[str, float]:
    return {dict(k)["reason"]: v for k, v in samples(text, "llamacpp_exporter_http_connections_closed_total").items()}


def test_hundreds_of_idle_and_half_sent_connections_leave_scrapes_answered(tmp_path: Path) -> None:
    proc, port = _start_exporter(tmp_path)
    url = f"http://127.0.0.1:{port}"
    held = []
    try:
        held = _hold_slow_clients(port, 400)
        t0, cpu0 = time.monotonic(), _cpu_seconds(proc.pid)
        took = sorted(_scrape_times(url, 10))
        busy = (_cpu_seconds(proc.pid) - cpu0) / (time.monotonic() - t0)
        waiting = samples(httpx.get(url + "/metrics", timeout=10).text, "llamacpp_exporter_http_connections_waiting")
        print(f"400 slow clients: scrapes answered in {took[0]:.3f}..{took[-1]:.3f} s, {busy:.0%} of a core")
        assert took[-1] < 1.0, took  # all 10 answered, the slowest (p99) within a second
        assert busy < 0.5, busy
        assert waiting[()] >= 350  # held without a thread each
        # the header is bounded in time: the slow clients are closed, and counted
        time.sleep(HEADER_TIMEOUT + 1)
        closed = _closed(httpx.get(url + "/metrics", timeout=10).text)
        assert closed["header_timeout"] >= 400 and closed["busy"] == 0, closed
    finally:
        for s in held:
            s.close()
        terminate(proc)
    assert "Traceback" not in (tmp_path / "exporter.stderr").read_text()


def test_slow_tls_clients_leave_tls_scrapes_answered(secured: dict[str, Any]) -> None:
    ca = ssl.create_default_context(cafile=str(secured["ca"]))
    before = _closed(httpx.get(secured["url"] + "/metrics", verify=ca, auth=("prometheus", PASSWORD), timeout=10).text)
    held = _hold_slow_clients(secured["port"], 400, tls=ca)
    try:
        took = sorted(_scrape_times(secured["url"], 10, verify=ca, auth=("prometheus", PASSWORD)))
        print(f"400 slow TLS clients: scrapes answered in {took[0]:.3f}..{took[-1]:.3f} s")
        assert took[-1] < 1.0, took
        time.sleep(HEADER_TIMEOUT + 1)
        after = _closed(
            httpx.get(secured["url"] + "/metrics", verify=ca, auth=("prometheus", PASSWORD), timeout=10).text
        )
        assert after["header_timeout"] - before["header_timeout"] >= 400, (before, after)
    finally:
        for s in held:
            s.close()


def test_at_the_open_file_limit_a_new_scrape_is_answered_and_nothing_spins(tmp_path: Path) -> None:
    proc, port = _start_exporter(tmp_path, nofile=256)
    url = f"http://127.0.0.1:{port}"
    held = []
    try:
        held = _hold_slow_clients(port, 400)
        time.sleep(0.5)
        t0, cpu0 = time.monotonic(), _cpu_seconds(proc.pid)
        took = _scrape_times(url, 5)
        busy = (_cpu_seconds(proc.pid) - cpu0) / (time.monotonic() - t0)
        text = httpx.get(url + "/metrics", timeout=10).text
        closed = _closed(text)
        print(
            f"open-file limit 256, 400 slow clients: scrapes in {sorted(took)} s, {busy:.0%} of a core, closed {closed}"
        )
        assert all(t < 1.0 for t in took), took  # 5 of 5 answered
        assert busy < 0.5, busy
        assert closed["waiting_limit"] + closed["descriptors"] >= 400 - 128, closed  # half the limit may wait
        assert samples(text, "process_open_fds")[()] < 256
    finally:
        for s in held:
            s.close()
        terminate(proc)
    assert "Traceback" not in (tmp_path / "exporter.stderr").read_text()


def _served_certificate(port: int) -> bytes:
    """The certificate the server presents, whatever it is signed by."""
    ctx = ssl.create_default_context()
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    with socket.create_connection(("127.0.0.1", port), timeout=5) as raw, ctx.wrap_socket(raw) as tls:
        der = tls.getpeercert(binary_form=True)
    assert der
    return der


def test_a_rotated_certificate_is_served_without_a_restart_and_a_broken_file_keeps_the_old(tmp_path: Path) -> None:
    """As the exporter-toolkit does: cert-manager (or anyone) writes a new certificate and key
    over the files the web configuration names, and the next connection gets the new one; a
    configuration that no longer loads keeps the one in force, says so in the log and in
    llamacpp_exporter_web_config_last_reload_successful. http_server_config's headers are sent."""
    old, new = tmp_path / "old", tmp_path / "new"
    old.mkdir()
    new.mkdir()
    ca_old, crt_old, key_old = make_certs(old)
    ca_new, crt_new, key_new = make_certs(new)
    live = tmp_path / "live"
    live.mkdir()
    crt, key = live / "tls.crt", live / "tls.key"
    crt.write_bytes(crt_old.read_bytes())
    key.write_bytes(key_old.read_bytes())
    web = tmp_path / "web.yml"
    doc = {
        "tls_server_config": {"cert_file": str(crt), "key_file": str(key)},
        "http_server_config": {"headers": {"Strict-Transport-Security": "max-age=31536000"}},
    }
    web.write_text(yaml.safe_dump(doc))
    err_path = tmp_path / "exporter.stderr"
    proc, port = start_with_web_config(web, err_path)
    url = f"https://127.0.0.1:{port}"
    try:

        def get(path: str, ca: Path) -> httpx.Response:
            assert proc.poll() is None, err_path.read_text()
            return httpx.get(url + path, verify=ssl.create_default_context(cafile=str(ca)), timeout=2)

        r = wait_for(
            lambda: get("/metrics", ca_old), "the exporter answering over TLS", 20, 0.1, ignore=(httpx.HTTPError,)
        )
        assert r.headers["Strict-Transport-Security"] == "max-age=31536000"
        first = _served_certificate(port)
        # the rotation: the new pair written over the old files, as a secret volume is updated
        crt.write_bytes(crt_new.read_bytes())
        key.write_bytes(key_new.read_bytes())
        wait_for(lambda: _served_certificate(port) != first, "the new certificate served", 10, 0.2)
        r = get("/metrics", ca_new)
        assert 'llamacpp_exporter_web_config_reloads_total{result="success"}' in r.text
        assert "llamacpp_exporter_web_config_last_reload_successful 1.0" in r.text
        # a broken configuration: the one in force stays, and says so
        web.write_text("tls_server_config: {cert_file: /nope.crt, key_file: /nope.key}\n")

        # looked at again as connections come (at most once a second), as the toolkit does
        def warned() -> bool:
            get("/-/healthy", ca_new)
            return "keeping the web configuration in force" in err_path.read_text()

        wait_for(warned, "the warning", 10, 0.3)
        r = get("/metrics", ca_new)
        assert r.status_code == 200
        assert "llamacpp_exporter_web_config_last_reload_successful 0.0" in r.text
        assert 'llamacpp_exporter_web_config_reloads_total{result="failure"} 1.0' in r.text
    finally:
        terminate(proc)
    assert "Traceback" not in err_path.read_text()


def _oversized(url: str, port: int, tls: ssl.SSLContext | None = None) -> tuple[int, int]:
    """The status codes of a request with a 1 MB header (httpx), and of one with a 1 MB URL (sent
    by hand: httpx refuses URLs that long, curl and browsers do not)."""
    big_header = httpx.get(url + "/metrics", headers={"X-Big": "a" * 1_000_000}, timeout=10, verify=tls or True)
    with socket.create_connection(("127.0.0.1", port), timeout=10) as raw:
        conn = tls.wrap_socket(raw, server_hostname="127.0.0.1") if tls is not None else raw
        conn.sendall(b"GET /metrics?" + b"a" * 1_000_000 + b" HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        answer = b""
        while b"\r\n" not in answer and (chunk := conn.recv(4096)):
            answer += chunk
    return big_header.status_code, int(answer.split()[1])


def test_a_huge_header_or_url_is_answered_431_or_414_then_closed(tmp_path: Path) -> None:
    proc, port = _start_exporter(tmp_path)
    url = f"http://127.0.0.1:{port}"
    try:
        for _ in range(3):
            assert _oversized(url, port) == (431, 414)
        assert httpx.get(url + "/metrics", timeout=10).status_code == 200
        closed = _closed(httpx.get(url + "/metrics", timeout=10).text)
        assert closed["header_too_large"] == 6, closed
    finally:
        terminate(proc)
    assert "Traceback" not in (tmp_path / "exporter.stderr").read_text()


def test_a_huge_header_or_url_over_tls_is_answered_too(secured: dict[str, Any]) -> None:
    ca = ssl.create_default_context(cafile=str(secured["ca"]))
    assert _oversized(secured["url"], secured["port"], ca) == (431, 414)
    assert (
        httpx.get(secured["url"] + "/metrics", verify=ca, auth=("prometheus", PASSWORD), timeout=10).status_code == 200
    )
