"""Replicas at fleet scale, simulated with simpy (chapter 08): a day of traffic, an HPA-like
autoscaler with cold starts and a warm pool, and a burst to compare fixes over several seeds.
Times in seconds, rates in requests/s, cost in GPU-hours.

:func:`day_trace` draws a day of arrivals, :func:`burst_trace` a burst sized in replicas' worth.
:func:`simulate_fleet` serves them on replicas of
``slots_per_replica`` concurrent slots behind one FIFO queue: the load balancer sends the oldest
request to the least-loaded ready replica (``routing="pool"``, what deploy/'s InferencePool and its
endpoint picker do); with ``routing="service"`` each request goes to a ready replica drawn at random
and queues there, as a Kubernetes Service balances connections, so a new replica takes over none of
the queued work. One not started within ``max_wait_s`` is dropped. Every
``interval_s`` the scaler sums ``waiting`` (queued requests, vLLM's ``vllm:num_requests_waiting``) or
``running`` (busy slots, ``vllm:num_requests_running``), wants ``ceil(signal / target)`` replicas in
[min, max], scales up at once and down only to the largest wish of the last ``scale_down_delay_s``
(HPA's stabilization window; ``waiting`` is 0 whenever the fleet keeps up, so it scales a busy fleet
down too). A new replica serves ``cold_start_s`` after the decision, or ``warm_start_s`` when taken
from the warm pool (refilled in ``cold_start_s``); a removed one finishes its requests first. A GPU
is billed from the scale-up decision until removal, warm-pool ones all the time. In
:func:`simulate_fleet` arrivals, the scaler and replica starts are simpy processes; a request's
service is a simpy ``Timeout`` whose callback frees its slot (no process per request: 50k requests
take about half a second). :func:`over_seeds` runs configurations on the traces of several seeds
and :func:`seed_verdict` says whether a change cut the late and dropped requests on every one.
Rollouts are in :mod:`labkit.production.rollout`.

Usage::

    from labkit.production import fleet
    arrivals = fleet.day_trace(mean_rps=2.0, seed=0)
    cfg = fleet.ScalerConfig(signal="running", target=6, cold_start_s=120, warm_pool=1)
    r = fleet.simulate_fleet(arrivals, service_s=4.0, slots_per_replica=8, config=cfg, slo_s=10,
                             max_wait_s=30, horizon_s=24 * 3600)
    print(r["completed"], r["dropped"], r["late"], r["gpu_hours"], r["accounted"])
    fleet.plot_fleet(r)
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable, Generator, Sequence
from dataclasses import asdict, dataclass, field
from functools import partial
from typing import Any

import numpy as np
import simpy

from ..stats import percentile
from .scaler import ScalerConfig
from .traces import Service

__all__ = ["over_seeds", "plot_fleet", "seed_verdict", "service_times", "simulate_fleet"]

@dataclass(slots=True)
class _Replica:
    since: float                # billed from (s)
    state: str                  # warm (pool), starting, ready, draining
    ready_at: float = 0.0       # warm-pool replicas: when warm (s)
    busy: int = 0
    inflight: set[int] = field(default_factory=set)   # request indices it serves
    queue: deque[int] = field(default_factory=deque)  # its own waiting requests (routing="service")


def service_times(service_s: Service, n: int, rng: np.random.Generator) -> np.ndarray:
    """``n`` service times (s): ``service_s`` itself, or drawn from ``rng`` when it is a function."""
    s = np.array([service_s(rng) for _ in range(n)] if callable(service_s) else np.full(n, service_s), float)
    if n and not (np.all(np.isfinite(s)) and s.min() > 0):
        raise ValueError("service_s must be (or draw) positive, finite seconds")
    return s


def simulate_fleet(arrivals: Sequence[float] | np.ndarray, service_s: Service, slots_per_replica: int,
                   config: ScalerConfig, slo_s: float, max_wait_s: float, seed: int = 0,
                   horizon_s: float | None = None, routing: str = "pool") -> dict[str, Any]:
    """Serve ``arrivals`` (s) on an autoscaled fleet (see the module docstring). ``service_s``: seconds
    in a slot, or ``f(rng) -> seconds`` drawn per request from ``numpy.random.default_rng(seed)``.
    ``min_replicas`` (and the warm pool) are up at 0 s; the run lasts until every request is done, and
    at least ``horizon_s``. Returns ``n``, ``completed``, ``dropped``, ``late`` (completed, latency >
    ``slo_s``), ``accounted`` (completed + dropped == n), ``p50/p99_latency_s``, ``gpu_hours``,
    ``peak_replicas``, ``timeline`` [(t_s, ready, starting, queue depth) every ``interval_s``, after
    the scaler's decision], ``arrivals_per_hour`` and ``end_s``. ``routing``: ``pool`` (one queue, the
    least-loaded replica next) or ``service`` (a random ready replica per request, queues per replica;
    the draw is seeded with ``(seed, 1)``; a request arriving while none is ready is dropped)."""
    arr = np.sort(np.asarray(arrivals, dtype=float))
    if arr.size == 0 or arr[0] < 0 or not (slo_s > 0 and max_wait_s >= 0):
        raise ValueError(f"need arrivals (non-empty, >= 0 s: see day_trace), slo_s > 0, max_wait_s >= 0; got "
                         f"{arr.size} arrivals, slo_s={slo_s}, max_wait_s={max_wait_s}")
    if routing not in ("pool", "service"):
        raise ValueError(f"routing={routing!r}: choose 'pool' (one shared queue) or 'service' (per replica)")
    if not isinstance(slots_per_replica, int | np.integer) or slots_per_replica < 1:
        raise ValueError(f"slots_per_replica={slots_per_replica!r} must be an integer >= 1")
    c, n, env = config, arr.size, simpy.Environment()
    serv, lat = service_times(service_s, n, np.random.default_rng(seed)), np.full(n, np.nan)
    pick = np.random.default_rng((seed, 1))
    queue: deque[int] = deque()
    reps = [_Replica(0.0, "ready") for _ in range(c.min_replicas)]
    ready, pool = list(reps), [_Replica(0.0, "warm") for _ in range(c.warm_pool)]
    st, timeline, done = {"completed": 0, "dropped": 0, "cut": 0, "billed": 0.0}, [], env.event()
    samples: deque[tuple[float, int, int]] = deque([(0.0, 0, 0)])   # (t, running, waiting) scraped
    events: deque[tuple[float, int]] = deque()                      # (t, change in replicas)

    def begin(r: _Replica, q: deque[int]) -> None:
        r.busy += 1
        r.inflight.add(q[0])
        env.timeout(serv[q[0]]).callbacks.append(partial(finish, r, q.popleft()))

    def give_up(q: deque[int]) -> None:
        while q and env.now - arr[q[0]] > max_wait_s:             # the oldest gave up
            q.popleft()
            st["dropped"] += 1

    def dispatch(only: _Replica | None = None) -> None:
        if routing == "service":
            for r in [only] if only else list(reps):
                give_up(r.queue)
                while r.queue and r.busy < slots_per_replica and r.state in ("ready", "draining"):
                    begin(r, r.queue)
                retire_if_drained(r)
        give_up(queue)
        while queue:
            best = min(ready, key=lambda r: r.busy, default=None)
            if best is None or best.busy >= slots_per_replica:
                break
            begin(best, queue)
        if st["completed"] + st["dropped"] == n and not done.triggered:
            done.succeed()

    def finish(r: _Replica, i: int, _event: Any) -> None:
        if i not in r.inflight:                 # cut at the end of its replica's grace period
            return
        r.inflight.discard(i)
        r.busy -= 1
        st["completed"] += 1
        lat[i] = env.now - arr[i]
        retire_if_drained(r)
        dispatch(r if routing == "service" else None)

    def cut(r: _Replica) -> Generator[Any, Any, None]:  # the grace period is over: what is left is lost
        yield env.timeout(c.grace_s)
        if r.state == "draining":
            st["dropped"] += len(r.inflight) + len(r.queue)
            st["cut"] += len(r.inflight) + len(r.queue)
            r.inflight.clear()
            r.queue.clear()
            r.busy = 0
            retire(r)
            dispatch()

    def retire_if_drained(r: _Replica) -> None:
        if r.state == "draining" and r.busy == 0 and not r.queue:
            retire(r)

    def retire(r: _Replica) -> None:
        st["billed"] += env.now - r.since
        r.state = "gone"
        reps.remove(r)
        if r in ready:
            ready.remove(r)

    def arrive() -> Generator[Any, Any, None]:
        for i, t in enumerate(arr):
            yield env.timeout(t - env.now)
            if routing == "pool":
                queue.append(i)
                dispatch()
            elif ready:                         # kube-proxy: a ready endpoint at random
                r = ready[int(pick.integers(len(ready)))]
                r.queue.append(i)
                dispatch(r)
            else:                               # no endpoint: the connection is refused
                st["dropped"] += 1
                dispatch()

    def start(r: _Replica, delay: float) -> Generator[Any, Any, None]:
        yield env.timeout(delay)
        if r.state == "starting":               # not cancelled by a scale-down meanwhile
            r.state = "ready"
            ready.append(r)
            dispatch()

    def scale_up(k: int) -> None:
        for _ in range(k):
            warm = min(pool, key=lambda w: w.ready_at, default=None)
            delay = max(warm.ready_at - env.now, 0.0) + c.warm_start_s if warm else math.inf
            if warm is not None and delay < c.cold_start_s:
                pool.remove(warm)               # keeps its billing start; a replacement starts warming
                pool.append(_Replica(env.now, "warm", env.now + c.cold_start_s))
                r = warm
            else:
                r, delay = _Replica(env.now, "warm"), c.cold_start_s
            r.state = "starting"
            reps.append(r)
            env.process(start(r, delay))

    def scale_down(k: int) -> None:
        starting = [r for r in reversed(reps) if r.state == "starting"]   # cancel those first
        for r in (starting + sorted(ready, key=lambda r: r.busy + len(r.queue)))[:k]:
            if r.busy or r.queue:
                r.state = "draining"            # finishes its requests, then goes
                ready.remove(r)
                if math.isfinite(c.grace_s):
                    env.process(cut(r))
            else:
                retire(r)

    def now_signals() -> tuple[int, int]:
        return sum(r.busy for r in ready), len(queue) + sum(len(r.queue) for r in reps)

    def scrape() -> Generator[Any, Any, None]:
        while True:
            yield env.timeout(c.scrape_s)
            samples.append((float(env.now), *now_signals()))
            while len(samples) > 2 and samples[1][0] <= env.now - c.lag_s - c.scrape_s:
                samples.popleft()

    def seen() -> tuple[int, int]:
        """(running, waiting) as the scaler sees them: now, or the last scrape at least lag_s old."""
        if c.scrape_s == 0 and c.lag_s == 0:
            return now_signals()
        old = [x for x in samples if x[0] <= env.now - c.lag_s]
        return old[-1][1:] if old else (0, 0)

    def wish(active: int) -> int:
        running, waiting = seen()
        value = {"running": running, "waiting": waiting}
        metrics = [(c.signal, c.target), *([c.second] if c.second else [])]
        wants = []
        for sig, target in metrics:
            ratio = value[sig] / (target * active) if active else math.inf
            if active and abs(ratio - 1) <= c.tolerance:
                wants.append(active)            # within tolerance: this metric asks for no change
            else:
                wants.append(math.ceil(value[sig] / target - 1e-9))
        return max(wants)

    def limits(active: int) -> tuple[int, int]:
        """Fewest and most replicas the behaviour's policies allow now, as the HPA computes them: from
        the replicas at the start of each policy's period (now, less the changes made within it)."""
        ups = sum(d for t, d in events if d > 0 and t > env.now - c.up_period_s)
        downs = -sum(d for t, d in events if d < 0 and t > env.now - c.down_period_s)
        hi = c.max_replicas
        if c.up_pods is not None or c.up_percent is not None:
            start = active - ups
            hi = max(start + (c.up_pods or 0), math.ceil(start * (1 + (c.up_percent or 0) / 100)))
        lo = active + downs - c.down_pods if c.down_pods is not None else 0
        return lo, hi

    def scaler() -> Generator[Any, Any, None]:
        wishes: deque[tuple[float, int]] = deque()
        while True:
            dispatch()                          # drops the requests that gave up
            active = sum(r.state in ("starting", "ready") for r in reps)
            wake = int(active == 0 and len(queue) > 0)      # 0 -> 1 on queued work, as KEDA activates
            want = min(max(wish(active), c.min_replicas, wake), c.max_replicas)
            wishes.append((env.now, want))
            while wishes[0][0] < env.now - c.scale_down_delay_s:
                wishes.popleft()
            lo, hi = limits(active)
            if want > active:
                scale_up(max(min(want, hi), active + wake) - active)
            elif env.now >= c.scale_down_delay_s and max(w for _, w in wishes) < active:
                scale_down(active - max(max(w for _, w in wishes), lo))
            after = sum(r.state in ("starting", "ready") for r in reps)
            if after != active:
                events.append((float(env.now), after - active))
                while events and events[0][0] <= env.now - max(c.up_period_s, c.down_period_s):
                    events.popleft()
            starting = sum(r.state == "starting" for r in reps)
            timeline.append((float(env.now), len(ready), starting, now_signals()[1]))
            yield env.timeout(c.interval_s)

    if c.scrape_s > 0:
        env.process(scrape())
    env.process(arrive())
    env.process(scaler())
    env.run(until=done)
    if horizon_s is not None and horizon_s > env.now:
        env.run(until=horizon_s)
    ok = lat[~np.isnan(lat)]
    return {"n": n, "completed": st["completed"], "dropped": st["dropped"], "cut": st["cut"],
            "late": int((ok > slo_s).sum()),
            "accounted": st["completed"] + st["dropped"] == n == ok.size + st["dropped"] and not queue
            and not any(r.queue for r in reps),
            "p50_latency_s": percentile(ok, 50), "p99_latency_s": percentile(ok, 99),
            "gpu_hours": float(st["billed"] + sum(env.now - r.since for r in reps + pool)) / 3600,
            "peak_replicas": max(r + s for _, r, s, _ in timeline), "timeline": timeline,
            "end_s": float(env.now), "arrivals_per_hour": np.bincount((arr // 3600).astype(int)).tolist(),
            "config": asdict(c), "routing": routing}


def plot_fleet(result: dict[str, Any], ax: Any = None) -> Any:
    """Over the day (h): replicas (ready; ready + starting) with the arrival rate (requests/s, hourly
    means) on a twin axis, and below them the queue (requests waiting), each on its own scale. ``ax``: a
    pair of Axes (replicas, queue), default a new figure of two rows. Returns the pair."""
    if ax is None:
        import matplotlib.pyplot as plt

        ax = plt.subplots(2, 1, figsize=(8, 4.5), sharex=True, height_ratios=(3, 2))[1]
    top, low = ax
    t, ready, starting, queued = (np.array(x) for x in zip(*result["timeline"], strict=True))
    top.step(t / 3600, ready, where="post", label="ready replicas")
    top.step(t / 3600, ready + starting, where="post", ls="--", label="ready + starting")
    top.set(ylabel="replicas", title="Autoscaled fleet over the day")
    top.set_ylim(bottom=0)
    top.legend(loc="upper left", fontsize=8)
    twin, rate = top.twinx(), np.array(result["arrivals_per_hour"]) / 3600
    twin.stairs(rate, np.arange(rate.size + 1), color="gray", alpha=0.5)
    twin.set_ylabel("arrivals (requests/s, gray)")
    low.step(t / 3600, queued, where="post", color="tab:green", label="queued requests")
    low.set(xlabel="time (h)", ylabel="queued requests")
    low.set_ylim(bottom=0)
    return top, low


def over_seeds(trace: Callable[[int], np.ndarray], configs: dict[str, ScalerConfig], seeds: Sequence[int],
               **simulate: Any) -> dict[str, list[dict[str, Any]]]:
    """``{name: [simulate_fleet result per seed]}``: each seed's trace ``trace(seed)`` served under
    every configuration (``simulate``: the other arguments of :func:`simulate_fleet`)."""
    out: dict[str, list[dict[str, Any]]] = {name: [] for name in configs}
    for s in seeds:
        arr = trace(s)
        for name, cfg in configs.items():
            out[name].append(simulate_fleet(arr, config=cfg, seed=s, **simulate))
    return out


def seed_verdict(baseline: Sequence[int], changed: Sequence[int],
                 change: str = "the change") -> dict[str, Any]:
    """Did ``change`` cut the requests that were late or dropped? ``baseline`` and ``changed``: their
    counts per seed (same seeds, same order). It ``held`` only when the baseline hurt some requests on
    every seed (a 0 -> 0 seed did not load the fleet and shows nothing) and the change had fewer on
    every seed. Returns ``held``, ``seeds``, ``loaded`` and ``cut`` (seeds of each kind), the means
    (``baseline_mean``, ``changed_mean``), the cut's mean and s.d. over seeds, and ``sentence``."""
    b, c = np.asarray(baseline, dtype=float), np.asarray(changed, dtype=float)
    if b.ndim != 1 or b.shape != c.shape or b.size == 0 or min(b.min(), c.min()) < 0:
        raise ValueError(f"need one count >= 0 per seed in each, as many seeds; got {list(baseline)} "
                         f"and {list(changed)}")
    loaded, cut, diff = int((b > 0).sum()), int((c < b).sum()), b - c
    spread = float(diff.std(ddof=1)) if b.size > 1 else 0.0
    pairs = ", ".join(f"{x:.0f} -> {y:.0f}" for x, y in zip(b, c, strict=True))
    if loaded < b.size:
        sentence = (f"the baseline had late or dropped requests on only {loaded} of {b.size} seeds "
                    f"({pairs}): the scenario did not load the fleet, so it cannot show what {change} does")
    else:
        sentence = (f"{change} cut the late or dropped requests on {cut} of {b.size} seeds: "
                    f"{b.mean():.0f} -> {c.mean():.0f} on average, a cut of {diff.mean():.0f} ± {spread:.0f} "
                    "(s.d. over seeds)")
    return {"held": loaded == cut == b.size, "seeds": int(b.size), "loaded": loaded, "cut": cut,
            "baseline_mean": float(b.mean()), "changed_mean": float(c.mean()), "cut_mean": float(diff.mean()),
            "cut_sd": spread, "sentence": sentence}
