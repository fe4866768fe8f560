"""The one arrival generator (labkit.serving.arrivals, chapters 02 and 08): gamma gaps with the asked
mean and burstiness, Poisson windows, thinning to a time-varying rate, seeds and bad input."""

import math

import numpy as np
import pytest

from labkit.serving import arrivals


def test_mean_gap_is_one_over_the_rate_and_burstiness_sets_the_cv():
    for shape in (0.25, 0.5, 1.0, 4.0):
        t = arrivals.arrival_times(40_000, rate=50.0, burstiness=shape, seed=1)
        gaps = np.diff(t)
        assert t[0] == 0.0 and np.all(gaps >= 0)
        assert gaps.mean() == pytest.approx(1 / 50, rel=0.03)
        assert gaps.std() / gaps.mean() == pytest.approx(1 / math.sqrt(shape), rel=0.06)   # gamma CV
    cv = [np.std(g) / np.mean(g) for g in (arrivals.gaps(40_000, 2.0, b, seed=2) for b in (0.5, 1.0, 2.0))]
    assert cv[0] > 1.3 > cv[1] > 0.9 > cv[2]         # burstier below 1, Poisson at 1, more regular above


def test_same_seed_same_times_and_a_shared_generator():
    a = arrivals.arrival_times(100, 3.0, 0.7, seed=5)
    assert np.array_equal(a, arrivals.arrival_times(100, 3.0, 0.7, seed=5))
    assert not np.array_equal(a, arrivals.arrival_times(100, 3.0, 0.7, seed=6))
    rng = np.random.default_rng(9)
    first, second = arrivals.gaps(10, 1.0, seed=rng), arrivals.gaps(10, 1.0, seed=rng)
    assert not np.array_equal(first, second)            # drawn from one stream, one after the other
    assert np.array_equal(np.concatenate([first, second]), arrivals.gaps(20, 1.0, seed=9))
    assert arrivals.arrival_times(0, 1.0).size == 0 and arrivals.arrival_times(1, 1.0).tolist() == [0.0]


def test_shape_one_is_the_exponential_poisson_process():
    assert np.array_equal(arrivals.gaps(50, 4.0, 1.0, seed=3), np.random.default_rng(3).exponential(0.25, 50))


def test_poisson_window_count_and_order():
    t = arrivals.poisson_window(5.0, 2000.0, seed=0)
    assert np.all(np.diff(t) >= 0) and t[0] >= 0 and t[-1] < 2000
    assert abs(t.size - 10_000) < 4 * math.sqrt(10_000)
    assert np.array_equal(t, arrivals.poisson_window(5.0, 2000.0, seed=0))


def test_thinning_follows_a_time_varying_rate():
    rate = lambda t: np.where(t < 1000, 1.0, 4.0)            # noqa: E731
    t = arrivals.thinned(rate, peak_rps=4.0, duration_s=2000.0, seed=1)
    lo, hi = (t < 1000).sum(), (t >= 1000).sum()
    assert abs(lo - 1000) < 4 * math.sqrt(1000) and abs(hi - 4000) < 4 * math.sqrt(4000)
    p = arrivals.piecewise([0.0, 1000.0], [1.0, 4.0], 2000.0, seed=1)
    assert np.array_equal(p, t)                                # piecewise is thinning with steps
    assert arrivals.piecewise([0.0, 10.0], [0.0, 2.0], 20.0, seed=0).min() >= 10   # a silent segment


@pytest.mark.parametrize("call", [
    lambda: arrivals.gaps(10, rate=0),
    lambda: arrivals.gaps(10, rate=-1.0),
    lambda: arrivals.gaps(10, rate=float("nan")),
    lambda: arrivals.gaps(10, rate=1.0, burstiness=0),
    lambda: arrivals.gaps(-1, rate=1.0),
    lambda: arrivals.gaps(2.5, rate=1.0),  # type: ignore[arg-type]  # deliberately not whole
    lambda: arrivals.arrival_times(10, rate=float("inf")),
    lambda: arrivals.poisson_window(1.0, 0.0),
    lambda: arrivals.thinned(lambda t: 2 * np.ones_like(t), peak_rps=1.0, duration_s=100.0),
    lambda: arrivals.thinned(lambda t: -np.ones_like(t), peak_rps=1.0, duration_s=100.0),
    lambda: arrivals.thinned(lambda t: 1.0, peak_rps=1.0, duration_s=100.0),  # type: ignore[arg-type, return-value]
    lambda: arrivals.piecewise([5.0, 10.0], [1.0, 1.0], 20.0),
    lambda: arrivals.piecewise([0.0, 10.0], [1.0], 20.0),
    lambda: arrivals.piecewise([0.0, 10.0, 5.0], [1.0, 1.0, 1.0], 20.0),
    lambda: arrivals.piecewise([0.0], [0.0], 20.0),
])
def test_bad_input_raises_a_clear_value_error(call):
    with pytest.raises(ValueError, match="must|need"):
        call()
