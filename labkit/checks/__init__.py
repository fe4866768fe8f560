"""A chapter's final checks: rules over the figures it recorded (every chapter).

A chapter records what it measured with :func:`labkit.results.record`; its last cell calls
:func:`verify`, which evaluates every rule of that chapter against the values **this run**
recorded, prints one ``CHECK`` line per rule (``make lab-<chapter>`` collects them) and raises
``AssertionError`` naming every rule that failed. A rule is a plain function of the recorded
values, declared with :func:`rule` in ``labkit/checks/<chapter>.py``::

    @rule("production", "the warm pool cut late or dropped requests on every seed",
          needs=("late_no_pool_min", "late_pool_max"),
          fails_on={"late_no_pool_min": 0, "late_pool_max": 0},      # nothing was late without it
          holds_on={"late_no_pool_min": 352, "late_pool_max": 0})
    def warm_pool(v):
        return v["late_pool_max"] < v["late_no_pool_min"], f"{v['late_no_pool_min']} -> {v['late_pool_max']}"

Every rule carries a realistic input that fails it (``fails_on``, e.g. a run that went wrong) and
one that passes (``holds_on``); ``tests/test_checks.py`` feeds both to every rule, so no rule can
hold by construction. ``when`` returns ``None`` when the rule applies to this run, else the reason
it does not (the rule is then printed as skipped, e.g. a vLLM-only rule on a simulated server).
What holds by construction of the code (request accounting, packing sizes) is a unit test of that
code, never a rule.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from ..chapters import CHAPTERS

Values = Mapping[str, Any]
Test = Callable[[Values], tuple[bool, str]]


@dataclass(frozen=True)
class Rule:
    """One final check of a chapter: ``claim`` (what the chapter demonstrates), the recorded keys it
    ``needs``, the ``test`` (values -> ``(held, detail)``), and the realistic inputs it must fail on
    and hold on. ``when``: values -> ``None`` (applies) or why it does not apply to this run."""

    chapter: str
    name: str
    claim: str
    needs: tuple[str, ...]
    test: Test
    fails_on: Mapping[str, Any]
    holds_on: Mapping[str, Any]
    when: Callable[[Values], str | None] | None = field(default=None, compare=False)


@dataclass(frozen=True)
class Outcome:
    """A rule evaluated on one run: ``held`` is ``None`` when it was skipped (``detail`` says why)."""

    rule: Rule
    held: bool | None
    detail: str


RULES: dict[str, dict[str, Rule]] = {c: {} for c in CHAPTERS}


def rule(chapter: str, claim: str, *, needs: tuple[str, ...], fails_on: Mapping[str, Any],
         holds_on: Mapping[str, Any], when: Callable[[Values], str | None] | None = None
         ) -> Callable[[Test], Test]:
    """Register the decorated function as one of ``chapter``'s final checks (see the module docstring).
    ``ValueError`` when an example input lacks a key the rule needs."""
    if chapter not in CHAPTERS:
        raise ValueError(f"chapter must be one of {', '.join(CHAPTERS)}, got {chapter!r}")

    def register(test: Test) -> Test:
        for label, example in (("fails_on", fails_on), ("holds_on", holds_on)):
            missing = [k for k in needs if k not in example]
            if missing:
                raise ValueError(f"rule {test.__name__}: {label} lacks {missing}")
        name = test.__name__
        if name in RULES[chapter]:
            raise ValueError(f"chapter {chapter} has two rules named {name}")
        RULES[chapter][name] = Rule(chapter, name, claim, tuple(needs), test, dict(fails_on),
                                    dict(holds_on), when)
        return test

    return register


def rules(chapter: str) -> list[Rule]:
    """``chapter``'s rules in the order they are declared (imports ``labkit.checks.<chapter>``)."""
    if chapter not in CHAPTERS:
        raise ValueError(f"chapter must be one of {', '.join(CHAPTERS)}, got {chapter!r}")
    try:
        importlib.import_module(f"{__name__}.{chapter}")
    except ModuleNotFoundError as e:
        if e.name != f"{__name__}.{chapter}":
            raise
    return list(RULES[chapter].values())


def evaluate(r: Rule, values: Values) -> Outcome:
    """``r`` on ``values``: skipped when ``when`` says so; failed (with the keys) when a needed figure
    was not recorded or is not a number where one is needed; else what the test says."""
    why = r.when(values) if r.when else None
    if why:
        return Outcome(r, None, why)
    missing = [k for k in r.needs if values.get(k) is None]
    if missing:
        return Outcome(r, False, f"not recorded in this run: {', '.join(missing)}")
    held, detail = r.test(values)
    return Outcome(r, bool(held), detail)


def run_values(chapter: str) -> dict[str, Any]:
    """The values ``chapter`` recorded in **this** process's run (``{key: value}``; a figure recorded
    with a spread also gives ``key.lo``, ``key.hi`` and ``key.n``); ``RuntimeError`` saying what to do
    when this process recorded nothing for it."""
    from ..results import RUN_ID, load

    data = load(chapter)
    if data is None or data.get("run") != RUN_ID:
        raise RuntimeError(f"chapter {chapter} recorded nothing in this run: run the notebook from the "
                           "top (its cells call labkit.results.record) before its final checks")
    values = {k: e.get("value") for k, e in data["values"].items()}
    for k, e in data["values"].items():
        values |= {f"{k}.{part}": e[part] for part in ("lo", "hi", "n") if part in e}
    return values


def line(o: Outcome) -> str:
    """The ``CHECK`` line of an outcome: ``CHECK ok``, ``CHECK FAIL`` or ``CHECK skip``."""
    tag = "skip" if o.held is None else "ok  " if o.held else "FAIL"
    return f"CHECK {tag} {o.rule.claim}" + (f"  ({o.detail})" if o.detail else "")


def verify(chapter: str, values: Values | None = None) -> None:
    """Evaluate every rule of ``chapter`` on the values this run recorded (or ``values``), print a
    ``CHECK`` line for each, then raise ``AssertionError`` listing the ones that failed (nothing is
    returned, so a notebook's last line shows only the CHECK lines; :func:`evaluate` gives outcomes)."""
    values = run_values(chapter) if values is None else values
    found = rules(chapter)
    if not found:
        raise RuntimeError(f"chapter {chapter} has no rules in labkit/checks/{chapter}.py")
    outcomes = [evaluate(r, values) for r in found]
    for o in outcomes:
        print(line(o), flush=True)
    failed = [o for o in outcomes if o.held is False]
    if failed:
        raise AssertionError(f"{len(failed)} of {len(outcomes)} checks failed: "
                             + "; ".join(f"{o.rule.claim} ({o.detail})" for o in failed))
