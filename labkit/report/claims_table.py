"""A chapter's claims judged on its own run, for the chapter's closing cell (every chapter).

:func:`chapter_claims` judges the rows of ``data/claims/NN_<chapter>.toml`` with the values the
chapter just recorded (a row citing another chapter uses that chapter's last recorded run, if any);
:func:`claims_text` prints them as plain text; :func:`unrecorded` lists the rows whose own figure the
run neither recorded nor explained (:func:`labkit.results.unmeasured`), which fails the chapter.
"""

from __future__ import annotations

import textwrap
from collections import Counter
from collections.abc import Mapping
from typing import Any

from ..chapters import CHAPTERS
from ..figures import keep
from ..results import current, load
from .ledger import Claim, load_ledger, split_key
from .verdicts import VERDICTS, fmt_value, judge_all

JUDGED = VERDICTS[:5]  # a figure met or missed: holds, does not hold here, depends, wrong, inconclusive
OUTSIDE = VERDICTS[-1]  # not checkable offline


def _mine(chapter: str) -> list[Claim]:
    return [c for c in load_ledger() if c.chapter == chapter]


def chapter_claims(chapter: str, data: dict[str, Any]) -> list[dict[str, Any]]:
    """Report rows (:func:`labkit.report.verdicts.judge`) of ``chapter``'s ledger rows, judged on
    ``data`` (its results dict) and on the other chapters' last recorded results."""
    results: dict[str, dict[str, Any] | None] = {c: load(c) for c in CHAPTERS if c != chapter}
    results[chapter] = data
    return judge_all(_mine(chapter), results, data.get("device", "cpu"))


def _shown(row: dict[str, Any]) -> str:
    if row.get("value") is None:
        return "-"
    text = fmt_value(row["value"], row.get("unit", ""))
    if row.get("lo") is not None and row.get("hi") is not None and row["lo"] != row["hi"]:  # a band
        text += f" [{fmt_value(row['lo'])}..{fmt_value(row['hi'])}]"
    return text


def claims_text(rows: list[dict[str, Any]], width: int = 110) -> str:
    """The rows as plain text: verdict, value (interval in brackets), expectation and the claim; the
    reason under any verdict but ``holds``, wrapped at ``width`` characters. Claims not checkable
    offline close the text in one paragraph, their reasons left to the report. ``(no claims)`` for none."""
    if not rows:
        return "(no claims)"
    outside = [r for r in rows if r["verdict"] == OUTSIDE]
    rows = [r for r in rows if r["verdict"] != OUTSIDE]
    verdict_w = max((len(r["verdict"]) for r in rows), default=0)
    value_w = max((len(_shown(r)) for r in rows), default=0)
    out = []
    for r in rows:
        expect = f"(expected {r['expect']})" if r.get("expect") else ""
        out.append(f"{r['verdict']:<{verdict_w}}  {_shown(r):>{value_w}}  {r['claim']} {expect}".rstrip())
        if r["verdict"] != "holds" and r.get("reason"):
            out += textwrap.wrap(r["reason"], width, initial_indent=" " * (verdict_w + 2) + "why: ",
                                 subsequent_indent=" " * (verdict_w + 7))
    if outside:
        out += textwrap.wrap(f"{OUTSIDE} ({len(outside)}; why, in the report): "
                             + "; ".join(r["claim"] for r in outside), width, subsequent_indent="  ",
                             break_on_hyphens=False)
    return "\n".join(out)


def unrecorded(chapter: str, data: dict[str, Any]) -> list[tuple[str, str]]:
    """``(claim id, what is missing)`` for each of ``chapter``'s rows whose own figure ``data`` lacks:
    its key (a ``gpu`` row's computed expectation instead, on a machine without a GPU run). A figure
    recorded as unmeasured with a reason counts as recorded: the verdict says why."""
    recorded = data.get("values", {})
    missing = []
    for c in _mine(chapter):
        if c.expect is None:
            continue
        refs = [c.gpu] if c.evidence == "gpu" and data.get("device") != "cuda" else [c.key]
        for ref in refs:
            ch, key = split_key(ref, chapter)
            if ch == chapter and key not in recorded:
                missing.append((c.id, f"{key} was not recorded (record it, or labkit.results.unmeasured "
                                      "with the reason)"))
    return missing


def findings_sentence(chapter: str, page: Mapping[str, Any] | None = None) -> str:
    """How ``chapter``'s claims fared on **this** run so far, as a sentence for its "What we learned"
    cell (every chapter): how many of those judged on a figure held, then each that did not, with its
    verdict, figure and expectation; the rest (a GPU needed, not checkable offline) counted apart. Claims
    whose figure this run has not recorded yet (a "Going further" section further down records it) are
    left to the table at the chapter's end, and counted; a previous run's figures are never used.
    ``page``: the notebook's variables (``globals()``), whose figures so far are recorded first."""
    if page is not None:
        keep(chapter, page, partial=True)

    data = current(chapter)
    if not data:
        return "This run has recorded no figure for the chapter's claims yet: the closing table judges them."
    later = {cid for cid, _ in unrecorded(chapter, data)}
    rows = [r for r in chapter_claims(chapter, data) if r["id"] not in later]
    judged = [r for r in rows if r["verdict"] in JUDGED]
    missed = [r for r in judged if r["verdict"] != "holds"]
    held = len(judged) - len(missed)
    text = f"Of the {len(judged)} tutorial claims this run judged on a figure, {held} held"
    rest = Counter(r["verdict"] for r in rows if r["verdict"] not in JUDGED)
    if rest:
        text += " (besides: " + ", ".join(f"{n} {v}" for v, n in rest.items()) + ")"
    if later:
        text += (f"; {len(later)} more, on figures recorded further down, "
                 f"{'is' if len(later) == 1 else 'are'} judged in the table at the end")
    if not missed:
        return text + "."
    return text + "; did not hold as stated here: " + "; ".join(
        f"{r['claim']} ({r['verdict']}: {_shown(r)}, expected {r['expect']})" for r in missed) + "."
