"""Rolling out a new version of a model server, simulated (chapter 08): blue-green against canary.

Blue-green starts a second full set of replicas and moves all traffic at once when it is ready;
canary moves a growing share of the traffic to a few new replicas, step by step. :func:`rollout`
prices one transition both in exposure (requests the new version served; when it is bad a share
``error_rate`` of them fail) and in GPU-hours (replicas billed while both versions run). A bad
version is noticed the way monitoring notices it: once ``detect_failures`` failed answers have come
back (a failure is seen when its request ends, one service time after it arrived), plus ``react_s``
to move the traffic back. A small canary sees few requests, so it needs longer to collect those
failures. Times are seconds, rates requests/s, costs GPU-hours; arrivals are a Poisson process
(:mod:`labkit.serving.arrivals`). :func:`over_seeds` repeats strategies on independent random
streams, :func:`expectation` gives a figure's mean over seeds with its spread.

Usage::

    from labkit.production import rollout
    runs = rollout.over_seeds({"blue-green": dict(strategy="blue_green"), "canary": dict(strategy="canary")},
                              range(24), replicas=4, rps=2.0, service_s=4.0, slots_per_replica=8)
    print(rollout.expectation(runs["canary"], "requests_exposed"))
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from ..serving import arrivals
from ..stats import summary
from .fleet import service_times
from .traces import Service

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


def _seen(arr: np.ndarray, fails: np.ndarray, svc: np.ndarray, k: int | None, react_s: float) -> float:
    """When the ``k``-th failed answer has come back, plus ``react_s`` (inf: never)."""
    back = np.sort(arr[fails] + svc[fails])
    return math.inf if k is None or back.size < k else float(back[k - 1]) + react_s


def rollout(strategy: str, replicas: int, rps: float, service_s: Service, slots_per_replica: int,
            splits: Sequence[float] = (0.05, 0.25, 0.5, 1.0), step_s: float = 600,
            detect_failures: int | None = 5, error_rate: float = 1.0, react_s: float = 60.0, bad: bool = True,
            cold_start_s: float = 120.0, seed: int | Sequence[int] = 0) -> dict[str, Any]:
    """Replace ``replicas`` old replicas serving ``rps`` requests/s by a new version. ``blue_green``:
    start ``replicas`` new ones (billed from 0 s), switch all traffic when they are ready (after
    ``cold_start_s``), keep the old set ``step_s`` s, then remove it. ``canary``: for each share in
    ``splits`` run ``ceil(share * replicas)`` new replicas (extra ones cold-start first; traffic
    moves when they are ready) and ``ceil((1 - share) * replicas)`` old ones for ``step_s`` s.
    Poisson arrivals (``seed``: an int or a tuple of ints, one random stream) go to the new version
    with that moment's share. When ``bad``, each of its requests fails with probability
    ``error_rate``; the fault is seen ``react_s`` s after the ``detect_failures``-th failure came back
    (a request's answer returns ``service_s`` after it arrived; ``None``: never seen): all traffic
    returns to the old set (restarted to full size if it shrank) and the new set goes.
    Returns ``outcome``, ``detected_s`` (from the first request to the new version until the fault
    was seen; NaN if never), ``duration_s``, ``gpu_hours`` (the transition), ``extra_gpu_hours`` (over
    ``replicas`` for as long), ``mean_replicas``, ``peak_replicas``, ``requests``, ``requests_exposed``
    (sent to the new version), ``failed``, ``completed``, ``accounted``, ``peak_utilization`` (busy
    slots needed / ready slots in the busier set, from the mean of ``service_s``: above 1 requests
    queue) and ``plan``."""
    if strategy not in STRATEGIES:
        raise ValueError(f"strategy={strategy!r}: choose one of {STRATEGIES}")
    if not (isinstance(replicas, int | np.integer) and min(replicas, slots_per_replica) >= 1 and rps > 0
            and list(splits) == sorted(splits) and 0 < splits[0] and splits[-1] == 1.0 and step_s > 0
            and cold_start_s >= 0 and react_s >= 0 and 0 < error_rate <= 1
            and (detect_failures is None or detect_failures >= 1)):
        raise ValueError("need integer replicas and slots_per_replica >= 1, rps > 0, splits rising from "
                         "above 0 to 1.0, step_s > 0, cold_start_s and react_s >= 0 s, 0 < error_rate <= 1, "
                         "detect_failures >= 1 (None: never seen)")
    plan, outcome = _plan(strategy, replicas, splits, step_s, cold_start_s), "completed"
    rng = np.random.default_rng(seed)
    arr = arrivals.poisson_window(rps, plan[-1][0] + cold_start_s + step_s, rng)
    t = np.array([p[0] for p in plan])
    to_new = rng.random(arr.size) < np.array([p[1] for p in plan])[np.searchsorted(t, arr, side="right") - 1]
    fails = to_new & (rng.random(arr.size) < error_rate) if bad else np.zeros(arr.size, bool)
    seen = _seen(arr, fails, service_times(service_s, arr.size, rng), detect_failures, react_s)
    if seen < plan[-1][0]:                      # roll back: old set to full size, new set removed
        plan, outcome = [p for p in plan if p[0] < seen] or plan[:1], "rolled_back"
        plan.append((seen, 0.0, 0, replicas, 0, up := plan[-1][5]))
        if up < replicas:
            plan.append((seen + cold_start_s, 0.0, 0, replicas, 0, replicas))
    first_new = next(p[0] for p in plan if p[1] > 0) if any(p[1] > 0 for p in plan) else math.nan
    t, share, new_b, old_b, new_up, old_up = (np.array(x, dtype=float) for x in zip(*plan, strict=True))
    end, gpu_s = float(t[-1]), float(np.sum(np.diff(t) * (new_b + old_b)[:-1]))
    keep = arr < end
    to_new, fails = to_new[keep] & (arr[keep] < seen), fails[keep] & (arr[keep] < seen)
    need = rps * float(np.mean(service_times(service_s, 1000, rng))) / slots_per_replica  # replicas' worth
    with np.errstate(divide="ignore", invalid="ignore"):       # 0/0: a set with no traffic and no replica
        util = np.nan_to_num(np.maximum(share * need / new_up, (1 - share) * need / old_up))[:-1]
    n, exposed, failed = int(keep.sum()), int(to_new.sum()), int(fails.sum())
    ok = n - failed
    detected = seen - first_new if outcome == "rolled_back" else math.nan
    return {"strategy": strategy, "outcome": outcome, "detected_s": detected, "duration_s": end,
            "gpu_hours": gpu_s / 3600,
            "extra_gpu_hours": (gpu_s - replicas * end) / 3600, "mean_replicas": gpu_s / end if end else 0.0,
            "peak_replicas": int(max(new_b + old_b)), "requests": n, "requests_exposed": exposed,
            "failed": failed, "completed": ok, "accounted": ok + failed == n,
            "peak_utilization": float(util.max()) if util.size else 0.0,
            "plan": [dict(zip(("t_s", "new_share", "new_billed", "old_billed", "new_ready", "old_ready"), p,
                              strict=True)) for p in plan]}


def over_seeds(strategies: Mapping[str, Mapping[str, Any]], seeds: Sequence[int],
               **common: Any) -> dict[str, list[dict[str, Any]]]:
    """``{name: [rollout result per seed]}``: each strategy (its own :func:`rollout` arguments, with
    ``common``) run once per seed on its **own** random stream (seed ``(seed, strategy's index)``), so
    no strategy's exposure is a subset of another's drawn from the same numbers."""
    return {name: [rollout(**{**common, **kw, "seed": (int(s), i)}) for s in seeds]
            for i, (name, kw) in enumerate(strategies.items())}


def expectation(results: Sequence[dict[str, Any]], key: str, z: float = 1.96) -> dict[str, float]:
    """The mean of ``key`` over ``results`` (one per seed) with its spread: ``n``, ``mean``, ``sd``
    (over seeds) and ``lo``/``hi`` = mean ∓ ``z`` standard errors (about 95% for 20 or more seeds)."""
    s = summary(float(r[key]) for r in results)
    if s["n"] < 2:
        raise ValueError(f"need at least two seeds' results with a finite {key!r}, got {s['n']}")
    se = s["std"] * math.sqrt(s["n"] / (s["n"] - 1)) / math.sqrt(s["n"])
    sd = s["std"] * math.sqrt(s["n"] / (s["n"] - 1))
    return {"n": int(s["n"]), "mean": s["mean"], "sd": sd, "lo": s["mean"] - z * se, "hi": s["mean"] + z * se}
