"""The package laid out as the pipeline: each folder imports only what sits below it, so a
newcomer can read sources -> parse -> assemble -> export, and the offline readers on top."""

from __future__ import annotations

import ast
from pathlib import Path

PKG = Path(__file__).resolve().parent.parent / "exporter" / "llamacpp_exporter"

# what each part may import from the package (besides itself); the top modules may use all
ALLOWED = {
    "parse": set(),
    "records": set(),
    "config": set(),
    "sources": {"records", "config"},
    "assemble": {"parse", "records", "config"},
    "export": {"records", "config", "__init__"},
    "demux": {"parse", "records", "config", "assemble", "export"},
    "pipeline": {"parse", "records", "config", "assemble", "export", "demux"},
    "offline": {"parse", "records", "config", "assemble", "export", "pipeline", "demux"},
    "live": {"parse", "records", "config", "export"},  # top renders its cells as the report does (export.concern)
}


def _part(path: Path) -> str:
    rel = path.relative_to(PKG)
    return rel.parts[0] if len(rel.parts) > 1 else rel.stem


def _imports(path: Path) -> set[str]:
    """The package parts a module imports (relative imports resolved to their top part)."""
    tree = ast.parse(path.read_text())
    depth = len(path.relative_to(PKG).parts) - 1  # 0: a top module, 1: inside a folder
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.level:
            up = node.level - 1  # levels above the module's own package
            base = list(path.relative_to(PKG).parts[: depth - up])
            for name in [node.module] if node.module else [a.name for a in node.names]:
                parts = base + name.split(".")
                first = parts[0]
                is_module = (PKG / f"{first}.py").exists() or (PKG / first).is_dir()
                out.add(first if is_module else "__init__")  # else a name of the package itself
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("llamacpp_exporter."):
            out.add((node.module or "").split(".")[1])
    return out


def test_each_part_imports_only_what_sits_below_it() -> None:
    wrong = []
    for path in sorted(PKG.rglob("*.py")):
        part = _part(path)
        if part not in ALLOWED:
            continue  # app, cli, __main__, __init__: the top, which wires everything
        for used in _imports(path) - {part}:
            if used not in ALLOWED[part]:
                wrong.append(f"{path.relative_to(PKG)} imports {used}")
    assert not wrong, wrong


def test_the_folders_are_the_stages() -> None:
    folders = {p.name for p in PKG.iterdir() if p.is_dir() and (p / "__init__.py").exists()}
    assert folders == {"sources", "assemble", "export", "offline", "live"}
    for f in folders:
        assert ast.get_docstring(ast.parse((PKG / f / "__init__.py").read_text())), f"{f}/ says what it is"


def test_parsing_and_assembly_never_speak_prometheus() -> None:
    """Parsing, assembly and the router demux make plain facts; the metrics Prometheus reads
    are declared in export/ (sources/ count their own reads and polls)."""
    wrong = []
    for path in sorted(PKG.rglob("*.py")):
        if _part(path) not in {"parse", "records", "assemble", "demux"}:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else []
            if isinstance(node, ast.ImportFrom) and not node.level:
                names = [node.module or ""]
            if any(n.split(".")[0] == "prometheus_client" for n in names):
                wrong.append(str(path.relative_to(PKG)))
    assert not wrong, wrong
