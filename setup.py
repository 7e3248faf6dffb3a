"""The build. The package is pure Python and works as such. Where a C compiler is at hand, the
modules every log line passes through (parse, assemble, the request metrics) are also compiled
to C by mypyc from the same source, which reads a log two to three times as fast (BENCHMARKS.md).
Without a compiler, or with LLAMACPP_EXPORTER_COMPILE=0, the wheel is the pure package; a
compiled module that fails to build is left out and its Python source is used.
Everything else (the metadata, the dependencies) is in pyproject.toml."""

from __future__ import annotations

import os
import shutil
import sysconfig

from setuptools import setup

# the hot path: a line's way from the parser to the request metrics (pipeline.py's imports).
# Not records.py: its reader of events files checks values against the record's declared
# types, which compiled classes do not keep at run time.
COMPILED = [
    "parse",
    "pipeline",
    "assemble/assembler",
    "assemble/attribution",
    "assemble/cachemirror",
    "assemble/classify",
    "assemble/draft",
    "assemble/finish",
    "assemble/join",
    "assemble/logclock",
    "assemble/lora",
    "assemble/promptcache",
    "assemble/pseudonyms",
    "assemble/router",
    "assemble/serverstate",
    "assemble/timeline",
    "export/conversations",
    "export/metrics",
]


def _compiler() -> str | None:
    cc = (os.environ.get("CC") or sysconfig.get_config_var("CC") or "cc").split()
    return shutil.which(cc[0]) if cc else None


def ext_modules() -> list:
    if os.environ.get("LLAMACPP_EXPORTER_COMPILE", "1") == "0" or _compiler() is None:
        return []
    try:
        from mypyc.build import mypycify
    except ImportError:  # a build without the build requirements (--no-build-isolation)
        return []
    here = os.path.dirname(os.path.abspath(__file__))
    paths = [os.path.join("exporter", "llamacpp_exporter", *f"{m}.py".split("/")) for m in COMPILED]
    cwd = os.getcwd()
    os.chdir(here)
    try:
        extensions = mypycify(paths, opt_level="3", debug_level="0")
    finally:
        os.chdir(cwd)
    for ext in extensions:
        ext.optional = True  # a compiler that fails leaves the pure package
    return extensions


setup(ext_modules=ext_modules())
