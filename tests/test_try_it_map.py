"""README's "Try It Yourself map" and chapter 01's open-weights table (chapters 01-08): every notebook
and section heading they cite exists, every ``make`` target and ``LABKIT_*`` variable they name is
real, and each chapter's opening lists the boxes the map places in it."""

import json
import re
from pathlib import Path

import pytest

from labkit.chapters import CHAPTERS

REPO = Path(__file__).resolve().parent.parent
NOTEBOOKS = REPO / "notebooks"
CITE = re.compile(r"`(\d\d[a-z]?_[a-z_]+\.ipynb)`:((?:\s*\"[^\"]+\";?)+)")


def headings(notebook: Path) -> set[str]:
    """The text of every markdown heading (``#`` to ``####``) in ``notebook``."""
    nb = json.loads(notebook.read_text())
    return {m.group(1).strip() for c in nb["cells"] if c["cell_type"] == "markdown"
            for m in re.finditer(r"^#{1,4}\s+(.+)$", "".join(c["source"]), re.M)}


def map_rows(readme: str) -> list[list[str]]:
    """The table rows of README's "Try It Yourself map" section, as cells (header and rule left out)."""
    section = readme.split("## Try It Yourself map", 1)[1].split("\n## ", 1)[0]
    rows = [[c.strip() for c in line.strip().strip("|").split("|")] for line in section.splitlines()
            if line.startswith("|")]
    return [r for r in rows[2:]]


def citations(cell: str) -> list[tuple[str, str]]:
    """``(notebook, heading)`` pairs in a cell written as `NN_name.ipynb`: "heading"; "heading"."""
    return [(m.group(1), h) for m in CITE.finditer(cell) for h in re.findall(r"\"([^\"]+)\"", m.group(2))]


def check(notebook: str, heading: str) -> str | None:
    path = NOTEBOOKS / notebook
    if not path.exists():
        return f"{notebook} does not exist"
    return None if heading in headings(path) else f"{notebook} has no heading {heading!r}"


README = (REPO / "README.md").read_text()


def test_the_map_has_the_ten_boxes_and_cites_real_headings():
    rows = map_rows(README)
    assert len(rows) == 10 and len({r[0] for r in rows}) == 10
    problems = []
    for row in rows:
        assert len(row) == 4, row
        cited = citations(row[1])
        assert cited, f"row {row[0]!r} cites no notebook heading"
        problems += [p for nb, h in cited if (p := check(nb, h))]
    assert not problems, "\n".join(problems)


def test_commands_in_the_map_exist():
    makefile = (REPO / "Makefile").read_text()
    settings = (REPO / "labkit" / "settings.py").read_text()
    section = README.split("## Try It Yourself map", 1)[1].split("\n## ", 1)[0]
    for target in re.findall(r"make ([a-z][\w-]*)", section):
        if target.startswith("lab-"):
            assert target[4:] in CHAPTERS, f"make {target}: no such chapter"
        else:
            assert re.search(rf"^{re.escape(target)}:", makefile, re.M), f"make {target}: no such target"
    for var in set(re.findall(r"LABKIT_[A-Z_]+", section)):
        assert f'"{var}"' in settings, f"{var} is not read by labkit/settings.py"


def test_the_checker_catches_a_renamed_heading_and_a_missing_notebook():
    row = '`04_gpu_hardware.ipynb`: "The decode ceiling"; "The roofline, renamed"'
    assert citations(row) == [("04_gpu_hardware.ipynb", "The decode ceiling"),
                              ("04_gpu_hardware.ipynb", "The roofline, renamed")]
    assert check("04_gpu_hardware.ipynb", "The decode ceiling") is None
    assert "no heading" in (check("04_gpu_hardware.ipynb", "The roofline, renamed") or "")
    assert "does not exist" in (check("09_missing.ipynb", "Anything") or "")


def test_chapter_01_open_weights_table_points_at_real_sections():
    nb = json.loads((NOTEBOOKS / CHAPTERS["concepts"]).read_text())
    cell = next("".join(c["source"]) for c in nb["cells"] if c.get("id") == "open-weights")
    rows = [line for line in cell.splitlines() if line.startswith("| ") and "---" not in line][1:]
    assert [r.split("|")[1].strip() for r in rows] == [
        "quantize", "fine-tune", "benchmark on your data", "control the deployment", "run offline"]
    by_number = {Path(f).stem.split("_")[0]: f for f in CHAPTERS.values()}
    cited = [(by_number[n], h) for n, h in re.findall(r"chapter (\d\d[a-z]?),? \"([^\"]+)\"", cell)]
    assert len(cited) >= 5
    problems = [p for nb_, h in cited if (p := check(nb_, h))]
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize("notebook", sorted({c[0] for r in map_rows(README) for c in citations(r[1])}))
def test_each_cited_notebook_is_a_chapter(notebook):
    assert notebook in CHAPTERS.values()


OPENING_MARK = "**Try It Yourself boxes here:**"


def opening_boxes(notebook: Path) -> set[str] | None:
    """The boxes a chapter's opening cell lists after :data:`OPENING_MARK` (``*box*`` items), or
    None when the opening has no such paragraph."""
    first = "".join(json.loads(notebook.read_text())["cells"][0]["source"])
    if OPENING_MARK not in first:
        return None
    para = first.split(OPENING_MARK, 1)[1].split("\n\n", 1)[0]
    return {" ".join(box.split()) for box in re.findall(r"\*([^*]+)\*", para)}  # a box may wrap a line


def boxes_by_notebook(readme: str) -> dict[str, set[str]]:
    out: dict[str, set[str]] = {}
    for row in map_rows(readme):
        for nb, _ in citations(row[1]):
            out.setdefault(nb, set()).add(row[0])
    return out


def test_each_chapter_opening_lists_the_boxes_the_map_places_there(tmp_path):
    wanted = boxes_by_notebook(README)
    for notebook in CHAPTERS.values():
        got = opening_boxes(NOTEBOOKS / notebook)
        assert got is not None, f"{notebook}: its opening has no {OPENING_MARK!r} paragraph"
        assert got == wanted.get(notebook, set()), f"{notebook}: opening {got}, map {wanted.get(notebook)}"
    stale = tmp_path / "stale.ipynb"  # an opening that forgot a box the map places in its chapter
    stale.write_text(json.dumps({"cells": [{"cell_type": "markdown", "source": [
        "# 07\n\n", f"{OPENING_MARK} *run Whisper locally* in \"1 · Whisper\".\n"]}]}))
    assert opening_boxes(stale) == {"run Whisper locally"} != wanted["07_beyond_llms.ipynb"]
