"""Command line: Prometheus-style flags over the same settings as the YAML file."""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import os
import sys
from datetime import datetime, timezone

from prometheus_client import disable_created_metrics

from . import __version__
from .config import Config, ConfigError, add_flags, flag_values, load_file, override, read_api_key, read_salt, validate
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
            "`llamacpp-exporter analyze --help`: the investigation from logs already on disk. "
            "`llamacpp-exporter check-lora-restore --help`: whether this llama-server has the LoRA restore bug."
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
    a("--version", action="version", version=f"llamacpp-exporter {__version__}")
    return p


def _dest(section: str, name: str) -> str:
    return f"{section}__{name}"


def config_from_args(args: argparse.Namespace) -> Config:
    cfg = load_file(args.config_file) if args.config_file else Config()
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
        from .offline.top import main as top_main  # noqa: PLC0415

        return top_main(argv[1:])
    if argv[:1] == ["check-lora-restore"]:
        from .offline.check_lora_restore import main as check_main  # noqa: PLC0415

        return check_main(argv[1:])
    if argv[:1] == ["analyze"]:
        from .offline.analyze import main as analyze_main  # noqa: PLC0415

        return analyze_main(argv[1:])
    args = build_parser().parse_args(argv)
    setup_logging(args.log__level or "info", args.log__format or "logfmt")
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
