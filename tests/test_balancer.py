"""Round-robin, least-loaded and prefix-aware routing, simulated (labkit.production.balancer, chapter 08)."""

import pytest

from labkit.production import balancer

COSTS = dict(prefill_s_per_token=0.0005, decode_s_per_token=0.02)


def _work(load: float, n: int = 3000, **kw):
    probe = balancer.workload(n, 1.0, seed=0, **kw)
    rate = load * balancer.capacity_rps(probe, replicas=4, slots=8, **COSTS)
    return balancer.workload(n, rate, seed=0, **kw)


def test_one_replica_makes_the_policies_the_same():
    work = _work(0.2, n=500)
    runs = {p: balancer.simulate(work, p, replicas=1, slots=8, cache_prefixes=4, **COSTS)
            for p in balancer.POLICIES}
    first = runs["round-robin"]
    assert all((r.ttft_p99_s, r.hit_rate) == (first.ttft_p99_s, first.hit_rate) for r in runs.values())


def test_round_robin_spreads_requests_evenly():
    r = balancer.simulate(_work(0.5, n=2000), "round-robin", replicas=4, slots=8, cache_prefixes=4, **COSTS)
    assert r.busiest_over_mean == 1.0


def test_prefix_aware_finds_the_cache_the_others_miss():
    work = _work(0.6, groups=32)
    runs = {p: balancer.simulate(work, p, replicas=4, slots=8, cache_prefixes=4, **COSTS)
            for p in balancer.POLICIES}
    assert runs["prefix-aware"].hit_rate > runs["least-loaded"].hit_rate + 0.2
    assert runs["prefix-aware"].ttft_p50_s < runs["least-loaded"].ttft_p50_s


def test_no_cache_no_hits():
    work = _work(0.5, n=500)
    for p in balancer.POLICIES:
        assert balancer.simulate(work, p, replicas=4, slots=8, cache_prefixes=0, **COSTS).hit_rate == 0


def test_least_loaded_shortens_the_tail_of_a_busy_fleet():
    work = _work(0.9, answer_tokens=(10, 600))
    rr = balancer.simulate(work, "round-robin", replicas=4, slots=8, cache_prefixes=0, **COSTS)
    ll = balancer.simulate(work, "least-loaded", replicas=4, slots=8, cache_prefixes=0, **COSTS)
    assert ll.ttft_p99_s < rr.ttft_p99_s


def test_bad_input_says_what_to_pass():
    work = balancer.workload(10, 1.0)
    with pytest.raises(ValueError, match="choose one of"):
        balancer.simulate(work, "random", replicas=2, slots=1, cache_prefixes=1, **COSTS)
    with pytest.raises(ValueError, match="replicas and slots"):
        balancer.simulate(work, "round-robin", replicas=0, slots=1, cache_prefixes=1, **COSTS)
    with pytest.raises(ValueError, match="no requests"):
        balancer.simulate([], "round-robin", replicas=1, slots=1, cache_prefixes=1, **COSTS)
    with pytest.raises(ValueError, match="rate_rps > 0"):
        balancer.workload(10, 0.0)
