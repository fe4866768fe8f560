"""Rolling out a new version of a model server, simulated (chapter 08): blue-green against the canary
that ``deploy/k8s/optional/canary.yaml`` ships, each judged the way that file's analysis judges.

Blue-green starts a second full set of replicas, moves all traffic to it once it is ready and keeps the
old set for one step while the new one is watched. The canary (:mod:`labkit.production.canary`, Argo
Rollouts with traffic routing) moves :data:`~labkit.production.canary.WEIGHTS` percent of the traffic
to ``ceil(share * replicas)`` new replicas, one step of ``step_s`` each, and keeps the stable set at full
size throughout (Argo's default with traffic routing: no ``dynamicStableScale``); at the end the new
set is scaled to full size, takes all the traffic and the stable one goes
:data:`SCALE_DOWN_DELAY_S` later. Both are judged by the AnalysisTemplate's rule:

* every :data:`~labkit.production.canary.ANALYSIS_INTERVAL_S` s, over the answers the new version
  returned in the last :data:`~labkit.production.canary.WINDOW_S` s: when there are at least
  :data:`~labkit.production.canary.MIN_REQUESTS`, two readings (fewer: neither is judged): their
  error ratio above :data:`~labkit.production.canary.ERROR_RATIO_LIMIT`, and their p99 time to first
  token over the old version's above :data:`~labkit.production.canary.TTFT_P99_RATIO_LIMIT`, are
  failed measurements of their metric. The old version's p99 is read from its answers in the same
  window, or, when it returned fewer than ``MIN_REQUESTS`` there (blue-green after its switch), from
  the window before the new version took traffic (with fewer there too, the p99 is not judged). More
  than :data:`~labkit.production.canary.FAILURE_LIMIT` failed measurements of one metric roll back:
  the new version's traffic returns to the old set ``react_s`` s later. The canary is watched from
  its first weight until it takes all the traffic, blue-green for one step after its switch;
* the canary's evidence check at the end of each step, as that file's PromQL reads it: when a window of
  ``WINDOW_S`` s ending in the step's last ``step_s - WINDOW_S`` s (one every
  :data:`~labkit.production.canary.SAMPLE_S` s; each lies wholly in the step, and a measurement falls
  among them) holds fewer than ``MIN_REQUESTS`` of the new
  version's answers, the measurement taken there may have gone unjudged: the rollout pauses until a
  person resumes it, ``person_s`` later (no answer in the whole step aborts it).

Both versions fail ``base_error_rate`` of their answers; a bad new version fails ``error_rate`` and
its times to first token are ``ttft_factor`` times the old version's. A request's time to first token
is lognormal with shape ``ttft_sigma`` (:data:`TTFT_SIGMA`, an assumption: its p99 is 3.2x its
median); its median does not matter, the criterion is a ratio. The p99s are exact quantiles of the
answers (Prometheus interpolates within histogram buckets, coarser). Exposure is counted over a
fixed ``horizon_s`` from the start: a bad version that got promoted keeps serving until then.
Times are seconds, rates requests/s, costs GPU-hours; arrivals are a Poisson process
(:mod:`labkit.serving.arrivals`). :func:`over_seeds` repeats strategies on independent random streams,
:func:`expectation` gives a figure's mean over seeds with its interval.

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

from ..results import record
from ..serving import arrivals
from ..stats import summary
from .canary import (
    ANALYSIS_INTERVAL_S,
    ERROR_RATIO_LIMIT,
    FAILURE_LIMIT,
    JUDGED_SPAN_S,
    MIN_REQUESTS,
    SAMPLE_S,
    STEP_PAUSE_S,
    TTFT_P99_RATIO_LIMIT,
    WEIGHTS,
    WINDOW_S,
)
from .fleet import service_times
from .traces import Service

STRATEGIES = ("blue_green", "canary")
SPLITS = (*(w / 100 for w in WEIGHTS), 1.0)  # the canary's shares, then promotion
SCALE_DOWN_DELAY_S = 30  # Argo Rollouts' default delay before the set that lost its traffic is removed
PERSON_S = 1800.0  # assumption: a rollout paused for want of evidence is resumed half an hour later
BASE_ERROR_RATE = 0.001  # both versions' share of failed answers, unless one is bad
HORIZON_S = 4 * 3600.0  # exposure and failures are counted over the first 4 hours
TTFT_SIGMA = 0.5  # assumption: log-space spread of one request's time to first token (p99 = 3.2x median)
METRICS = ("errors", "ttft")  # what the analysis judges, each with its own count of failed measurements


class _Judge:
    """The analysis over one run's requests: which went to the new version (set phase by phase), which
    failed, their times to first token (the old version's; the new one's are ``slow`` times longer) and
    the failed measurements of each metric so far."""

    def __init__(self, arr: np.ndarray, back: np.ndarray, fail_u: np.ndarray, split_u: np.ndarray,
                 p_new: float, p_old: float, ttft: np.ndarray | None = None, slow: float = 1.0) -> None:
        self.arr, self.back, self.fail_u, self.split_u = arr, back, fail_u, split_u
        self.p_new, self.p_old = p_new, p_old
        self.ttft, self.slow = (np.ones(arr.size) if ttft is None else ttft), slow
        self.order = np.argsort(back)
        self.back_sorted = back[self.order]
        self.to_new = np.zeros(arr.size, bool)
        self.failures, self.start = dict.fromkeys(METRICS, 0), math.nan
        self.tripped = ""  # the metric that rolled back

    def phase(self, t: float, share: float) -> None:
        """From ``t`` on, each arrival goes to the new version with probability ``share``."""
        later = self.arr >= t
        self.to_new[later] = self.split_u[later] < share

    def failed(self) -> np.ndarray:
        return self.fail_u < np.where(self.to_new, self.p_new, self.p_old)

    def _answers(self, t0: float, t1: float) -> tuple[np.ndarray, np.ndarray]:
        """(the new version's, the old version's) requests answered in (t0, t1]."""
        lo, hi = np.searchsorted(self.back_sorted, [t0, t1], side="right")
        idx = self.order[lo:hi]
        return idx[self.to_new[idx]], idx[~self.to_new[idx]]

    def returned(self, t0: float, t1: float) -> tuple[int, int]:
        """(answers the new version returned in (t0, t1], how many of them failed)."""
        new = self._answers(t0, t1)[0]
        return int(new.size), int(np.count_nonzero(self.fail_u[new] < self.p_new))

    def ttft_ratio(self, t0: float, t1: float) -> float:
        """The new version's p99 time to first token over the old one's, answers in (t0, t1]; NaN when
        either has fewer than ``MIN_REQUESTS`` (the old one's read before :attr:`start` if need be)."""
        new, old = self._answers(t0, t1)
        if old.size < MIN_REQUESTS:
            old = self._answers(self.start - WINDOW_S, self.start)[1]
        if min(new.size, old.size) < MIN_REQUESTS:
            return math.nan
        return float(np.quantile(self.ttft[new], 0.99) * self.slow / np.quantile(self.ttft[old], 0.99))

    def judged_floor(self, t: float, span_s: float = JUDGED_SPAN_S) -> int:
        """The fewest new-version answers in one window among those ending in the last ``span_s`` s
        before ``t``, every ``SAMPLE_S`` s (the evidence step's subquery)."""
        ends = t - np.arange(0, span_s, SAMPLE_S)
        return min(self.returned(c - WINDOW_S, c)[0] for c in ends)

    def watch(self, t0: float, t1: float) -> float | None:
        """Take the measurements due in (t0, t1]; the time of the one that rolls back, or None."""
        if math.isnan(self.start):
            return None
        m = max(math.floor((t0 - self.start) / ANALYSIS_INTERVAL_S) + 1, 1)
        while (c := self.start + m * ANALYSIS_INTERVAL_S) <= t1:
            n, bad = self.returned(c - WINDOW_S, c)
            if n >= MIN_REQUESTS:
                failed = {"errors": bad / n > ERROR_RATIO_LIMIT,
                          "ttft": self.ttft_ratio(c - WINDOW_S, c) > TTFT_P99_RATIO_LIMIT}
                for metric in METRICS:
                    self.failures[metric] += failed[metric]
                    if self.failures[metric] > FAILURE_LIMIT:
                        self.tripped = metric
                        return c
            m += 1
        return None


def _blue_green(j: _Judge, r: int, step_s: float, cold_s: float) -> tuple[list[tuple], float | None, int]:
    plan: list[tuple] = [(0.0, 0.0, r, r, 0, r), (cold_s, 1.0, r, r, r, r)]
    j.phase(cold_s, 1.0)
    j.start = cold_s
    if (abort := j.watch(cold_s, cold_s + step_s)) is not None:
        return plan, abort, 0
    return [*plan, (cold_s + step_s, 1.0, r, 0, r, 0)], None, 0


def _canary(j: _Judge, r: int, splits: Sequence[float], step_s: float, cold_s: float,
            person_s: float) -> tuple[list[tuple], float | None, int]:
    plan: list[tuple] = [(0.0, 0.0, 0, r, 0, r)]
    t, new, share, pauses = 0.0, 0, 0.0, 0
    for s in splits:
        if (k := math.ceil(s * r - 1e-9)) > new:      # start the extra new replicas, wait a cold start
            plan.append((t, share, k, r, new, r))
            if (abort := j.watch(t, t + cold_s)) is not None:
                return plan, abort, pauses
            t, new = t + cold_s, k
        if s == 1.0:                                  # promotion: the old set goes a little later
            j.phase(t, 1.0)
            plan += [(t, 1.0, r, r, r, r), (t + SCALE_DOWN_DELAY_S, 1.0, r, 0, r, 0)]
            return plan, None, pauses
        plan.append((t, s, new, r, new, r))
        j.phase(t, share := s)
        if math.isnan(j.start):
            j.start = t
        if (abort := j.watch(t, t + step_s)) is not None:
            return plan, abort, pauses
        served, t = j.returned(t, t + step_s)[0], t + step_s
        if served < 1:                                # the evidence check: routing is broken
            return plan, t, pauses
        if j.judged_floor(t, step_s - WINDOW_S) < MIN_REQUESTS:  # inconclusive: paused for a person
            pauses += 1
            if (abort := j.watch(t, t + person_s)) is not None:
                return plan, abort, pauses
            t += person_s
    raise AssertionError("splits end at 1.0")


def rollout(strategy: str, replicas: int, rps: float, service_s: Service, slots_per_replica: int,
            splits: Sequence[float] = SPLITS, step_s: float = STEP_PAUSE_S, error_rate: float = 0.02,
            base_error_rate: float = BASE_ERROR_RATE, ttft_factor: float = 1.0,
            ttft_sigma: float = TTFT_SIGMA, bad: bool = True, react_s: float = 0.0,
            cold_start_s: float = 120.0, person_s: float = PERSON_S, horizon_s: float = HORIZON_S,
            seed: int | Sequence[int] = 0) -> dict[str, Any]:
    """Replace ``replicas`` old replicas serving ``rps`` requests/s by a new version (see the module
    docstring); each answer returns ``service_s`` after its request arrived; when ``bad`` the new
    version fails ``error_rate`` of its answers and takes ``ttft_factor`` times as long to its first
    token, else it behaves like the old one (``base_error_rate``). Returns ``outcome`` (``rolled_back``
    or ``promoted``), ``rolled_back_on`` (``errors``, ``ttft``, ``no answers`` or ``""``),
    ``promoted_bad``, ``detected_s`` (first request to
    the new version until the rollback; NaN if none), ``pauses``, ``duration_s``, ``gpu_hours``,
    ``extra_gpu_hours`` (over ``replicas`` for as long), ``mean_replicas``, ``peak_replicas``; over
    ``horizon_s``: ``requests``, ``requests_exposed`` (sent to the new version), ``failed``,
    ``completed``; ``peak_utilization`` (busy slots needed / ready slots in the busier
    set, from the mean of ``service_s``: above 1 requests queue) and ``plan``."""
    if strategy not in STRATEGIES:
        raise ValueError(f"strategy={strategy!r}: choose one of {STRATEGIES}")
    if not (isinstance(replicas, int | np.integer) and min(replicas, slots_per_replica) >= 1 and rps > 0
            and list(splits) == sorted(splits) and 0 < splits[0] and splits[-1] == 1.0
            and step_s >= WINDOW_S + ANALYSIS_INTERVAL_S
            and cold_start_s >= 0 and react_s >= 0 and person_s >= 0 and 0 < error_rate <= 1
            and 0 <= base_error_rate < 1 and horizon_s > 0 and ttft_factor > 0 and ttft_sigma >= 0):
        raise ValueError("need integer replicas and slots_per_replica >= 1, rps > 0, splits rising from "
                         f"above 0 to 1.0, step_s >= {WINDOW_S + ANALYSIS_INTERVAL_S} s (a whole window and "
                         "a measurement after it), cold_start_s, react_s and person_s >= 0 s, "
                         "0 < error_rate <= 1, 0 <= base_error_rate < 1, horizon_s > 0, ttft_factor > 0, "
                         "ttft_sigma >= 0")
    rng = np.random.default_rng(seed)
    # the old version has served a window before the rollout starts (the baseline's); counts start at 0
    arr = arrivals.poisson_window(rps, horizon_s + WINDOW_S, rng) - WINDOW_S
    back = arr + service_times(service_s, arr.size, rng)
    fail_u, split_u = rng.random(arr.size), rng.random(arr.size)
    j = _Judge(arr, back, fail_u, split_u, error_rate if bad else base_error_rate, base_error_rate,
               rng.lognormal(0.0, ttft_sigma, arr.size), ttft_factor if bad else 1.0)
    if strategy == "blue_green":
        plan, abort, pauses = _blue_green(j, replicas, step_s, cold_start_s)
    else:
        plan, abort, pauses = _canary(j, replicas, splits, step_s, cold_start_s, person_s)
    if plan[-1][0] > horizon_s:
        raise ValueError(f"the rollout ran {plan[-1][0]:.0f} s, past horizon_s={horizon_s:.0f}: "
                         "raise horizon_s")
    first_new = next((p[0] for p in plan if p[1] > 0), math.nan)
    if abort is not None:                            # traffic back to the old set, the new one removed
        back_s = abort + react_s
        plan = [p for p in plan if p[0] < back_s]
        j.phase(back_s, 0.0)
        plan += [(back_s, 0.0, plan[-1][2], replicas, 0, replicas),
                 (back_s + SCALE_DOWN_DELAY_S, 0.0, 0, replicas, 0, replicas)]
    t, share, new_b, old_b, new_up, old_up = (np.array(x, dtype=float) for x in zip(*plan, strict=True))
    end, gpu_s = float(t[-1]), float(np.sum(np.diff(t) * (new_b + old_b)[:-1]))
    need = rps * float(np.mean(service_times(service_s, 1000, rng))) / slots_per_replica  # replicas' worth
    with np.errstate(divide="ignore", invalid="ignore"):       # 0/0: a set with no traffic and no replica
        util = np.nan_to_num(np.maximum(share * need / new_up, (1 - share) * need / old_up))[:-1]
    counted = arr >= 0
    failed = j.failed() & counted
    n, exposed, n_failed = int(counted.sum()), int(j.to_new.sum()), int(failed.sum())
    return {"strategy": strategy, "outcome": "rolled_back" if abort is not None else "promoted",
            "rolled_back_on": (j.tripped or "no answers") if abort is not None else "",
            "promoted_bad": abort is None and bad, "pauses": pauses,
            "detected_s": abort - first_new if abort is not None else math.nan, "duration_s": end,
            "gpu_hours": gpu_s / 3600, "extra_gpu_hours": (gpu_s - replicas * end) / 3600,
            "mean_replicas": gpu_s / end if end else 0.0, "peak_replicas": int(max(new_b + old_b)),
            "requests": n, "requests_exposed": exposed, "failed": n_failed, "completed": n - n_failed,
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
    sd = s["std"] * math.sqrt(s["n"] / (s["n"] - 1))  # summary's std is the population one
    se = sd / math.sqrt(s["n"])
    return {"n": int(s["n"]), "mean": s["mean"], "sd": sd, "lo": s["mean"] - z * se, "hi": s["mean"] + z * se}


def _ratio(a: dict[str, float], b: dict[str, float]) -> tuple[float, float, float]:
    """``a``'s mean over ``b``'s with the extremes of their intervals (lo over hi, hi over lo)."""
    return a["mean"] / b["mean"], a["lo"] / b["hi"], a["hi"] / b["lo"]


FAULTS = ("errors", "ttft")  # a bad version fails more answers, or answers later


def compare(fleets: Mapping[str, int], seeds: Sequence[int], replica_rps: float, load: float = 0.6,
            error_rate: float = 0.02, ttft_factor: float = 1.5, record_figures: bool = False,
            **common: Any) -> list[dict[str, Any]]:
    """Blue-green against the canary (chapter 08) on each of ``fleets`` (case name -> replica count)
    loaded to ``load`` of their ``replica_rps`` requests/s per replica, over ``seeds``, each strategy
    on its own streams (:func:`over_seeds`; ``common``: :func:`rollout`'s other arguments). Three
    kinds of new version: one that fails ``error_rate`` of its answers (fault ``errors``), one whose
    times to first token are ``ttft_factor`` times the old one's (``ttft``, errors as before) and a
    good one (cost, false rollbacks). One row per fleet and strategy: ``case``, ``replicas``, and per
    fault ``exposed_<fault>`` (mean requests sent to it, with ``_lo``/``_hi``), ``rolled_back_<fault>``,
    ``promoted_bad_<fault>``, ``noticed_after_s_<fault>`` (mean over the rolled-back runs); ``pauses``
    (the error fault's mean), ``false_rollbacks`` (good versions), ``extra_gpu_hours`` (good runs'
    mean), ``peak_replicas``. ``record_figures``: record chapter 08's canary ÷ blue-green figures per
    fleet and fault, keys ending in the case's name, and the worst (the claims hold only where every
    fleet and fault does). Two cases may have the same replica count (a fast machine's small fleets)."""
    if not all(n >= 1 for n in fleets.values()):
        raise ValueError(f"every fleet needs at least one replica, got {dict(fleets)}")
    strategies = {"blue-green": {"strategy": "blue_green"}, "canary": {"strategy": "canary"}}
    base = common.get("base_error_rate", BASE_ERROR_RATE)
    versions = {"errors": dict(bad=True, error_rate=error_rate),
                # errors as the old version's (rollout() takes a bad version's error_rate above 0)
                "ttft": dict(bad=True, error_rate=max(base, 1e-9), ttft_factor=ttft_factor),
                "good": dict(bad=False)}
    rows, exposed, cost = [], {}, {}
    for case, size in fleets.items():
        kw = {**common, "replicas": size, "rps": size * replica_rps * load}
        runs = {v: over_seeds(strategies, [s + 10_000 * i for s in seeds], **vkw, **kw)
                for i, (v, vkw) in enumerate(versions.items())}
        exp = {(f, k): expectation(runs[f][k], "requests_exposed") for f in FAULTS for k in strategies}
        extra = {k: expectation(runs["good"][k], "extra_gpu_hours") for k in strategies}
        for f in FAULTS:
            exposed[case, f] = _ratio(exp[f, "canary"], exp[f, "blue-green"])
        cost[case] = _ratio(extra["canary"], extra["blue-green"])
        for k in strategies:
            row: dict[str, Any] = {"replicas": size, "case": case, "rollout": k}
            for f in FAULTS:
                bad = runs[f][k]
                back = [r["detected_s"] for r in bad if r["outcome"] == "rolled_back"]
                row |= {f"exposed_{f}": exp[f, k]["mean"], f"exposed_{f}_lo": exp[f, k]["lo"],
                        f"exposed_{f}_hi": exp[f, k]["hi"], f"rolled_back_{f}": len(back),
                        f"promoted_bad_{f}": sum(r["promoted_bad"] for r in bad),
                        f"noticed_after_s_{f}": float(np.mean(back)) if back else math.nan}
            good = runs["good"][k]
            rows.append({**row, "pauses": float(np.mean([r["pauses"] for r in runs["errors"][k]])),
                         "false_rollbacks": sum(r["outcome"] == "rolled_back" for r in good),
                         "extra_gpu_hours": extra[k]["mean"],
                         "peak_replicas": max(r["peak_replicas"] for v in runs.values() for r in v[k]),
                         "seeds": len(seeds)})
    if record_figures:
        _record(rows, fleets, exposed, cost, len(seeds), load, error_rate, ttft_factor)
    return rows


def _record(rows: list[dict[str, Any]], cases: Mapping[str, int],
            exposed: dict[tuple[str, str], tuple[float, float, float]],
            cost: dict[str, tuple[float, float, float]], n: int, load: float, error_rate: float,
            ttft_factor: float) -> None:
    faults = {"errors": f"a version that fails {error_rate:.0%} of its answers",
              "ttft": f"a version {ttft_factor:g}x slower to its first token"}
    for (case, f), (value, lo, hi) in exposed.items():
        suffix = "" if f == "errors" else f"_{f}"
        record("production", f"canary_over_bluegreen_exposed{suffix}_{case}", value, "x",
               f"requests sent to {faults[f]}, {cases[case]} replicas at {load:.0%} load, means over {n} "
               "seeds (interval: the two 95% intervals' extremes)", spread=(lo, hi, n))
    for case, (value, lo, hi) in cost.items():
        record("production", f"canary_over_bluegreen_extra_gpu_hours_{case}", value, "x",
               f"replica-hours beyond the fleet's, good versions, {cases[case]} replicas at {load:.0%} load, "
               f"means over {n} seeds (interval: the two 95% intervals' extremes)", spread=(lo, hi, n))
    sizes = sorted(cases.values())
    for key, pairs, what in (("exposed", exposed, "requests sent to a bad version (either fault)"),
                             ("extra_gpu_hours", {(s, ""): c for s, c in cost.items()},
                              "replica-hours beyond the fleet's, good versions")):
        worst = max(pairs, key=lambda c: pairs[c][0])
        value, lo, hi = (max(p[j] for p in pairs.values()) for j in range(3))
        at = f"{cases[worst[0]]}" + (f", {worst[1]}" if worst[1] else "")
        record("production", f"canary_over_bluegreen_{key}", value, "x",
               f"{what}: the largest canary ÷ blue-green over {', '.join(map(str, sizes))} replicas ({at}), "
               f"means over {n} seeds", spread=(lo, hi, n))
    for name, key in (("blue-green", "bluegreen"), ("canary", "canary")):
        peak = max(r["peak_replicas"] / r["replicas"] for r in rows if r["rollout"] == name)
        record("production", f"{key}_peak_replicas_ratio", peak, "x",
               f"{name}: most replicas billed at once / the fleet's")
