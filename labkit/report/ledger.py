"""The ledger of the tutorial's claims, ``data/claims.toml``, for every chapter's part of the lab report.

Each ``[[claim]]`` row says what the tutorial claims, which chapter checks it, which recorded
figure (:func:`labkit.results.record`) answers it and what range of that figure means it holds:

* ``id``, ``chapter`` (short name), ``claim`` (a title), ``tutorial`` (what the tutorial says),
  ``measure`` (how the lab gets the figure);
* ``key``: the figure, a key the chapter records, ``other_chapter/key``, or ``fn:name`` for a check
  the report computes itself (:mod:`labkit.report.computed`);
* ``expect``: when it holds (grammar below); ``where``: ``here`` (measured on this machine),
  ``computed`` (arithmetic on datasheets and configs: the same everywhere) or ``gpu`` (only a GPU
  can measure it: ``gpu`` names the computed expectation shown until a GPU run exists);
* ``fails``: the verdict when ``expect`` does not hold: ``not here`` (this machine) or ``wrong``
  (the tutorial is); ``reason``: why, shown with that verdict; ``also``: figures shown beside it.

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

from ..chapters import CHAPTERS
from ..paths import DATA

WHERE = ("here", "computed", "gpu")
FAILS = ("not here", "wrong")
FIELDS = ("id", "chapter", "claim", "tutorial", "measure", "key", "expect", "where", "fails", "reason")
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
    expect: Expect
    where: str
    fails: str
    reason: str
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


def _claim(row: dict[str, Any], n: int) -> Claim:
    where = f"claim #{n} ({row.get('id', 'no id')})"
    missing = [f for f in FIELDS if not str(row.get(f, "")).strip()]
    if missing:
        raise ValueError(f"{where}: fields {missing} are empty; every row needs {', '.join(FIELDS)}")
    unknown = set(row) - set(FIELDS) - {"also", "gpu"}
    if unknown:
        raise ValueError(f"{where}: unknown fields {sorted(unknown)}")
    if row["chapter"] not in CHAPTERS:
        raise ValueError(f"{where}: chapter {row['chapter']!r} is not one of {', '.join(CHAPTERS)}")
    if row["where"] not in WHERE or row["fails"] not in FAILS:
        raise ValueError(f"{where}: where must be one of {WHERE} and fails one of {FAILS}")
    if row["where"] == "gpu" and not row.get("gpu"):
        raise ValueError(f"{where}: a 'gpu' row needs gpu = the computed expectation (a key or fn:name)")
    also = row.get("also", [])
    if not isinstance(also, list) or not all(isinstance(a, str) for a in also):
        raise ValueError(f"{where}: also must be a list of keys")
    for ref in [row["key"], *also, *([row["gpu"]] if row.get("gpu") else [])]:
        chapter, _ = split_key(ref, row["chapter"])
        if chapter not in (*CHAPTERS, "fn"):
            raise ValueError(f"{where}: {ref!r} names no chapter")
    try:
        expect = parse_expect(row["expect"])
    except ValueError as e:
        raise ValueError(f"{where}: {e}") from None
    return Claim(row["id"], row["chapter"], row["claim"], row["tutorial"], row["measure"], row["key"], expect,
                 row["where"], row["fails"], row["reason"], tuple(also), row.get("gpu", ""))


def load_ledger(path: Path | None = None) -> list[Claim]:
    """The ledger's rows, checked: every field present, known chapters, ``expect`` parses, unique ids.
    ``ValueError`` naming the row otherwise."""
    path = path or DATA / "claims.toml"
    with open(path, "rb") as f:
        rows = tomllib.load(f).get("claim", [])
    if not rows:
        raise ValueError(f"{path} has no [[claim]] rows")
    claims = [_claim(row, n) for n, row in enumerate(rows, 1)]
    seen: set[str] = set()
    for c in claims:
        if c.id in seen:
            raise ValueError(f"{path}: claim id {c.id!r} appears twice")
        seen.add(c.id)
    return claims
