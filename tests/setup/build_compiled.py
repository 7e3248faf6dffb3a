"""The package as `pip install .` builds it on a machine with a C compiler (setup.py: the hot
path compiled by mypyc), installed into a folder of its own, for the tests and the benchmarks
to put first on PYTHONPATH. The development install (.venv) stays the pure source.

The wheel is cached under $LLAMACPP_EXPORTER_CACHE/wheels by a digest of what it is built
from, so a second run with the same source builds nothing.

Usage: .venv/bin/python tests/setup/build_compiled.py [--no-compiler]  (prints the folder)
"""

from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CACHE = Path(os.environ.get("LLAMACPP_EXPORTER_CACHE", Path.home() / ".cache" / "llamacpp-exporter"))


def _digest() -> str:
    h = hashlib.sha256(sys.version.encode())
    for f in sorted((ROOT / "exporter" / "llamacpp_exporter").rglob("*.py")) + [
        ROOT / "setup.py",
        ROOT / "pyproject.toml",
    ]:
        h.update(str(f.relative_to(ROOT)).encode() + b"\0" + f.read_bytes())
    return h.hexdigest()[:16]


def installed_package(compiler: bool = True) -> Path:
    """The folder holding the installed package (built with a compiler, or with none at hand)."""
    kind = "compiled" if compiler else "pure"
    target = CACHE / "wheels" / f"{_digest()}-{kind}"
    if (target / "llamacpp_exporter").is_dir():
        return target
    env = dict(os.environ)
    if not compiler:
        env["CC"] = "/nonexistent/cc"  # what a machine without a compiler looks like to setup.py
    with tempfile.TemporaryDirectory() as tmp:
        src = Path(tmp) / "src"  # a copy: the build leaves build/ and egg-info behind
        shutil.copytree(ROOT, src, ignore=shutil.ignore_patterns(".venv", ".git", "build", "*.egg-info", "__pycache__"))
        wheels = Path(tmp) / "wheels"
        subprocess.run(
            [sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "-w", str(wheels), str(src)],
            check=True,
            env=env,
        )
        (wheel,) = wheels.glob("*.whl")
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
