"""Strict configuration: YAML file and command line, one set of frozen dataclasses.

Unknown keys, wrong types and out-of-range values are errors that name the key.
The command line overrides the file; the file overrides the defaults.
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import math
import os
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Final
from urllib.parse import urlsplit

import yaml

DEFAULT_PORT = 10938
DEFAULT_LISTEN = f":{DEFAULT_PORT}"


class ConfigError(ValueError):
    """One or more mistakes of a configuration, each a message naming its key: all of them are
    reported at once, so that a file with four mistakes takes one run to mend, not four."""

    def __init__(self, *messages: str) -> None:
        self.messages = [redact(m) for m in messages]  # a value shown may hold a password
        super().__init__("; ".join(self.messages))


class _Mistakes:
    """Collects the messages of a configuration's mistakes as they are found."""

    def __init__(self) -> None:
        self.messages: list[str] = []

    def add(self, e: ConfigError) -> None:
        self.messages.extend(e.messages)

    def raise_any(self) -> None:
        if self.messages:
            raise ConfigError(*self.messages)


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


def setting(
    default: Any,
    help: str,
    flag: str | None = None,
    metavar: str | None = None,
    bounds: tuple[float, float] | None = None,
    choices: tuple[str, ...] | None = None,
    zero_allowed: bool = False,
    default_text: str | None = None,
) -> Any:
    """One setting, declared once: its YAML key is the field's name, and its default, bounds,
    choices, command-line flag and help live here. The parser (cli.py), the checks (validate)
    and the help text are made from it."""
    meta = {
        "help": help,
        "flag": flag,
        "metavar": metavar,
        "bounds": bounds,
        "choices": choices,
        "zero_allowed": zero_allowed,
        "default_text": default_text,
    }
    return field(default=default, metadata=meta)


@dataclass(frozen=True)
class LlamaConfig:
    url: str | None = setting(
        None,
        "llama-server base URL (default: the address of the log's 'listening on' line; until it is read, "
        "http://127.0.0.1:8080 or :9931, llama-server's default ports, whichever answers)",
        flag="--llama.url",
        metavar="URL",
    )
    api_key_file: str | None = setting(
        None,
        "file holding llama-server's API key (else the environment variable of --llama.api-key-env)",
        flag="--llama.api-key-file",
        metavar="FILE",
    )
    api_key_env: str = setting(
        "LLAMA_API_KEY",
        "environment variable holding llama-server's API key",
        flag="--llama.api-key-env",
        metavar="NAME",
    )
    timeout_seconds: float = setting(
        2.0, "timeout of each request to llama-server", flag="--llama.timeout", metavar="SECONDS", bounds=(0.1, 300.0)
    )
    poll_interval_seconds: float = setting(
        5.0,
        "interval of the periodic polls of /health, /metrics, /slots, /lora-adapters",
        flag="--llama.poll-interval",
        metavar="SECONDS",
        bounds=(0.05, 3600.0),
    )
    poll_slots: bool = setting(
        True, "poll /slots for each task's LoRA and reused tokens", flag="--llama.slots", default_text="on"
    )
    poll_metrics: bool = setting(
        True, "re-export llama-server's /metrics as llamacpp_server_*", flag="--llama.metrics", default_text="on"
    )
    # llama-server's log, the exporter's input
    log_path: str | None = setting(
        None,
        "llama-server log file to follow (rotation and truncation handled), or - for standard input",
        flag="--llama.log-path",
        metavar="FILE",
    )
    log_command: str | None = setting(
        None,
        "command whose output is followed, e.g. 'journalctl -f -n 0 -o cat -u llama-server' or "
        "'docker logs -f --tail 0 llama' (restarted with backoff if it exits; history it prints again is dropped)",
        flag="--llama.log-command",
        metavar="COMMAND",
    )
    log_from_start: bool = setting(
        False,
        "read the log file from its start, counting every request in it (default: from its end; the "
        "server run before that is read again to know its state, without counting its requests)",
        flag="--llama.log-from-start",
    )
    log_poll_interval_seconds: float = setting(
        0.25,
        "how often the log file is checked for new lines",
        flag="--llama.log-poll-interval",
        metavar="SECONDS",
        bounds=(0.01, 60.0),
    )
    log_max_line_bytes: int = setting(
        1 << 20,
        "longest log line read whole; longer ones are counted oversized",
        flag="--llama.log-max-line-bytes",
        metavar="BYTES",
        bounds=(1024, 1 << 30),
    )
    log_position_file: str | None = setting(
        None,
        "where the read position in --llama.log-path is kept, so that a restarted exporter reads on where it "
        "stopped (default: next to --events.path; without either, a restart starts at the log's end)",
        flag="--llama.log-position-file",
        metavar="FILE",
    )


@dataclass(frozen=True)
class LogConfig:
    """The exporter's own log, named as in the Prometheus exporter-toolkit (--log.level, --log.format)."""

    level: str = setting("info", "the exporter's own log level", flag="--log.level", choices=LOG_LEVELS)
    format: str = setting("logfmt", "the exporter's own log format", flag="--log.format", choices=LOG_FORMATS)


@dataclass(frozen=True)
class WebConfig:
    listen_address: str = setting(
        DEFAULT_LISTEN, "address of the exporter's HTTP server", flag="--web.listen-address", metavar="HOST:PORT"
    )
    telemetry_path: str = setting(
        "/metrics", "path of the metrics endpoint", flag="--web.telemetry-path", metavar="PATH"
    )
    config_file: str | None = setting(
        None,
        "TLS and basic auth for the exporter's HTTP server, in the Prometheus exporter-toolkit format "
        "(tls_server_config, basic_auth_users with bcrypt hashes)",
        flag="--web.config.file",
        metavar="FILE",
    )


@dataclass(frozen=True)
class EventsConfig:
    path: str | None = setting(
        None,
        "append one JSON line per request record (numbers and fixed words only, never text); - writes them "
        "to standard output",
        flag="--events.path",
        metavar="FILE",
    )
    # at about 860 bytes a record, 100 MiB hold some 120,000 requests
    max_bytes: int = setting(
        100 << 20,
        "rotate the events file (FILE -> FILE.1 -> ...) before it grows past this (0: never, for your own "
        "logrotate with SIGHUP)",
        flag="--events.max-bytes",
        metavar="BYTES",
        bounds=(4096, 1 << 50),
        zero_allowed=True,
        default_text="104857600, 100 MiB",
    )
    max_files: int = setting(
        5,
        "rotated events files kept, FILE.1 to FILE.N; analyze --events FILE reads them all",
        flag="--events.max-files",
        metavar="N",
        bounds=(0, 1000),
    )


@dataclass(frozen=True)
class CacheConfig:
    min_prompt_tokens: int = setting(
        1024,
        "smallest prompt counted in llamacpp_prompt_cache_outcomes_total",
        flag="--cache.min-prompt-tokens",
        metavar="N",
        bounds=(1, 1 << 30),
    )
    hit_ratio: float = setting(
        0.9,
        "share of its prompt a request reuses to count as a hit",
        flag="--cache.hit-ratio",
        metavar="RATIO",
        bounds=(0.0, 1.0),
    )
    miss_ratio: float = setting(
        0.1,
        "share of its prompt under which a request counts as a miss",
        flag="--cache.miss-ratio",
        metavar="RATIO",
        bounds=(0.0, 1.0),
    )


@dataclass(frozen=True)
class ContentionConfig:
    fraction: float = setting(
        0.1,
        "share of a request's decoding overlapped by other slots' prefills that labels it contended",
        flag="--contention.fraction",
        metavar="RATIO",
        bounds=(0.0, 1.0),
    )


@dataclass(frozen=True)
class TakeoverConfig:
    small_task_tokens: int = setting(
        256,
        "largest prompt of a small task (a health probe)",
        flag="--takeover.small-task-tokens",
        metavar="N",
        bounds=(1, 1 << 30),
    )
    big_conversation_tokens: int = setting(
        1024,
        "smallest slot content that is a big conversation a small task takes over",
        flag="--takeover.big-conversation-tokens",
        metavar="N",
        bounds=(1, 1 << 30),
    )


@dataclass(frozen=True)
class ConversationsConfig:
    salt_file: str | None = setting(
        None,
        "file holding the salt that pseudonymises conversation ids (else $LLAMACPP_EXPORTER_SALT; "
        "else a random salt: pseudonyms then change when the exporter restarts)",
        flag="--conversations.salt-file",
        metavar="FILE",
    )
    salt_env: str = setting(
        "LLAMACPP_EXPORTER_SALT",
        "environment variable holding the salt",
        flag="--conversations.salt-env",
        metavar="NAME",
    )
    window_seconds: float = setting(
        900.0,
        "window of the per-conversation costs and of `top`",
        flag="--conversations.window",
        metavar="SECONDS",
        bounds=(60.0, 7 * 86400.0),
    )
    top: int = setting(
        10,
        "conversations named in the llamacpp_conversation_* metrics, the rest summed as other (it bounds the "
        "metric's series)",
        flag="--conversations.top",
        metavar="N",
        bounds=(1, 100),
    )
    max_tracked: int = setting(
        10000,
        "conversations whose costs are kept",
        flag="--conversations.max-tracked",
        metavar="N",
        bounds=(1, 1 << 24),
    )


# Histogram bounds in seconds. A user waits from a few ms on an idle server to an hour for a
# long generation on a CPU server; the latency objectives of the alert rules (mixin/
# thresholds.yaml) are bounds of these, and must stay bounds of a configured set.
LATENCY_BUCKETS: Final = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 20, 30, 60, 120, 300, 600, 1200, 1800, 3600)
TPOT_BUCKETS: Final = (0.005, 0.01, 0.015, 0.02, 0.025, 0.03, 0.04, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.5, 1, 2, 5)
PREFILL_BUCKETS: Final = (
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1,
    2.5,
    5,
    10,
    20,
    30,
    60,
    120,
    300,
    600,
    1200,
    1800,
    3600,
)
MAX_BUCKETS: Final = 40  # each bound is a series per label set


@dataclass(frozen=True)
class TracesConfig:
    otlp_endpoint: str | None = setting(
        None,
        "send each request's trace over OTLP/HTTP to this collector (Tempo, Jaeger, an OpenTelemetry Collector: "
        "http://tempo:4318); needs pip install 'llamacpp-exporter[otlp]'. Without it OTEL_EXPORTER_OTLP_ENDPOINT "
        "or OTEL_EXPORTER_OTLP_TRACES_ENDPOINT turn traces on",
        flag="--traces.otlp-endpoint",
        metavar="URL",
    )
    max_queued: int = setting(
        10_000,
        "requests whose trace may wait to be sent (a collector down or slow); more are dropped and counted",
        flag="--traces.max-queued",
        metavar="N",
        bounds=(1, 10_000_000),
    )


def bucket_setting(default: tuple[float, ...], of: str, flag: str) -> Any:
    return setting(
        default,
        f"bucket bounds (seconds) of {of}",
        flag=flag,
        metavar="S,S,...",
        default_text=",".join(f"{b:g}" for b in default),
    )


@dataclass(frozen=True)
class MetricsConfig:
    latency_buckets: tuple[float, ...] = bucket_setting(
        LATENCY_BUCKETS,
        "the queue time, time to first token and end-to-end histograms; keep the latency objectives of your alert "
        "rules among them",
        "--metrics.latency-buckets",
    )
    time_per_output_token_buckets: tuple[float, ...] = bucket_setting(
        TPOT_BUCKETS, "the time per output token histogram", "--metrics.time-per-output-token-buckets"
    )
    prefill_duration_buckets: tuple[float, ...] = bucket_setting(
        PREFILL_BUCKETS, "the prefill duration histogram", "--metrics.prefill-duration-buckets"
    )


def bucket_list(text: str) -> tuple[float, ...]:
    """A flag's bucket bounds: numbers separated by commas."""
    try:
        return tuple(float(x) for x in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"bucket bounds are numbers separated by commas, got {text!r}") from None


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
    metrics: MetricsConfig = field(default_factory=MetricsConfig)
    traces: TracesConfig = field(default_factory=TracesConfig)


def settings() -> list[tuple[str, dataclasses.Field[Any]]]:
    """Every setting as (section, field), in declaration order."""
    return [
        (sec.name, f)
        for sec in dataclasses.fields(Config)
        for f in dataclasses.fields(sec.default_factory)  # type: ignore[arg-type]
    ]


def add_flags(parser: argparse.ArgumentParser, prefix: str, cls: Any) -> None:
    """The command-line flags of a settings dataclass's fields that have one; each flag's
    value lands in ``<prefix>__<field>``, None when not given."""
    for f in dataclasses.fields(cls):
        flag = f.metadata.get("flag")
        if flag is None:
            continue  # a setting of the YAML file only
        kw: dict[str, Any] = {"dest": f"{prefix}__{f.name}", "default": None, "help": describe(f)}
        if f.type in ("bool", bool):
            kw["action"] = argparse.BooleanOptionalAction if f.default else "store_true"
        elif f.metadata["choices"] is not None:
            kw["choices"] = list(f.metadata["choices"])
        else:
            kw["metavar"] = f.metadata["metavar"]
            kw["type"] = {"int": int, "float": float, "tuple[float, ...]": bucket_list}.get(str(f.type), str)
        parser.add_argument(flag, **kw)


def flag_values(args: argparse.Namespace, prefix: str, cls: Any) -> dict[str, Any]:
    """The values given on the command line for a settings dataclass (by field name)."""
    out = {}
    for f in dataclasses.fields(cls):
        v = getattr(args, f"{prefix}__{f.name}", None) if f.metadata.get("flag") else None
        if v is not None:
            out[f.name] = v
    return out


def check(obj: Any, name: Callable[[dataclasses.Field[Any]], str]) -> None:
    """The declared bounds and choices of every setting of a settings dataclass instance:
    finite and within what makes sense (inf or nan would stop a thread, 1e-9 would spin it).
    ``name`` names a setting in the error (its key, or its flag). Every mistake is reported."""
    messages = []
    for f in dataclasses.fields(obj):
        v, m = getattr(obj, f.name), f.metadata
        if m.get("choices") is not None and v not in m["choices"]:
            messages.append(f"{name(f)}: one of {', '.join(m['choices'])}")
        if isinstance(v, tuple):
            messages += _bucket_mistakes(name(f), v)
        if m.get("bounds") is None or isinstance(v, bool) or not isinstance(v, (int, float)):
            continue
        lo, hi = m["bounds"]
        if not math.isfinite(v):
            messages.append(f"{name(f)}: must be a finite number, got {v}")
        elif not (lo <= v <= hi) and not (m["zero_allowed"] and v == 0):
            zero = "0 or " if m["zero_allowed"] else ""
            messages.append(f"{name(f)}: must be {zero}a number between {lo:g} and {hi:g}, got {v}")
    if messages:
        raise ConfigError(*messages)


def _bucket_mistakes(key: str, bounds: tuple[float, ...]) -> list[str]:
    if not 1 <= len(bounds) <= MAX_BUCKETS:
        return [f"{key}: between 1 and {MAX_BUCKETS} bounds, got {len(bounds)}"]
    if not all(math.isfinite(b) and b > 0 for b in bounds):
        return [f"{key}: bounds must be finite numbers above 0 (+Inf is always added), got {list(bounds)}"]
    if any(a >= b for a, b in itertools.pairwise(bounds)):
        return [f"{key}: bounds must increase, got {list(bounds)}"]
    return []


def describe(f: dataclasses.Field[Any]) -> str:
    """The help text of a setting, with its default."""
    m = f.metadata
    shown = m["default_text"] if m["default_text"] is not None else f.default
    if shown is None or shown is False:
        return str(m["help"])
    return f"{m['help']} (default {shown})"


def _check_type(path: str, value: Any, typ: Any) -> Any:
    t = str(typ)
    optional = "None" in t
    if value is None:
        if optional:
            return None
        raise ConfigError(f"{path}: must not be empty")
    if t.startswith("tuple"):
        if not isinstance(value, list) or not all(
            isinstance(x, (int, float)) and not isinstance(x, bool) for x in value
        ):
            raise ConfigError(f"{path}: expected a list of numbers, got {value!r}")
        return tuple(float(x) for x in value)
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


def _build(cls: Any, data: Any, path: str, mistakes: _Mistakes) -> Any:
    """The settings of one section; a key with a mistake keeps its default, and the mistake is
    collected, so that every mistake of the file is found in one reading."""
    if data is None:
        data = {}
    if not isinstance(data, dict):
        mistakes.add(ConfigError(f"{path or 'config'}: expected a mapping, got {type(data).__name__}"))
        return cls()
    fields = {f.name: f for f in dataclasses.fields(cls)}
    where = f"{path}." if path else ""
    for name in sorted(set(data) - set(fields), key=str):
        mistakes.add(ConfigError(f"unknown key {where}{name} (known: {', '.join(sorted(fields))})"))
    kwargs = {}
    for name, f in fields.items():
        if name not in data:
            continue
        key = f"{path}.{name}" if path else name
        if dataclasses.is_dataclass(f.default_factory) if f.default_factory is not dataclasses.MISSING else False:
            kwargs[name] = _build(f.default_factory, data[name], key, mistakes)
        else:
            try:
                kwargs[name] = _check_type(key, data[name], f.type)
            except ConfigError as e:
                mistakes.add(e)
    return cls(**kwargs)


def load_file(path: str) -> Config:
    cfg, mistakes = load_file_and_mistakes(path)
    if mistakes:
        raise ConfigError(*mistakes)
    return cfg


def load_file_and_mistakes(path: str) -> tuple[Config, list[str]]:
    """The file's configuration, each mistaken key at its default, and every mistake found."""
    try:
        with open(path, encoding="utf-8") as fh:
            data = yaml.safe_load(fh)
    except OSError as e:
        return Config(), [f"cannot read config file {path}: {e.strerror}"]
    except yaml.YAMLError as e:
        return Config(), [f"config file {path} is not valid YAML: {e}"]
    except UnicodeDecodeError:
        return Config(), [f"config file {path} is not text (UTF-8 YAML expected)"]
    mistakes = _Mistakes()
    if isinstance(data, dict) and isinstance(data.get("log"), dict):
        for old, new in _MOVED.items():
            if old in data["log"]:
                mistakes.add(ConfigError(f"log.{old} is now {new} (log: is the exporter's own log: level, format)"))
                del data["log"][old]
    return _build(Config, data, "", mistakes), mistakes.messages


def override(cfg: Config, section: str, **values: Any) -> Config:
    """Apply command-line values that were given (not None) to one section."""
    given = {k: v for k, v in values.items() if v is not None}
    if not given:
        return cfg
    return dataclasses.replace(cfg, **{section: dataclasses.replace(getattr(cfg, section), **given)})


def validate(cfg: Config) -> Config:
    """Every rule over the settings together; all mistakes reported at once."""
    mistakes = _Mistakes()
    lc = cfg.llama
    if lc.log_path and lc.log_command:
        mistakes.add(
            ConfigError(
                "llama.log_path and llama.log_command are exclusive: follow a file (or - for stdin) or a command"
            )
        )
    for url_key, url in (("llama.url", cfg.llama.url), ("traces.otlp_endpoint", cfg.traces.otlp_endpoint)):
        if url is not None:
            try:
                _check_url(url, url_key)
            except ConfigError as e:
                mistakes.add(e)
    for sec in dataclasses.fields(cfg):

        def key(f: dataclasses.Field[Any], section: str = sec.name) -> str:
            return f"{section}.{f.name}"

        try:
            check(getattr(cfg, sec.name), key)
        except ConfigError as e:
            mistakes.add(e)
    c = cfg.cache
    if not (0 <= c.miss_ratio <= c.hit_ratio <= 1):
        mistakes.add(ConfigError("cache: need 0 <= miss_ratio <= hit_ratio <= 1"))
    cv = cfg.conversations
    if cv.max_tracked < cv.top:
        mistakes.add(ConfigError("conversations.max_tracked: must be at least conversations.top"))
    try:
        parse_listen_address(cfg.web.listen_address)
    except ConfigError as e:
        mistakes.add(e)
    tp = cfg.web.telemetry_path
    if not tp.startswith("/") or tp == "/" or any(c in tp for c in "?#% ") or tp.startswith("/-/"):
        mistakes.add(
            ConfigError(
                f"web.telemetry_path: a plain path that starts with / (not /, /-/..., no ?, #, % or space), got {tp!r}"
            )
        )
    mistakes.raise_any()
    return cfg


def _check_url(url: str, key: str = "llama.url") -> None:
    if not url.startswith(("http://", "https://")):
        raise ConfigError(f"{key}: must start with http:// or https://, got {url!r}")
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 - raises on a bad port
    except ValueError as e:
        raise ConfigError(f"{key}: not a URL ({e}): {url!r}") from None
    if not parts.hostname:
        raise ConfigError(f"{key}: no host in {url!r}")


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


# a password in user:password@ (of a URL, with or without its scheme); greedy to the last @
# of the word, as URL parsers split
_USERINFO = re.compile(r"((?:[A-Za-z][A-Za-z0-9+.-]*://)?[^\s:/@'\"\[\]{},]*):(?!//)[^\s'\"]*@")


def redact(text: str) -> str:
    """The one redaction of every message the exporter writes (configuration errors, its log,
    its start line, /-/ready): a password in ``user:password@`` is replaced, wherever it stands
    (a URL, a URL without its scheme, a list or mapping shown as a value)."""
    return _USERINFO.sub(r"\1:xxxxx@", text)


def position_file(cfg: Config) -> str | None:
    """The file that keeps the read position of llama.log_path across restarts."""
    if cfg.llama.log_position_file:
        return cfg.llama.log_position_file
    if cfg.events.path and cfg.events.path != "-":
        return cfg.events.path + ".log-position"
    return None
