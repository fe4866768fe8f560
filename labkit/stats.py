"""Percentiles, summaries and intervals (chapters 02, 02b, 06 and 08): every figure is
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


def wilson(k: int, n: int, confidence: float = 0.95) -> dict[str, float]:
    """A proportion ``k / n`` with its Wilson score interval (chapters 02b and 06: a score on n items).
    Returns ``k``, ``n``, ``p``, ``lo`` and ``hi`` (fractions); NaN figures when ``n`` is 0.
    ``ValueError`` unless ``0 <= k <= n``."""
    if not 0 <= k <= n:
        raise ValueError(f"need 0 <= k <= n, got k={k}, n={n}")
    if n == 0:
        return {"k": 0, "n": 0, "p": NAN, "lo": NAN, "hi": NAN}
    from scipy.stats import binomtest

    ci = binomtest(k, n).proportion_ci(confidence_level=confidence, method="wilson")
    return {"k": k, "n": n, "p": k / n, "lo": float(ci.low), "hi": float(ci.high)}


def mcnemar(a: Sequence[bool], b: Sequence[bool]) -> dict[str, float]:
    """Exact McNemar test of two systems scored on the same items (chapter 02b): ``a_only`` (items only
    ``a`` got right), ``b_only``, and ``p``, the two-sided exact binomial p-value that the discordant
    items split evenly (1.0 when there are none). ``ValueError`` unless both score the same items."""
    if len(a) != len(b):
        raise ValueError(f"score the same items: got {len(a)} and {len(b)}")
    a_only = sum(1 for x, y in zip(a, b, strict=True) if x and not y)
    b_only = sum(1 for x, y in zip(a, b, strict=True) if y and not x)
    if a_only + b_only == 0:
        return {"a_only": 0, "b_only": 0, "p": 1.0}
    from scipy.stats import binomtest

    return {"a_only": a_only, "b_only": b_only, "p": float(binomtest(a_only, a_only + b_only).pvalue)}


def paired_bootstrap(a: Sequence[float], b: Sequence[float], groups: Sequence[object] | None = None,
                     stat: str = "diff", confidence: float = 0.95, resamples: int = 2000,
                     seed: int = 0) -> dict[str, float]:
    """A paired comparison of per-item figures ``a`` and ``b`` (same items, same order) with a
    percentile bootstrap interval (chapters 02b and 06). ``stat``: ``diff`` (mean of ``b`` minus mean
    of ``a``) or ``ratio`` (mean of ``b`` over mean of ``a``). ``groups``: the unit items cluster in
    (e.g. the invoice an item was asked about, the window a token sits in): whole groups are resampled.
    Returns ``value``, ``lo``, ``hi`` and ``n`` (groups). ``ValueError`` on unequal lengths or no items."""
    x, y = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    if x.shape != y.shape or x.size == 0:
        raise ValueError(f"need the same number (>= 1) of paired items, got {x.size} and {y.size}")
    if stat not in ("diff", "ratio"):
        raise ValueError(f"stat must be 'diff' or 'ratio', got {stat!r}")
    keys = list(range(x.size)) if groups is None else list(groups)
    if len(keys) != x.size:
        raise ValueError(f"groups must name one group per item: {len(keys)} for {x.size} items")
    labels = {g: i for i, g in enumerate(dict.fromkeys(keys))}
    idx = np.array([labels[g] for g in keys])
    sums = np.zeros((len(labels), 3))
    np.add.at(sums, idx, np.c_[x, y, np.ones_like(x)])

    def value(s: np.ndarray) -> np.ndarray:
        ma, mb = s[..., 0] / s[..., 2], s[..., 1] / s[..., 2]
        return mb - ma if stat == "diff" else mb / ma

    rng = np.random.default_rng(seed)
    picks = rng.integers(0, len(labels), size=(resamples, len(labels)))
    boot = value(sums[picks].sum(axis=1))
    tail = (1 - confidence) / 2
    lo, hi = np.nanquantile(boot, [tail, 1 - tail])
    return {"value": float(value(sums.sum(axis=0))), "lo": float(lo), "hi": float(hi), "n": len(labels)}
