"""Rolling out a new version of a model server, simulated (chapter 08): blue-green against canary.

Blue-green starts a second full set of replicas and moves all traffic at once when it is ready;
canary moves a growing share of the traffic to a few new replicas, step by step. :func:`rollout`
prices one transition both in exposure (requests the new version served, which all fail when it is
bad) and in GPU-hours (replicas billed while both versions run). Times are seconds, rates
requests/s, costs GPU-hours; arrivals are a Poisson process (:mod:`labkit.serving.arrivals`).

Usage::

    from labkit.production import rollout
    bg = rollout.rollout("blue_green", replicas=4, rps=2.0, service_s=4.0, slots_per_replica=8)
    can = rollout.rollout("canary", replicas=4, rps=2.0, service_s=4.0, slots_per_replica=8)
    print(bg["requests_exposed"], can["requests_exposed"], can["extra_gpu_hours"])
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from ..serving import arrivals
from .fleet import Service, service_times

STRATEGIES = ("blue_green", "canary")


def _plan(strategy: str, r: int, splits: Sequence[float], step_s: float, cold_s: float) -> list[tuple]:
    """Steps (t_s, new version's share, new billed, old billed, new ready, old ready) of a good rollout."""
    if strategy == "blue_green":
        return [(0.0, 0.0, r, r, 0, r), (cold_s, 1.0, r, r, r, r), (cold_s + step_s, 1.0, r, 0, r, 0)]
    steps, t, new, old, share = [], 0.0, 0, r, 0.0
    for s in splits:
        if (k := math.ceil(s * r - 1e-9)) > new:    # start the extra new replicas, wait a cold start
            steps.append((t, share, k, old, new, old))
            t += cold_s
        new, old, share = k, math.ceil((1 - s) * r - 1e-9), s
        steps.append((t, s, new, old, new, old))
        t += step_s
    return steps


def rollout(strategy: str, replicas: int, rps: float, service_s: Service, slots_per_replica: int,
            splits: Sequence[float] = (0.05, 0.25, 0.5, 1.0), step_s: float = 600,
            detect_s: float | None = 300, bad: bool = True, cold_start_s: float = 120.0,
            seed: int = 0) -> dict[str, Any]:
    """Replace ``replicas`` old replicas serving ``rps`` requests/s by a new version. ``blue_green``:
    start ``replicas`` new ones (billed from 0 s), switch all traffic when they are ready (after
    ``cold_start_s``), keep the old set ``step_s`` s, then remove it. ``canary``: for each share in
    ``splits`` run ``ceil(share * replicas)`` new replicas (extra ones cold-start first; traffic
    moves when they are ready) and ``ceil((1 - share) * replicas)`` old ones for ``step_s`` s. When
    ``bad`` and ``detect_s`` is not None, the fault is seen ``detect_s`` s after the new version first
    gets traffic: all traffic returns to the old set (restarted to full size if it shrank) and the
    new set goes. Poisson arrivals (``seed``) go to the new version with that moment's share.
    Returns ``outcome``, ``duration_s``, ``gpu_hours`` (the transition), ``extra_gpu_hours`` (over
    ``replicas`` for as long), ``mean_replicas``, ``peak_replicas``, ``requests``, ``requests_exposed``
    (sent to the new version), ``failed`` (those, if bad), ``completed``, ``accounted``,
    ``peak_utilization`` (busy slots needed / ready slots in the busier set, from the mean of
    ``service_s``: above 1 requests queue) and ``plan``."""
    if strategy not in STRATEGIES:
        raise ValueError(f"strategy={strategy!r}: choose one of {STRATEGIES}")
    if not (isinstance(replicas, int | np.integer) and min(replicas, slots_per_replica) >= 1 and rps > 0
            and list(splits) == sorted(splits) and 0 < splits[0] and splits[-1] == 1.0 and step_s > 0
            and cold_start_s >= 0 and (detect_s is None or detect_s >= 0)):
        raise ValueError("need integer replicas and slots_per_replica >= 1, rps > 0, splits rising from "
                         "above 0 to 1.0, step_s > 0, cold_start_s >= 0, detect_s >= 0 s (None: never seen)")
    plan, outcome = _plan(strategy, replicas, splits, step_s, cold_start_s), "completed"
    seen = next(p[0] for p in plan if p[1] > 0) + (math.inf if detect_s is None else detect_s)
    if bad and seen < plan[-1][0]:              # roll back: old set to full size, new set removed
        plan, outcome = [p for p in plan if p[0] < seen] or plan[:1], "rolled_back"
        plan.append((seen, 0.0, 0, replicas, 0, up := plan[-1][5]))
        if up < replicas:
            plan.append((seen + cold_start_s, 0.0, 0, replicas, 0, replicas))
    t, share, new_b, old_b, new_up, old_up = (np.array(x, dtype=float) for x in zip(*plan, strict=True))
    end, gpu_s = float(t[-1]), float(np.sum(np.diff(t) * (new_b + old_b)[:-1]))
    rng = np.random.default_rng(seed)
    arr = arrivals.poisson_window(rps, end, rng) if end > 0 else np.zeros(0)
    to_new = rng.random(arr.size) < share[np.searchsorted(t, arr, side="right") - 1]
    need = rps * float(np.mean(service_times(service_s, 1000, rng))) / slots_per_replica  # replicas' worth
    with np.errstate(divide="ignore", invalid="ignore"):       # 0/0: a set with no traffic and no replica
        util = np.nan_to_num(np.maximum(share * need / new_up, (1 - share) * need / old_up))[:-1]
    exposed, failed = int(to_new.sum()), int(to_new.sum()) if bad else 0
    ok = int((~to_new).sum()) + exposed - failed
    return {"strategy": strategy, "outcome": outcome, "duration_s": end, "gpu_hours": gpu_s / 3600,
            "extra_gpu_hours": (gpu_s - replicas * end) / 3600, "mean_replicas": gpu_s / end if end else 0.0,
            "peak_replicas": int(max(new_b + old_b)), "requests": int(arr.size), "requests_exposed": exposed,
            "failed": failed, "completed": ok, "accounted": ok + failed == arr.size,
            "peak_utilization": float(util.max()) if util.size else 0.0,
            "plan": [dict(zip(("t_s", "new_share", "new_billed", "old_billed", "new_ready", "old_ready"), p,
                              strict=True)) for p in plan]}
