"""The package's shape (issue: labkit grows up): every module names the chapter that teaches it,
imports only go down the layers, no import cycles, modules small enough to read in one sitting,
notebook code cells of at most 30 lines."""

import ast
import importlib.util
import json
import re
import sys
from pathlib import Path

import pytest

PKG = Path(__file__).resolve().parent.parent / "labkit"
MODULES = sorted(p for p in PKG.rglob("*.py"))
MAX_LINES = 400  # one concept per module, whole: split by concept, never to get under a line count
# The layers from the bottom up: a module may import its own layer and the ones below, never one
# above. An entry names a top-level module or a whole package (``labkit.hardware`` places every
# module under labkit/hardware/, new ones included); ``labkit`` is the package's own __init__.
LAYERS: list[set[str]] = [
    {"labkit.settings", "labkit.paths", "labkit.table", "labkit.stats"},
    {"labkit.hardware"},
    {"labkit.results", "labkit.chapters"},  # recording a figure: any layer above may record where it measures
    {"labkit.models"},
    {"labkit.llm"},
    {"labkit.media"},
    {"labkit.serving"},
    {"labkit.engines"},
    {"labkit.production"},
    {"labkit.report", "labkit.checks", "labkit.jupyter", "labkit.cli",
     "labkit.gpucheck", "labkit"},
]


def _name(path: Path) -> str:
    return ".".join(path.relative_to(PKG.parent).with_suffix("").parts).removesuffix(".__init__")


def _is_module(name: str) -> bool:
    path = PKG.parent / name.replace(".", "/")
    return path.with_suffix(".py").exists() or (path / "__init__.py").exists()


def labkit_imports(path: Path) -> set[str]:
    """The labkit modules ``path`` imports anywhere in it (inside functions too), relative or absolute:
    ``from . import x`` and ``from .x import y`` name the module ``x``, ``from .x import y`` with ``y``
    a submodule names ``x.y``."""
    name = _name(path)
    pkg = name if path.name == "__init__.py" else name.rpartition(".")[0]
    deps = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            deps |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = importlib.util.resolve_name("." * node.level + (node.module or ""), pkg) \
                if node.level else (node.module or "")
            for a in node.names:
                full = f"{base}.{a.name}"
                deps.add(full if _is_module(full) else base)
    return {d for d in deps if (d == "labkit" or d.startswith("labkit.")) and d != name}


def layer_of(module: str) -> int | None:
    """Index in :data:`LAYERS` of the entry that places ``module`` (the longest match), or None."""
    best = None
    for i, layer in enumerate(LAYERS):
        for entry in layer:
            hit = module == entry or (entry != "labkit" and module.startswith(entry + "."))
            if hit and (best is None or len(entry) > best[1]):
                best = (i, len(entry))
    return None if best is None else best[0]


def layer_violations(graph: dict[str, set[str]]) -> list[str]:
    """What breaks the layer order in ``graph`` (module -> labkit modules it imports): an import into
    a higher layer, or a module (importer or imported) that no layer places."""
    problems = []
    for module in sorted(set(graph) | {d for deps in graph.values() for d in deps}):
        if layer_of(module) is None:
            problems.append(f"{module} is in no layer: place it in LAYERS (tests/test_layout.py)")
    for module, deps in sorted(graph.items()):
        low = layer_of(module)
        for dep in sorted(deps):
            high = layer_of(dep)
            if low is not None and high is not None and high > low:
                problems.append(f"{module} (layer {low}) imports {dep} (layer {high}), a higher layer")
    return problems


def import_graph() -> dict[str, set[str]]:
    return {_name(path): labkit_imports(path) for path in MODULES}


@pytest.mark.parametrize("path", MODULES, ids=lambda p: str(p.relative_to(PKG)))
def test_every_module_names_its_chapter(path):
    doc = ast.get_docstring(ast.parse(path.read_text())) or ""
    if path == PKG / "__init__.py":
        return  # the package's own docstring describes the layout
    assert re.search(r"[Cc]hapters? \d\d|every chapter", doc), f"{_name(path)}: docstring names no chapter"


def test_imports_only_go_down_the_layers():
    problems = layer_violations(import_graph())
    assert not problems, "\n".join(problems)


def test_the_layer_check_catches_an_upward_import_and_an_unplaced_module():
    graph = import_graph()
    assert "labkit.hardware.roofline" in graph["labkit.hardware.catalog"]  # the graph sees imports
    assert "labkit.hardware.microbench" in graph["labkit.llm.decode"]
    upward = "labkit.hardware.machine (layer 1) imports labkit.serving.loadgen (layer 6), a higher layer"
    machine = "labkit.hardware.machine"
    planted = {**graph, machine: graph[machine] | {"labkit.serving.loadgen"}}
    assert upward in layer_violations(planted) and upward not in layer_violations(graph)
    assert layer_violations({"labkit.hardware.machine": {"labkit.serving.loadgen"}}) == [upward]
    assert layer_violations({"labkit.llm.decode": {"labkit.models", "labkit.hardware.microbench"}}) == []
    assert layer_violations({"labkit.newthing": set()}) == [
        "labkit.newthing is in no layer: place it in LAYERS (tests/test_layout.py)"]
    assert layer_of("labkit.serving.arrivals") == layer_of("labkit.serving") == 6  # placed by package
    assert layer_of("labkit") == layer_of("labkit.gpucheck") == len(LAYERS) - 1


def test_function_level_and_absolute_imports_are_seen(tmp_path, monkeypatch):
    fake = tmp_path / "labkit" / "hardware"
    fake.mkdir(parents=True)
    for name in ("__init__.py", "roofline.py"):
        (fake / name).write_text("")
    (tmp_path / "labkit" / "serving").mkdir()
    (tmp_path / "labkit" / "serving" / "__init__.py").write_text("")
    (tmp_path / "labkit" / "serving" / "loadgen.py").write_text("")
    module = fake / "machine.py"
    module.write_text("def f():\n    import labkit.serving.loadgen\n    from ..serving import loadgen\n"
                      "    from . import roofline\n    from .roofline import ridge_point\n")
    monkeypatch.setattr(sys.modules[__name__], "PKG", tmp_path / "labkit")
    assert labkit_imports(module) == {"labkit.serving.loadgen", "labkit.hardware.roofline"}


def test_no_import_cycles():
    graph = import_graph()
    seen, stack = set(), []

    def visit(n):
        if n in stack:
            raise AssertionError("import cycle: " + " -> ".join(stack[stack.index(n):] + [n]))
        if n in seen:
            return
        stack.append(n)
        for d in graph.get(n, ()):
            visit(d)
        stack.pop()
        seen.add(n)

    for n in graph:
        visit(n)


def test_modules_stay_small():
    long = {str(p.relative_to(PKG)): len(p.read_text().splitlines()) for p in MODULES}
    over = {k: v for k, v in long.items() if v > MAX_LINES}
    assert not over, f"split these (at most {MAX_LINES} lines each): {over}"


MAX_CELL_LINES = 30  # notebooks stay thin: prose, a few calls into labkit, a plot, a check


def long_cells(notebook: Path, limit: int = MAX_CELL_LINES) -> list[tuple[int, int]]:
    """``(cell index, lines)`` of ``notebook``'s code cells longer than ``limit`` lines."""
    cells = json.loads(notebook.read_text())["cells"]
    sizes = [(i, len("".join(c["source"]).splitlines())) for i, c in enumerate(cells)
             if c["cell_type"] == "code"]
    return [(i, n) for i, n in sizes if n > limit]


def test_notebook_code_cells_stay_short(tmp_path):
    notebooks = sorted((PKG.parent / "notebooks").glob("*.ipynb"))
    over = {p.name: cells for p in notebooks if (cells := long_cells(p))}
    assert not over, f"move logic into labkit (code cells of at most {MAX_CELL_LINES} lines): {over}"
    nb = tmp_path / "long.ipynb"  # a 31-line code cell is caught, a long markdown cell is not
    nb.write_text(json.dumps({"cells": [{"cell_type": "code", "source": ["x = 1\n"] * 31},
                                        {"cell_type": "markdown", "source": ["a\n"] * 40}]}))
    assert long_cells(nb) == [(0, 31)]
