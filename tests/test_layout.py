"""The package's shape (issue: labkit grows up): every module names the chapter that teaches it,
imports only go down the layers, no import cycles, modules small enough to read in one sitting,
notebook code cells of at most 30 lines."""

import ast
import importlib.util
import json
import re
import sys
from pathlib import Path
from typing import Any

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
    {"labkit.experiments"},  # the chapters' experiments on real engines
    {"labkit.production"},
    {"labkit.figures"},  # each chapter's figures, read from its page by its closing cell
    {"labkit.report", "labkit.jupyter", "labkit.gpucheck"},  # the report; a notebook's kernel; the GPU check
    {"labkit.checks"},  # the lab's own checks, printed beside the report's verdicts
    {"labkit.cli", "labkit"},  # the command line, and the package's own __init__
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
    assert layer_of("labkit") == layer_of("labkit.cli") == len(LAYERS) - 1
    site, checks, cli = (layer_of(m) for m in ("labkit.report.site", "labkit.checks.setup", "labkit.cli"))
    assert site is not None and checks is not None and cli is not None and site < checks < cli


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
    seen: set[str] = set()
    stack: list[Any] = []

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


# Imports stand at the top of a module, where a reader sees what it needs. A function may import only
# these packages itself, each for the reason given; the command line imports each subcommand's modules
# when it runs (``labkit --help`` in 0.03 s, not 0.3 s); any other late import says why on its line.
LATE_IMPORTS = {
    **dict.fromkeys(("torch", "transformers", "peft", "torchao", "auto_gptq"),
                    "the numeric stack: seconds to import; serving, production and reports run without it"),
    **dict.fromkeys(("diffusers", "faster_whisper", "ctranslate2"), "chapter 07's media models only"),
    "matplotlib": "0.4 s to import; loaded when a figure is drawn",
    **dict.fromkeys(("scipy", "sklearn"), "0.6-0.9 s to import, for one function each"),
    "safetensors": "safetensors.torch loads torch",
    "gguf": "0.2 s to import, for the few functions that read GGUF files",
    **dict.fromkeys(("nbconvert", "jinja2"), "make report's page rendering only (nbconvert: 1.4 s)"),
    "ollama": "the optional Ollama client (no server offline)",
    "huggingface_hub": "the full profile's hub downloads only",
    "pynvml": "NVIDIA machines only",
}


def late_imports(path: Path) -> list[str]:
    """``file:line import`` for each import inside a function of ``path`` that is neither of a
    :data:`LATE_IMPORTS` package nor commented with its reason (``labkit/cli.py`` aside)."""
    if path.name == "cli.py" and path.parent.name == "labkit":
        return []
    lines = path.read_text().splitlines()
    out = []
    for f in ast.walk(ast.parse(path.read_text())):
        if isinstance(f, ast.FunctionDef | ast.AsyncFunctionDef):
            for n in ast.walk(f):
                if isinstance(n, ast.Import | ast.ImportFrom):
                    roots = {a.name.split(".")[0] for a in n.names} if isinstance(n, ast.Import) \
                        else {"" if n.level else (n.module or "").split(".")[0]}
                    if not roots <= LATE_IMPORTS.keys() and "#" not in lines[(n.end_lineno or n.lineno) - 1]:
                        out.append(f"{path.name}:{n.lineno} {lines[n.lineno - 1].strip()}")
    return out


def test_imports_stand_at_the_top_unless_heavy_or_explained(tmp_path):
    late = [x for p in MODULES for x in late_imports(p)]
    assert not late, "import at the top of the module, or say on the line why not:\n" + "\n".join(late)
    mod = tmp_path / "mod.py"
    mod.write_text("def f():\n    import torch\n    import json\n    from .settings import profile\n"
                   "    import yaml  # only the deploy generator\n")
    assert late_imports(mod) == ["mod.py:3 import json", "mod.py:4 from .settings import profile"]


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


# One import path per name: a labkit module hands out only the names it defines (a package's __init__
# aside), so ``from labkit.serving.loadgen import LoadSpec`` fails when LoadSpec lives in loadspec.
ROOT = PKG.parent


def _top_names(path: Path) -> tuple[set[str], set[str], list[str]]:
    """(names ``path`` defines at module level, names of labkit objects it imports (modules aside), its
    ``__all__``)."""
    defined, imported, exported = set(), set(), []
    pkg = _name(path) if path.name == "__init__.py" else _name(path).rpartition(".")[0]
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            defined.add(node.name)
        elif isinstance(node, ast.Assign | ast.AnnAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for t in targets:
                for n in ast.walk(t):
                    if isinstance(n, ast.Name):
                        defined.add(n.id)
                        if n.id == "__all__" and isinstance(node.value, ast.List | ast.Tuple):
                            exported = [e.value for e in node.value.elts
                                        if isinstance(e, ast.Constant) and isinstance(e.value, str)]
        elif isinstance(node, ast.ImportFrom) and (node.level or (node.module or "").startswith("labkit")):
            base = importlib.util.resolve_name("." * node.level + (node.module or ""), pkg) \
                if node.level else (node.module or "")
            imported |= {a.asname or a.name for a in node.names if not _is_module(f"{base}.{a.name}")}
        elif isinstance(node, ast.If | ast.Try | ast.With):
            for sub in ast.walk(node):
                if isinstance(sub, ast.FunctionDef | ast.ClassDef):
                    defined.add(sub.name)
                elif isinstance(sub, ast.Name) and isinstance(sub.ctx, ast.Store):
                    defined.add(sub.id)
    return defined, imported - defined, exported


def _module_file(module: str) -> Path | None:
    path = ROOT / module.replace(".", "/")
    return path.with_suffix(".py") if path.with_suffix(".py").exists() else None  # packages are allowed


def _sources() -> list[tuple[str, str, str]]:
    """(file, its package for relative imports, Python source) of labkit, tests, benchmarks and notebooks."""
    out = []
    for folder in ("labkit", "tests", "benchmarks"):
        for p in sorted((ROOT / folder).rglob("*.py")):
            rel = p.relative_to(ROOT)
            out.append((str(rel), ".".join(rel.parent.parts), p.read_text()))
    for p in sorted((ROOT / "notebooks").glob("*.ipynb")):
        cells = json.loads(p.read_text())["cells"]
        code = "\n".join("".join(c["source"]) for c in cells if c["cell_type"] == "code"
                         and not "".join(c["source"]).lstrip().startswith(("!", "%")))
        out.append((str(p.relative_to(ROOT)), "", code))
    return out


def second_import_paths(sources: list[tuple[str, str, str]]) -> list[str]:
    """Each ``file: module.name`` that reaches a name through a labkit module that only imports it (by
    ``from module import name`` or ``module.name``)."""
    problems, cache = [], {}

    def borrowed(module: str, name: str) -> bool:
        path = _module_file(module)
        if path is None or _is_module(f"{module}.{name}"):
            return False
        if path not in cache:
            cache[path] = _top_names(path)
        defined, imported, _ = cache[path]
        return name in imported and name not in defined

    for file, pkg, src in sources:
        tree = ast.parse(src)
        aliases = {}
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom):
                base = importlib.util.resolve_name("." * node.level + (node.module or ""), pkg) \
                    if node.level else (node.module or "")
                if not base.startswith("labkit"):
                    continue
                for a in node.names:
                    if _module_file(f"{base}.{a.name}"):
                        aliases[a.asname or a.name] = f"{base}.{a.name}"
                    elif borrowed(base, a.name):
                        problems.append(f"{file}: {base}.{a.name}")
            elif isinstance(node, ast.Import):
                aliases |= {a.asname: a.name for a in node.names if a.asname and a.name.startswith("labkit")}
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) \
                    and node.value.id in aliases:
                module = aliases[node.value.id]
                if borrowed(module, node.attr):
                    problems.append(f"{file}: {module}.{node.attr}")
    return sorted(set(problems))


def foreign_exports() -> list[str]:
    """Each name a module's ``__all__`` lists that it does not define (a package's __init__ aside)."""
    problems = []
    for path in sorted(PKG.rglob("*.py")):
        if path.name != "__init__.py":
            defined, _, exported = _top_names(path)
            problems += [f"{_name(path)}.__all__ lists {n}, defined elsewhere"
                         for n in exported if n not in defined]
    return problems


def test_every_name_has_one_import_path():
    problems = second_import_paths(_sources()) + foreign_exports()
    assert not problems, "import each name from the module that defines it:\n" + "\n".join(problems)


def test_a_second_import_path_is_spotted():
    src = ("from labkit.serving.loadgen import LoadSpec\n"
           "from labkit.serving import loadgen\nloadgen.ClientSpec\n")
    assert second_import_paths([("x.py", "", src)]) == [
        "x.py: labkit.serving.loadgen.ClientSpec", "x.py: labkit.serving.loadgen.LoadSpec"]
    assert second_import_paths([("x.py", "", "from labkit.serving.loadspec import LoadSpec\n")]) == []


def missing_names(sources: list[tuple[str, str, str]]) -> list[str]:
    """Each ``file: module.name`` whose code takes from a labkit module a name it does not have
    (``from module import name`` or ``module.name``): mypy checks labkit, tests and benchmarks, not
    the notebooks' cells, where a renamed function otherwise surfaces only when the chapter runs."""
    problems = []
    for file, _, src in sources:
        aliases = {}
        for node in ast.walk(ast.parse(src)):
            if isinstance(node, ast.ImportFrom) and not node.level \
                    and (node.module or "").startswith("labkit"):
                for a in node.names:
                    if _is_module(f"{node.module}.{a.name}"):
                        aliases[a.asname or a.name] = importlib.import_module(f"{node.module}.{a.name}")
                    elif not hasattr(importlib.import_module(node.module or ""), a.name):
                        problems.append(f"{file}: {node.module}.{a.name}")
            elif isinstance(node, ast.Import):
                aliases |= {a.asname: importlib.import_module(a.name) for a in node.names
                            if a.asname and a.name.startswith("labkit")}
        for node in ast.walk(ast.parse(src)):
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) \
                    and node.value.id in aliases and not hasattr(aliases[node.value.id], node.attr):
                problems.append(f"{file}: {aliases[node.value.id].__name__}.{node.attr}")
    return problems


def test_pages_use_only_names_labkit_has():
    pages = [s for s in _sources() if s[0].startswith("notebooks/")]
    problems = missing_names(pages)
    assert not problems, "these names are not (or no longer) in labkit:\n" + "\n".join(problems)
    gone = "from labkit.serving import loadgen\nloadgen.no_such_thing()\n"
    assert missing_names([("x.ipynb", "", gone)]) == ["x.ipynb: labkit.serving.loadgen.no_such_thing"]
    assert missing_names([("x.ipynb", "", "from labkit.stats import no_such_helper\n")]) == [
        "x.ipynb: labkit.stats.no_such_helper"]
