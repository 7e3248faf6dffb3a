"""The package as users install it: `pip install .` compiles the hot path with mypyc where a C
compiler is at hand (setup.py), and is the pure package where none is. Both must read every
recorded log into the same records and the same /metrics as the source the other tests run,
and the compiled one must pass the parser's, the assembler's and the golden tests itself
(mypyc checks the declared types at run time: a type the code does not keep is an error
there, not in the source)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).parent / "setup"))
from build_compiled import installed_package  # noqa: E402

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[1]
LOGS = ROOT / "tests" / "fixtures" / "logs"

# every recorded log: its records (events-file form) and its exposition, in one process
READ_ALL = """
import json, sys
from pathlib import Path
from prometheus_client import CollectorRegistry, disable_created_metrics, generate_latest
import llamacpp_exporter.parse
from llamacpp_exporter.assemble.pseudonyms import Pseudonymizer
from llamacpp_exporter.pipeline import Pipeline
disable_created_metrics()
out = {"compiled": llamacpp_exporter.parse.__file__.endswith(".so"), "logs": {}}
for f in sorted(Path(sys.argv[1]).rglob("*.log")):
    seen = []
    pl = Pipeline(CollectorRegistry(), clock=lambda: 0.0, pseudonymize=Pseudonymizer("salt"),
                  on_record=lambda r: seen.append(r.to_event()),
                  on_proof=lambda p: seen.append(["proof", p.key.task, p.conversation, p.source]))
    pl.process_lines(line.rstrip("\\r\\n") for line in open(f, encoding="utf-8", errors="replace", newline="\\n"))
    pl.flush()
    out["logs"][f.name] = {"records": seen, "metrics": generate_latest(pl.registry).decode()}
print(json.dumps(out))
"""


def read_all(pythonpath: Path | None) -> dict[str, Any]:
    env = dict(os.environ)
    if pythonpath is not None:
        env["PYTHONPATH"] = str(pythonpath)
    out = subprocess.run(
        [sys.executable, "-c", READ_ALL, str(LOGS)], capture_output=True, text=True, env=env, check=True, cwd="/"
    )
    result: dict[str, Any] = json.loads(out.stdout)
    return result


@pytest.fixture(scope="module")
def source() -> dict[str, Any]:
    return read_all(None)


@pytest.fixture(scope="module")
def compiled_dir() -> Path:
    return installed_package(compiler=True)


def test_with_a_compiler_the_hot_path_is_compiled_and_reads_every_log_as_the_source(
    source: dict[str, Any], compiled_dir: Path
) -> None:
    assert not source["compiled"]
    got = read_all(compiled_dir)
    assert got["compiled"], "pip install . with gcc at hand did not compile the hot path"
    assert sorted(got["logs"]) == sorted(source["logs"]) and len(got["logs"]) >= 30
    for name, want in source["logs"].items():
        assert got["logs"][name]["records"] == want["records"], name
        assert got["logs"][name]["metrics"] == want["metrics"], name
    assert sum(len(v["records"]) for v in got["logs"].values()) > 500


def test_without_a_compiler_the_install_is_the_pure_package_and_reads_every_log_as_the_source(
    source: dict[str, Any],
) -> None:
    pure = installed_package(compiler=False)
    assert list(pure.glob("*.whl"))[0].name.endswith("-py3-none-any.whl")
    got = read_all(pure)
    assert not got["compiled"]
    assert got["logs"] == source["logs"]


# tests of the source itself: replacing one of its parts (monkeypatch) cannot reach into
# compiled code, and compiled classes do not keep their declared types at run time
SOURCE_ONLY = " and ".join(
    f"not {name}"
    for name in (
        "test_a_failing_snapshot_is_counted_as_an_internal_error",
        "test_a_parser_bug_costs_one_unrecognized_line",
        "test_a_record_takes_its_drafts_facts_under_the_same_names_and_types",
        # counts calls by replacing methods, which compiled classes do not allow
        "test_the_waiting_records_look_at_other_slots_no_more_often_a_line_with_four_times_the_slots",
        "test_the_join_looks_at_open_tasks_no_more_often_a_line_with_four_times_the_slots",
    )
)


def test_the_compiled_package_passes_the_parser_assembler_events_and_golden_tests(compiled_dir: Path) -> None:
    tests = ["test_parse.py", "test_fuzz.py", "test_assemble.py", "test_golden.py", "test_join.py", "test_parts.py"]
    tests += ["test_events_file.py", "test_analyze.py", "test_analyze_store.py", "test_exposition.py"]
    tests += ["test_many_slots.py", "test_join_solver.py"]
    env = dict(os.environ, PYTHONPATH=str(compiled_dir))
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-m", "fast", "-k", SOURCE_ONLY, *tests],
        cwd=ROOT / "tests",
        env=env,
        capture_output=True,
        text=True,
    )
    assert run.returncode == 0, run.stdout[-4000:]
    assert " passed" in run.stdout.splitlines()[-1] and "failed" not in run.stdout.splitlines()[-1]
