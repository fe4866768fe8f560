"""When requests arrive: one seeded generator for the load generator and the simulators (chapters 02
and 08). Times are seconds from the start, rates requests per second.

* :func:`gaps` draws the time between consecutive requests from a gamma distribution with mean
  ``1/rate`` and shape ``burstiness``: shape 1 is an exponential (Poisson arrivals), below 1 the
  gaps vary more (bursts and lulls), above 1 less (more regular). Their coefficient of variation
  (standard deviation / mean) is ``1/sqrt(burstiness)``. ``vllm bench serve`` draws its gaps the
  same way.
* :func:`arrival_times` turns ``n`` such gaps into send times, the first request at 0 s.
* :func:`poisson_window` draws a Poisson process over a fixed window: the count is Poisson with
  mean ``rate * duration_s`` and the times are uniform in the window, sorted.
* :func:`thinned` draws a Poisson process whose rate changes with time (a day's traffic, a spike):
  a process at ``peak_rps`` from :func:`poisson_window`, each point kept with probability
  ``rate_fn(t) / peak_rps`` (Lewis and Shedler's thinning); :func:`piecewise` is the case of a
  rate that steps between constant levels (a burst).

``seed`` is an integer or a ``numpy.random.Generator`` (which is then drawn from, so a caller can
share one stream between arrivals and other draws). The same seed gives the same times.

Usage::

    from labkit.serving import arrivals
    t = arrivals.arrival_times(1000, rate=5.0, burstiness=0.5, seed=0)   # bursty, first at 0 s
    day = arrivals.thinned(lambda t: 1 + 0.5 * np.sin(t / 3600), peak_rps=1.5, duration_s=86_400)
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import numpy as np

Seed = int | np.random.Generator


def _positive(name: str, value: float) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float | np.integer | np.floating) \
            or not math.isfinite(value) or value <= 0:
        raise ValueError(f"{name} must be a positive, finite number, got {value!r}")
    return float(value)


def _count(n: int) -> int:
    if isinstance(n, bool) or not isinstance(n, int | np.integer) or n < 0:
        raise ValueError(f"n must be a whole number of requests >= 0, got {n!r}")
    return int(n)


def gaps(n: int, rate: float, burstiness: float = 1.0, seed: Seed = 0) -> np.ndarray:
    """``n`` gaps (s) between requests: gamma with shape ``burstiness`` and mean ``1/rate``
    (``rate`` requests/s), so a coefficient of variation ``1/sqrt(burstiness)``."""
    n, rate, shape = _count(n), _positive("rate", rate), _positive("burstiness", burstiness)
    return np.random.default_rng(seed).gamma(shape=shape, scale=1.0 / (rate * shape), size=n)


def arrival_times(n: int, rate: float, burstiness: float = 1.0, seed: Seed = 0) -> np.ndarray:
    """Send times (s) of ``n`` open-loop requests at ``rate`` per second with :func:`gaps` of shape
    ``burstiness`` between them; the first request goes at 0 s."""
    g = gaps(n, rate, burstiness, seed)
    return np.concatenate(([0.0], np.cumsum(g[:-1]))) if n else g


def poisson_window(rate: float, duration_s: float, seed: Seed = 0) -> np.ndarray:
    """Sorted arrival times (s) in ``[0, duration_s)`` of a Poisson process at ``rate`` requests/s."""
    rate, duration_s = _positive("rate", rate), _positive("duration_s", duration_s)
    rng = np.random.default_rng(seed)
    return np.sort(rng.uniform(0.0, duration_s, rng.poisson(rate * duration_s)))


def thinned(rate_fn: Callable[[np.ndarray], np.ndarray], peak_rps: float, duration_s: float,
            seed: Seed = 0) -> np.ndarray:
    """Sorted arrival times (s) in ``[0, duration_s)`` of a Poisson process whose rate at time ``t``
    is ``rate_fn(t)`` requests/s (``rate_fn`` takes an array of times). ``peak_rps`` must bound the
    rate from above; a rate above it or below 0 raises ``ValueError`` (it would bias the trace)."""
    rng = np.random.default_rng(seed)
    t = poisson_window(peak_rps, duration_s, rng)
    rate = np.asarray(rate_fn(t), dtype=float)
    if rate.shape != t.shape:
        raise ValueError(f"rate_fn must return one rate per time: got shape {rate.shape} for {t.shape}")
    top = peak_rps * (1 + 1e-9)
    if rate.size and not (np.all(np.isfinite(rate)) and 0 <= rate.min() and rate.max() <= top):
        raise ValueError(f"rate_fn must stay in [0, peak_rps={peak_rps}] requests/s; it reached "
                         f"[{rate.min():.4g}, {rate.max():.4g}]")
    return t[rng.uniform(0.0, peak_rps, t.size) < rate]


def piecewise(starts_s: Sequence[float], rates: Sequence[float], duration_s: float,
              seed: Seed = 0) -> np.ndarray:
    """Sorted arrival times (s) in ``[0, duration_s)`` of a Poisson process whose rate is ``rates[i]``
    requests/s from ``starts_s[i]`` until the next start (``starts_s`` rising from 0; rates >= 0):
    :func:`thinned` with a step-shaped rate."""
    edges, r = np.asarray(starts_s, dtype=float), np.asarray(rates, dtype=float)
    if not (edges.ndim == r.ndim == 1 and edges.size == r.size >= 1 and edges[0] == 0
            and np.all(np.diff(edges) > 0) and np.all(np.isfinite(r)) and r.min() >= 0 and r.max() > 0):
        raise ValueError(f"need starts_s rising from 0 and one rate >= 0 (not all 0) per start; got "
                         f"starts_s={list(starts_s)}, rates={list(rates)}")
    return thinned(lambda t: r[np.searchsorted(edges, t, side="right") - 1], float(r.max()), duration_s, seed)
