"""Command line: Prometheus-style flags over the same settings as the YAML file."""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from datetime import datetime, timezone

from prometheus_client import disable_created_metrics

from . import __version__
from .config import DEFAULT_LISTEN, Config, ConfigError, load_file, override, read_api_key, read_salt, validate
from .export.web_config import load_web_config

log = logging.getLogger("llamacpp_exporter")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="llamacpp-exporter",
        description=(
            "Prometheus exporter for llama.cpp's llama-server. Tails its log, polls /slots, "
            "/metrics and /health, assembles one record per request and serves metrics. "
            "Run llama-server with -lv 4 for the RAM prompt-cache diagnostics. "
            "`llamacpp-exporter top --help`: the live table of conversations by cost. "
            "`llamacpp-exporter analyze --help`: the investigation from logs already on disk."
        ),
    )
    a = p.add_argument
    a(
        "--config.file",
        dest="config_file",
        metavar="FILE",
        default=None,
        help="YAML configuration file (strict: unknown keys are errors). Flags override it.",
    )
    a(
        "--config.check",
        dest="config_check",
        action="store_true",
        help="validate the configuration, print the result and exit (0 valid, 1 invalid)",
    )
    a(
        "--llama.url",
        dest="llama_url",
        metavar="URL",
        default=None,
        help="llama-server base URL (default http://127.0.0.1:8080)",
    )
    a(
        "--llama.api-key-file",
        dest="api_key_file",
        metavar="FILE",
        default=None,
        help="file holding llama-server's API key (else the environment variable of --llama.api-key-env)",
    )
    a(
        "--llama.api-key-env",
        dest="api_key_env",
        metavar="NAME",
        default=None,
        help="environment variable holding llama-server's API key (default LLAMA_API_KEY)",
    )
    a(
        "--llama.timeout",
        dest="timeout",
        type=float,
        metavar="SECONDS",
        default=None,
        help="timeout of each request to llama-server (default 2)",
    )
    a(
        "--llama.poll-interval",
        dest="poll_interval",
        type=float,
        metavar="SECONDS",
        default=None,
        help="interval of the periodic polls of /health, /metrics, /slots, /lora-adapters (default 5)",
    )
    a(
        "--llama.slots",
        dest="poll_slots",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="poll /slots for each task's LoRA and reused tokens (default on)",
    )
    a(
        "--llama.metrics",
        dest="poll_metrics",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="re-export llama-server's /metrics as llamacpp_server_* (default on)",
    )
    a(
        "--llama.log-path",
        dest="log_path",
        metavar="FILE",
        default=None,
        help="llama-server log file to follow (rotation and truncation handled), or - for standard input",
    )
    a(
        "--llama.log-command",
        dest="log_command",
        metavar="COMMAND",
        default=None,
        help="command whose output is followed, e.g. 'journalctl -f -n 0 -o cat -u llama-server' or "
        "'docker logs -f --tail 0 llama' (restarted with backoff if it exits; history it prints again is dropped)",
    )
    a(
        "--llama.log-position-file",
        dest="log_position_file",
        metavar="FILE",
        default=None,
        help="where the read position in --llama.log-path is kept, so that a restarted exporter reads on where it "
        "stopped (default: next to --events.path; without either, a restart starts at the log's end)",
    )
    a(
        "--llama.log-from-start",
        dest="from_start",
        action="store_true",
        default=None,
        help=(
            "read the log file from its start, counting every request in it (default: from its end; the "
            "server run before that is read again to know its state, without counting its requests)"
        ),
    )
    a(
        "--llama.log-poll-interval",
        dest="log_poll",
        type=float,
        metavar="SECONDS",
        default=None,
        help="how often the log file is checked for new lines (default 0.25)",
    )
    a(
        "--web.listen-address",
        dest="listen",
        metavar="HOST:PORT",
        default=None,
        help=f"address of the exporter's HTTP server (default {DEFAULT_LISTEN})",
    )
    a(
        "--web.config.file",
        dest="web_config_file",
        metavar="FILE",
        default=None,
        help="TLS and basic auth for the exporter's HTTP server, in the Prometheus exporter-toolkit format "
        "(tls_server_config, basic_auth_users with bcrypt hashes)",
    )
    a(
        "--web.telemetry-path",
        dest="telemetry_path",
        metavar="PATH",
        default=None,
        help="path of the metrics endpoint (default /metrics)",
    )
    a(
        "--events.path",
        dest="events_path",
        metavar="FILE",
        default=None,
        help="append one JSON line per request record (numbers and fixed words only, never text)",
    )
    a(
        "--events.max-bytes",
        dest="events_max_bytes",
        type=int,
        metavar="BYTES",
        default=None,
        help="rotate the events file (FILE -> FILE.1 -> ...) before it grows past this (default 104857600, "
        "100 MiB; 0: never, for your own logrotate with SIGHUP)",
    )
    a(
        "--events.max-files",
        dest="events_max_files",
        type=int,
        metavar="N",
        default=None,
        help="rotated events files kept, FILE.1 to FILE.N (default 5); analyze --events FILE reads them all",
    )
    a(
        "--cache.min-prompt-tokens",
        dest="min_prompt_tokens",
        type=int,
        metavar="N",
        default=None,
        help="smallest prompt counted in llamacpp_prompt_cache_outcomes_total (default 1024)",
    )
    a(
        "--conversations.salt-file",
        dest="salt_file",
        metavar="FILE",
        default=None,
        help="file holding the salt that pseudonymises conversation ids (else $LLAMACPP_EXPORTER_SALT; "
        "else a random salt: pseudonyms then change when the exporter restarts)",
    )
    a(
        "--conversations.window",
        dest="conv_window",
        type=float,
        metavar="SECONDS",
        default=None,
        help="window of the per-conversation costs and of `top` (default 900)",
    )
    a(
        "--conversations.top",
        dest="conv_top",
        type=int,
        metavar="N",
        default=None,
        help="conversations named in the llamacpp_conversation_* metrics, the rest summed as other (default 10)",
    )
    a(
        "--log.level",
        dest="log_level",
        default=None,
        choices=["debug", "info", "warn", "error"],
        help="the exporter's own log level (default info)",
    )
    a(
        "--log.format",
        dest="log_format",
        default=None,
        choices=["logfmt", "json"],
        help="the exporter's own log format (default logfmt)",
    )
    # the names before 0.1: --log.* is the exporter's own log in every exporter-toolkit exporter
    for old, dest, kw in (
        ("--log.path", "old_log_path", {}),
        ("--log.command", "old_log_command", {}),
        ("--log.from-start", "old_from_start", {"action": "store_true"}),
        ("--log.poll-interval", "old_log_poll", {"type": float}),
    ):
        a(old, dest=dest, default=None, help=argparse.SUPPRESS, **kw)
    a("--version", action="version", version=f"llamacpp-exporter {__version__}")
    return p


def config_from_args(args: argparse.Namespace) -> Config:
    cfg = load_file(args.config_file) if args.config_file else Config()
    for old, new, old_flag, new_flag in (
        ("old_log_path", "log_path", "--log.path", "--llama.log-path"),
        ("old_log_command", "log_command", "--log.command", "--llama.log-command"),
        ("old_from_start", "from_start", "--log.from-start", "--llama.log-from-start"),
        ("old_log_poll", "log_poll", "--log.poll-interval", "--llama.log-poll-interval"),
    ):
        if getattr(args, old) is not None:
            log.warning("%s is deprecated: use %s (--log.* is the exporter's own log)", old_flag, new_flag)
            if getattr(args, new) is None:
                setattr(args, new, getattr(args, old))
    cfg = override(
        cfg,
        "llama",
        url=args.llama_url,
        api_key_file=args.api_key_file,
        api_key_env=args.api_key_env,
        timeout_seconds=args.timeout,
        poll_interval_seconds=args.poll_interval,
        poll_slots=args.poll_slots,
        poll_metrics=args.poll_metrics,
        log_path=args.log_path,
        log_command=args.log_command,
        log_from_start=args.from_start,
        log_position_file=args.log_position_file,
        log_poll_interval_seconds=args.log_poll,
    )
    cfg = override(cfg, "log", level=args.log_level, format=args.log_format)
    cfg = override(
        cfg, "web", listen_address=args.listen, telemetry_path=args.telemetry_path, config_file=args.web_config_file
    )
    cfg = override(
        cfg, "events", path=args.events_path, max_bytes=args.events_max_bytes, max_files=args.events_max_files
    )
    cfg = override(cfg, "cache", min_prompt_tokens=args.min_prompt_tokens)
    cfg = override(cfg, "conversations", salt_file=args.salt_file, window_seconds=args.conv_window, top=args.conv_top)
    validate(cfg)
    read_api_key(cfg.llama)  # a missing key file is a config error, found now
    read_salt(cfg.conversations)
    if cfg.web.config_file:
        load_web_config(cfg.web.config_file)  # a bad TLS or auth file is a config error, found now
    return cfg


class _Formatter(logging.Formatter):
    """logfmt or JSON lines, with the keys of the exporter-toolkit's logs (time, level, source, msg)."""

    def __init__(self, fmt: str) -> None:
        super().__init__()
        self.json = fmt == "json"

    def format(self, record: logging.LogRecord) -> str:
        t = datetime.fromtimestamp(record.created, timezone.utc).isoformat(timespec="milliseconds")
        fields = {"time": t, "level": record.levelname.lower().replace("warning", "warn"), "source": record.name}
        fields["msg"] = record.getMessage()
        if record.exc_info:
            fields["err"] = self.formatException(record.exc_info)
        if self.json:
            return json.dumps(fields)
        return " ".join(f"{k}={_logfmt_value(v)}" for k, v in fields.items())


def _logfmt_value(v: str) -> str:
    if v and not any(c in v for c in ' ="\n\\'):
        return v
    return json.dumps(v)


def setup_logging(level: str, fmt: str) -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(_Formatter(fmt))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(getattr(logging, level.upper(), logging.INFO))
    logging.getLogger("httpx").setLevel(logging.WARNING)  # one line per poll otherwise


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["top"]:
        from .export.top import main as top_main  # noqa: PLC0415

        return top_main(argv[1:])
    if argv[:1] == ["analyze"]:
        from .offline.analyze import main as analyze_main  # noqa: PLC0415

        return analyze_main(argv[1:])
    args = build_parser().parse_args(argv)
    setup_logging(args.log_level or "info", args.log_format or "logfmt")
    try:
        cfg = config_from_args(args)
    except ConfigError as e:
        print(f"llamacpp-exporter: configuration error: {e}", file=sys.stderr)
        return 1
    setup_logging(cfg.log.level, cfg.log.format)
    if args.config_check:
        print("configuration is valid")
        return 0
    os.environ.setdefault("PROMETHEUS_DISABLE_CREATED_SERIES", "True")
    disable_created_metrics()
    from .app import run  # noqa: PLC0415 - keep --help and --config.check light

    try:
        return run(cfg)
    except OSError as e:
        print(f"llamacpp-exporter: cannot start: {e}", file=sys.stderr)
        return 1
