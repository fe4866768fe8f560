"""One request's figures from its timeline (chapter 02): TTFT, E2E, TPOT, per-token ITL, the gaps
between chunks and decode speed, in seconds, tokens and tokens/s (NaN when unknown).

The definitions, and where other tools differ, are documented at
:func:`labkit.serving.metrics.request_metrics`, the function to call. This module computes them
from plain values, so that :class:`labkit.serving.records.RequestRecord` can write them into its
JSONL line without importing :mod:`labkit.serving.metrics`, which reads records."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TypedDict

NAN = float("nan")


class RequestFigures(TypedDict):
    """One request's figures (:func:`labkit.serving.metrics.request_metrics`): seconds, tokens,
    tokens/s; NaN when unknown."""

    ttft_s: float
    e2e_s: float
    tpot_s: float
    itl_s: list[float]
    chunk_gaps_s: list[float]
    output_tokens: int | None
    tps: float
    output_tokens_per_s: float


def timeline_figures(chunks: Sequence[tuple[float, int | None]], t_sent: float, t_end: float | None,
                     output_tokens: int | None) -> RequestFigures:
    """The figures of a request sent at ``t_sent`` and closed at ``t_end`` (seconds, one clock)
    whose output-bearing ``chunks`` are (seconds after ``t_sent``, tokens in it or None) and whose
    output count is ``output_tokens`` (None: the chunks' sum, when every count is known)."""
    counts = [c[1] for c in chunks]
    known = bool(chunks) and all(isinstance(k, int) for k in counts)
    n_out = output_tokens
    if n_out is None and known:
        n_out = sum(k or 0 for k in counts)
    bearing = [c for c in chunks if c[1] is None or c[1] > 0] or list(chunks)
    if bearing:
        ttft, e2e = bearing[0][0], bearing[-1][0]
    else:
        ttft, e2e = NAN, (t_sent if t_end is None else t_end) - t_sent
    gaps = [b[0] - a[0] for a, b in zip(bearing, bearing[1:], strict=False)]
    itl: list[float] = []
    if known:  # gaps run from the previous chunk that carried tokens: empty chunks lose no time
        prev_t = None
        for t, k in chunks:
            if k:
                if prev_t is not None:
                    itl += [(t - prev_t) / k] * k
                prev_t = t
    tpot = (e2e - ttft) / (n_out - 1) if n_out and n_out > 1 and chunks else NAN
    return {
        "ttft_s": ttft,
        "e2e_s": e2e,
        "tpot_s": tpot,
        "itl_s": itl,
        "chunk_gaps_s": gaps,
        "output_tokens": n_out,
        "tps": 1.0 / tpot if tpot and tpot > 0 else NAN,
        "output_tokens_per_s": n_out / e2e if n_out and e2e > 0 else NAN,
    }
