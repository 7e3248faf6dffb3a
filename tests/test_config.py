"""Strict configuration and the command line."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, cast

import httpx
import pytest
import yaml

from llamacpp_exporter.cli import build_parser, config_from_args
from llamacpp_exporter.config import ConfigError, load_file, load_file_and_mistakes, read_api_key, settings, validate

CONF = Path(__file__).parent / "fixtures" / "config"


def cli(*args: str, env: dict[str, Any] | None = None) -> subprocess.CompletedProcess[Any]:
    return subprocess.run(
        [sys.executable, "-m", "llamacpp_exporter", *args], capture_output=True, text=True, env=env, timeout=30
    )


def test_good_file() -> None:
    cfg = validate(load_file(str(CONF / "good.yaml")))
    assert cfg.llama.timeout_seconds == 1.5 and cfg.cache.min_prompt_tokens == 2048
    assert cfg.cache.miss_ratio == 0.1  # default kept


@pytest.mark.parametrize(
    "name,message",
    [
        ("bad-unknown-key", "unknown key llama.tiemout_seconds"),
        ("bad-url", "llama.url"),
        ("bad-type", "cache.min_prompt_tokens: expected an integer"),
        ("bad-two-sources", "exclusive"),
        ("bad-thresholds", "miss_ratio <= hit_ratio"),
        ("bad-yaml", "not valid YAML"),
        ("bad-moved-key", "log.path is now llama.log_path"),
    ],
)
def test_bad_files_name_the_problem(name: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message.replace(".", r"\.").replace("(", r"\(")):
        validate(load_file(str(CONF / f"{name}.yaml")))


def test_flags_override_the_file() -> None:
    args = build_parser().parse_args(
        [
            "--config.file",
            str(CONF / "good.yaml"),
            "--llama.url",
            "http://10.0.0.1:9",
            "--cache.min-prompt-tokens",
            "10",
        ]
    )
    cfg = config_from_args(args)
    assert cfg.llama.url == "http://10.0.0.1:9" and cfg.cache.min_prompt_tokens == 10
    assert cfg.llama.timeout_seconds == 1.5


@pytest.mark.integration
def test_config_check_exit_codes() -> None:
    ok = cli("--config.check", "--config.file", str(CONF / "good.yaml"))
    assert ok.returncode == 0 and "valid" in ok.stdout
    bad = cli("--config.check", "--config.file", str(CONF / "bad-unknown-key.yaml"))
    assert bad.returncode == 1 and "tiemout_seconds" in bad.stderr
    assert cli("--config.check", "--web.listen-address", "nonsense").returncode == 1


@pytest.mark.integration
def test_help_lists_every_setting() -> None:
    out = cli("--help").stdout
    for flag in (
        "--llama.url",
        "--llama.log-path",
        "--llama.log-command",
        "--llama.log-from-start",
        "--web.listen-address",
        "--config.file",
        "--config.check",
        "--events.path",
        "--llama.api-key-file",
        "--log.level",
        "--log.format",
        "--web.config.file",
        "-lv 4",
    ):
        assert flag in out
    assert "--log.path" not in out  # accepted for a while, not advertised


@pytest.mark.integration
def test_input_and_own_log_flags_follow_the_exporter_toolkit_names(tmp_path: Path) -> None:
    """--log.* is the exporter's own log (as in every exporter-toolkit exporter); llama-server's
    log, the input, is --llama.log-*. The names used before still work, with a warning."""
    cfg = config_from_args(build_parser().parse_args(["--config.file", str(CONF / "good.yaml")]))
    assert cfg.llama.log_path == "/var/log/llama-server.log" and (cfg.log.level, cfg.log.format) == ("debug", "json")
    res = cli("--config.check", "--log.path", "/var/log/x.log", "--log.format", "json")
    assert res.returncode == 0 and "--log.path is deprecated: use --llama.log-path" in res.stderr
    line = next(x for x in res.stderr.splitlines() if "deprecated" in x)
    assert json.loads(line)["level"] == "warn"
    res = cli("--config.check", "--log.path", "/var/log/x.log")
    assert 'level=warn source=llamacpp_exporter msg="--log.path is deprecated' in res.stderr


@pytest.mark.integration
def test_api_key_from_file_or_env_never_printed(tmp_path: Path) -> None:
    key = tmp_path / "key"
    key.write_text("# comment\ns3cr3t-key\n")
    args = build_parser().parse_args(["--llama.api-key-file", str(key)])
    assert read_api_key(config_from_args(args).llama) == "s3cr3t-key"
    args = build_parser().parse_args(["--llama.api-key-env", "MY_KEY"])
    import os

    os.environ["MY_KEY"] = "from-env"
    try:
        assert read_api_key(config_from_args(args).llama) == "from-env"
    finally:
        del os.environ["MY_KEY"]
    res = cli("--config.check", "--llama.api-key-file", str(key))
    assert "s3cr3t" not in res.stdout + res.stderr
    missing = cli("--config.check", "--llama.api-key-file", str(tmp_path / "nope"))
    assert missing.returncode == 1 and "api_key_file" in missing.stderr


@pytest.mark.integration
@pytest.mark.parametrize(
    "args, key",
    [
        (["--llama.poll-interval", "inf"], "llama.poll_interval_seconds"),
        (["--llama.timeout", "nan"], "llama.timeout_seconds"),
        (["--llama.log-poll-interval", "inf"], "llama.log_poll_interval_seconds"),
        (["--llama.log-poll-interval", "1e-9"], "llama.log_poll_interval_seconds"),
        (["--llama.url", "http://[::1"], "llama.url"),
        (["--llama.url", "http://host:99999"], "llama.url"),
        (["--web.telemetry-path", "/metrics?x"], "web.telemetry_path"),
        (["--web.listen-address", "[::1:10938"], "web.listen_address"),
    ],
)
def test_values_that_would_stop_or_spin_a_thread_are_rejected_by_name(args: list[str], key: str) -> None:
    res = cli("--config.check", *args)
    assert res.returncode == 1 and key in res.stderr and "Traceback" not in res.stderr, res.stderr


@pytest.mark.integration
@pytest.mark.parametrize(
    "text, key",
    [
        ("llama:\n  poll_interval_seconds: .inf\n", "llama.poll_interval_seconds"),
        ("llama:\n  timeout_seconds: .nan\n", "llama.timeout_seconds"),
        ("cache:\n  hit_ratio: .nan\n", "cache"),
    ],
)
def test_infinite_and_nan_in_the_file_are_rejected(tmp_path: Path, text: str, key: str) -> None:
    f = tmp_path / "c.yaml"
    f.write_text(text)
    res = cli("--config.check", "--config.file", str(f))
    assert res.returncode == 1 and key in res.stderr and "Traceback" not in res.stderr, res.stderr


@pytest.mark.integration
def test_a_binary_config_file_is_a_clear_error(tmp_path: Path) -> None:
    f = tmp_path / "c.yaml"
    f.write_bytes(bytes(range(256)) * 4)
    res = cli("--config.check", "--config.file", str(f))
    assert res.returncode == 1 and "configuration error" in res.stderr and "Traceback" not in res.stderr


@pytest.mark.integration
@pytest.mark.parametrize(
    "url", ["user:Pw0rd@127.0.0.1:8080", "http://user:Pw0rd@127.0.0.1:notaport", "ftp://u:Pw0rd@h"]
)
def test_config_check_never_prints_a_password_from_the_url(url: str) -> None:
    res = subprocess.run(
        [sys.executable, "-m", "llamacpp_exporter", "--config.check", "--llama.url", url],
        capture_output=True,
        text=True,
    )
    assert res.returncode != 0 and "Pw0rd" not in res.stdout + res.stderr, res.stderr


def test_each_setting_is_declared_once_and_the_flags_help_and_checks_are_made_from_it() -> None:
    from llamacpp_exporter.config import describe, settings

    parser = build_parser()
    flags = {a.option_strings[0]: a for a in parser._actions if a.option_strings}
    for section, f in settings():
        m = f.metadata
        assert m["help"], f"{section}.{f.name} has no help"
        if m["flag"] is not None:
            # the flag's help carries the declared default; its value goes to the same key
            assert flags[m["flag"]].help == describe(f)
            assert m["flag"].startswith(f"--{section}."), m["flag"]
        if m["bounds"] is not None:
            lo, hi = m["bounds"]
            below = lo - 1 if isinstance(f.default, int) else lo / 2 - 1
            # the same bound from the YAML file and from the command line, with the same message
            import dataclasses

            from llamacpp_exporter.config import Config

            bad = dataclasses.replace(
                Config(),
                **{
                    section: dataclasses.replace(
                        getattr(Config(), section), **{f.name: cast(Any, type(f.default))(below)}
                    )
                },
            )
            if m["zero_allowed"] and below == 0:
                continue
            with pytest.raises(ConfigError, match=f"{section}.{f.name}: must be"):
                validate(bad)
            if m["flag"] is not None:
                with pytest.raises(ConfigError, match=f"{section}.{f.name}: must be"):
                    config_from_args(parser.parse_args([m["flag"], str(cast(Any, type(f.default))(below))]))


def test_analyze_checks_its_flags_by_the_same_declarations(capsys: pytest.CaptureFixture[str]) -> None:
    from llamacpp_exporter.offline import analyze

    log = str(Path(__file__).parent / "fixtures" / "logs" / "lv4-np2-text.log")
    for flag, value in (("--top", "0"), ("--gap", "inf"), ("--min-prompt-tokens", "0"), ("--openmetrics-step", "0")):
        assert analyze.main([log, flag, value]) == 2
        assert f"{flag}: must be" in capsys.readouterr().err


def readme_configuration() -> str:
    """The YAML example of the README's Configuration section, as written."""
    section = (Path(__file__).parents[1] / "README.md").read_text().split("## Configuration", 1)[1]
    return section.split("```yaml\n", 1)[1].split("```", 1)[0]


@pytest.mark.integration
def test_the_readme_example_configuration_passes_config_check_on_a_clean_machine(tmp_path: Path) -> None:
    f = tmp_path / "config.yaml"
    f.write_text(readme_configuration())
    env = {k: v for k, v in os.environ.items() if k not in ("LLAMA_API_KEY", "LLAMACPP_EXPORTER_SALT")}
    res = cli("--config.check", "--config.file", str(f), env=env)
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == "configuration is valid"


def test_the_readme_example_shows_every_setting_and_each_has_a_flag() -> None:
    # the keys shown commented out (files a clean machine does not have) count as shown
    shown = yaml.safe_load(re.sub(r"^(\s+)# (\w+:)", r"\1\2", readme_configuration(), flags=re.M))
    for section, f in settings():
        assert f.name in shown[section], f"{section}.{f.name} is not in the README's example configuration"
        assert f.metadata["flag"] and f.metadata["flag"].startswith(f"--{section}."), f"{section}.{f.name}"


def test_every_mistake_of_a_file_is_reported_at_once(tmp_path: Path) -> None:
    f = tmp_path / "config.yaml"
    f.write_text(
        "llama:\n  url: [http://a]\n  timeout_seconds: -1\n  bogus: 1\n"
        "web:\n  listen_address: nonsense\ncache:\n  hit_ratio: 3\nunknown_section: {}\n"
    )
    with pytest.raises(ConfigError) as e:
        config_from_args(build_parser().parse_args(["--config.file", str(f), "--conversations.top", "0"]))
    keys = [m.split(":")[0].removeprefix("unknown key ").split(" ")[0] for m in e.value.messages]
    assert keys == [
        "unknown_section",
        "llama.bogus",
        "llama.url",
        "llama.timeout_seconds",
        "cache.hit_ratio",
        "conversations.top",
        "cache",
        "web.listen_address",
    ], e.value.messages


@pytest.mark.integration
def test_config_check_prints_one_line_per_mistake(tmp_path: Path) -> None:
    f = tmp_path / "config.yaml"
    f.write_text("llama:\n  timeout_seconds: -1\n  bogus: 1\ncache:\n  hit_ratio: 3\n")
    res = cli("--config.check", "--config.file", str(f))
    assert res.returncode == 1
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 4 and all(line.startswith("llamacpp-exporter: configuration error: ") for line in lines), lines


def test_help_lists_the_subcommands() -> None:
    text = build_parser().format_help()
    for command in ("analyze", "top", "check-lora-restore"):
        assert re.search(rf"^  {command} +\S", text, re.M), command


CANARY = "CanaryPassw0rd"


@pytest.mark.integration
@pytest.mark.parametrize(
    "how",
    [
        ["file", "llama:\n  url: http://u:{pw}@h:99999\n"],
        ["file", "llama:\n  url: [http://u:{pw}@h:8080]\n"],  # a wrong type: the value is shown
        ["file", "llama:\n  url: {{nested: http://u:{pw}@h:8080}}\n"],
        ["file", "llama:\n  url: u:{pw}@h:8080\n"],  # no scheme
        ["file", "llama:\n  url: 'http://u:{pw}@h:8080\n  bad: [\n"],  # not YAML: the parser quotes the line
        ["file", "llama:\n  timeout_seconds: http://u:{pw}@h\nweb:\n  listen_address: http://u:{pw}@h:1\n"],
        ["file", "conversations:\n  salt_env: [http://u:{pw}@h]\n"],
        ["flags", "--llama.url", "http://u:{pw}@h:99999"],
        ["flags", "--llama.timeout", "http://u:{pw}@h"],  # argparse's own error
        ["flags", "--web.listen-address", "u:{pw}@h:x"],
        ["flags", "--web.telemetry-path", "/u:{pw}@h?"],
        ["flags", "--traces.otlp-endpoint", "u:{pw}@tempo:4318"],  # no scheme: the value is shown
        ["web", "basic_auth_users:\n  prometheus: {pw}\n"],  # a password where a hash belongs
    ],
    ids=lambda how: f"{how[0]}-{'-'.join(how[1:])[:40]}",
)
def test_a_password_in_any_configuration_reaches_no_message(tmp_path: Path, how: list[str]) -> None:
    kind, *rest = how
    rest = [r.format(pw=CANARY) for r in rest]
    args = ["--config.check"]
    if kind == "file":
        (tmp_path / "c.yaml").write_text(rest[0])
        args += ["--config.file", str(tmp_path / "c.yaml")]
    elif kind == "web":
        (tmp_path / "web.yml").write_text(rest[0])
        args += ["--web.config.file", str(tmp_path / "web.yml")]
    else:
        args += rest
    res = cli(*args, env={**os.environ, "LLAMA_API_KEY": CANARY})
    assert res.returncode != 0, res
    assert CANARY not in res.stdout + res.stderr, res.stderr
    if kind != "web" and "not valid YAML" not in res.stderr:
        assert "xxxxx" in res.stderr, res.stderr  # the message still shows the value, redacted


@pytest.mark.integration
def test_a_password_in_the_url_reaches_neither_the_log_at_debug_nor_ready(tmp_path: Path) -> None:
    from realserver import ExporterProcess, free_port

    url = f"http://prometheus:{CANARY}@127.0.0.1:{free_port()}"
    exp = ExporterProcess(["--llama.url", url, "--log.level", "debug", "--llama.poll-interval", "0.2"], tmp_path)
    exp.env = {**os.environ, "LLAMA_API_KEY": CANARY}
    exp.start()
    try:
        ready = httpx.get(exp.url + "/-/ready", timeout=5).text
        time.sleep(1)  # polls fail, and say so
        metrics = exp.metrics_text()
    finally:
        exp.stop()
    log = exp.stderr_path.read_text()
    assert "prometheus:xxxxx@127.0.0.1" in ready and "prometheus:xxxxx@127.0.0.1" in log
    assert "ConnectError" in log  # the failing polls were logged, with their URL
    for text in (ready, log, metrics):
        assert CANARY not in text


@pytest.mark.integration
def test_top_never_prints_the_password_of_the_url_it_cannot_read() -> None:
    from realserver import free_port

    res = cli("top", "--once", "--url", f"http://prometheus:{CANARY}@127.0.0.1:{free_port()}")
    assert res.returncode == 1 and "prometheus:xxxxx@127.0.0.1" in res.stderr, res.stderr
    assert CANARY not in res.stdout + res.stderr


def test_histogram_bounds_come_from_the_configuration_flags_and_file(tmp_path: Path) -> None:
    """metrics.*_buckets set the bounds the histograms are served with (+Inf added), from the
    file or a flag (which wins); a request slower than the last bound still lands in +Inf."""
    from prometheus_client import CollectorRegistry
    from support import log_lines

    from llamacpp_exporter.pipeline import Pipeline

    f = tmp_path / "c.yaml"
    f.write_text("metrics:\n  latency_buckets: [1, 10, 3600]\n  time_per_output_token_buckets: [0.1]\n")
    args = build_parser().parse_args(["--config.file", str(f), "--metrics.time-per-output-token-buckets", "0.01,0.1"])
    cfg = config_from_args(args)
    assert cfg.metrics.latency_buckets == (1.0, 10.0, 3600.0)
    assert cfg.metrics.time_per_output_token_buckets == (0.01, 0.1)
    registry = CollectorRegistry()
    pl = Pipeline(registry, buckets=cfg.metrics, clock=lambda: 0.0)
    for line in log_lines("lv4-np2-text.log"):
        pl.process_line(line, 0.0)
    pl.flush()

    def bounds(name: str) -> list[str]:
        return sorted(
            {s.labels["le"] for m in registry.collect() for s in m.samples if s.name == name + "_bucket"},
            key=float,
        )

    assert bounds("llamacpp_time_to_first_token_seconds") == ["1.0", "10.0", "3600.0", "+Inf"]
    assert bounds("llamacpp_request_duration_seconds") == ["1.0", "10.0", "3600.0", "+Inf"]
    assert bounds("llamacpp_time_per_output_token_seconds") == ["0.01", "0.1", "+Inf"]
    assert bounds("llamacpp_prefill_duration_seconds")[-2:] == ["3600.0", "+Inf"]  # the default: up to an hour
    count = registry.get_sample_value("llamacpp_time_to_first_token_seconds_count", {"model": ""})
    assert (
        count
        and registry.get_sample_value("llamacpp_time_to_first_token_seconds_bucket", {"model": "", "le": "+Inf"})
        == count
    )


@pytest.mark.parametrize(
    "value, message",
    [
        ("[]", "between 1 and 40 bounds"),
        ("[1, 0.5]", "bounds must increase"),
        ("[0, 1]", "finite numbers above 0"),
        ("[1, .inf]", "finite numbers above 0"),
        ("[1, true]", "expected a list of numbers"),
        ("fast", "expected a list of numbers"),
    ],
)
def test_bad_bucket_bounds_are_configuration_errors_naming_the_key(tmp_path: Path, value: str, message: str) -> None:
    f = tmp_path / "c.yaml"
    f.write_text(f"metrics:\n  latency_buckets: {value}\n")
    cfg, mistakes = load_file_and_mistakes(str(f))
    if not mistakes:
        with pytest.raises(ConfigError) as e:
            validate(cfg)
        mistakes = list(e.value.messages)
    assert any(m.startswith("metrics.latency_buckets:") and message in m for m in mistakes), mistakes


def test_the_traces_endpoint_is_checked_as_a_url_and_needs_the_sdk(monkeypatch: pytest.MonkeyPatch) -> None:
    from llamacpp_exporter.export import otlp

    args = build_parser().parse_args(["--traces.otlp-endpoint", "tempo:4318"])
    with pytest.raises(ConfigError, match=r"traces\.otlp_endpoint: must start with http:// or https://"):
        config_from_args(args)
    args = build_parser().parse_args(["--traces.otlp-endpoint", "http://tempo:4318", "--traces.max-queued", "5"])
    cfg = config_from_args(args)
    assert cfg.traces.otlp_endpoint == "http://tempo:4318" and cfg.traces.max_queued == 5
    assert otlp.traces_url(cfg.traces.otlp_endpoint) == "http://tempo:4318/v1/traces"
    assert otlp.traces_url("http://c:4318/v1/traces/") == "http://c:4318/v1/traces"
    monkeypatch.setattr(otlp, "available", lambda: False)  # an install without the otlp extra
    with pytest.raises(ConfigError, match=r"traces\.otlp_endpoint: .*pip install 'llamacpp-exporter\[otlp\]'"):
        config_from_args(args)


def test_the_standard_variables_turn_traces_on_and_off(monkeypatch: pytest.MonkeyPatch) -> None:
    from llamacpp_exporter.export import otlp

    for name in ("OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_SDK_DISABLED"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.delenv("OTEL_TRACES_EXPORTER", raising=False)
    assert otlp.endpoint_from_environment() is None
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://collector:4318")
    assert otlp.endpoint_from_environment() == "http://collector:4318/v1/traces"
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "http://tempo:4318/v1/traces")
    assert otlp.endpoint_from_environment() == "http://tempo:4318/v1/traces"
    monkeypatch.setenv("OTEL_TRACES_EXPORTER", "none")
    assert otlp.endpoint_from_environment() is None
