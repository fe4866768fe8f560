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
