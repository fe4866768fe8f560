"""Blue-green against canary rollouts (labkit.production.rollout, chapter 08): replicas billed, the
analysis deploy/'s canary runs (error ratio and p99 TTFT over the old version's, over non-overlapping
windows, a minimum of answers, a failure limit per metric, the evidence pause), exposure over a fixed
horizon, independent streams over seeds, determinism and bad input."""

import math
from typing import Any

import numpy as np
import pytest

from labkit.production import canary, rollout
from labkit.results import load

STRATEGIES = {"blue-green": dict(strategy="blue_green"), "canary": dict(strategy="canary")}
BUSY: dict[str, Any] = dict(replicas=20, rps=20.0, service_s=4.0, slots_per_replica=8, cold_start_s=120)


def test_good_rollouts_bill_two_full_sets_at_their_peak():
    bg, can = (rollout.rollout(s, **BUSY, bad=False, base_error_rate=0.0) for s in rollout.STRATEGIES)
    assert bg["outcome"] == can["outcome"] == "promoted" and not bg["promoted_bad"]
    assert bg["duration_s"] == 120 + 600 and bg["peak_replicas"] == 40
    assert bg["extra_gpu_hours"] == pytest.approx(20 * 720 / 3600)
    # the canary: 1, 5, 10 then 20 new replicas, the stable set at 20 until the promotion (Argo's default)
    assert [p["old_billed"] for p in can["plan"]][:-1] == [20] * (len(can["plan"]) - 1)
    assert can["plan"][-1]["old_billed"] == 0 and can["peak_replicas"] == 40 and can["pauses"] == 0
    ready = [p["new_share"] for p in can["plan"] if p["new_ready"] == p["new_billed"]]
    assert ready == [0, 0.05, 0.25, 0.5, 1.0, 1.0]
    assert can["duration_s"] == 4 * 120 + 3 * 600 + rollout.SCALE_DOWN_DELAY_S
    assert can["failed"] == bg["failed"] == 0 and can["completed"] == can["requests"]
    assert rollout.rollout("canary", **BUSY, bad=False, base_error_rate=0.0) == can   # deterministic


def test_a_bad_version_is_rolled_back_after_two_failed_windows():
    for strategy in rollout.STRATEGIES:
        r = rollout.rollout(strategy, **BUSY, error_rate=0.05)
        assert r["outcome"] == "rolled_back" and not r["promoted_bad"]
        # measurements every WINDOW_S from the first weight; the second failed one rolls back
        assert r["detected_s"] == pytest.approx(2 * canary.ANALYSIS_INTERVAL_S)
        assert r["plan"][-1]["new_billed"] == 0 and r["plan"][-1]["old_billed"] == 20
    bg = rollout.rollout("blue_green", **BUSY, error_rate=0.05)
    assert bg["requests_exposed"] == pytest.approx(20.0 * 600, rel=0.05)   # all traffic for two windows
    can = rollout.rollout("canary", **BUSY, error_rate=0.05)
    assert can["requests_exposed"] < bg["requests_exposed"] / 5            # 5% of it


def test_too_little_traffic_is_never_judged_and_the_paused_canary_is_promoted():
    # 5%, 25% and 50% of 0.5 requests/s never bring MIN_REQUESTS answers into one window
    slow: dict[str, Any] = dict(BUSY, replicas=4, rps=0.5, service_s=10.0)
    can = rollout.rollout("canary", **slow, error_rate=0.5)
    assert can["outcome"] == "promoted" and can["promoted_bad"] and can["pauses"] == 3
    assert can["duration_s"] == 3 * 120 + 3 * (600 + rollout.PERSON_S) + rollout.SCALE_DOWN_DELAY_S
    bg = rollout.rollout("blue_green", **slow, error_rate=0.5)
    assert bg["outcome"] == "promoted" and bg["promoted_bad"]   # 0.5 requests/s: 150 answers a window
    assert can["requests_exposed"] == pytest.approx(bg["requests_exposed"], rel=0.5)


def test_a_step_whose_windows_hold_too_few_answers_pauses_though_the_step_has_enough():
    # 5% of 10 requests/s: 300 answers in the 600 s step, but about 150 in each 5-minute window, so
    # the measurement taken during the step was not judged: the evidence check must pause there
    mid: dict[str, Any] = dict(BUSY, replicas=10, rps=10.0)
    can = rollout.rollout("canary", **mid, bad=False, base_error_rate=0.0)
    assert can["outcome"] == "promoted" and can["pauses"] == 1       # the 5% step only (25%: ~750)
    j = _judge(0.5, [])                                              # 150 answers a window, 300 a step
    assert j.returned(0.0, 600.0)[0] >= canary.MIN_REQUESTS > j.judged_floor(600.0)
    assert _judge(1.0, []).judged_floor(600.0) == 300 >= canary.MIN_REQUESTS
    with pytest.raises(ValueError, match="a whole window"):
        rollout.rollout("canary", **dict(mid, step_s=canary.WINDOW_S))


def _judge(n_per_s: float, failed: list[int], p_new: float = 0.5) -> rollout._Judge:
    arr = np.arange(0.0, 3000.0, 1 / n_per_s)
    fail = np.ones(arr.size)
    fail[failed] = 0.0
    j = rollout._Judge(arr, arr + 1.0, fail, np.zeros(arr.size), p_new, 0.0)
    j.phase(0.0, 1.0)
    j.start = 0.0
    return j


def test_one_burst_of_errors_fails_one_measurement_not_the_rollout():
    # answers at 1 per second; two failed answers in one window only: one failed measurement
    j = _judge(1.0, [400, 450])
    assert j.watch(0.0, 3000.0) is None and j.failures == {"errors": 1, "ttft": 0}
    assert _judge(1.0, [400, 450, 1000, 1010]).watch(0.0, 3000.0) == 1200.0   # a second such window


def test_a_window_under_the_minimum_of_answers_is_not_judged(monkeypatch):
    # 60 answers a window with one failure in each of two windows: 1.7% errors, but too few to read
    assert _judge(0.2, [10, 100]).watch(0.0, 3000.0) is None
    monkeypatch.setattr(rollout, "MIN_REQUESTS", 1)       # a judge without the minimum rolls back on noise
    assert _judge(0.2, [10, 100]).watch(0.0, 3000.0) == 600.0


def test_over_seeds_gives_each_strategy_its_own_stream():
    kw: dict[str, Any] = dict(replicas=4, rps=1.0, service_s=5.0, slots_per_replica=8)
    runs = rollout.over_seeds({"a": dict(strategy="canary"), "b": dict(strategy="canary")}, range(3), **kw)
    assert [len(v) for v in runs.values()] == [3, 3]
    assert [r["requests"] for r in runs["a"]] != [r["requests"] for r in runs["b"]]
    assert rollout.over_seeds({"a": dict(strategy="canary")}, range(3), **kw)["a"] == runs["a"]


def test_expectation_mean_and_spread():
    e = rollout.expectation([{"x": v} for v in (10, 12, 14, 16)], "x")
    sd = float(np.std([10, 12, 14, 16], ddof=1))
    assert e["n"] == 4 and e["mean"] == 13 and e["sd"] == pytest.approx(sd)
    assert (e["lo"], e["hi"]) == pytest.approx((13 - 1.96 * sd / 2, 13 + 1.96 * sd / 2))
    with pytest.raises(ValueError, match="at least two"):
        rollout.expectation([{"x": 1.0}, {"x": float("nan")}], "x")


def test_a_version_slower_to_its_first_token_is_rolled_back_on_the_ttft_reading():
    for strategy in rollout.STRATEGIES:
        r = rollout.rollout(strategy, **BUSY, error_rate=0.001, base_error_rate=0.001, ttft_factor=1.5)
        assert r["outcome"] == "rolled_back" and r["rolled_back_on"] == "ttft"
        assert r["detected_s"] == pytest.approx(2 * canary.ANALYSIS_INTERVAL_S)
        # the error fault alone is caught on errors; a regression under the limit is promoted
        assert rollout.rollout(strategy, **BUSY, error_rate=0.05)["rolled_back_on"] == "errors"
        mild = rollout.rollout(strategy, **BUSY, error_rate=0.001, ttft_sigma=0.0, ttft_factor=1.1)
        assert mild["outcome"] == "promoted" and mild["promoted_bad"]


def test_a_judge_that_reads_errors_only_promotes_the_slow_version(monkeypatch):
    monkeypatch.setattr(rollout, "METRICS", ("errors",))
    r = rollout.rollout("canary", **BUSY, error_rate=0.001, base_error_rate=0.001, ttft_factor=1.5)
    assert r["outcome"] == "promoted" and r["promoted_bad"]


def test_the_ttft_ratio_reads_the_old_version_before_the_switch_when_it_has_no_traffic():
    arr = np.arange(0.0, 2000.0, 0.5)                      # 2 answers/s, each 1 s after its request
    ttft = np.where(arr < 1000.0, 1.0, 2.0)                 # every answer after 1000 s is slower
    j = rollout._Judge(arr, arr + 1.0, np.ones(arr.size), np.zeros(arr.size), 0.0, 0.0, ttft)
    j.phase(1000.0, 1.0)                                    # blue-green: all traffic moves at 1000 s
    j.start = 1000.0
    assert j.ttft_ratio(1300.0, 1600.0) == pytest.approx(2.0)   # against (700, 1000]: the old version's
    j.start = 100.0                          # 199 old answers before it, under MIN_REQUESTS: not read
    assert math.isnan(j.ttft_ratio(1300.0, 1600.0))


def test_compare_records_the_worst_size_and_fault():
    rows = rollout.compare({"4r": 4, "40r": 40}, range(4), 0.5, record_figures=True, service_s=8.0,
                           slots_per_replica=8, cold_start_s=120)
    assert [(r["replicas"], r["rollout"]) for r in rows] == [
        (4, "blue-green"), (4, "canary"), (40, "blue-green"), (40, "canary")]
    values = (load("production") or {})["values"]
    per_case = [values[f"canary_over_bluegreen_exposed{f}_{n}r"]["value"]
                for n in (4, 40) for f in ("", "_ttft")]
    assert values["canary_over_bluegreen_exposed"]["value"] == max(per_case)
    assert per_case[2] < 1 < per_case[0] and per_case[3] < 1 < per_case[1]   # 4 replicas never judge 5%
    assert all(r["rolled_back_ttft"] == 4 for r in rows if r["replicas"] == 40)
    assert values["bluegreen_peak_replicas_ratio"]["value"] == 2.0
    assert all(math.isfinite(r["extra_gpu_hours"]) for r in rows)


def test_compare_names_its_figures_by_case_when_given_named_fleets():
    rows = rollout.compare({"small": 4, "large": 40}, range(2), 0.5, record_figures=True, service_s=8.0,
                           slots_per_replica=8, cold_start_s=120)
    assert [(r["case"], r["replicas"]) for r in rows] == [("small", 4), ("small", 4), ("large", 40),
                                                          ("large", 40)]
    values = (load("production") or {})["values"]
    assert "canary_over_bluegreen_exposed_ttft_small" in values
    assert "canary_over_bluegreen_extra_gpu_hours_large" in values
    assert "4, 40 replicas" in values["canary_over_bluegreen_exposed"]["note"]
    with pytest.raises(ValueError, match="at least one replica"):
        rollout.compare({"a": 4, "b": 0}, range(2), 0.5, service_s=8.0, slots_per_replica=8)
    same = rollout.compare({"a": 2, "b": 2}, range(2), 0.5, record_figures=True, service_s=8.0,
                           slots_per_replica=8, cold_start_s=120)  # two cases, one size: both kept
    values = (load("production") or {})["values"]
    assert [r["case"] for r in same] == ["a", "a", "b", "b"]
    assert "canary_over_bluegreen_exposed_a" in values and "canary_over_bluegreen_exposed_b" in values


def test_rollout_bad_arguments():
    kw: dict[str, Any] = dict(replicas=4, rps=2.0, service_s=4.0, slots_per_replica=8)
    bad: dict[str, Any]
    for bad in (dict(strategy="big_bang"), dict(replicas=0), dict(rps=0), dict(splits=(0.5, 0.25, 1.0)),
                dict(splits=(0.1, 0.5)), dict(step_s=0), dict(react_s=-1), dict(person_s=-1),
                dict(error_rate=0), dict(error_rate=1.5), dict(base_error_rate=1.0),
                dict(slots_per_replica=0), dict(ttft_factor=0), dict(ttft_sigma=-1)):
        with pytest.raises(ValueError):
            rollout.rollout(**{"strategy": "canary", **kw, **bad})
    with pytest.raises(ValueError, match="raise horizon_s"):
        rollout.rollout("canary", **kw, horizon_s=600)
