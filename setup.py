"""The build. The package is pure Python and works as such. Where a C compiler is at hand, the
modules every log line passes through (parse, assemble, the request metrics) are also compiled
to C by mypyc from the same source, which reads a log two to three times as fast (BENCHMARKS.md).

An install never fails for the compile's sake: without a compiler, with
LLAMACPP_EXPORTER_COMPILE=0, in an editable install (`pip install -e .`: edits must take
effect), or when the compile cannot be done (a type check or a compiler that fails), the wheel
is the pure package, and the build says so in one line. The build requirements in
pyproject.toml are what the compile needs (mypy, and the packages whose types it checks).
Everything else (the metadata, the dependencies) is in pyproject.toml."""

from __future__ import annotations

import os
import shutil
import sys
import sysconfig

from setuptools import setup
from setuptools.command.build_ext import build_ext

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
    "assemble/join_solver",
    "assemble/logclock",
    "assemble/lora",
    "assemble/promptcache",
    "assemble/pseudonyms",
    "assemble/serverstate",
    "assemble/timeline",
    "demux",
    "export/cache_outcome",
    "export/concern",
    "export/concerns",
    "export/contention",
    "export/context_shift",
    "export/conversations",
    "export/families",
    "export/latency",
    "export/metrics",
    "export/request_endings",
    "export/speculative",
    "export/task_kinds",
]

# setup.py runs for every step of a PEP 517 build; only these build the package (the metadata
# steps, sdist and the editable install do not compile, and must not type-check)
BUILDING = {"bdist_wheel", "build", "build_ext", "install"}


def _say(message: str) -> None:
    print(f"llamacpp-exporter build: {message}", file=sys.stderr, flush=True)


def _compiler() -> str | None:
    cc = (os.environ.get("CC") or sysconfig.get_config_var("CC") or "cc").split()
    return shutil.which(cc[0]) if cc else None


def ext_modules() -> list:
    if not BUILDING.intersection(sys.argv[1:]):
        return []
    if os.environ.get("LLAMACPP_EXPORTER_COMPILE", "1") == "0":
        _say("pure Python package (LLAMACPP_EXPORTER_COMPILE=0)")
        return []
    if _compiler() is None:
        _say("pure Python package (no C compiler: gcc or build-essential would compile the log reading)")
        return []
    try:
        from mypyc.build import mypycify
    except ImportError:  # a build without the build requirements (--no-build-isolation)
        _say("pure Python package (mypy is not installed in the build environment)")
        return []
    here = os.path.dirname(os.path.abspath(__file__))
    paths = [os.path.join("exporter", "llamacpp_exporter", *f"{m}.py".split("/")) for m in COMPILED]
    cwd = os.getcwd()
    os.chdir(here)
    try:
        return mypycify(paths, opt_level="3", debug_level="0")
    except SystemExit:  # mypyc has printed the errors of its type check
        _say("pure Python package (the type check before compiling failed, above)")
        return []
    except Exception as e:
        _say(f"pure Python package (mypyc failed: {type(e).__name__}: {e})")
        return []
    finally:
        os.chdir(cwd)


class BuildHotPath(build_ext):
    """All compiled modules or none: mypyc's modules share one library, so a compiled module
    whose library failed to build would not import. A compiler that fails leaves the pure
    package, and the wheel is then tagged as pure."""

    def build_extensions(self) -> None:
        try:
            super().build_extensions()
        except Exception as e:  # CompileError, LinkError, a missing header: all the compiler's
            for ext in self.extensions:
                path = self.get_ext_fullpath(ext.name)
                if os.path.exists(path):
                    os.remove(path)
            self.extensions = []
            self.distribution.ext_modules = []
            wheel = self.distribution.command_obj.get("bdist_wheel")
            if wheel is not None:  # its tag is read after the build
                wheel.root_is_pure = True
            _say(f"pure Python package (the C compiler failed, {type(e).__name__}: its output is above)")
            return
        _say(f"log reading compiled ({len(COMPILED)} modules, mypyc)")


setup(ext_modules=ext_modules(), cmdclass={"build_ext": BuildHotPath})
