"""Which replica gets a request: round-robin, least-loaded and prefix-aware routing, simulated with
simpy (chapter 08, Going further). Times in seconds.

Each replica serves ``slots`` requests at once (continuous batching) and queues the rest in arrival
order; the router picks a replica when a request arrives, as a gateway's endpoint picker does. A
request carries a shared prefix (a system prompt or a document, one of several groups) and its own
tokens; a replica keeps the KV cache of its ``cache_prefixes`` most recently used prefixes, so a
request whose prefix is cached there prefills only its own tokens. Prefill costs
``prefill_s_per_token`` per uncached token, the answer ``decode_s_per_token`` per token (one fixed
step time: the batch's effect on it is left out). TTFT is the wait for a slot plus the prefill.

* ``round-robin``: the replicas in turn, blind to load and to caches (a plain Service's spread);
* ``least-loaded``: the replica with the fewest requests running and queued;
* ``prefix-aware``: the least loaded of the replicas that hold the prefix, unless it has ``slots``
  or more requests than the least-loaded replica overall, which then gets it (a prefix-cache scorer
  tempered by a load scorer, as the Gateway API Inference Extension's picker combines them).

Usage::

    from labkit.production import balancer
    work = balancer.workload(4000, rate_rps=3.0, groups=32, seed=0)
    r = balancer.simulate(work, "prefix-aware", replicas=4, slots=8, cache_prefixes=4,
                          prefill_s_per_token=0.0005, decode_s_per_token=0.02)
    print(r.ttft_p50_s, r.ttft_p99_s, r.hit_rate)
"""

from __future__ import annotations

import itertools
from collections import OrderedDict
from collections.abc import Generator
from dataclasses import dataclass
from typing import Any

import numpy as np
import simpy

from ..serving.arrivals import arrival_times
from ..stats import percentile

POLICIES = ("round-robin", "least-loaded", "prefix-aware")


@dataclass(frozen=True, slots=True)
class Request:
    """One request: arrival (s), prefix group, shared prefix tokens, own tokens, answer tokens."""
    t_s: float
    group: int
    prefix_tokens: int
    own_tokens: int
    answer_tokens: int


@dataclass(frozen=True, slots=True)
class Outcome:
    """One policy's run: TTFT and end-to-end latency percentiles (s), the share of requests whose
    prefix was cached on the replica that served them, and the busiest replica's requests over the
    mean (1.0: an even spread)."""
    policy: str
    ttft_p50_s: float
    ttft_p99_s: float
    e2e_p99_s: float
    hit_rate: float
    busiest_over_mean: float


def workload(n: int, rate_rps: float, groups: int = 32, prefix_tokens: int = 1000,
             own_tokens: tuple[int, int] = (50, 200), answer_tokens: tuple[int, int] = (50, 300),
             zipf_s: float = 1.0, seed: int = 0) -> list[Request]:
    """``n`` Poisson arrivals at ``rate_rps``; each request's prefix group drawn from ``groups`` with
    Zipf popularity (group k has weight 1/k**``zipf_s``: a few system prompts or documents take most
    of the traffic), its own and answer tokens uniform in the given inclusive ranges."""
    if n < 1 or rate_rps <= 0 or groups < 1 or prefix_tokens < 0:
        raise ValueError(f"need n >= 1, rate_rps > 0, groups >= 1, prefix_tokens >= 0; got {n}, {rate_rps}, "
                         f"{groups}, {prefix_tokens}")
    rng = np.random.default_rng(seed)
    weights = 1.0 / np.arange(1, groups + 1) ** zipf_s
    g = rng.choice(groups, size=n, p=weights / weights.sum())
    own = rng.integers(own_tokens[0], own_tokens[1] + 1, size=n)
    ans = rng.integers(answer_tokens[0], answer_tokens[1] + 1, size=n)
    t = arrival_times(n, rate_rps, seed=rng)
    return [Request(float(t[i]), int(g[i]), prefix_tokens, int(own[i]), int(ans[i])) for i in range(n)]


def simulate(work: list[Request], policy: str, replicas: int, slots: int, cache_prefixes: int,
             prefill_s_per_token: float, decode_s_per_token: float) -> Outcome:
    """Serve ``work`` on ``replicas`` replicas routed by ``policy`` (see the module docstring)."""
    if policy not in POLICIES:
        raise ValueError(f"policy={policy!r}: choose one of {POLICIES}")
    if replicas < 1 or slots < 1 or cache_prefixes < 0 or prefill_s_per_token < 0 or decode_s_per_token < 0:
        raise ValueError("replicas and slots must be >= 1, cache_prefixes and the costs >= 0")
    if not work:
        raise ValueError("no requests to serve: see workload()")
    env = simpy.Environment()
    servers = [simpy.Resource(env, capacity=slots) for _ in range(replicas)]
    caches: list[OrderedDict[int, None]] = [OrderedDict() for _ in range(replicas)]
    served = [0] * replicas
    turn = itertools.cycle(range(replicas))
    ttft, e2e, hits = [], [], []

    def load(i: int) -> int:                   # running + queued, as the router sees it
        return servers[i].count + len(servers[i].queue)

    def pick(r: Request) -> int:
        if policy == "round-robin":
            return next(turn)
        least = min(range(replicas), key=load)
        if policy == "least-loaded":
            return least
        holders = [i for i in range(replicas) if r.group in caches[i]]
        best = min(holders, key=load, default=None)
        return best if best is not None and load(best) < load(least) + slots else least

    def serve(r: Request, i: int) -> Generator[Any, Any, None]:
        with servers[i].request() as slot:
            yield slot
            hit = r.group in caches[i]
            if hit:
                caches[i].move_to_end(r.group)
            yield env.timeout((r.own_tokens + (0 if hit else r.prefix_tokens)) * prefill_s_per_token)
            ttft.append(env.now - r.t_s)
            hits.append(hit)
            if cache_prefixes:
                caches[i][r.group] = None
                caches[i].move_to_end(r.group)
                while len(caches[i]) > cache_prefixes:
                    caches[i].popitem(last=False)   # least recently used
            yield env.timeout(r.answer_tokens * decode_s_per_token)
        e2e.append(env.now - r.t_s)

    def arrive() -> Generator[Any, Any, None]:
        for r in sorted(work, key=lambda r: r.t_s):
            yield env.timeout(r.t_s - env.now)
            i = pick(r)
            served[i] += 1
            env.process(serve(r, i))

    env.process(arrive())
    env.run()
    return Outcome(policy, percentile(ttft, 50), percentile(ttft, 99), percentile(e2e, 99),
                   sum(hits) / len(hits), max(served) / (len(work) / replicas))


def capacity_rps(work: list[Request], replicas: int, slots: int, prefill_s_per_token: float,
                 decode_s_per_token: float) -> float:
    """Requests/s the fleet finishes when every prefill misses the cache: ``replicas * slots`` over a
    request's mean time in a slot. Chapter 08 sets the offered rate as a share of it."""
    mean = np.mean([(r.prefix_tokens + r.own_tokens) * prefill_s_per_token
                    + r.answer_tokens * decode_s_per_token for r in work])
    return replicas * slots / float(mean)
