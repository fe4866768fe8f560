"""labkit.figures: each chapter's closing cell records the page's figures from labkit/figures/<chapter>.py,
so the notebooks carry no bookkeeping."""

import ast
import sys
import types

import nbformat
import pytest

from labkit import figures
from labkit.chapters import CHAPTERS
from labkit.paths import NOTEBOOKS, REPO


def test_take_returns_the_named_variables_in_order():
    assert figures.take({"a": 1, "b": 2, "c": 3}, "c a") == (3, 1)
    assert figures.take({"a": 1, "b": 2}, " b\n a ") == (2, 1)


def test_keep_names_the_variable_the_page_lacks(monkeypatch):
    fake = types.ModuleType("labkit.figures.fake")
    fake.keep = lambda page: figures.take(page, "tps ttft_ms")  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "labkit.figures.fake", fake)
    with pytest.raises(figures.NotOnPage, match=r"fake's figures read the page's variable\(s\) ttft_ms.*Run"):
        figures.keep("fake", {"tps": 9.0})


def test_keep_refuses_a_chapter_without_figures():
    with pytest.raises(ValueError, match="labkit/figures/nosuch.py is missing"):
        figures.keep("nosuch", {})


@pytest.mark.parametrize("short", sorted(CHAPTERS))
def test_each_chapter_keeps_its_figures_in_its_closing_cell(short):
    notebook = nbformat.read(NOTEBOOKS / CHAPTERS[short], as_version=4)
    cells = [c for c in notebook.cells if c.cell_type == "code"]
    assert f'keep("{short}", globals())' in cells[-1].source
    assert (REPO / "labkit" / "figures" / f"{short}.py").exists()


def test_notebooks_carry_no_record_calls():
    """Bookkeeping stays off the page: the figures are recorded by labkit/figures or where labkit measures."""
    calls = []
    for name in CHAPTERS.values():
        for cell in nbformat.read(NOTEBOOKS / name, as_version=4).cells:
            if cell.cell_type == "code":
                calls += [f"{name}: {ast.unparse(n)[:60]}" for n in ast.walk(ast.parse(cell.source))
                          if isinstance(n, ast.Call) and getattr(n.func, "id", getattr(n.func, "attr", ""))
                          in ("record", "unmeasured")]
    assert not calls, calls


def test_keep_partial_records_the_sections_before_the_page_stops(tmp_path, monkeypatch, capsys):
    from labkit import results

    monkeypatch.setenv(results.ENV_VAR, str(tmp_path))
    fake = types.ModuleType("labkit.figures.setup")

    def keep(page):
        results.record("setup", "ran_first", figures.take(page, "a")[0], "x")
        results.record("setup", "needs_later", figures.take(page, "b")[0], "x")

    fake.keep = keep  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "labkit.figures.setup", fake)
    figures.keep_partial("setup", {"a": 1.5})
    assert set((results.load("setup") or {})["values"]) == {"ran_first"}
    assert "recorded up to where the page stops" in capsys.readouterr().out


@pytest.mark.slow  # starts a Jupyter kernel (about 4 s)
def test_a_failed_chapter_run_keeps_the_figures_of_the_cells_that_ran(tmp_path, monkeypatch, capfd):
    """run_chapter: a cell fails, the cells above it measured something: keep_partial records it;
    the kernel's own start-up log stays out of the terminal."""
    from labkit import chapters, results

    monkeypatch.setenv(results.ENV_VAR, str(tmp_path / "results"))  # the kernel inherits it
    monkeypatch.setattr(chapters, "NOTEBOOKS", tmp_path)
    monkeypatch.setattr(chapters, "REPO", tmp_path)
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(
        "import sys, types\nfrom labkit import results\nm = types.ModuleType('labkit.figures.setup')\n"
        "m.keep = lambda page: results.record('setup', 'measured', page['tps'], 'tokens/s')\n"
        "sys.modules['labkit.figures.setup'] = m\ntps = 12.5"),
        nbformat.v4.new_code_cell("raise RuntimeError('a later cell fails')"),
        nbformat.v4.new_code_cell("print('never')")]
    nbformat.write(nb, tmp_path / CHAPTERS["setup"])
    assert chapters.run_chapter("setup", timeout=120, out_dir=tmp_path / "build") == 1
    assert (results.load("setup") or {})["values"]["measured"]["value"] == 12.5
    executed = nbformat.read(tmp_path / "build" / CHAPTERS["setup"], as_version=4)
    assert len(executed.cells) == 3  # the extra cell is not left on the page
    assert "[IPKernelApp]" not in capfd.readouterr().err
