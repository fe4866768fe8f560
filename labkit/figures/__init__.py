"""Each chapter's figures for the report, recorded from its page once it has run (every chapter's
closing cell).

A chapter's page measures, computes and prints; ``labkit/figures/<chapter>.py`` says which of the
page's variables each recorded figure is, in which unit, and how it was obtained, so the page carries
no bookkeeping. The closing cell calls ``keep("<chapter>", globals())`` before
:func:`labkit.checks.verify`, which judges what was kept.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from typing import Any

from ..results import record, seal


class NotOnPage(LookupError):
    """A figure reads a variable the chapter's page did not define in this run."""


def take(page: Mapping[str, Any], names: str) -> tuple[Any, ...]:
    """The page's variables named in ``names`` (space-separated), in that order."""
    wanted = names.split()
    missing = [n for n in wanted if n not in page]
    if missing:
        raise NotOnPage(", ".join(missing))
    return tuple(page[n] for n in wanted)


def keep(chapter: str, page: Mapping[str, Any], *, partial: bool = False) -> None:
    """Record chapter ``chapter``'s figures (short name: ``"setup"`` ... ``"production"``) from
    ``page``, the notebook's variables (``globals()``) after every cell above has run. ``partial``:
    the page has run only so far (its "What we learned" cell): record the sections in page order up to
    the first figure whose variable is not defined yet, quietly."""
    try:
        module = importlib.import_module(f"{__name__}.{chapter}")
    except ModuleNotFoundError as err:
        raise ValueError(f"no figures for chapter {chapter!r}: labkit/figures/{chapter}.py is missing") \
            from err
    if "STUDY" in page:  # whether the chapter's Going further studies ran: its checks on them skip if not
        record(chapter, "study", bool(page["STUDY"]), "", "the Going further studies ran (LABKIT_STUDY=1)")
    try:
        module.keep(page)
    except NotOnPage as err:
        if partial:
            return
        raise NotOnPage(f"chapter {chapter}'s figures read the page's variable(s) {err}, which this run did "
                        "not define: run the chapter top to bottom (Restart Kernel and Run All Cells)") \
            from None


def keep_partial(chapter: str, page: Mapping[str, Any]) -> None:
    """After a cell failed: record what :func:`keep` can of chapter ``chapter``'s figures from the cells
    that ran (its sections go in page order, so it stops at the first figure the page lacks), so that
    nothing already measured is lost (:func:`labkit.chapters.run_chapter` calls it)."""
    try:
        keep(chapter, page)
        print(f"chapter {chapter}: every figure was recorded before the failure")
    except Exception as err:  # a failed run: keep what there is, and say where it stopped
        print(f"chapter {chapter}: figures recorded up to where the page stops ({type(err).__name__}: {err})")
    seal(chapter)
