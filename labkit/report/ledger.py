"""The ledger of the tutorial's checkable statements, ``data/claims/NN_<chapter>.toml`` (one file per
chapter, the chapter is the file's), for every chapter's part of the lab report.

Each ``[[claim]]`` row states one thing the tutorial claims, in the lab's own words, and how the lab
judges it:

* ``id``; ``claim`` (a title); ``tutorial`` (what the tutorial says, in our words, with its figure);
  ``section`` (the tutorial's section it comes from); ``measure`` (how the lab gets the figure);
* ``evidence``: what kind of evidence the verdict rests on, counted apart in the report:
  ``measured`` (measured on this machine by the chapter: a timing, a score, a count of a real run),
  ``simulated`` (a model's output, such as the fleet or batching simulator, even when fed measured
  inputs), ``gpu`` (only a GPU can measure it: ``gpu`` names the computed expectation shown until a
  GPU run exists), ``computed`` (derived from shipped configs, files, tensors or datasheets: the same
  on every machine), ``lookup`` (a datasheet, price list or config value restated as it is),
  ``arithmetic`` (the tutorial's own arithmetic re-done with its own inputs) or ``outside`` (an
  outside fact, such as uptime or a release date, that no offline lab can check: no key, the verdict
  says so and ``reason`` why). A row whose outcome follows from its own construction (an identity)
  is no claim: it is one of the lab's own checks (:mod:`labkit.checks`) or a unit test;
* ``key``: the figure, a key the chapter records, ``other_chapter/key``, or ``fn:name`` for a check
  the report computes itself (:mod:`labkit.report.computed`);
* ``expect``: when it holds (grammar below). A figure recorded with a spread (``lo``/``hi`` over
  repeated runs) holds only when the whole interval does, fails when none of it does, and is
  ``inconclusive`` otherwise;
* ``fails``: the verdict when ``expect`` does not hold: ``not here`` (this machine: only for
  measured, simulated and gpu rows), ``wrong`` (the tutorial is) or ``depends`` (the figure depends on a
  choice such as the model or workload: ``also`` shows the figures it depends on); ``reason``: why,
  shown with that verdict; ``also``: figures shown beside the value.

``expect`` grammar: ``lo..hi`` (inclusive), ``X ± Y`` or ``X ± Y%`` (``+-`` works too), ``< X``,
``<= X``, ``> X``, ``>= X``, ``== X`` (a number, ``true``/``false`` or a word).
"""

from __future__ import annotations

import math
import re
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..chapters import CHAPTERS, names
from ..paths import DATA

EVIDENCE = ("measured", "simulated", "gpu", "computed", "lookup", "arithmetic", "outside")
FAILS = ("not here", "wrong", "depends")
FIELDS = ("id", "claim", "tutorial", "section", "measure", "evidence", "reason")
JUDGED = ("key", "expect", "fails")  # every row but an ``outside`` one
CLAIMS = DATA / "claims"
NUMBER = r"[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?"


@dataclass(frozen=True)
class Expect:
    """A parsed ``expect``: ``op`` is one of ``range``, ``<``, ``<=``, ``>``, ``>=``, ``==``; ``lo`` and
    ``hi`` bound ``range`` (a ``±`` is turned into one); ``value`` is what the others compare to."""

    text: str
    op: str
    lo: float | None = None
    hi: float | None = None
    value: float | bool | str | None = None


@dataclass(frozen=True)
class Claim:
    """One row of the ledger (see the module docstring for each field)."""

    id: str
    chapter: str
    claim: str
    tutorial: str
    measure: str
    key: str
    expect: Expect | None
    evidence: str
    fails: str
    reason: str
    section: str = ""
    also: tuple[str, ...] = ()
    gpu: str = ""


def parse_expect(text: str) -> Expect:
    """Parse an ``expect`` string; ``ValueError`` quoting it and the grammar when it does not parse."""
    t = text.strip().replace("+-", "±")
    m = re.fullmatch(rf"({NUMBER})\s*\.\.\s*({NUMBER})", t)
    if m:
        lo, hi = float(m[1]), float(m[2])
        if lo > hi:
            raise ValueError(f"expect {text!r}: the range's low end is above its high end")
        return Expect(text, "range", lo, hi)
    m = re.fullmatch(rf"({NUMBER})\s*±\s*({NUMBER})\s*(%?)", t)
    if m:
        x, tol = float(m[1]), float(m[2])
        tol = abs(x) * tol / 100 if m[3] else tol
        return Expect(text, "range", x - tol, x + tol, x)
    m = re.fullmatch(rf"(<=|>=|<|>)\s*({NUMBER})", t)
    if m:
        return Expect(text, m[1], value=float(m[2]))
    m = re.fullmatch(r"==\s*(\S.*)", t)
    if m:
        word = m[1].strip()
        value: float | bool | str = {"true": True, "false": False}.get(word.lower(), word)
        if isinstance(value, str) and re.fullmatch(NUMBER, value):
            value = float(value)
        return Expect(text, "==", value=value)
    raise ValueError(f"expect {text!r} does not parse: use 'lo..hi', 'X ± Y', 'X ± Y%', '< X', '<= X', "
                     "'> X', '>= X' or '== X'")


def holds(expect: Expect, value: Any) -> bool:
    """Whether ``value`` meets ``expect``. A non-number against a numeric comparison is ``False``."""
    if expect.op == "==":
        if isinstance(expect.value, bool) or isinstance(value, bool):
            return value is expect.value
        if isinstance(expect.value, float):
            return isinstance(value, int | float) and math.isclose(value, expect.value, rel_tol=1e-9)
        return str(value) == expect.value
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        return False
    if expect.op == "range":
        assert expect.lo is not None and expect.hi is not None, f"range without bounds: {expect.text}"
        return expect.lo <= value <= expect.hi
    bound = expect.value
    assert isinstance(bound, int | float), f"numeric comparison with a non-number: {expect.text}"
    return {"<": value < bound, "<=": value <= bound, ">": value > bound, ">=": value >= bound}[expect.op]


def split_key(ref: str, chapter: str) -> tuple[str, str]:
    """``(chapter, key)`` of a reference: ``key`` (this chapter's), ``other/key`` or ``fn:name``
    (chapter ``"fn"``)."""
    if ref.startswith("fn:"):
        return "fn", ref[3:]
    if "/" in ref:
        other, key = ref.split("/", 1)
        return other, key
    return chapter, ref


def _claim(row: dict[str, Any], chapter: str, n: int, path: Path) -> Claim:
    where = f"{path.name} claim #{n} ({row.get('id', 'no id')})"
    judged = row.get("evidence") != "outside"
    missing = [f for f in FIELDS + (JUDGED if judged else ()) if not str(row.get(f, "")).strip()]
    if missing:
        raise ValueError(f"{where}: fields {missing} are empty; every row needs {', '.join(FIELDS)}"
                         + (f" and {', '.join(JUDGED)}" if judged else ""))
    unknown = set(row) - set(FIELDS) - set(JUDGED) - {"also", "gpu"}
    if unknown:
        raise ValueError(f"{where}: unknown fields {sorted(unknown)}")
    evidence, fails = row["evidence"], row.get("fails", "")
    if evidence not in EVIDENCE:
        raise ValueError(f"{where}: evidence must be one of {EVIDENCE}, got {evidence!r}")
    if not judged:
        return Claim(row["id"], chapter, row["claim"], row["tutorial"], row["measure"], "", None, evidence,
                     "", row["reason"], row["section"])
    if fails not in FAILS:
        raise ValueError(f"{where}: fails must be one of {FAILS}, got {fails!r}")
    if fails == "not here" and evidence not in ("measured", "simulated", "gpu"):
        raise ValueError(f"{where}: a {evidence} figure is the same on every machine, so it cannot fail "
                         "'not here': use 'wrong' or 'depends'")
    if evidence == "gpu" and not row.get("gpu"):
        raise ValueError(f"{where}: a 'gpu' row needs gpu = the computed expectation (a key or fn:name)")
    also = row.get("also", [])
    if not isinstance(also, list) or not all(isinstance(a, str) for a in also):
        raise ValueError(f"{where}: also must be a list of keys")
    for ref in [row["key"], *also, *([row["gpu"]] if row.get("gpu") else [])]:
        ch, _ = split_key(ref, chapter)
        if ch not in (*CHAPTERS, "fn"):
            raise ValueError(f"{where}: {ref!r} names no chapter")
    try:
        expect = parse_expect(row["expect"])
    except ValueError as e:
        raise ValueError(f"{where}: {e}") from None
    return Claim(row["id"], chapter, row["claim"], row["tutorial"], row["measure"], row["key"], expect,
                 evidence, fails, row["reason"], row["section"], tuple(also), row.get("gpu", ""))


def chapter_file(chapter: str, folder: Path | None = None) -> Path:
    """``data/claims/NN_<chapter>.toml``: the ledger file of ``chapter`` (``NN`` is the number its
    notebook's name starts with, e.g. ``02b``)."""
    return (folder or CLAIMS) / f"{names(chapter)[1]}_{chapter}.toml"


def load_file(path: Path, chapter: str) -> list[Claim]:
    """The rows of one chapter's ledger file, checked (``ValueError`` naming the row)."""
    with open(path, "rb") as f:
        rows = tomllib.load(f).get("claim", [])
    return [_claim(row, chapter, n, path) for n, row in enumerate(rows, 1)]


def load_ledger(folder: Path | None = None) -> list[Claim]:
    """Every chapter's rows in chapter order, checked: every field present, ``expect`` parses, ids unique
    across the ledger. ``ValueError`` naming the file and row otherwise."""
    folder = folder or CLAIMS
    files = {p.name: p for p in folder.glob("*.toml")}
    stray = set(files) - {chapter_file(c, folder).name for c in CHAPTERS}
    if stray:
        raise ValueError(f"{folder}: {sorted(stray)} name no chapter (files are NN_<chapter>.toml)")
    claims = [c for ch in CHAPTERS if chapter_file(ch, folder).is_file()
              for c in load_file(chapter_file(ch, folder), ch)]
    if not claims:
        raise ValueError(f"{folder} has no [[claim]] rows")
    seen: set[str] = set()
    for c in claims:
        if c.id in seen:
            raise ValueError(f"{folder}: claim id {c.id!r} appears twice")
        seen.add(c.id)
    return claims
