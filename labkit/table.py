"""Plain-text tables of result rows, for every chapter's printed comparisons (chapters 02, 05, 06
and 08). Units are whatever the rows hold; column names should say them (``ttft_ms``, ``tok_s``).

Bottom layer: imports nothing from labkit.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


def format_rows(rows: Sequence[dict[str, Any]]) -> str:
    """Plain-text table of result rows (dicts with the same keys; the keys are the header): floats
    to one decimal, text left-aligned, numbers right-aligned. ``(no rows)`` for none."""
    if not rows:
        return "(no rows)"
    keys = list(rows[0])
    fmt = lambda v: f"{v:.1f}" if isinstance(v, float) else str(v)
    cells = [[fmt(r[k]) for k in keys] for r in rows]
    widths = [max(len(k), *(len(c[i]) for c in cells)) for i, k in enumerate(keys)]
    left = [isinstance(rows[0][k], str) for k in keys]
    line = lambda vals: "  ".join(v.ljust(w) if lj else v.rjust(w)
                                  for v, w, lj in zip(vals, widths, left, strict=True))
    return "\n".join([line(keys)] + [line(c) for c in cells])
