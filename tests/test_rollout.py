"""Blue-green against canary rollouts (labkit.production.rollout, chapter 08): replicas billed, requests
exposed to a bad version, detection after a number of observed failures, the rollback, independent
streams over seeds, determinism and bad input."""

import math

import numpy as np
import pytest

from labkit.production import rollout

STRATEGIES = {"blue-green": dict(strategy="blue_green"), "canary": dict(strategy="canary")}


def test_blue_green_doubles_replicas_canary_exposes_its_share():
    kw = dict(replicas=4, rps=20.0, service_s=0.4, slots_per_replica=8, detect_failures=None,
              cold_start_s=120, seed=3, step_s=300)
    bg, can = rollout.rollout("blue_green", **kw), rollout.rollout("canary", **kw)
    assert bg["outcome"] == "completed" and bg["duration_s"] == 420.0             # never seen
    assert bg["mean_replicas"] == pytest.approx(8.0) and bg["peak_replicas"] == 8
    assert bg["extra_gpu_hours"] == pytest.approx(4 * 420 / 3600)
    assert bg["requests_exposed"] == pytest.approx(20.0 * 300, rel=0.05) == bg["failed"]
    assert can["plan"][1]["new_share"] == 0.05 and can["plan"][1]["t_s"] == 120.0    # the 5% step, once ready
    for r in (bg, can):
        assert r["accounted"] and r["completed"] + r["failed"] == r["requests"]
        assert math.isnan(r["detected_s"])


def test_detection_needs_failures_so_a_small_canary_notices_later():
    kw = dict(replicas=4, rps=2.0, service_s=10.0, slots_per_replica=8, detect_failures=5, error_rate=1.0,
              react_s=30.0, cold_start_s=120)
    bg, can = rollout.rollout("blue_green", **kw), rollout.rollout("canary", **kw)
    for r in (bg, can):
        assert r["outcome"] == "rolled_back" and r["failed"] == r["requests_exposed"] >= 5
        assert r["accounted"] and r["detected_s"] >= 10.0 + 30.0                  # a service time + react
    # blue-green: 2 requests/s fail from 120 s; the 5th comes back about 2.5 + 10 s later, seen 30 s after
    assert bg["detected_s"] == pytest.approx(2.5 + 10 + 30, abs=6)
    assert bg["requests_exposed"] == pytest.approx(2.0 * bg["detected_s"], rel=0.3)
    assert can["detected_s"] > 2 * bg["detected_s"]                                # 5% of the traffic
    assert can["requests_exposed"] < bg["requests_exposed"]
    half = rollout.rollout("blue_green", **{**kw, "error_rate": 0.5})
    assert half["failed"] < half["requests_exposed"]
    assert half["completed"] + half["failed"] == half["requests"]


def test_good_rollouts_complete():
    kw = dict(replicas=4, rps=2.0, service_s=4.0, slots_per_replica=8, bad=False, cold_start_s=120)
    bg, can = rollout.rollout("blue_green", **kw), rollout.rollout("canary", **kw)
    assert bg["outcome"] == can["outcome"] == "completed" and bg["failed"] == can["failed"] == 0
    assert bg["duration_s"] == 120 + 600 and bg["gpu_hours"] == pytest.approx(8 * 720 / 3600)
    # canary replicas 1, 1, 2, 4 of 4: three cold starts and three held steps
    assert can["duration_s"] == 3 * 120 + 3 * 600
    assert [p["new_ready"] for p in can["plan"]] == [0, 1, 1, 1, 2, 2, 4]
    assert [p["new_share"] for p in can["plan"]] == [0, 0.05, 0.25, 0.25, 0.5, 0.5, 1.0]
    assert [p["old_billed"] for p in can["plan"]] == [4, 4, 3, 3, 2, 2, 0]
    assert can["completed"] == can["requests"] and 0 < can["peak_utilization"] <= 1
    assert can["extra_gpu_hours"] < bg["extra_gpu_hours"]
    never_seen = rollout.rollout("canary", **{**kw, "bad": True, "detect_failures": None})
    assert never_seen["outcome"] == "completed" and never_seen["failed"] == never_seen["requests_exposed"] > 0
    assert rollout.rollout("canary", **kw) == can                # deterministic with the seed


def test_every_request_is_accounted_for():
    # holds by construction (completed + failed = arrivals): a unit test, not a chapter claim
    for seed in range(10):
        for strategy in rollout.STRATEGIES:
            r = rollout.rollout(strategy, replicas=3, rps=0.5, service_s=lambda g: g.exponential(20.0),
                                slots_per_replica=4, error_rate=0.3, seed=seed)
            assert r["accounted"] and r["completed"] + r["failed"] == r["requests"]
            assert r["failed"] <= r["requests_exposed"] <= r["requests"]


def test_over_seeds_gives_each_strategy_its_own_stream():
    runs = rollout.over_seeds({"a": dict(strategy="canary"), "b": dict(strategy="canary")}, range(3),
                              replicas=4, rps=1.0, service_s=5.0, slots_per_replica=8, error_rate=0.5)
    assert [len(v) for v in runs.values()] == [3, 3]
    # the same strategy on the same seed, but another stream: the draws differ
    assert [r["requests"] for r in runs["a"]] != [r["requests"] for r in runs["b"]]
    again = rollout.over_seeds({"a": dict(strategy="canary")}, range(3), replicas=4, rps=1.0, service_s=5.0,
                               slots_per_replica=8, error_rate=0.5)
    assert again["a"] == runs["a"]


def test_expectation_mean_and_spread():
    e = rollout.expectation([{"x": v} for v in (10, 12, 14, 16)], "x")
    sd = float(np.std([10, 12, 14, 16], ddof=1))
    assert e["n"] == 4 and e["mean"] == 13 and e["sd"] == pytest.approx(sd)
    assert (e["lo"], e["hi"]) == pytest.approx((13 - 1.96 * sd / 2, 13 + 1.96 * sd / 2))
    with pytest.raises(ValueError, match="at least two"):
        rollout.expectation([{"x": 1.0}, {"x": float("nan")}], "x")


def test_canary_against_blue_green_is_open_on_average():
    # the chapter's comparison can go either way: with answers back at once, no reaction time and
    # little traffic, both expose about the 5 requests it takes to see 5 failures (blue-green sees them
    # sooner), so the canary does not expose fewer; with slow answers and a reaction time it does
    def means(service_s, rps, react_s):
        runs = rollout.over_seeds(STRATEGIES, range(24), replicas=4, rps=rps, service_s=service_s,
                                  slots_per_replica=8, error_rate=0.25, react_s=react_s, cold_start_s=76)
        return {k: rollout.expectation(v, "requests_exposed") for k, v in runs.items()}
    fast = means(0.5, 0.48, 0.0)
    assert fast["canary"]["hi"] > fast["blue-green"]["lo"]
    slow = means(71.0, 0.27, 60.0)
    assert slow["canary"]["hi"] < slow["blue-green"]["lo"]


def test_rollout_bad_arguments():
    kw = dict(replicas=4, rps=2.0, service_s=4.0, slots_per_replica=8)
    for bad in (dict(strategy="big_bang"), dict(replicas=0), dict(rps=0), dict(splits=(0.5, 0.25, 1.0)),
                dict(splits=(0.1, 0.5)), dict(step_s=0), dict(detect_failures=0), dict(react_s=-1),
                dict(error_rate=0), dict(error_rate=1.5), dict(slots_per_replica=0)):
        with pytest.raises(ValueError):
            rollout.rollout(**{"strategy": "canary", **kw, **bad})
