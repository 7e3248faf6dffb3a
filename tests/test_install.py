"""The way in, as a newcomer takes it: the README's install and the Dockerfile's two stages, each
in a fresh venv with nothing installed beforehand, from a clean copy of the tree and from the
sdist a release would publish, on a machine with a C compiler (the compiled build) and without
one (the pure package). Each installed exporter then replays a recorded log and its /metrics
must agree with the responses' own timings.

The builds run two at a time (this machine has two cores; a compile keeps one busy)."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
import zipfile
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

sys.path.insert(0, str(Path(__file__).parent / "setup"))
from build_compiled import (  # noqa: E402
    BASE_PYTHON,
    clean_copy,
    dockerfile,
    fresh_venv,
    installed_package,
    tracked_files,
    without_compiler,
)
from realserver import ExporterProcess, free_port  # noqa: E402
from support import samples  # noqa: E402

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[1]
LOGS = ROOT / "tests" / "fixtures" / "logs"
REPLAYED = "lv4-np2-text"  # a real -lv 4 run with two slots and LoRA, and its responses' timings
NOBODY = 65534  # the Dockerfile's USER


def _python(version: str) -> str:
    """A working interpreter of that version (pyenv's shims exist for versions not selected)."""
    for candidate in (
        shutil.which(f"python{version}"),
        *sorted(Path.home().glob(f".pyenv/versions/{version}.*/bin/python{version}")),
    ):
        if candidate and subprocess.run([str(candidate), "-c", ""], capture_output=True).returncode == 0:
            return str(candidate)
    return str(BASE_PYTHON)


NEWEST_PYTHON = _python("3.12")  # the Dockerfile's base image, python:3.12
OLDEST_PYTHON = "3.10"


def readme_install_command() -> list[str]:
    """The install line of the README's Run section, as written."""
    (line,) = re.findall(r"^(pip install \.)\s", (ROOT / "README.md").read_text(), re.M)
    return [str(word) for word in line.split()]


def _run(cmd: list[Any], log: Path, **kw: Any) -> None:
    with open(log, "ab") as out:
        out.write(f"$ {' '.join(map(str, cmd))}\n".encode())
        out.flush()
        r = subprocess.run([str(c) for c in cmd], stdout=out, stderr=subprocess.STDOUT, **kw)
    if r.returncode != 0:
        raise AssertionError(f"{cmd} failed ({r.returncode}):\n{log.read_text()[-4000:]}")


@dataclass
class Install:
    """One install: the venv's python, the build's output and how long the install took."""

    python: Path
    log: Path
    seconds: float

    @property
    def exporter(self) -> Path:
        return self.python.parent / "llamacpp-exporter"

    def build_lines(self) -> list[str]:
        return re.findall(r"llamacpp-exporter build: .*", self.log.read_text())


def _pip_install(
    work: Path, args: list[str], compiler: bool, src: Path | None = None, python: Path | str = BASE_PYTHON
) -> Install:
    work.mkdir(parents=True)
    src = src or clean_copy(work / "src")
    py = fresh_venv(work / "venv", python)
    env = dict(os.environ) if compiler else without_compiler(py)
    t0 = time.monotonic()
    # -v: the build's own lines (compiled or pure, and why) reach the log
    _run([py, "-m", *args, "-v"], work / "install.log", cwd=src, env=env)
    return Install(py, work / "install.log", time.monotonic() - t0)


def _with_extras(wheel: str, arg: str) -> str:
    extras = re.search(r"\[\w+\]$", arg)
    return wheel + (extras.group(0) if extras else "")


def _docker(work: Path) -> dict[str, Any]:
    """The Dockerfile's build stage (a compiler at hand) and its runtime stage (none). The build
    stage's wheel is the one tests/test_compiled.py checks (cached by what it is built from)."""
    work.mkdir(parents=True)
    t0 = time.monotonic()
    (wheel,) = installed_package(compiler=True).glob("*.whl")
    build_seconds = time.monotonic() - t0
    py = fresh_venv(work / "runtime")
    # the wheel with the extras the image installs it with ("$(echo /wheels/*.whl)[otlp]")
    install = [_with_extras(str(wheel), a) if "/wheels/" in a else a for a in dockerfile()["install"]]
    _run([py, "-m", *install], work / "runtime.log", env=without_compiler(py))
    return {"wheel": wheel, "python": py, "build_seconds": build_seconds, "work": work}


def _release(work: Path) -> dict[str, Any]:
    """`python -m build` as the release does (the sdist, and the pure wheel PyPI takes), then
    the sdist alone installed with a compiler and without."""
    work.mkdir(parents=True)
    tools = fresh_venv(work / "tools")
    _run([tools, "-m", "pip", "install", "--quiet", "build", "twine"], work / "tools.log")
    src = clean_copy(work / "src")
    env = dict(os.environ, LLAMACPP_EXPORTER_COMPILE="0")
    _run([tools, "-m", "build", "--outdir", work / "dist", src], work / "build.log", env=env)
    dist = sorted((work / "dist").iterdir())
    twine = subprocess.run(
        [tools.parent / "twine", "check", "--strict", *dist], capture_output=True, text=True, check=False
    )
    (sdist,) = [d for d in dist if d.name.endswith(".tar.gz")]
    out = {"dist": dist, "twine": twine, "sdist": sdist}
    for kind, compiler in (("sdist-compiled", True), ("sdist-pure", False)):
        w = work / kind
        w.mkdir()
        out[kind] = _pip_install(w / "i", ["pip", "install", str(sdist)], compiler, src=w)
    return out


def _failed_compile(work: Path, how: str) -> Install:
    """A compile that cannot be done: a type check that fails, or a compiler that fails."""
    work.mkdir(parents=True)
    src = clean_copy(work / "src")
    env = dict(os.environ)
    if how == "type check":
        with open(src / "exporter/llamacpp_exporter/parse.py", "a") as fh:
            fh.write('\nNOT_AN_INT: int = "a type error, as a newer mypy might find one"\n')
    else:
        env["CC"] = "false"
    py = fresh_venv(work / "venv")
    t0 = time.monotonic()
    _run([py, "-m", "pip", "install", ".", "-v"], work / "install.log", cwd=src, env=env)
    return Install(py, work / "install.log", time.monotonic() - t0)


@pytest.fixture(scope="module")
def installs() -> Iterator[dict[str, Any]]:
    # readable by uid 65534 all the way down (pytest's own temporary folders are private)
    top = Path(tempfile.mkdtemp(prefix="llamacpp-exporter-install-"))
    top.chmod(0o755)
    jobs = {
        # the image's Python (python:3.12) where this machine has it; the other builds use the tests' own
        "readme-compiled": lambda: _pip_install(
            top / "readme-compiled", readme_install_command(), True, python=NEWEST_PYTHON
        ),
        "docker": lambda: _docker(top / "docker"),
        "release": lambda: _release(top / "release"),
        "readme-pure": lambda: _pip_install(top / "readme-pure", readme_install_command(), False),
        # the oldest Python the package says it supports (requires-python)
        "readme-pure-oldest": lambda: _pip_install(
            top / "readme-pure-oldest", readme_install_command(), False, python=_python(OLDEST_PYTHON)
        ),
        "editable": lambda: _pip_install(top / "editable", ["pip", "install", "-e", "."], True),
        "type-check-fails": lambda: _failed_compile(top / "type-check-fails", "type check"),
        "compiler-fails": lambda: _failed_compile(top / "compiler-fails", "compiler"),
    }
    with ThreadPoolExecutor(2) as pool:
        futures = {name: pool.submit(job) for name, job in jobs.items()}
        done = {name: f.result() for name, f in futures.items()}
    yield done
    shutil.rmtree(top, ignore_errors=True)


def _log_reading(exporter: Path) -> str:
    out = subprocess.run([exporter, "--version"], capture_output=True, text=True, check=True, cwd="/").stdout
    assert out.startswith("llamacpp-exporter "), out
    return out.strip().rsplit("(log reading ", 1)[1].rstrip(")")


def _replays_a_recorded_log(
    exporter: Path, work: Path, user: int | None = None, env: dict[str, Any] | None = None
) -> tuple[str, str]:
    """The installed exporter replays a recorded log (llama-server itself is down); its /metrics
    must hold every request and the prompt and reused tokens of the responses' timings."""
    logs, data = work / "logs", work / "data"
    logs.mkdir(parents=True)
    data.mkdir()
    shutil.copy(LOGS / f"{REPLAYED}.log", logs / "llama-server.log")
    command = [str(exporter)]
    if user is not None:  # only the data folder is the user's; the rest it may read, not write
        os.chown(data, user, user)
        command = [
            shutil.which("setpriv") or "/usr/bin/setpriv",
            f"--reuid={user}",
            f"--regid={user}",
            "--clear-groups",
            *command,
        ]
    exp = ExporterProcess(
        [
            "--llama.url",
            f"http://127.0.0.1:{free_port()}",
            "--llama.log-path",
            str(logs / "llama-server.log"),
            "--llama.log-from-start",
            "--events.path",
            str(data / "events.jsonl"),
        ],
        work,
        command=command,
        env={**(env or os.environ), "HOME": "/nonexistent"} if user is not None else env,
    )
    exp.start()
    try:
        truth = [json.loads(line) for line in (LOGS / f"{REPLAYED}.truth.jsonl").read_text().splitlines()]

        def total(text: str, name: str) -> float:
            return sum(samples(text, name).values())

        deadline = time.monotonic() + 60
        while total(text := exp.metrics_text(), "llamacpp_requests_total") < len(truth):
            assert time.monotonic() < deadline, f"{len(truth)} requests not exported:\n{text[-2000:]}"
            time.sleep(0.2)
        assert total(text, "llamacpp_requests_total") == len(truth)
        assert total(text, "llamacpp_prompt_tokens_total") == sum(t["prompt_n"] + t["cache_n"] for t in truth)
        assert total(text, "llamacpp_prompt_tokens_reused_total") == sum(t["cache_n"] for t in truth)
        assert httpx.get(exp.url + "/-/healthy", timeout=5).status_code == 200
    finally:
        exp.stop()
    written = {p.name for p in data.iterdir()}
    assert "events.jsonl" in written, written
    return exp.stderr_path.read_text(), text


def test_readme_install_with_a_compiler_compiles_the_log_reading_and_the_exporter_runs(
    installs: dict[str, Any],
) -> None:
    inst = installs["readme-compiled"]
    assert any("log reading compiled" in line for line in inst.build_lines()), inst.build_lines()
    assert _log_reading(inst.exporter) == "compiled"
    stderr, _ = _replays_a_recorded_log(inst.exporter, inst.log.parent / "run")
    assert "log reading compiled" in stderr
    print(f"README install, compiled ({Path(NEWEST_PYTHON).name}): {inst.seconds:.0f} s")


def test_readme_install_without_a_compiler_is_the_pure_package_and_the_exporter_runs(installs: dict[str, Any]) -> None:
    inst = installs["readme-pure"]
    assert inst.build_lines() == [
        "llamacpp-exporter build: pure Python package (no C compiler: gcc or build-essential would compile the log reading)"
    ]
    assert _log_reading(inst.exporter) == "pure Python"
    _replays_a_recorded_log(inst.exporter, inst.log.parent / "run", env=without_compiler(inst.python))
    print(f"README install, pure: {inst.seconds:.0f} s")


def test_the_oldest_python_the_package_claims_installs_and_runs_it(installs: dict[str, Any]) -> None:
    inst = installs["readme-pure-oldest"]
    version = subprocess.run(
        [inst.python, "-c", "import sys; print(sys.version_info[:2])"], capture_output=True, text=True
    )
    assert version.stdout.strip() == str(tuple(map(int, OLDEST_PYTHON.split(".")))), "no Python 3.10 on this machine"
    meta = (ROOT / "pyproject.toml").read_text()
    assert f'requires-python = ">={OLDEST_PYTHON}"' in meta
    _replays_a_recorded_log(inst.exporter, inst.log.parent / "run", env=without_compiler(inst.python))


def test_an_editable_install_is_the_source_itself(installs: dict[str, Any]) -> None:
    inst = installs["editable"]
    assert _log_reading(inst.exporter) == "pure Python"  # a compiled module would hide edits
    where = subprocess.run(
        [inst.python, "-c", "import llamacpp_exporter.parse as p; print(p.__file__)"],
        capture_output=True,
        text=True,
        check=True,
        cwd="/",
    ).stdout.strip()
    assert where == str(inst.log.parent / "src/exporter/llamacpp_exporter/parse.py")
    assert not list((inst.log.parent / "src/exporter").rglob("*.so"))


@pytest.mark.parametrize("how", ["type-check-fails", "compiler-fails"])
def test_a_compile_that_cannot_be_done_leaves_the_pure_package_with_one_line(
    installs: dict[str, Any], how: str
) -> None:
    inst = installs[how]
    lines = inst.build_lines()
    assert len(lines) == 1 and lines[0].startswith("llamacpp-exporter build: pure Python package ("), lines
    assert ("type check" in lines[0]) == (how == "type-check-fails")
    assert _log_reading(inst.exporter) == "pure Python"
    assert "py3-none-any.whl" in inst.log.read_text()  # the wheel is tagged as what it holds


def test_the_image_builds_and_runs_as_nobody_with_only_its_data_writable(installs: dict[str, Any]) -> None:
    d = installs["docker"]
    assert not d["wheel"].name.endswith("-none-any.whl"), d["wheel"].name  # compiled in the build stage
    exporter = d["python"].parent / "llamacpp-exporter"
    assert _log_reading(exporter) == "compiled"
    # the image's entry point and command name the flags the exporter has
    run = d["work"] / "run"
    stderr, _ = _replays_a_recorded_log(exporter, run, user=NOBODY, env=without_compiler(d["python"]))
    assert "log reading compiled" in stderr
    # with the otlp extra: traces can be sent (the configuration check finds the SDK)
    check = subprocess.run(
        [exporter, "--config.check", "--traces.otlp-endpoint", "http://127.0.0.1:4318"], capture_output=True, text=True
    )
    assert check.returncode == 0, check.stderr
    print(f"Dockerfile build stage (compiled, or cached by its source): {d['build_seconds']:.0f} s")


def test_the_dockerfile_copies_what_the_build_needs_and_its_command_is_valid() -> None:
    d = dockerfile()
    assert set(d["copy"]) >= {"pyproject.toml", "setup.py", "README.md", "exporter"}
    text = (ROOT / "Dockerfile").read_text()
    found = re.search(r"^CMD (\[.*\])$", text, re.M)
    assert found is not None
    cmd = json.loads(found.group(1))
    from llamacpp_exporter.cli import build_parser

    build_parser().parse_args(cmd)  # an unknown flag exits


def test_hadolint_finds_nothing_in_the_dockerfile(tmp_path: Path) -> None:
    hadolint = Path(sys.executable).parent / "hadolint"
    run = subprocess.run([hadolint, ROOT / "Dockerfile"], capture_output=True, text=True)
    assert run.returncode == 0, run.stdout + run.stderr
    # and it does look: a known mistake is found
    bad = tmp_path / "Dockerfile"
    bad.write_text("FROM python:3.12-slim-bookworm\nRUN cd /tmp && pip install x\n")
    found = subprocess.run([hadolint, bad], capture_output=True, text=True)
    assert found.returncode != 0 and "DL3003" in found.stdout, found.stdout


def test_the_release_sdist_and_wheel_are_complete_and_install_from_the_sdist_alone(installs: dict[str, Any]) -> None:
    r = installs["release"]
    assert r["twine"].returncode == 0, r["twine"].stdout + r["twine"].stderr
    assert r["twine"].stdout.count("PASSED") == 2, r["twine"].stdout
    names = sorted(p.name for p in r["dist"])
    assert names == ["llamacpp_exporter-0.1.0-py3-none-any.whl", "llamacpp_exporter-0.1.0.tar.gz"], names
    with tarfile.open(r["sdist"]) as tar:
        in_sdist = {m.name.split("/", 1)[1] for m in tar.getmembers() if m.isfile()}
    package = {f for f in tracked_files() if f.startswith("exporter/") and f.endswith(".py")}
    assert package <= in_sdist, package - in_sdist
    assert {"LICENSE", "README.md", "CHANGELOG.md", "setup.py", "pyproject.toml"} <= in_sdist
    assert not [f for f in in_sdist if f.endswith((".c", ".so", ".pyc"))]
    (wheel,) = [p for p in r["dist"] if p.suffix == ".whl"]
    with zipfile.ZipFile(wheel) as z:
        in_wheel = set(z.namelist())
        meta = z.read("llamacpp_exporter-0.1.0.dist-info/METADATA").decode()
    assert {f.removeprefix("exporter/") for f in package} <= in_wheel
    assert "llamacpp_exporter-0.1.0.dist-info/licenses/LICENSE" in in_wheel
    for field in ("License-Expression: MIT", "Project-URL: ", "Classifier: ", "Requires-Python: >=3.10"):
        assert field in meta, field
    assert "Provides-Extra: plot" in meta
    for kind, want in (("sdist-compiled", "compiled"), ("sdist-pure", "pure Python")):
        inst = r[kind]
        assert _log_reading(inst.exporter) == want, kind
        print(f"install from the sdist, {want}: {inst.seconds:.0f} s")
    _replays_a_recorded_log(r["sdist-compiled"].exporter, r["sdist-compiled"].log.parent / "run")
