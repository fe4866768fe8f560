"""Every chapter's final checks (labkit.checks): each rule fails on its realistic failing input and
holds on its passing one, so none holds by construction; notebooks end with ``verify``."""

import json
import re
from pathlib import Path

import pytest

from labkit import checks
from labkit.chapters import CHAPTERS, available

ROOT = Path(__file__).resolve().parent.parent
ALL = [(c, r.name) for c in available() for r in checks.rules(c)]


def _rule(chapter: str, name: str) -> checks.Rule:
    return {r.name: r for r in checks.rules(chapter)}[name]


@pytest.mark.parametrize(("chapter", "name"), ALL)
def test_rule_fails_on_its_failing_input(chapter, name):
    r = _rule(chapter, name)
    o = checks.evaluate(r, r.fails_on)
    assert o.held is False, f"{chapter}/{name} did not fail on fails_on: {o.detail}"
    assert o.detail, "a failing check says what it saw"


@pytest.mark.parametrize(("chapter", "name"), ALL)
def test_rule_holds_on_its_passing_input(chapter, name):
    r = _rule(chapter, name)
    o = checks.evaluate(r, r.holds_on)
    assert o.held is True, f"{chapter}/{name} did not hold on holds_on: {o.detail}"


def _sources(nb: str) -> list[str]:
    cells = json.loads((ROOT / "notebooks" / nb).read_text())["cells"]
    return ["".join(c["source"]) for c in cells if c["cell_type"] == "code"]


@pytest.mark.parametrize("chapter", list(available()))
def test_notebook_ends_with_verify_and_records_what_rules_need(chapter):
    code = _sources(CHAPTERS[chapter])
    assert not any(re.search(r"(?<![\w.])check\(", c) for c in code), \
        "final checks are rules in labkit/checks/<chapter>.py, evaluated by verify(), not check() calls"
    assert any(f'verify("{chapter}")' in c for c in code[-2:]), f"end with verify({chapter!r})"
    assert checks.rules(chapter), f"chapter {chapter} has no rules"
    text = "\n".join(code) + "".join(p.read_text() for p in (ROOT / "labkit").rglob("*.py"))
    for r in checks.rules(chapter):
        for key in r.needs:
            assert f'"{key}"' in text or f"'{key}'" in text, f"{r.name} needs {key!r}: never recorded"


def test_missing_figure_fails_and_when_skips(capsys):
    r = checks.Rule("setup", "t", "a claim", ("x",), lambda v: (v["x"] > 1, f"x={v['x']}"), {"x": 0},
                    {"x": 2}, when=lambda v: "no server" if v.get("server") == "none" else None)
    assert checks.evaluate(r, {}).held is False and "not recorded" in checks.evaluate(r, {}).detail
    assert checks.evaluate(r, {"x": 5, "server": "none"}).held is None
    assert checks.line(checks.evaluate(r, {"x": 2})).startswith("CHECK ok")
    assert checks.line(checks.evaluate(r, {"x": 0})).startswith("CHECK FAIL")


def test_verify_prints_every_rule_then_raises(monkeypatch, capsys):
    good = checks.Rule("setup", "good", "holds", ("x",), lambda v: (True, "fine"), {"x": 0}, {"x": 0})
    bad = checks.Rule("setup", "bad", "breaks", ("x",), lambda v: (False, "x too small"), {"x": 0}, {"x": 0})
    monkeypatch.setattr(checks, "rules", lambda ch: [bad, good])
    with pytest.raises(AssertionError, match="1 of 2 checks failed: breaks"):
        checks.verify("setup", {"x": 1})
    out = capsys.readouterr().out
    assert "CHECK FAIL breaks" in out and "CHECK ok   holds" in out


def test_verify_without_a_run_says_what_to_do(monkeypatch, tmp_path):
    monkeypatch.setenv("LABKIT_RESULTS", str(tmp_path))
    with pytest.raises(RuntimeError, match="run the notebook from the top"):
        checks.run_values("setup")


def test_rule_needs_complete_examples():
    with pytest.raises(ValueError, match="fails_on lacks"):
        checks.rule("setup", "c", needs=("a", "b"), fails_on={"a": 1}, holds_on={"a": 1, "b": 2})(
            lambda v: (True, ""))


def test_run_values_exposes_a_spread(monkeypatch, tmp_path):
    from labkit import results

    monkeypatch.setenv("LABKIT_RESULTS", str(tmp_path))
    results.record("setup", "speedup", 1.4, "x", "median of 5", spread=(1.1, 1.6, 5))
    results.record("setup", "flag", True)
    v = checks.run_values("setup")
    assert v == {"speedup": 1.4, "speedup.lo": 1.1, "speedup.hi": 1.6, "speedup.n": 5, "flag": True}
