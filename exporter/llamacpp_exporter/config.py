"""Strict configuration: YAML file and command line, one set of frozen dataclasses.

Unknown keys, wrong types and out-of-range values are errors that name the key.
The command line overrides the file; the file overrides the defaults.
"""

from __future__ import annotations

import dataclasses
import math
import os
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import yaml

DEFAULT_PORT = 10938
DEFAULT_LISTEN = f":{DEFAULT_PORT}"


class ConfigError(ValueError):
    pass


LOG_LEVELS = ("debug", "info", "warn", "error")
LOG_FORMATS = ("logfmt", "json")
# keys of the log: section before it became the exporter's own log (llama-server's log is llama.log_*)
_MOVED = {
    "path": "llama.log_path",
    "command": "llama.log_command",
    "from_start": "llama.log_from_start",
    "poll_interval_seconds": "llama.log_poll_interval_seconds",
    "max_line_bytes": "llama.log_max_line_bytes",
}


@dataclass(frozen=True)
class LlamaConfig:
    url: str = "http://127.0.0.1:8080"
    api_key_file: str | None = None
    api_key_env: str = "LLAMA_API_KEY"
    timeout_seconds: float = 2.0
    poll_interval_seconds: float = 5.0
    poll_slots: bool = True
    poll_metrics: bool = True
    # llama-server's log, the exporter's input
    log_path: str | None = None
    log_command: str | None = None
    log_from_start: bool = False
    log_poll_interval_seconds: float = 0.25
    log_max_line_bytes: int = 1 << 20
    # where the read position is kept across exporter restarts; default: next to events.path
    log_position_file: str | None = None


@dataclass(frozen=True)
class LogConfig:
    """The exporter's own log, named as in the Prometheus exporter-toolkit (--log.level, --log.format)."""

    level: str = "info"
    format: str = "logfmt"


@dataclass(frozen=True)
class WebConfig:
    listen_address: str = DEFAULT_LISTEN
    telemetry_path: str = "/metrics"
    config_file: str | None = None  # TLS and basic auth, exporter-toolkit format (web.py)


@dataclass(frozen=True)
class EventsConfig:
    path: str | None = None
    # rotated (X -> X.1 ...) when a record would take it past max_bytes; 0: never (your own
    # logrotate, then SIGHUP). At about 860 bytes a record, 100 MiB hold some 120,000 requests.
    max_bytes: int = 100 << 20
    max_files: int = 5  # rotated copies kept: the files hold at most max_bytes x (max_files + 1)


@dataclass(frozen=True)
class CacheConfig:
    min_prompt_tokens: int = 1024
    hit_ratio: float = 0.9
    miss_ratio: float = 0.1


@dataclass(frozen=True)
class ContentionConfig:
    fraction: float = 0.1


@dataclass(frozen=True)
class TakeoverConfig:
    small_task_tokens: int = 256
    big_conversation_tokens: int = 1024


@dataclass(frozen=True)
class ConversationsConfig:
    salt_file: str | None = None
    salt_env: str = "LLAMACPP_EXPORTER_SALT"
    window_seconds: float = 900.0
    top: int = 10
    max_tracked: int = 10000


@dataclass(frozen=True)
class Config:
    llama: LlamaConfig = field(default_factory=LlamaConfig)
    log: LogConfig = field(default_factory=LogConfig)
    web: WebConfig = field(default_factory=WebConfig)
    events: EventsConfig = field(default_factory=EventsConfig)
    cache: CacheConfig = field(default_factory=CacheConfig)
    contention: ContentionConfig = field(default_factory=ContentionConfig)
    takeover: TakeoverConfig = field(default_factory=TakeoverConfig)
    conversations: ConversationsConfig = field(default_factory=ConversationsConfig)


def _check_type(path: str, value: Any, typ: Any) -> Any:
    t = str(typ)
    optional = "None" in t
    if value is None:
        if optional:
            return None
        raise ConfigError(f"{path}: must not be empty")
    if "bool" in t:
        if not isinstance(value, bool):
            raise ConfigError(f"{path}: expected true or false, got {value!r}")
        return value
    if "int" in t and "float" not in t:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"{path}: expected an integer, got {value!r}")
        return value
    if "float" in t:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(f"{path}: expected a number, got {value!r}")
        return float(value)
    if "str" in t:
        if not isinstance(value, str):
            raise ConfigError(f"{path}: expected a string, got {value!r}")
        return value
    return value


def _build(cls: Any, data: Any, path: str) -> Any:
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(f"{path or 'config'}: expected a mapping, got {type(data).__name__}")
    fields = {f.name: f for f in dataclasses.fields(cls)}
    unknown = sorted(set(data) - set(fields))
    if unknown:
        where = f"{path}." if path else ""
        raise ConfigError(f"unknown key {where}{unknown[0]} (known: {', '.join(sorted(fields))})")
    kwargs = {}
    for name, f in fields.items():
        if name not in data:
            continue
        key = f"{path}.{name}" if path else name
        if dataclasses.is_dataclass(f.default_factory) if f.default_factory is not dataclasses.MISSING else False:
            kwargs[name] = _build(f.default_factory, data[name], key)
        else:
            kwargs[name] = _check_type(key, data[name], f.type)
    return cls(**kwargs)


def load_file(path: str) -> Config:
    try:
        with open(path, encoding="utf-8") as fh:
            data = yaml.safe_load(fh)
    except OSError as e:
        raise ConfigError(f"cannot read config file {path}: {e.strerror}") from None
    except yaml.YAMLError as e:
        raise ConfigError(f"config file {path} is not valid YAML: {e}") from None
    except UnicodeDecodeError:
        raise ConfigError(f"config file {path} is not text (UTF-8 YAML expected)") from None
    if isinstance(data, dict) and isinstance(data.get("log"), dict):
        for old, new in _MOVED.items():
            if old in data["log"]:
                raise ConfigError(f"log.{old} is now {new} (log: is the exporter's own log: level, format)")
    return _build(Config, data, "")


def override(cfg: Config, section: str, **values: Any) -> Config:
    """Apply command-line values that were given (not None) to one section."""
    given = {k: v for k, v in values.items() if v is not None}
    if not given:
        return cfg
    return dataclasses.replace(cfg, **{section: dataclasses.replace(getattr(cfg, section), **given)})


def validate(cfg: Config) -> Config:
    lc = cfg.llama
    if lc.log_path and lc.log_command:
        raise ConfigError(
            "llama.log_path and llama.log_command are exclusive: follow a file (or - for stdin) or a command"
        )
    if cfg.log.level not in LOG_LEVELS:
        raise ConfigError(f"log.level: one of {', '.join(LOG_LEVELS)}")
    if cfg.log.format not in LOG_FORMATS:
        raise ConfigError(f"log.format: one of {', '.join(LOG_FORMATS)}")
    if not cfg.llama.url.startswith(("http://", "https://")):
        raise ConfigError(f"llama.url: must start with http:// or https://, got {redact_url(cfg.llama.url)!r}")
    try:
        parts = urlsplit(cfg.llama.url)
        parts.port  # noqa: B018 - raises on a bad port
    except ValueError as e:
        raise ConfigError(f"llama.url: not a URL ({e}): {redact_url(cfg.llama.url)!r}") from None
    if not parts.hostname:
        raise ConfigError(f"llama.url: no host in {redact_url(cfg.llama.url)!r}")
    # finite and within what makes sense: inf or nan would stop a thread, 1e-9 would spin it
    for key, v, lo, hi in (
        ("llama.timeout_seconds", cfg.llama.timeout_seconds, 0.1, 300.0),
        ("llama.poll_interval_seconds", cfg.llama.poll_interval_seconds, 0.05, 3600.0),
        ("llama.log_poll_interval_seconds", cfg.llama.log_poll_interval_seconds, 0.01, 60.0),
        ("conversations.window_seconds", cfg.conversations.window_seconds, 60.0, 7 * 86400.0),
    ):
        if not (math.isfinite(v) and lo <= v <= hi):
            raise ConfigError(f"{key}: must be a number between {lo:g} and {hi:g}, got {v}")
    for key, f in (
        ("cache.hit_ratio", cfg.cache.hit_ratio),
        ("cache.miss_ratio", cfg.cache.miss_ratio),
        ("contention.fraction", cfg.contention.fraction),
    ):
        if not math.isfinite(f):
            raise ConfigError(f"{key}: must be a finite number, got {f}")
    ev = cfg.events
    if ev.max_bytes != 0 and not (1 << 12 <= ev.max_bytes <= 1 << 50):
        raise ConfigError(f"events.max_bytes: 0 (never rotate) or between 4096 and 2^50, got {ev.max_bytes}")
    if not (0 <= ev.max_files <= 1000):
        raise ConfigError(f"events.max_files: must be between 0 and 1000, got {ev.max_files}")
    if cfg.llama.log_max_line_bytes < 1024:
        raise ConfigError("llama.log_max_line_bytes: must be at least 1024")
    c = cfg.cache
    if not (0 <= c.miss_ratio <= c.hit_ratio <= 1):
        raise ConfigError("cache: need 0 <= miss_ratio <= hit_ratio <= 1")
    if c.min_prompt_tokens < 1:
        raise ConfigError("cache.min_prompt_tokens: must be at least 1")
    if not (0 <= cfg.contention.fraction <= 1):
        raise ConfigError("contention.fraction: must be between 0 and 1")
    cv = cfg.conversations
    if cv.window_seconds < 60:
        raise ConfigError("conversations.window_seconds: must be at least 60")
    if not (1 <= cv.top <= 100):
        raise ConfigError("conversations.top: must be between 1 and 100 (it bounds the metric's series)")
    if cv.max_tracked < cv.top:
        raise ConfigError("conversations.max_tracked: must be at least conversations.top")
    parse_listen_address(cfg.web.listen_address)
    tp = cfg.web.telemetry_path
    if not tp.startswith("/") or tp == "/" or any(c in tp for c in "?#% ") or tp.startswith("/-/"):
        raise ConfigError(
            f"web.telemetry_path: a plain path that starts with / (not /, /-/..., no ?, #, % or space), got {tp!r}"
        )
    return cfg


def parse_listen_address(addr: str) -> tuple[str, int]:
    host, sep, port = addr.rpartition(":")
    if host.startswith("[") != host.endswith("]"):
        raise ConfigError(f"web.listen_address: unbalanced brackets in {addr!r}")
    if not sep or not port.isdigit() or not (0 <= int(port) <= 65535):
        raise ConfigError(f"web.listen_address: expected HOST:PORT or :PORT, got {addr!r}")
    host = host.strip("[]")
    return host or "0.0.0.0", int(port)


def read_api_key(cfg: LlamaConfig) -> str | None:
    """The API key from a file (first non-comment line) or an environment variable. Never logged."""
    if cfg.api_key_file:
        try:
            with open(cfg.api_key_file, encoding="utf-8") as fh:
                for line in fh:
                    line = line.strip()
                    if line and not line.startswith("#"):
                        return line
        except OSError as e:
            raise ConfigError(f"llama.api_key_file: cannot read {cfg.api_key_file}: {e.strerror}") from None
        raise ConfigError(f"llama.api_key_file: {cfg.api_key_file} holds no key")
    key = os.environ.get(cfg.api_key_env, "").strip()
    return key or None


def read_salt(cfg: ConversationsConfig) -> str | None:
    """The pseudonymisation salt from a file or an environment variable; None: a random one."""
    if cfg.salt_file:
        try:
            with open(cfg.salt_file, encoding="utf-8") as fh:
                salt = fh.read().strip()
        except OSError as e:
            raise ConfigError(f"conversations.salt_file: cannot read {cfg.salt_file}: {e.strerror}") from None
        if len(salt) < 16:
            raise ConfigError("conversations.salt_file: the salt must have at least 16 characters")
        return salt
    salt = os.environ.get(cfg.salt_env, "").strip()
    return salt or None


def redact_url(url: str) -> str:
    """The URL as it may be logged: a password in it (http://user:pw@host) is replaced, also in
    a URL without its scheme (user:pw@host: no URL parser sees a password there)."""
    if "://" not in url and "@" in url:
        return "xxxxx@" + url.rpartition("@")[2]
    try:
        parts = urlsplit(url)
        if parts.password is None:
            return url
        host = parts.hostname or ""
        if ":" in host:
            host = f"[{host}]"
        netloc = f"{parts.username}:xxxxx@{host}" + (f":{parts.port}" if parts.port else "")
        return urlunsplit(parts._replace(netloc=netloc))
    except ValueError:
        return "<unparsable URL>"


def position_file(cfg: Config) -> str | None:
    """The file that keeps the read position of llama.log_path across restarts."""
    if cfg.llama.log_position_file:
        return cfg.llama.log_position_file
    if cfg.events.path:
        return cfg.events.path + ".log-position"
    return None
