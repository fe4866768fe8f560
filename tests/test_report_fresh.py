"""The committed report matches the tree (every chapter): each chapter page and ``reports/results.json``
were made from the notebook, ledger file, checks, labkit modules and data files in this checkout (the
digest over every file the chapter's run used), the report judged
the ledger's current rows, and no committed report file carries an absolute path of the machine that
made it. When this fails: run ``make report`` (it re-runs only the chapters whose digest changed)."""

import json
import re
from pathlib import Path

import pytest

from labkit.chapters import CHAPTERS, digest, names
from labkit.report.ledger import load_ledger
from labkit.report.site import page_digest

ROOT = Path(__file__).resolve().parent.parent
REPORTS = ROOT / "reports"
DATA_URI = re.compile(r"data:[\w/+.\-]+;base64,[A-Za-z0-9+/=]+")  # embedded images are not paths
FIX = "the committed report is stale: run `make report` and commit reports/"
ABSOLUTE = re.compile(r"(?<![\w.~])/(?:home|root|work|tmp|Users|mnt|var/folders)/[\w.\-]+")


@pytest.fixture(scope="module")
def report() -> dict:
    path = REPORTS / "results.json"
    if not path.is_file():
        pytest.skip("no committed report (reports/results.json)")
    return json.loads(path.read_text())


def stale_chapters(report: dict) -> list[str]:
    """Chapters whose recorded digest differs from the tree's (a chapter the report left out is
    skipped only when it has no page)."""
    out = []
    for short, info in report["chapters"].items():
        now = digest(short, info.get("sources", [])) if short in CHAPTERS else ""
        if short in CHAPTERS and info.get("html") and info.get("digest") != now:
            out.append(f"{short} (report {info.get('digest')}, tree {now})")
    return out


def test_every_chapter_of_the_report_was_made_from_this_tree(report):
    stale = stale_chapters(report)
    assert not stale, f"{FIX}; changed since: {', '.join(stale)}"
    assert all(info.get("html") for info in report["chapters"].values()), f"{FIX}: a chapter has no page"


def test_every_chapter_page_carries_the_trees_digest(report):
    pages = sorted((REPORTS / "chapters").glob("*.html"))
    if not pages:
        pytest.skip("no committed chapter pages")
    by_stem = {names(s)[2]: s for s in CHAPTERS}
    now = {s: digest(s, report["chapters"].get(s, {}).get("sources", [])) for s in CHAPTERS}
    wrong = [f"{p.name} ({page_digest(p.read_text())} vs {now[by_stem[p.stem]]})" for p in pages
             if p.stem in by_stem and page_digest(p.read_text()) != now[by_stem[p.stem]]]
    assert not wrong, f"{FIX}: {', '.join(wrong)}"


def test_the_report_judged_the_ledgers_current_rows(report):
    assert [r["id"] for r in report["rows"]] == [c.id for c in load_ledger()], f"{FIX}: the ledger changed"


def test_every_chapter_of_the_report_ran_its_going_further_studies(report):
    without = [short for short, data in report["results"].items() if data and not data.get("study")]
    assert not without, (f"{FIX} (it runs them with LABKIT_STUDY=1); run without the Going further "
                         f"studies: {', '.join(without)}")


def test_no_committed_report_file_has_an_absolute_path():
    files = [p for p in REPORTS.rglob("*") if p.is_file() and p.suffix in (".json", ".html")]
    found = [f"{p.relative_to(ROOT)}: {m}" for p in files
             for m in set(ABSOLUTE.findall(DATA_URI.sub("", p.read_text(errors="replace"))))]
    assert not found, "absolute paths in reports/ (make report writes . and ~):\n" + "\n".join(found[:20])


def test_every_chapter_run_used_its_modules_and_data(report):
    for short, info in report["chapters"].items():
        if info.get("html"):
            used = info.get("sources", [])
            assert any(u.startswith("labkit/") for u in used), f"{FIX}: {short}'s run lists no labkit module"


def test_the_digest_covers_a_used_module_and_data_file(tmp_path, monkeypatch):
    from labkit import chapters

    module = tmp_path / "labkit" / "mod.py"
    datafile = tmp_path / "data" / "x.json"
    for p in (module, datafile):
        p.parent.mkdir(parents=True)
        p.write_text("1")
    monkeypatch.setattr(chapters, "REPO", tmp_path)
    monkeypatch.setattr(chapters, "sources", lambda short: [])
    used = ["labkit/mod.py", "data/x.json"]
    before = chapters.digest("setup", used)
    module.write_text("2")
    assert chapters.digest("setup", used) != before
    mid = chapters.digest("setup", used)
    datafile.write_text("22")
    assert chapters.digest("setup", used) != mid


def test_a_run_records_the_modules_and_data_files_it_used(tmp_path, monkeypatch):
    import json as js

    from labkit import paths, results

    monkeypatch.setenv("LABKIT_RESULTS", str(tmp_path))
    js.loads((paths.DATA / "prices.json").read_text())  # a data file read through Python's open
    with open(paths.DATA / "prices.json") as f:
        f.read()
    results.record("setup", "x", 1.0)
    data = results.load("setup")
    assert data is not None
    assert "data/prices.json" in data["sources"] and "labkit/results.py" in data["sources"]
    assert data["digest"] == digest("setup", data["sources"])


def test_stale_chapters_spots_a_changed_digest():
    short = next(iter(CHAPTERS))
    fake = {"chapters": {short: {"html": "x.html", "digest": "0" * 16}}}
    assert stale_chapters(fake) and not stale_chapters({"chapters": {short: {"digest": "0"}}})
    assert ABSOLUTE.search("saved to /work/main/build/x.json") and not ABSOLUTE.search("~/.cache/labkit")
