"""The lab's own checks (labkit.checks) and the one-judge rule: each check fails on its failing input
and holds on its passing one, names a unit test that runs a broken implementation through it, no
figure is judged both by a check and by a ledger row, and notebooks end with ``verify``."""

import ast
import json
import re
from pathlib import Path

import pytest

from labkit import checks
from labkit.chapters import CHAPTERS, available
from labkit.report.ledger import load_ledger, split_key

ROOT = Path(__file__).resolve().parent.parent
ALL = [(c, k.name) for c in available() for k in checks.checks(c)]


def _check(chapter: str, name: str) -> checks.Check:
    return {k.name: k for k in checks.checks(chapter)}[name]


@pytest.mark.parametrize(("chapter", "name"), ALL)
def test_check_fails_on_its_failing_input(chapter, name):
    c = _check(chapter, name)
    o = checks.evaluate(c, c.fails_on)
    assert o.held is False, f"{chapter}/{name} did not fail on fails_on: {o.detail}"
    assert o.detail, "a failing check says what it saw"


@pytest.mark.parametrize(("chapter", "name"), ALL)
def test_check_holds_on_its_passing_input(chapter, name):
    c = _check(chapter, name)
    o = checks.evaluate(c, c.holds_on)
    assert o.held is True, f"{chapter}/{name} did not hold on holds_on: {o.detail}"


def broken_test_source(broken: str) -> str | None:
    """The source of the test function ``tests/file.py::test_name`` names, or ``None``."""
    file, _, name = broken.partition("::")
    path = ROOT / file
    if not path.is_file():
        return None
    tree = ast.parse(path.read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef) and node.name == name:
            return ast.get_source_segment(path.read_text(), node)
    return None


@pytest.mark.parametrize(("chapter", "name"), ALL)
def test_check_names_a_broken_implementation_test_that_calls_it(chapter, name):
    c = _check(chapter, name)
    src = broken_test_source(c.broken)
    assert src is not None, f"{chapter}/{name}: broken names {c.broken}, which does not exist"
    assert f'"{name}"' in src and "outcome(" in src, (
        f"{c.broken} must run a broken implementation through checks.outcome({chapter!r}, {name!r}, ...)")


@pytest.mark.parametrize("chapter", list(available()))
def test_every_chapter_keeps_three_checks(chapter):
    assert len(checks.checks(chapter)) >= 3, f"chapter {chapter}: fewer than three of the lab's own checks"


def double_judged(claims, found) -> list[str]:
    """Figures judged twice: a ledger row's key (or a ``gpu`` row's expectation) that one of the same
    chapter's own checks also needs."""
    judged: dict[tuple[str, str], str] = {}
    for c in claims:
        for ref in [c.key, c.gpu]:
            if ref:
                judged.setdefault(split_key(ref, c.chapter), c.id)
    out = []
    for k in found:
        for key in k.needs:
            hit = judged.get((k.chapter, key.split(".")[0]))
            if hit:
                out.append(f"{k.chapter}/{key}: check {k.name} and ledger row {hit}")
    return out


def test_no_figure_is_judged_twice():
    found = [k for c in CHAPTERS for k in checks.checks(c)]
    twice = double_judged(load_ledger(), found)
    assert not twice, "one judge per figure: a claim is the ledger's, a check of the lab's code is "\
        "labkit/checks's:\n" + "\n".join(twice)


def test_double_judged_spots_a_shared_key():
    claims = [c for c in load_ledger() if c.chapter == "internals" and c.key and ":" not in c.key][:1]
    assert claims, "chapter internals has a ledger row keyed on a recorded figure"
    fake = checks.Check("internals", "fake", "a claim", (claims[0].key,), lambda v: (True, ""), {}, {},
                        "tests/test_checks.py::test_x")
    assert double_judged(claims, [fake]) and not double_judged(claims, [])


def _sources(nb: str) -> list[str]:
    cells = json.loads((ROOT / "notebooks" / nb).read_text())["cells"]
    return ["".join(c["source"]) for c in cells if c["cell_type"] == "code"]


@pytest.mark.parametrize("chapter", list(available()))
def test_notebook_ends_with_verify_and_records_what_checks_need(chapter):
    code = _sources(CHAPTERS[chapter])
    assert not any(re.search(r"(?<![\w.])check\(", c) for c in code), \
        "the lab's checks are in labkit/checks/<chapter>.py, evaluated by verify(), not check() calls"
    assert any(f'verify("{chapter}")' in c for c in code[-2:]), f"end with verify({chapter!r})"
    text = "\n".join(code) + "".join(p.read_text() for p in (ROOT / "labkit").rglob("*.py"))
    for k in checks.checks(chapter):
        for key in k.needs:
            key = key.split(".")[0]
            assert f'"{key}"' in text or f"'{key}'" in text or f'"{key}_' in text, \
                f"{k.name} needs {key!r}: never recorded"


def test_missing_figure_fails_and_when_skips():
    c = checks.Check("setup", "t", "a claim", ("x",), lambda v: (v["x"] > 1, f"x={v['x']}"), {"x": 0},
                     {"x": 2}, "tests/test_checks.py::test_x",
                     when=lambda v: "no server" if v.get("server") == "none" else None)
    assert checks.evaluate(c, {}).held is False and "not recorded" in checks.evaluate(c, {}).detail
    assert checks.evaluate(c, {"x": 5, "server": "none"}).held is None
    assert checks.line(checks.evaluate(c, {"x": 2})).startswith("CHECK ok")
    assert checks.line(checks.evaluate(c, {"x": 0})).startswith("CHECK FAIL")


def test_a_check_on_a_going_further_study_skips_only_in_a_run_without_it():
    c = checks.Check("setup", "t", "a claim", ("x",), lambda v: (v["x"] > 1, ""), {"x": 0}, {"x": 2},
                     "tests/test_checks.py::test_x", when=checks.studied)
    skipped = checks.evaluate(c, {"study": False})
    assert skipped.held is None and "LABKIT_STUDY=1" in skipped.detail
    assert checks.evaluate(c, {"x": 0, "study": True}).held is False  # the study ran: judged as usual
    assert checks.evaluate(c, {"study": True}).held is False  # ran and recorded nothing: a failure


def _data(values: dict) -> dict:
    return {"chapter": "setup", "device": "cpu",
            "values": {k: {"value": v, "unit": "", "note": ""} for k, v in values.items()}}


def test_verify_prints_checks_and_claims_then_raises_on_a_failed_check(monkeypatch, capsys):
    good = checks.Check("setup", "good", "holds", ("x",), lambda v: (True, "fine"), {}, {},
                        "tests/t.py::test_a")
    bad = checks.Check("setup", "bad", "breaks", ("x",), lambda v: (False, "x too small"), {}, {},
                       "tests/t.py::test_b")
    monkeypatch.setattr(checks, "checks", lambda ch: [bad, good, good])
    monkeypatch.setattr(checks, "unrecorded", lambda ch, data: [])
    with pytest.raises(AssertionError, match="1 failed: breaks"):
        checks.verify("setup", _data({"x": 1}))
    out = capsys.readouterr().out
    assert "CHECK FAIL breaks" in out and "CHECK ok   holds" in out and "claims in this chapter" in out


def test_verify_fails_on_an_unrecorded_claim_figure_but_not_on_a_verdict(monkeypatch, capsys):
    good = checks.Check("setup", "good", "holds", ("x",), lambda v: (True, "fine"), {}, {},
                        "tests/t.py::test_a")
    monkeypatch.setattr(checks, "checks", lambda ch: [good] * 3)
    mine = [c for c in load_ledger() if c.chapter == "setup" and c.expect and ":" not in c.key
            and "/" not in c.key and c.evidence != "gpu"]
    with pytest.raises(AssertionError, match=f"claim {mine[0].id}:"):
        checks.verify("setup", _data({"x": 1}))
    # every figure recorded, each as a value that meets no expectation: verdicts only, no failure
    values = {c.key: "nonsense" for c in mine} | {"x": 1}
    values |= {split_key(c.gpu, "setup")[1]: 0 for c in load_ledger() if c.chapter == "setup" and c.gpu}
    checks.verify("setup", _data(values))
    assert "nonsense" in capsys.readouterr().out


def test_an_unmeasured_figure_with_its_reason_is_not_forgotten(monkeypatch, tmp_path):
    from labkit import results
    from labkit.report.claims_table import chapter_claims, unrecorded

    monkeypatch.setenv("LABKIT_RESULTS", str(tmp_path))
    mine = [c for c in load_ledger() if c.chapter == "setup" and c.expect and ":" not in c.key
            and "/" not in c.key and c.evidence != "gpu"]
    results.unmeasured("setup", mine[0].key, "no such tool here")
    data = results.load("setup")
    assert data is not None
    assert mine[0].id not in dict(unrecorded("setup", data))
    row = {r["id"]: r for r in chapter_claims("setup", data)}[mine[0].id]
    assert row["verdict"] == "not measured" and "no such tool" in row["reason"]
    with pytest.raises(ValueError, match="why"):
        results.unmeasured("setup", "x", " ")


def test_verify_without_a_run_says_what_to_do(monkeypatch, tmp_path):
    monkeypatch.setenv("LABKIT_RESULTS", str(tmp_path))
    with pytest.raises(RuntimeError, match="run the notebook from the top"):
        checks.this_run("setup")


def test_check_needs_complete_examples_and_a_broken_test():
    with pytest.raises(ValueError, match="fails_on lacks"):
        checks.check("setup", "c", needs=("a", "b"), broken="tests/t.py::test_a", fails_on={"a": 1},
                     holds_on={"a": 1, "b": 2})(lambda v: (True, ""))
    with pytest.raises(ValueError, match="broken must name"):
        checks.check("setup", "c", needs=("a",), broken="somewhere", fails_on={"a": 1}, holds_on={"a": 1})


def test_values_of_this_run_expose_a_spread(monkeypatch, tmp_path):
    from labkit import results

    monkeypatch.setenv("LABKIT_RESULTS", str(tmp_path))
    results.record("setup", "speedup", 1.4, "x", "median of 5", spread=(1.1, 1.6, 5))
    results.record("setup", "flag", True)
    v = checks.values_of(checks.this_run("setup"))
    assert v == {"speedup": 1.4, "speedup.lo": 1.1, "speedup.hi": 1.6, "speedup.n": 5, "flag": True}


def test_findings_sentence_judges_only_what_this_run_recorded(monkeypatch, tmp_path):
    """The "What we learned" sentence never reports a previous run's verdicts, and leaves the claims whose
    figures come further down the page to the closing table (counting them)."""
    from labkit import results
    from labkit.report.claims_table import findings_sentence, unrecorded

    monkeypatch.setenv("LABKIT_RESULTS", str(tmp_path))
    mine = [c for c in load_ledger() if c.chapter == "setup" and c.expect and ":" not in c.key
            and "/" not in c.key and c.evidence != "gpu"]
    results.unmeasured("setup", mine[0].key, "no such tool here")  # an earlier kernel's figure
    monkeypatch.setattr(results, "RUN_ID", "a-new-kernel-process")
    assert findings_sentence("setup").startswith("This run has recorded no figure")
    results.unmeasured("setup", mine[0].key, "no such tool here")  # this run: one figure so far
    later = unrecorded("setup", results.load("setup") or {})
    assert later and f"{len(later)} more, on figures recorded further down" in findings_sentence("setup")
