"""Run summaries for tests that need one without a run (the load generator's output, chapter 02)."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from labkit.serving.metrics import FIGURES, RunSummary, summarize


def fake_summary(**given: Any) -> RunSummary:
    """A :class:`RunSummary` of no requests with ``given`` fields set; a spread's statistic is given
    as ``<figure>_<stat>`` in ms (``ttft_median=20.0``, ``itl_p99=5.0``)."""
    s = summarize([])
    spreads: dict[str, Any] = {f: s.spread(f) for f in FIGURES}
    plain: dict[str, Any] = {}
    for key, value in given.items():
        figure, _, stat = key.rpartition("_")
        if figure in spreads:
            spreads[figure] = replace(spreads[figure], **{stat: value})
        else:
            plain[key] = value
    return replace(s, **spreads, **plain)
