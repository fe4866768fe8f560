"""Verdicts: each ledger row against what the chapters recorded (every chapter's part of the report).

:func:`judge` gives one row of the report: the claim, the recorded value with its unit, and one of

* ``holds``: the value meets the row's ``expect``;
* ``does not hold here``: it does not, and the row says that is this machine (``fails = "not here"``);
* ``wrong``: it does not, and the tutorial is wrong (``fails = "wrong"``); the row's reason says why;
* ``depends``: it does not, and the figure depends on a choice (model, workload) the row names;
* ``inconclusive``: the figure was recorded with a spread over repeated runs that straddles ``expect``;
* ``not checkable offline``: an ``outside`` row (an outside fact), with the reason;
* ``needs a GPU``: a ``gpu`` row judged on a machine without a CUDA GPU, shown with its computed
  expectation (and what this machine measured, if anything);
* ``not measured``: the chapter did not record the figure (``not measured (chapter X did not
  record KEY)``), or recorded NaN. A recorded infinity is shown as ``inf`` and meets no ``expect``.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from typing import Any

from .computed import compute
from .ledger import Claim, holds, split_key

VERDICTS = ("holds", "does not hold here", "depends", "wrong", "inconclusive", "needs a GPU", "not measured",
            "not checkable offline")
KINDS = ("measured", "simulated", "gpu", "computed", "lookup", "arithmetic", "outside")
Results = dict[str, dict[str, Any] | None]


def fmt_value(value: Any, unit: str = "") -> str:
    """A recorded value as the report prints it: booleans as ``true``/``false``, whole numbers with
    thousands separators, floats to about three significant figures; then the unit."""
    if value is None:
        text = "n/a"
    elif isinstance(value, bool):
        text = "true" if value else "false"
    elif isinstance(value, int):
        text = f"{value:,}"
    elif isinstance(value, float):
        a = abs(value)
        text = (f"{value:,.0f}" if a >= 100 else f"{value:.1f}" if a >= 10 else f"{value:.2f}" if a >= 1
                else f"{value:.3f}" if a >= 0.01 or a == 0 else f"{value:.2e}")
    else:
        text = str(value)
    if not unit or value is None:
        return text
    return f"{text}{unit}" if unit == "%" else f"{text} {unit}"


def lookup(ref: str, chapter: str, results: Results,
           fns: Callable[[str], dict[str, Any]] = compute) -> dict[str, Any] | None:
    """The entry (``value``, ``unit``, ``note``, plus ``chapter`` and ``key``) a reference names, or
    ``None`` when its chapter did not record it."""
    ch, key = split_key(ref, chapter)
    if ch == "fn":
        entry = dict(fns(key))
    else:
        data = results.get(ch)
        if not data or key not in data.get("values", {}):
            return None
        entry = dict(data["values"][key])
    entry.update(chapter=ch, key=key)
    return entry


def _missing(ref: str, chapter: str) -> str:
    ch, key = split_key(ref, chapter)
    return f"not measured (chapter {ch} did not record {key})"


def _on_gpu(claim: Claim, results: Results, device: str) -> bool:
    """Whether the claim's figure comes from a CUDA run (the chapter's recorded device, else this one)."""
    data = results.get(claim.chapter) or {}
    return (data.get("device") or device) == "cuda"


def judge(claim: Claim, results: Results, device: str = "cpu",
          fns: Callable[[str], dict[str, Any]] = compute) -> dict[str, Any]:
    """One report row for ``claim`` from ``results`` (chapter -> results file dict, or ``None``).
    ``device`` is this machine's, used for checks the report computes itself."""
    entry = lookup(claim.key, claim.chapter, results, fns) if claim.expect else None
    row: dict[str, Any] = {
        "id": claim.id, "chapter": claim.chapter, "claim": claim.claim, "tutorial": claim.tutorial,
        "measure": claim.measure, "section": claim.section, "key": claim.key,
        "expect": claim.expect.text if claim.expect else "", "evidence": claim.evidence,
        "lo": None, "hi": None,
        "value": entry["value"] if entry else None, "unit": entry.get("unit", "") if entry else "",
        "note": entry.get("note", "") if entry else "", "at": entry.get("at", "") if entry else "",
        "also": [], "expectation": None,
    }
    if claim.expect is None:  # an outside fact: nothing to look up
        return {**row, "verdict": "not checkable offline", "reason": claim.reason}
    for ref in claim.also:
        e = lookup(ref, claim.chapter, results, fns)
        row["also"].append({"key": ref, "value": e["value"] if e else None,
                            "unit": e.get("unit", "") if e else "",
                            "note": e.get("note", "") if e else _missing(ref, claim.chapter)})
    if claim.evidence == "gpu" and not _on_gpu(claim, results, device):
        exp = lookup(claim.gpu, claim.chapter, results, fns)
        if exp is None or exp.get("value") is None:
            why = _missing(claim.gpu, claim.chapter) if exp is None else exp.get("note", "")
            return {**row, "verdict": "not measured", "reason": f"computed expectation {why}"}
        row["expectation"] = {"key": claim.gpu, "value": exp["value"], "unit": exp.get("unit", ""),
                              "note": exp.get("note", "")}
        here = ""
        if entry and entry.get("value") is not None:
            shown = fmt_value(entry["value"], entry.get("unit", ""))
            here = f"; measured here: {shown} ({entry.get('note', '')}), which judges nothing without a GPU"
        reason = (f"computed for a GPU: {fmt_value(exp['value'], exp.get('unit', ''))} "
                  f"({exp.get('note', '')}){here}")
        return {**row, "verdict": "needs a GPU", "reason": reason}
    if entry is None:
        return {**row, "verdict": "not measured", "reason": _missing(claim.key, claim.chapter)}
    if entry.get("value") is None and entry.get("nonfinite") in ("inf", "-inf"):
        entry["value"] = row["value"] = entry["nonfinite"]  # a measured infinity: meets no expectation
    if entry.get("value") is None:
        why = f"recorded as {entry['nonfinite']}" if entry.get("nonfinite") else entry.get("note", "no value")
        return {**row, "verdict": "not measured", "reason": why}
    ends = [entry[k] for k in ("lo", "hi") if isinstance(entry.get(k), int | float)]
    if len(ends) == 2:
        row.update(lo=ends[0], hi=ends[1], n=entry.get("n"))
        met = [holds(claim.expect, e) for e in ends]
        if all(met) and holds(claim.expect, entry["value"]):
            return {**row, "verdict": "holds", "reason": ""}
        if any(met) or holds(claim.expect, entry["value"]):
            span = f"{fmt_value(ends[0])}..{fmt_value(ends[1], entry.get('unit', ''))}"
            return {**row, "verdict": "inconclusive",
                    "reason": f"over {entry.get('n', '?')} runs the figure spans {span}, on both sides of "
                              f"{claim.expect.text}"}
    elif holds(claim.expect, entry["value"]):
        return {**row, "verdict": "holds", "reason": ""}
    verdict = {"wrong": "wrong", "depends": "depends"}.get(claim.fails, "does not hold here")
    return {**row, "verdict": verdict, "reason": claim.reason}


def judge_all(claims: list[Claim], results: Results, device: str = "cpu",
              fns: Callable[[str], dict[str, Any]] = compute) -> list[dict[str, Any]]:
    """:func:`judge` for every claim; each computed check runs once however many rows use it."""
    cache: dict[str, dict[str, Any]] = {}

    def cached(name: str) -> dict[str, Any]:
        if name not in cache:
            cache[name] = fns(name)
        return cache[name]

    return [judge(c, results, device, cached) for c in claims]


def summary(rows: list[dict[str, Any]]) -> dict[str, int]:
    """How many rows got each verdict, in :data:`VERDICTS` order (zeros included)."""
    counts = Counter(r["verdict"] for r in rows)
    return {v: counts.get(v, 0) for v in VERDICTS}


def by_kind(rows: list[dict[str, Any]]) -> dict[str, dict[str, int]]:
    """For each kind of evidence (:data:`KINDS`), how many rows got each verdict: the report counts
    "holds" per kind, so a reader sees how much of it was measured and how much is arithmetic."""
    return {k: summary([r for r in rows if r["evidence"] == k]) for k in KINDS}
