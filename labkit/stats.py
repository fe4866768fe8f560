"""Percentiles and summaries that stay honest on empty input (chapters 02 and 08): every figure is
NaN when there is nothing to summarize, never 0. Values keep their own units (seconds, tokens, ...).

Bottom layer: imports nothing from labkit. Percentiles are numpy's default (linear interpolation),
as ``vllm bench serve`` computes them.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence

import numpy as np

NAN = float("nan")
PERCENTILES = (50, 90, 99)


def finite(values: Iterable[float | None]) -> np.ndarray:
    """``values`` as a float array without ``None`` and NaN (unknown figures are left out)."""
    if isinstance(values, np.ndarray):
        a = values.astype(float).ravel()
        return a[~np.isnan(a)]
    return np.asarray([v for v in values if v is not None and not math.isnan(v)], dtype=float)


def percentile(values: Iterable[float | None], q: float) -> float:
    """The ``q``-th percentile (0..100) of ``values`` (``None``/NaN left out); NaN when none is left."""
    a = finite(values)
    return float(np.percentile(a, q)) if a.size else NAN


def percentile_key(q: float) -> str:
    """``p50`` for 50, ``p99.9`` for 99.9: the key :func:`summary` uses for a percentile."""
    return f"p{int(q)}" if int(q) == q else f"p{q}"


def summary(values: Iterable[float | None], percentiles: Sequence[float] = PERCENTILES) -> dict[str, float]:
    """``n``, ``mean``, ``std``, ``median`` and ``p<q>`` (:func:`percentile_key`) of ``values``
    (``None``/NaN left out). Empty input gives ``n`` 0 and NaN figures, never 0."""
    a = finite(values)
    out: dict[str, float] = {"n": int(a.size)}
    if a.size == 0:
        return out | {"mean": NAN, "std": NAN, "median": NAN} | {percentile_key(q): NAN for q in percentiles}
    out |= {"mean": float(a.mean()), "std": float(a.std()), "median": float(np.median(a))}
    return out | {percentile_key(q): float(np.percentile(a, q)) for q in percentiles}


def median_interval(values: Iterable[float | None], confidence: float = 0.9) -> dict[str, float]:
    """The median of repeated runs with a distribution-free interval for it (chapters 06 and 08): the
    narrowest pair of order statistics ``x(k) .. x(n+1-k)`` whose binomial coverage is at least
    ``confidence``, else the full range (``min .. max``). Returns ``n``, ``median``, ``lo``, ``hi``
    and ``coverage`` (the interval's own confidence: 0.75 for 3 runs, 0.94 for 5). NaN when empty."""
    a = np.sort(finite(values))
    n = int(a.size)
    if n == 0:
        return {"n": 0, "median": NAN, "lo": NAN, "hi": NAN, "coverage": NAN}
    # P(x(k) <= median <= x(n+1-k)) = 1 - 2 P(Binomial(n, 1/2) < k)
    below = np.cumsum([math.comb(n, j) for j in range(n + 1)]) / 2.0**n
    k = 1
    while k + 1 <= (n + 1) // 2 and 1 - 2 * below[k] >= confidence:
        k += 1
    coverage = 1 - 2 * (below[k - 1] if k >= 1 else 0.0)
    return {"n": n, "median": float(np.median(a)), "lo": float(a[k - 1]), "hi": float(a[n - k]),
            "coverage": float(coverage)}


def ratio_interval(num: Sequence[float] | np.ndarray, den: Sequence[float] | np.ndarray,
                   confidence: float = 0.9) -> dict[str, float]:
    """:func:`median_interval` of the per-round ratios ``num[i] / den[i]`` of two figures measured in
    turn, round after round (chapters 05 and 06: a speed-up with its spread). ``ValueError`` unless
    both have the same number (>= 1) of rounds."""
    a, b = np.asarray(num, dtype=float), np.asarray(den, dtype=float)
    if a.shape != b.shape or a.size == 0:
        raise ValueError(f"need the same number (>= 1) of rounds, got {a.size} and {b.size}")
    return median_interval(a / b, confidence)
