"""Traffic for chapter 08's fleet simulations: a day of arrivals with a daily cycle and spikes, and a
burst sized in replicas' worth (arrival times in seconds, rates in requests/s), for
:mod:`labkit.production.fleet`.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import numpy as np

from ..serving import arrivals

SPIKES = ((10.0, 3.0, 0.25), (19.0, 2.5, 0.5))  # (start hour, rate multiplier, duration hours)
#: Seconds a request holds a slot, or a function drawing them from a numpy Generator.
Service = float | Callable[[np.random.Generator], float]


def rate_at(t_s: float | np.ndarray, mean_rps: float, peak_to_trough: float = 4.0,
            spikes: Sequence[tuple[float, float, float]] = SPIKES) -> np.ndarray:
    """Arrival rate (requests/s) at ``t_s`` seconds after midnight: mean ``mean_rps`` over a day
    (before spikes), lowest at 04:00, highest at 16:00, peak/trough ``peak_to_trough``, multiplied by
    ``multiplier`` during each spike ``(start hour, multiplier, duration hours)``, every day."""
    if not (mean_rps > 0 and peak_to_trough >= 1 and all(m > 0 and d >= 0 for _, m, d in spikes)):
        raise ValueError(f"need mean_rps > 0 ({mean_rps}), peak_to_trough >= 1 ({peak_to_trough}), spikes as "
                         f"(hour, multiplier > 0, duration hours >= 0) ({spikes})")
    h = np.asarray(t_s, dtype=float) / 3600.0
    a = (peak_to_trough - 1) / (peak_to_trough + 1)
    rate = mean_rps * (1 - a * np.cos(2 * np.pi * (h - 4.0) / 24))
    for start, mult, dur in spikes:
        rate = rate * np.where((h - start) % 24 < dur, mult, 1.0)
    return rate


def day_trace(mean_rps: float, hours: float = 24, peak_to_trough: float = 4.0,
              spikes: Sequence[tuple[float, float, float]] = SPIKES, seed: int = 0) -> np.ndarray:
    """Sorted arrival times (s) over ``hours`` from midnight, with rate :func:`rate_at`, by thinning:
    a Poisson process at the rate's upper bound, each point kept with probability rate/bound."""
    if not hours > 0:
        raise ValueError(f"hours={hours} must be positive")
    rate_at(0.0, mean_rps, peak_to_trough, spikes)  # validates
    peak = mean_rps * 2 * peak_to_trough / (peak_to_trough + 1)
    bound = peak * math.prod(max(m, 1.0) for _, m, _ in spikes)
    return arrivals.thinned(lambda t: rate_at(t, mean_rps, peak_to_trough, spikes), bound, hours * 3600, seed)


def burst_trace(slots_per_replica: int, service_s: float, base: float = 1.0, extra: float = 8.0,
                front_s: float = 15.0, start_s: float = 600.0, hold_s: float = 1200.0, after_s: float = 600.0,
                seed: int = 0) -> np.ndarray:
    """Arrival times (s) of a burst, in replicas' worth (one replica serves ``slots_per_replica /
    service_s`` requests/s): ``base`` for ``start_s``, then ``base + extra`` for ``hold_s``, then
    ``base`` for ``after_s``. The burst's first ``front_s`` seconds bring ``extra`` replicas' worth of
    requests in flight (a faster rate when a request lasts longer than ``front_s``), so the fleet fills
    up faster than a replica cold-starts, however long a request holds its slot."""
    if not (service_s > 0 and 0 < front_s < hold_s and min(start_s, after_s) > 0 and base > 0 and extra > 0):
        raise ValueError(f"need service_s, base, extra, start_s, after_s > 0 and 0 < front_s < hold_s; got "
                         f"{service_s=}, {base=}, {extra=}, {start_s=}, {after_s=}, {front_s=}, {hold_s=}")
    cap = slots_per_replica / service_s
    front = base * cap + extra * slots_per_replica / min(front_s, service_s)
    rates = [base * cap, front, (base + extra) * cap, base * cap]
    starts = [0.0, start_s, start_s + front_s, start_s + hold_s]
    return arrivals.piecewise(starts, rates, start_s + hold_s + after_s, seed)


def burst_hold_s(cold_start_s: float, service_s: float) -> float:
    """How long chapter 08's burst holds (s): the longest of 20 minutes, 3 cold starts and 4 request
    times. The manifest's autoscaler asks for the replicas a burst needs within a few minutes (at most
    2 pods or double per minute), they serve a cold start later and must then clear the backlog; a burst
    shorter than that would end before the fleet caught up, and compare nothing but the cold start."""
    if not (cold_start_s > 0 and service_s > 0):
        raise ValueError(f"need cold_start_s > 0 and service_s > 0, got {cold_start_s=}, {service_s=}")
    return max(1200.0, 3 * cold_start_s, 4 * service_s)
