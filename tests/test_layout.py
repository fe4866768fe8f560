"""The package's shape (issue: labkit grows up): every module names the chapter that teaches it,
no import cycles, modules small enough to read in one sitting."""

import ast
import importlib.util
import re
from pathlib import Path

import pytest

PKG = Path(__file__).resolve().parent.parent / "labkit"
MODULES = sorted(p for p in PKG.rglob("*.py"))
# Longer than ~300 lines on purpose: one script of five independent GPU checks, each a few lines
# of setup plus printing, kept in one file so it runs from a plain checkout as one command.
LONG_ON_PURPOSE = {"hardware/gpucheck.py"}


def _name(path: Path) -> str:
    return ".".join(path.relative_to(PKG.parent).with_suffix("").parts).removesuffix(".__init__")


@pytest.mark.parametrize("path", MODULES, ids=lambda p: str(p.relative_to(PKG)))
def test_every_module_names_its_chapter(path):
    doc = ast.get_docstring(ast.parse(path.read_text())) or ""
    if path == PKG / "__init__.py":
        return  # the package's own docstring describes the layout
    assert re.search(r"[Cc]hapters? \d\d|every chapter", doc), f"{_name(path)}: docstring names no chapter"


def test_no_import_cycles():
    graph: dict[str, set[str]] = {}
    for path in MODULES:
        name, pkg = _name(path), _name(path if path.name == "__init__.py" else path.parent / "__init__.py")
        deps = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom):
                base = importlib.util.resolve_name("." * node.level + (node.module or ""), pkg) \
                    if node.level else (node.module or "")
                for a in node.names:
                    full = f"{base}.{a.name}"
                    deps.add(full if (PKG.parent / (full.replace(".", "/") + ".py")).exists() else base)
        graph[name] = {d for d in deps if d.startswith("labkit") and d != name}
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
    over = {k: v for k, v in long.items() if v > 320 and k not in LONG_ON_PURPOSE}
    assert not over, f"split these (or give a reason in LONG_ON_PURPOSE): {over}"
