"""--web.config.file: TLS and basic auth in the Prometheus exporter-toolkit's format.

The same file node_exporter and every toolkit exporter read, so one file serves them all:

    tls_server_config:
      cert_file: /etc/llamacpp-exporter/tls.crt
      key_file: /etc/llamacpp-exporter/tls.key
      client_auth_type: RequireAndVerifyClientCert   # optional, with client_ca_file
      client_ca_file: /etc/llamacpp-exporter/ca.crt
      min_version: TLS12
    basic_auth_users:
      prometheus: $2y$10$...                          # bcrypt hash (htpasswd -nBC 10 "" | tr -d ':\\n')
    http_server_config:
      headers:                                        # added to every response
        Strict-Transport-Security: max-age=31536000
        X-Content-Type-Options: nosniff

As the toolkit does, the file is read again when it or a file it names changes: a rotated
certificate is served without a restart; a file that no longer loads keeps the previous
configuration, and says why.

Keys of the toolkit format this exporter does not implement (cipher_suites, curve_preferences,
max_version, client_allowed_sans) are errors naming the key, never ignored: a security setting
that silently does nothing is worse than a refusal to start.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import logging
import os
import ssl
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

import yaml
from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from ..config import ConfigError

log = logging.getLogger(__name__)

_TLS_KEYS = {"cert_file", "key_file", "client_auth_type", "client_ca_file", "min_version"}
_CLIENT_AUTH = {
    "NoClientCert": ssl.CERT_NONE,
    "RequestClientCert": ssl.CERT_OPTIONAL,  # Go requests without verifying; Python verifies if given
    "VerifyClientCertIfGiven": ssl.CERT_OPTIONAL,
    "RequireAndVerifyClientCert": ssl.CERT_REQUIRED,
}
BCRYPT_CONCURRENCY = 2
BCRYPT_WAIT_SECONDS = 2.0
_VERSIONS = {"TLS12": ssl.TLSVersion.TLSv1_2, "TLS13": ssl.TLSVersion.TLSv1_3}
# http_server_config.headers the toolkit sets, and the values it accepts where it limits them
_HEADERS: Final[dict[str, frozenset[str] | None]] = {
    "Content-Security-Policy": None,
    "X-Frame-Options": frozenset({"deny", "sameorigin"}),
    "X-Content-Type-Options": frozenset({"nosniff"}),
    "X-XSS-Protection": None,
    "Strict-Transport-Security": None,
}
RECHECK_SECONDS: Final = 1.0  # the files' status is looked at no more often than this


@dataclass
class WebSecurity:
    ssl_context: ssl.SSLContext | None = None
    users: dict[str, bytes] = field(default_factory=dict)  # user -> bcrypt hash
    headers: list[tuple[str, str]] = field(default_factory=list)  # added to every response
    files: tuple[str, ...] = ()  # the certificate, key and CA files it was made from
    _verified: set[bytes] = field(default_factory=set)  # digests of accepted credentials
    _lock: threading.Lock = field(default_factory=threading.Lock)
    # an unknown user costs the same bcrypt check as a known one (as exporter-toolkit does): the
    # answer's time does not tell which user names exist
    dummy_hash: bytes | None = None
    # bcrypt checks at once: a flood of wrong passwords takes at most these cores
    _checks: threading.BoundedSemaphore = field(default_factory=lambda: threading.BoundedSemaphore(BCRYPT_CONCURRENCY))

    def authorized(self, header: str | None) -> bool:
        """Basic auth against the bcrypt hashes. bcrypt is slow on purpose; as the toolkit
        does, a credential once verified is remembered (by a digest, not in clear) so that
        every scrape does not pay for it."""
        if not self.users:
            return True
        if not header or not header.startswith("Basic "):
            return False
        try:
            user, _, password = base64.b64decode(header[6:], validate=True).decode().partition(":")
        except (binascii.Error, UnicodeDecodeError):
            return False
        known = self.users.get(user)
        hashed = known if known is not None else self.dummy_hash
        if hashed is None:
            return False
        digest = hashlib.sha256(hashed + b"\0" + password.encode()).digest()
        with self._lock:
            if known is not None and digest in self._verified:
                return True
        import bcrypt  # only needed, and only imported, when basic_auth_users is configured

        if not self._checks.acquire(timeout=BCRYPT_WAIT_SECONDS):
            return False  # too many checks at once: refused, the client may retry
        try:
            ok = bcrypt.checkpw(password.encode(), hashed) and known is not None
        except ValueError:
            return False
        finally:
            self._checks.release()
        if ok:
            with self._lock:
                if len(self._verified) > 64:
                    self._verified.clear()
                self._verified.add(digest)
        return ok


def load_web_config(path: str) -> WebSecurity:
    try:
        doc = yaml.safe_load(Path(path).read_text())
    except OSError as e:
        raise ConfigError(f"--web.config.file {path}: {e.strerror}") from e
    except yaml.YAMLError as e:
        raise ConfigError(f"--web.config.file {path}: not YAML: {e}") from e
    except UnicodeDecodeError:
        raise ConfigError(f"--web.config.file {path}: not text (UTF-8 YAML expected)") from None
    doc = doc or {}
    if not isinstance(doc, dict):
        raise ConfigError(f"--web.config.file {path}: expected a mapping")
    unknown = set(doc) - {"tls_server_config", "basic_auth_users", "http_server_config"}
    if unknown:
        raise ConfigError(f"--web.config.file {path}: unsupported key(s): {', '.join(sorted(unknown))}")
    cfg = WebSecurity()
    tls = doc.get("tls_server_config")
    if tls:
        cfg.ssl_context = _ssl_context(tls, path)
        cfg.files = tuple(tls[k] for k in ("cert_file", "key_file", "client_ca_file") if tls.get(k))
    cfg.headers = _http_server_config(doc.get("http_server_config"), path)
    users = doc.get("basic_auth_users") or {}
    if not isinstance(users, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in users.items()):
        raise ConfigError(f"--web.config.file {path}: basic_auth_users must map user names to bcrypt hashes")
    for user, hashed in users.items():
        if not hashed.startswith(("$2a$", "$2b$", "$2y$")):
            raise ConfigError(f"--web.config.file {path}: basic_auth_users.{user} is not a bcrypt hash")
        try:
            import bcrypt  # noqa: F401
        except ImportError as e:  # pragma: no cover - bcrypt is a dependency
            raise ConfigError("basic_auth_users needs the bcrypt package") from e
    cfg.users = {u: h.encode() for u, h in users.items()}
    if cfg.users:
        import bcrypt

        cost = max(
            int(h.split("$")[2]) if h.count("$") >= 3 and h.split("$")[2].isdigit() else 10 for h in users.values()
        )
        cfg.dummy_hash = bcrypt.hashpw(b"not a password", bcrypt.gensalt(rounds=min(max(cost, 4), 16)))
    return cfg


def _http_server_config(http: object, path: str) -> list[tuple[str, str]]:
    """The response headers of http_server_config; http2 is accepted (this server speaks
    HTTP/1.1 only, which the toolkit's http2: false also means)."""
    where = f"--web.config.file {path}: http_server_config"
    if http is None:
        return []
    if not isinstance(http, dict):
        raise ConfigError(f"{where} must be a mapping")
    unknown = set(http) - {"headers", "http2"}
    if unknown:
        raise ConfigError(f"{where}: unsupported key(s): {', '.join(sorted(unknown))}")
    if not isinstance(http.get("http2", True), bool):
        raise ConfigError(f"{where}.http2: true or false")
    headers = http.get("headers") or {}
    if not isinstance(headers, dict):
        raise ConfigError(f"{where}.headers must map header names to values")
    out = []
    for name, value in headers.items():
        if name not in _HEADERS:
            raise ConfigError(f"{where}.headers: {name} is not one of {', '.join(_HEADERS)}")
        if not isinstance(value, str):
            raise ConfigError(f"{where}.headers.{name}: a string")
        if not value:
            continue  # blank: unset, as the toolkit reads it
        allowed = _HEADERS[name]
        if allowed is not None and value.lower() not in allowed:
            raise ConfigError(f"{where}.headers.{name}: one of {', '.join(sorted(allowed))}")
        if "\r" in value or "\n" in value:
            raise ConfigError(f"{where}.headers.{name}: one line")
        out.append((name, value))
    return out


class WebConfigFile:
    """--web.config.file, read again when it or a file it names changes, as the exporter-toolkit
    does: a rotated certificate (cert-manager rewrites the files, not the configuration) is
    served without a restart. A file that no longer loads keeps the previous configuration,
    says why once, and is counted."""

    def __init__(self, path: str, registry: CollectorRegistry | None = None) -> None:
        self.path = path
        self._security = load_web_config(path)  # at start: a mistake stops the exporter
        self._fingerprint = self._stat()
        self._checked = time.monotonic()
        self._lock = threading.Lock()
        self.reloads = {"success": 0, "failure": 0}
        self.last_reload_successful = True
        if registry is not None:
            registry.register(_ReloadCollector(self))

    def _stat(self) -> tuple[tuple[str, int, int, int] | tuple[str, None], ...]:
        out: list[tuple[str, int, int, int] | tuple[str, None]] = []
        for f in (self.path, *self._security.files):
            try:
                st = os.stat(f)
                out.append((f, st.st_mtime_ns, st.st_size, st.st_ino))
            except OSError:
                out.append((f, None))
        return tuple(out)

    def current(self) -> WebSecurity:
        """The configuration in force, read again if a file changed since it was last looked at
        (at most every RECHECK_SECONDS)."""
        now = time.monotonic()
        if now - self._checked < RECHECK_SECONDS:
            return self._security
        with self._lock:
            if now - self._checked >= RECHECK_SECONDS:
                self._checked = now
                fingerprint = self._stat()
                if fingerprint != self._fingerprint:
                    self._fingerprint = fingerprint
                    self._reload()
            return self._security

    def _reload(self) -> None:
        try:
            security = load_web_config(self.path)
        except Exception as e:  # noqa: BLE001 - asked at every connection: it must never raise
            self.reloads["failure"] += 1
            self.last_reload_successful = False
            log.warning("%s; keeping the web configuration in force", e)
            return
        self._security = security
        self._fingerprint = self._stat()  # a new file may name other certificate files
        self.reloads["success"] += 1
        self.last_reload_successful = True
        log.info("web configuration %s read again", self.path)


class _ReloadCollector(Collector):
    def __init__(self, web: WebConfigFile) -> None:
        self.web = web

    def collect(self) -> Iterator[Metric]:
        c = CounterMetricFamily(
            "llamacpp_exporter_web_config_reloads",
            "Times --web.config.file (or a certificate it names) changed and was read again, by result "
            "(failure: the configuration in force was kept).",
            labels=["result"],
        )
        for result, n in self.web.reloads.items():
            c.add_metric([result], n)
        yield c
        yield GaugeMetricFamily(
            "llamacpp_exporter_web_config_last_reload_successful",
            "1 when the last reading of --web.config.file succeeded (as prometheus_config_last_reload_successful).",
            value=1.0 if self.web.last_reload_successful else 0.0,
        )


def _ssl_context(tls: object, path: str) -> ssl.SSLContext:
    where = f"--web.config.file {path}: tls_server_config"
    if not isinstance(tls, dict):
        raise ConfigError(f"{where} must be a mapping")
    unknown = set(tls) - _TLS_KEYS
    if unknown:
        raise ConfigError(f"{where}: unsupported key(s): {', '.join(sorted(unknown))}")
    if not tls.get("cert_file") or not tls.get("key_file"):
        raise ConfigError(f"{where}: cert_file and key_file are required")
    for key in ("cert_file", "key_file", "client_ca_file", "client_auth_type", "min_version"):
        if key in tls and not isinstance(tls[key], str):
            raise ConfigError(f"{where}.{key}: a string")
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    if "min_version" in tls:
        if tls["min_version"] not in _VERSIONS:
            raise ConfigError(f"{where}.min_version: one of {', '.join(_VERSIONS)}")
        ctx.minimum_version = _VERSIONS[tls["min_version"]]
    try:
        ctx.load_cert_chain(tls["cert_file"], tls["key_file"])
    except (OSError, ssl.SSLError) as e:
        raise ConfigError(f"{where}: cannot load cert_file/key_file: {e}") from e
    auth = tls.get("client_auth_type", "NoClientCert")
    if auth not in _CLIENT_AUTH:
        raise ConfigError(f"{where}.client_auth_type: one of {', '.join(_CLIENT_AUTH)}")
    ctx.verify_mode = _CLIENT_AUTH[auth]
    if auth != "NoClientCert":
        if not tls.get("client_ca_file"):
            raise ConfigError(f"{where}: client_auth_type {auth} needs client_ca_file")
        try:
            ctx.load_verify_locations(tls["client_ca_file"])
        except (OSError, ssl.SSLError) as e:
            raise ConfigError(f"{where}: cannot load client_ca_file: {e}") from e
    return ctx
