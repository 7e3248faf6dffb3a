"""The package as users build and install it, each time in a fresh venv with nothing installed
beforehand (a development venv that holds the dependencies hides install bugs):

- ``clean_copy``: the tree as a clean clone has it (what git tracks, plus new files not ignored).
- ``fresh_venv``, ``without_compiler``: a new venv, and the environment of a machine with no C
  compiler (PATH holds only the venv's own commands).
- ``dockerfile_build_stage``: the wheel the Dockerfile's build stage makes, by its own command
  (read from the Dockerfile) over exactly the files it copies.
- ``installed_package``: that wheel installed into a folder of its own, for the tests and the
  benchmarks to put first on PYTHONPATH (the development install, .venv, stays the pure source).

The wheel is cached under $LLAMACPP_EXPORTER_CACHE/wheels by a digest of what it is built from,
so a second run with the same source builds nothing.

Usage: .venv/bin/python tests/setup/build_compiled.py [--no-compiler]  (prints the folder)
"""

from __future__ import annotations

import argparse
import hashlib
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CACHE = Path(os.environ.get("LLAMACPP_EXPORTER_CACHE", Path.home() / ".cache" / "llamacpp-exporter"))
# the interpreter the venvs are made from: the one under the development venv, so that a compiled
# module built here loads in the tests' own interpreter
BASE_PYTHON = Path(sys.base_prefix) / "bin" / f"python{sys.version_info.major}.{sys.version_info.minor}"


def tracked_files(root: Path = ROOT) -> list[str]:
    """The files of a clean clone (and new ones, not ignored): what `git clone` would give."""
    if (root / ".git").exists():
        out = subprocess.run(
            ["git", "-C", str(root), "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
            check=True,
            capture_output=True,
        ).stdout
        return sorted({f for f in out.decode().split("\0") if f and (root / f).is_file()})
    skip = {".venv", ".git", "build", "__pycache__", ".pytest_cache", ".mypy_cache"}
    return sorted(
        str(p.relative_to(root))
        for p in root.rglob("*")
        if p.is_file() and not skip.intersection(p.relative_to(root).parts) and not p.name.endswith((".so", ".pyc"))
    )


def clean_copy(dest: Path, only: list[str] | None = None) -> Path:
    """A copy of the tree as a clean clone has it; ``only``: just these files and folders."""
    for f in tracked_files():
        if only is not None and not any(f == o or f.startswith(o.rstrip("/") + "/") for o in only):
            continue
        (dest / f).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / f, dest / f)
    return dest


def fresh_venv(path: Path, python: Path | str = BASE_PYTHON) -> Path:
    """A new venv with nothing but pip; returns its python."""
    subprocess.run([str(python), "-m", "venv", str(path)], check=True)
    return path / "bin" / "python"


def without_compiler(venv_python: Path, env: dict[str, str] | None = None) -> dict[str, str]:
    """The environment of a machine without a C compiler: only the venv's commands on PATH."""
    env = dict(os.environ if env is None else env)
    env.pop("CC", None)
    env["PATH"] = str(venv_python.parent)
    return env


def dockerfile() -> dict[str, list[str]]:
    """The Dockerfile's COPY sources of the build stage and its two pip commands."""
    text = (ROOT / "Dockerfile").read_text()
    build_stage = text.split("FROM ", 2)[1]
    copies = [w for line in re.findall(r"^COPY (?!--from)(.+)$", build_stage, re.M) for w in shlex.split(line)[:-1]]
    runs = [r.split("&&")[0].strip() for r in re.findall(r"^RUN (.+?)(?:\\\n|$)", text, re.M)]
    (wheel,) = [shlex.split(r) for r in runs if r.startswith("pip wheel")]
    (install,) = [shlex.split(r) for r in runs if r.startswith("pip install")]
    return {"copy": copies, "wheel": wheel, "install": install}


def dockerfile_build_stage(work: Path, compiler: bool = True, python: Path | str = BASE_PYTHON) -> Path:
    """The Dockerfile's build stage: its files copied, its `pip wheel` run in a fresh venv (with
    or without a compiler). Returns the wheel."""
    d = dockerfile()
    src = clean_copy(work / "src", only=d["copy"])
    py = fresh_venv(work / "venv", python)
    env = dict(os.environ) if compiler else without_compiler(py)
    wheels = work / "wheels"
    cmd = [str(py), "-m", *[str(wheels) if a == "/wheels" else a for a in d["wheel"]]]
    subprocess.run(cmd, check=True, cwd=src, env=env, stdout=subprocess.DEVNULL)
    (wheel,) = wheels.glob("*.whl")
    return wheel


def _digest() -> str:
    h = hashlib.sha256(sys.version.encode())
    for f in sorted((ROOT / "exporter" / "llamacpp_exporter").rglob("*.py")) + [
        ROOT / "setup.py",
        ROOT / "pyproject.toml",
        ROOT / "Dockerfile",
    ]:
        h.update(str(f.relative_to(ROOT)).encode() + b"\0" + f.read_bytes())
    return h.hexdigest()[:16]


def installed_package(compiler: bool = True) -> Path:
    """The folder holding the installed package (built with a compiler, or with none at hand)."""
    kind = "compiled" if compiler else "pure"
    target = CACHE / "wheels" / f"{_digest()}-{kind}"
    if (target / "llamacpp_exporter").is_dir():
        return target
    with tempfile.TemporaryDirectory() as tmp:
        wheel = dockerfile_build_stage(Path(tmp), compiler)
        staging = Path(tmp) / "install"
        subprocess.run(
            [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--target", str(staging), str(wheel)],
            check=True,
        )
        target.parent.mkdir(parents=True, exist_ok=True)
        for old in target.parent.glob(f"*-{kind}"):  # builds of an earlier source
            shutil.rmtree(old, ignore_errors=True)
        shutil.move(str(staging), target)
        shutil.copy(wheel, target / wheel.name)
    return target


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--no-compiler", action="store_true", help="build as on a machine without a C compiler")
    args = ap.parse_args()
    print(installed_package(compiler=not args.no_compiler))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
