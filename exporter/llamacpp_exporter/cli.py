"""Command line: Prometheus-style flags over the same settings as the YAML file."""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import os
import sys
import textwrap
from collections.abc import Callable
from datetime import datetime, timezone
from typing import NoReturn

from prometheus_client import disable_created_metrics

from . import __version__, log_reading
from .config import (
    Config,
    ConfigError,
    add_flags,
    flag_values,
    load_file_and_mistakes,
    override,
    read_api_key,
    read_salt,
    redact,
    validate,
)
from .export import otlp
from .export.web_config import load_web_config

log = logging.getLogger("llamacpp_exporter")


# the subcommands, each with its own flags (--help)
COMMANDS = {
    "analyze": "the investigation from logs or events files already on disk: a report, findings, plots",
    "top": "the live table of conversations by the time their prefills cost others",
    "check-lora-restore": "whether this llama-server build has the LoRA restore bug",
}


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        super().error(redact(message))  # a flag's value may hold a password


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(
        prog="llamacpp-exporter",
        usage="%(prog)s [flags]\n       %(prog)s {" + ",".join(COMMANDS) + "} [flags]  (each with --help)",
        description=textwrap.fill(
            "Prometheus exporter for llama.cpp's llama-server. Tails its log, polls /slots, "
            "/metrics and /health, assembles one record per request and serves metrics. "
            "Run llama-server with -lv 4 for the RAM prompt-cache diagnostics.",
            width=100,
        ),
        epilog=(
            "commands:\n"
            + "".join(f"  {name:<20}{what}\n" for name, what in COMMANDS.items())
            + "\nEvery flag also has a key in the --config.file YAML (README, Configuration)."
        ),
        formatter_class=argparse.RawDescriptionHelpFormatter,
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
    for sec in dataclasses.fields(Config):
        add_flags(p, sec.name, sec.default_factory)
    # the names before 0.1: --log.* is the exporter's own log in every exporter-toolkit exporter
    for old, dest, kw in (
        ("--log.path", "old_log_path", {}),
        ("--log.command", "old_log_command", {}),
        ("--log.from-start", "old_from_start", {"action": "store_true"}),
        ("--log.poll-interval", "old_log_poll", {"type": float}),
    ):
        a(old, dest=dest, default=None, help=argparse.SUPPRESS, **kw)
    a("--version", action="version", version=f"llamacpp-exporter {__version__} (log reading {log_reading()})")
    return p


def _dest(section: str, name: str) -> str:
    return f"{section}__{name}"


def config_from_args(args: argparse.Namespace) -> Config:
    """The file's settings under the flags', checked; every mistake reported at once."""
    cfg, mistakes = load_file_and_mistakes(args.config_file) if args.config_file else (Config(), [])
    for old, new, old_flag, new_flag in (
        ("old_log_path", "llama__log_path", "--log.path", "--llama.log-path"),
        ("old_log_command", "llama__log_command", "--log.command", "--llama.log-command"),
        ("old_from_start", "llama__log_from_start", "--log.from-start", "--llama.log-from-start"),
        ("old_log_poll", "llama__log_poll_interval_seconds", "--log.poll-interval", "--llama.log-poll-interval"),
    ):
        if getattr(args, old) is not None:
            log.warning("%s is deprecated: use %s (--log.* is the exporter's own log)", old_flag, new_flag)
            if getattr(args, new) is None:
                setattr(args, new, getattr(args, old))
    for sec in dataclasses.fields(Config):
        cfg = override(cfg, sec.name, **flag_values(args, sec.name, sec.default_factory))
    checks: list[Callable[[], object]] = [
        lambda: validate(cfg),
        lambda: read_api_key(cfg.llama),  # a missing key file is a config error, found now
        lambda: read_salt(cfg.conversations),
    ]
    if cfg.traces.otlp_endpoint and not otlp.available():
        mistakes.append(
            f"traces.otlp_endpoint: sending traces needs the OpenTelemetry SDK and its OTLP/HTTP exporter: "
            f"{otlp.EXTRA_HINT}, into the environment the exporter runs in ({sys.executable} -m pip install "
            f"opentelemetry-sdk opentelemetry-exporter-otlp-proto-http)"
        )
    if cfg.web.config_file:
        web_file = cfg.web.config_file
        checks.append(lambda: load_web_config(web_file))  # a bad TLS or auth file, found now
    for run_check in checks:
        try:
            run_check()
        except ConfigError as e:
            mistakes.extend(e.messages)
    if mistakes:
        raise ConfigError(*mistakes)
    return cfg


class _Formatter(logging.Formatter):
    """logfmt or JSON lines, with the keys of the exporter-toolkit's logs (time, level, source, msg)."""

    def __init__(self, fmt: str) -> None:
        super().__init__()
        self.json = fmt == "json"

    def format(self, record: logging.LogRecord) -> str:
        t = datetime.fromtimestamp(record.created, timezone.utc).isoformat(timespec="milliseconds")
        fields = {"time": t, "level": record.levelname.lower().replace("warning", "warn"), "source": record.name}
        fields["msg"] = redact(record.getMessage())  # never a password, whatever a message holds
        if record.exc_info:
            fields["err"] = redact(self.formatException(record.exc_info))
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
        from .live.top import main as top_main  # noqa: PLC0415

        return top_main(argv[1:])
    if argv[:1] == ["check-lora-restore"]:
        from .live.check_lora_restore import main as check_main  # noqa: PLC0415

        return check_main(argv[1:])
    if argv[:1] == ["analyze"]:
        from .offline.analyze import main as analyze_main  # noqa: PLC0415

        return analyze_main(argv[1:])
    args = build_parser().parse_args(argv)
    setup_logging(args.log__level or "info", args.log__format or "logfmt")
    try:
        cfg = config_from_args(args)
    except ConfigError as e:
        for message in e.messages:
            print(f"llamacpp-exporter: configuration error: {message}", file=sys.stderr)
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
