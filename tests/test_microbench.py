import numpy as np
import pytest

from labkit.hardware import machine, microbench, roofline


def test_time_fn_synchronizes_around_every_run(monkeypatch):
    events: list[tuple[str, ...]] = []
    monkeypatch.setattr(machine, "synchronize", lambda device: events.append(("sync", device)))
    times = microbench.time_fn(lambda: events.append(("run",)), device="cuda", warmup=1, repeats=3)
    assert len(times) == 3 and np.all(times >= 0)
    runs = [i for i, e in enumerate(events) if e == ("run",)][1:]  # skip the warm-up
    for i in runs:
        assert events[i - 1] == ("sync", "cuda") and events[i + 1] == ("sync", "cuda")


def test_time_fn_rejects_zero_repeats():
    with pytest.raises(ValueError):
        microbench.time_fn(lambda: None, repeats=0)


def test_matmul_flops():
    assert roofline.matmul_flops(2, 3, 4) == 48


def test_bandwidth_counts_read_and_write():
    r = microbench.memory_bandwidth("cpu", nbytes=8 * 2**20, repeats=3)
    assert r["bytes"] == 2 * 8 * 2**20
    assert r["gbps"] == pytest.approx(r["bytes"] / r["seconds"] / 1e9)
    assert r["gbps_best"] >= r["gbps"] > 0


def test_matmul_tflops_consistent():
    r = microbench.matmul_tflops("cpu", "float32", n=128, repeats=3)
    assert r["flops"] == 2 * 128**3
    assert r["tflops"] == pytest.approx(r["flops"] / r["seconds"] / 1e12)
    with pytest.raises(ValueError, match="unknown dtype"):
        microbench.matmul_tflops("cpu", "float3")


def test_bandwidth_measure_agrees_with_numpy_copy():
    """Our torch copy timer and a plain numpy copy of the same size agree within a factor of 4."""
    import time

    nbytes = 64 * 2**20
    ours = microbench.memory_bandwidth("cpu", nbytes=nbytes, repeats=5)["gbps_best"]
    src = np.ones(nbytes // 4, dtype=np.float32)
    dst = np.empty_like(src)
    best = float("inf")
    for _ in range(5):
        t0 = time.perf_counter()
        np.copyto(dst, src)
        best = min(best, time.perf_counter() - t0)
    numpy_gbps = 2 * nbytes / best / 1e9
    assert 0.25 < ours / numpy_gbps < 4, (ours, numpy_gbps)


def test_ridge_point_from_measured_units():
    assert roofline.ridge_point(989.4e12, 3350e9) == pytest.approx(295, rel=0.01)
