"""Blue-green against canary rollouts (labkit.production.rollout, chapter 08): replicas billed, requests
exposed to a bad version, the rollback, determinism and bad input."""

import pytest

from labkit.production import rollout


def test_blue_green_doubles_replicas_canary_exposes_its_share():
    kw = dict(replicas=4, rps=20.0, service_s=0.4, slots_per_replica=8, detect_s=300, cold_start_s=120,
              seed=3)
    bg, can = rollout.rollout("blue_green", **kw), rollout.rollout("canary", **kw)
    for r in (bg, can):
        assert r["outcome"] == "rolled_back" and r["duration_s"] == 420.0         # cold start + detection
        assert r["accounted"] and r["completed"] + r["failed"] == r["requests"]
    assert bg["mean_replicas"] == pytest.approx(8.0) and bg["peak_replicas"] == 8
    assert bg["extra_gpu_hours"] == pytest.approx(4 * 420 / 3600)
    assert can["extra_gpu_hours"] == pytest.approx(1 * 420 / 3600)              # one canary replica
    assert bg["requests_exposed"] == pytest.approx(20.0 * 300, rel=0.05)
    assert can["requests_exposed"] / bg["requests_exposed"] == pytest.approx(0.05, abs=0.01)
    assert can["failed"] == can["requests_exposed"]


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
    never_seen = rollout.rollout("canary", **{**kw, "bad": True, "detect_s": None})
    assert never_seen["outcome"] == "completed" and never_seen["failed"] == never_seen["requests_exposed"] > 0
    assert rollout.rollout("canary", **kw) == can                # deterministic with the seed


def test_rollout_bad_arguments():
    kw = dict(replicas=4, rps=2.0, service_s=4.0, slots_per_replica=8)
    for bad in (dict(strategy="big_bang"), dict(replicas=0), dict(rps=0), dict(splits=(0.5, 0.25, 1.0)),
                dict(splits=(0.1, 0.5)), dict(step_s=0), dict(detect_s=-1), dict(slots_per_replica=0)):
        with pytest.raises(ValueError):
            rollout.rollout(**{"strategy": "canary", **kw, **bad})
