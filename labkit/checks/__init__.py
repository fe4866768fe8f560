"""The lab's own checks, and each chapter's closing cell (every chapter).

Two kinds of check live in two places, and each figure is judged in one of them only:

* **The lab's own checks** (this package, ``labkit/checks/<chapter>.py``): assertions that the lab's
  code is right on this machine, e.g. the from-scratch forward pass equals transformers', greedy
  speculative decoding writes what plain greedy decoding writes, every request is accounted for.
  A failed check fails the chapter (and CI). Each is declared with :func:`check` and names the unit
  test (``broken``) that runs a deliberately broken implementation through it and sees it fail.
* **The tutorial's claims** (the ledger, ``data/claims/NN_<chapter>.toml``): each judged once, by its
  row's ``expect`` (:mod:`labkit.report.verdicts`). A claim that does not hold here is a finding,
  never a failure; a claim whose figure this run did not record (nor said why) fails the chapter.

A chapter's last cell calls :func:`verify`: it prints the lab's checks (one ``CHECK`` line each),
then the table of the chapter's claims with their verdicts on this run, then raises
``AssertionError`` naming every check that failed and every figure that was never recorded::

    @check("internals", "attention written out equals PyTorch's fused attention",
           needs=("attention_max_diff",), broken="tests/test_attention.py::test_broken_scale_fails",
           fails_on={"attention_max_diff": 0.3}, holds_on={"attention_max_diff": 2e-7})
    def attention_matches(v):
        return v["attention_max_diff"] < 1e-5, f"max |difference| {v['attention_max_diff']:.1e}"

``when`` returns ``None`` when the check applies to this run, else why it does not (it is then
printed as skipped, e.g. a vLLM-only check where vLLM cannot run).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from ..chapters import CHAPTERS
from ..report.claims_table import chapter_claims, claims_text, unrecorded
from ..results import current, seal
from ..settings import STUDY_SKIPPED

Values = Mapping[str, Any]
Test = Callable[[Values], tuple[bool, str]]


@dataclass(frozen=True)
class Check:
    """One of the lab's own checks: ``claim`` (what the lab's code must get right), the recorded keys
    it ``needs``, the ``test`` (values -> ``(held, detail)``), ``broken`` (the unit test, as
    ``tests/file.py::test_name``, that feeds it a broken implementation's output and sees it fail),
    and example inputs it must fail on and hold on. ``when``: values -> ``None`` or why it is skipped."""

    chapter: str
    name: str
    claim: str
    needs: tuple[str, ...]
    test: Test
    fails_on: Mapping[str, Any]
    holds_on: Mapping[str, Any]
    broken: str
    when: Callable[[Values], str | None] | None = field(default=None, compare=False)


@dataclass(frozen=True)
class Outcome:
    """A check evaluated on one run: ``held`` is ``None`` when it was skipped (``detail`` says why)."""

    check: Check
    held: bool | None
    detail: str


CHECKS: dict[str, dict[str, Check]] = {c: {} for c in CHAPTERS}


def check(chapter: str, claim: str, *, needs: tuple[str, ...], broken: str, fails_on: Mapping[str, Any],
          holds_on: Mapping[str, Any], when: Callable[[Values], str | None] | None = None
          ) -> Callable[[Test], Test]:
    """Register the decorated function as one of ``chapter``'s own checks (see the module docstring).
    ``ValueError`` when an example input lacks a key the check needs or ``broken`` names no test."""
    if chapter not in CHAPTERS:
        raise ValueError(f"chapter must be one of {', '.join(CHAPTERS)}, got {chapter!r}")
    if not broken.startswith("tests/") or "::test_" not in broken:
        raise ValueError(f"broken must name a unit test as tests/<file>.py::test_<name>, got {broken!r}")

    def register(test: Test) -> Test:
        for label, example in (("fails_on", fails_on), ("holds_on", holds_on)):
            missing = [k for k in needs if k not in example]
            if missing:
                raise ValueError(f"check {test.__name__}: {label} lacks {missing}")
        name = test.__name__
        if name in CHECKS[chapter]:
            raise ValueError(f"chapter {chapter} has two checks named {name}")
        CHECKS[chapter][name] = Check(chapter, name, claim, tuple(needs), test, dict(fails_on),
                                      dict(holds_on), broken, when)
        return test

    return register


def studied(v: Values) -> str | None:
    """``when`` of a check on a "Going further" study's figures: skipped in a run without the study
    (the chapter records ``study``: ``LABKIT_STUDY=1``, as ``make report`` runs it)."""
    return None if v.get("study") else STUDY_SKIPPED


def checks(chapter: str) -> list[Check]:
    """``chapter``'s own checks in the order they are declared (imports ``labkit.checks.<chapter>``)."""
    if chapter not in CHAPTERS:
        raise ValueError(f"chapter must be one of {', '.join(CHAPTERS)}, got {chapter!r}")
    try:
        importlib.import_module(f"{__name__}.{chapter}")
    except ModuleNotFoundError as e:
        if e.name != f"{__name__}.{chapter}":
            raise
    return list(CHECKS[chapter].values())


def evaluate(c: Check, values: Values) -> Outcome:
    """``c`` on ``values``: skipped when ``when`` says so; failed (with the keys) when a needed figure
    was not recorded; else what the test says."""
    why = c.when(values) if c.when else None
    if why:
        return Outcome(c, None, why)
    missing = [k for k in c.needs if values.get(k) is None]
    if missing:
        return Outcome(c, False, f"not recorded in this run: {', '.join(missing)}")
    held, detail = c.test(values)
    return Outcome(c, bool(held), detail)


def outcome(chapter: str, name: str, values: Values) -> Outcome:
    """Check ``name`` of ``chapter`` on ``values`` (what a broken-implementation unit test calls)."""
    found = {c.name: c for c in checks(chapter)}
    if name not in found:
        raise KeyError(f"chapter {chapter} has no check {name!r}; it has {', '.join(found) or 'none'}")
    return evaluate(found[name], values)


def this_run(chapter: str) -> dict[str, Any]:
    """The results ``chapter`` recorded in **this** process's run (as :func:`labkit.results.load`
    returns them); ``RuntimeError`` saying what to do when this process recorded nothing for it."""
    data = current(chapter)
    if data is None:
        raise RuntimeError(f"chapter {chapter} recorded nothing in this run: run the notebook from the "
                           "top (its cells call labkit.results.record) before its final checks")
    return data


def values_of(data: dict[str, Any]) -> dict[str, Any]:
    """``{key: value}`` of a results dict; a figure recorded with a spread also gives ``key.lo``,
    ``key.hi`` and ``key.n``."""
    values = {k: e.get("value") for k, e in data["values"].items()}
    for k, e in data["values"].items():
        values |= {f"{k}.{part}": e[part] for part in ("lo", "hi", "n") if part in e}
    return values


def line(o: Outcome) -> str:
    """The ``CHECK`` line of an outcome: ``CHECK ok``, ``CHECK FAIL`` or ``CHECK skip``."""
    tag = "skip" if o.held is None else "ok  " if o.held else "FAIL"
    return f"CHECK {tag} {o.check.claim}" + (f"  ({o.detail})" if o.detail else "")


def verify(chapter: str, data: dict[str, Any] | None = None) -> None:
    """The chapter's closing cell: evaluate its own checks on the values this run recorded (or on the
    results dict ``data``, as :func:`labkit.results.load` returns it), print a ``CHECK`` line for each,
    print its claims with their verdicts on this run, then raise ``AssertionError`` listing every check
    that failed and every claim whose figure was never recorded. Nothing is returned, so a notebook's
    last line shows only what was printed."""
    if data is None:
        seal(chapter)  # the digest covers every file the run used, those imported after its last record too
        data = this_run(chapter)
    values = values_of(data)
    found = checks(chapter)
    if len(found) < 3:
        raise RuntimeError(f"chapter {chapter} has {len(found)} checks in labkit/checks/{chapter}.py; "
                           "every chapter keeps at least three")
    outcomes = [evaluate(c, values) for c in found]
    print(f"The lab's own checks ({len(outcomes)}): is the code right on this machine?", flush=True)
    for o in outcomes:
        print(line(o), flush=True)
    rows = chapter_claims(chapter, data)
    print(f"\nThe tutorial's claims in this chapter ({len(rows)}), judged on this run "
          "(a claim that does not hold here is a finding, not a failure):")
    print(claims_text(rows), flush=True)
    failed = [f"{o.check.claim} ({o.detail})" for o in outcomes if o.held is False]
    failed += [f"claim {cid}: {why}" for cid, why in unrecorded(chapter, data)]
    if failed:
        raise AssertionError(f"{len(failed)} failed: " + "; ".join(failed))
