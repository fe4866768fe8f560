"""Every labkit name has one import path: callers import a name from the module that defines it,
never through another module that imported it (package ``__init__`` files aside). Scans labkit,
the tests, the benchmarks and the notebooks' code cells."""

import ast
import importlib.util
import json
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def module_path(name: str, root: Path = ROOT) -> Path | None:
    """The file of module ``name`` (``a.b`` -> a/b.py or a/b/__init__.py) under ``root``, if any."""
    base = root / name.replace(".", "/")
    for path in (base.with_suffix(".py"), base / "__init__.py"):
        if path.is_file():
            return path
    return None


def _resolve(node: ast.ImportFrom, pkg: str) -> str:
    module = node.module or ""
    return importlib.util.resolve_name("." * node.level + module, pkg) if node.level else module


def imported_here(name: str, root: Path = ROOT) -> set[str]:
    """The names module ``name`` binds by importing them from another labkit module (its re-exports,
    were a caller to take them from it); empty for a package ``__init__``, which may gather names."""
    path = module_path(name, root)
    if path is None or path.name == "__init__.py":
        return set()
    pkg = name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            source = _resolve(node, pkg)
            if source.split(".")[0] == "labkit":
                found |= {a.asname or a.name for a in node.names
                          if module_path(f"{source}.{a.name}", root) is None}
    return found


def uses(tree: ast.AST, pkg: str = "", root: Path = ROOT) -> Iterator[tuple[str, str, int]]:
    """``(module, name, line)`` for each labkit name the code takes from a module: ``from m import
    name`` and ``alias.name`` where ``alias`` was bound to a labkit module. ``pkg``: the package a
    file with relative imports sits in."""
    aliases: dict[str, str] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            source = _resolve(node, pkg)
            if source.split(".")[0] != "labkit":
                continue
            for a in node.names:
                if module_path(f"{source}.{a.name}", root) is not None:
                    aliases[a.asname or a.name] = f"{source}.{a.name}"
                else:
                    yield source, a.name, node.lineno
        elif isinstance(node, ast.Import):
            for a in node.names:
                if a.name.startswith("labkit.") and a.asname:
                    aliases[a.asname] = a.name
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in aliases:
            yield aliases[node.value.id], node.attr, node.lineno


def second_paths(sources: dict[str, tuple[ast.AST, str]], root: Path = ROOT) -> list[str]:
    """Each use in ``sources`` (label -> (tree, package)) of a name through a module that only
    imported it."""
    cache: dict[str, set[str]] = {}
    bad = []
    for label, (tree, pkg) in sources.items():
        for module, name, line in uses(tree, pkg, root):
            if name in cache.setdefault(module, imported_here(module, root)):
                bad.append(f"{label}:{line}: {name} taken from {module}, which imports it from elsewhere")
    return bad


def _sources() -> dict[str, tuple[ast.AST, str]]:
    out: dict[str, tuple[ast.AST, str]] = {}
    for path in sorted((ROOT / "labkit").rglob("*.py")):
        name = ".".join(path.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")
        pkg = name if path.name == "__init__.py" else name.rpartition(".")[0]
        out[str(path.relative_to(ROOT))] = (ast.parse(path.read_text()), pkg)
    for path in sorted([*(ROOT / "tests").glob("*.py"), *(ROOT / "benchmarks").glob("*.py")]):
        out[str(path.relative_to(ROOT))] = (ast.parse(path.read_text()), "")
    for path in sorted((ROOT / "notebooks").glob("*.ipynb")):
        cells = json.loads(path.read_text())["cells"]
        code = "\n".join("".join(c["source"]) for c in cells if c["cell_type"] == "code")
        out[str(path.relative_to(ROOT))] = (ast.parse(code), "")
    return out


def test_every_name_has_one_import_path():
    bad = second_paths(_sources())
    assert not bad, "import each name from the module that defines it:\n" + "\n".join(bad)


def test_a_name_taken_through_a_second_module_is_found(tmp_path):
    pkg = tmp_path / "labkit"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("from .a import f\n")
    (pkg / "a.py").write_text("def f():\n    return 1\n")
    (pkg / "b.py").write_text("from .a import f\n\ndef g():\n    return f()\n")
    ok = ast.parse("from labkit.a import f\nfrom labkit import b\nb.g()\nimport labkit\n")
    wrong = ast.parse("from labkit.b import f\n")
    via_alias = ast.parse("from labkit import b\nb.f()\n")
    assert second_paths({"ok": (ok, "")}, tmp_path) == []
    assert second_paths({"wrong": (wrong, "")}, tmp_path) == [
        "wrong:1: f taken from labkit.b, which imports it from elsewhere"]
    assert len(second_paths({"alias": (via_alias, "")}, tmp_path)) == 1
