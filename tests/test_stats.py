"""labkit.stats: percentiles and summaries that are NaN on empty input (chapters 02 and 08), against
numpy and hand-computed values."""

import math

import numpy as np
import pytest

from labkit.stats import finite, percentile, percentile_key, summary


def test_percentile_is_numpys_linear_one_without_unknowns():
    x = [3.0, 1.0, None, 2.0, float("nan"), 10.0]
    assert percentile(x, 50) == pytest.approx(2.5)  # median of 1, 2, 3, 10
    assert percentile(x, 99) == pytest.approx(np.percentile([1, 2, 3, 10], 99))
    assert percentile(np.array([1.0, np.nan, 5.0]), 50) == 3.0  # arrays too, NaN dropped
    assert list(finite(iter([1, None, 2]))) == [1.0, 2.0]


def test_empty_is_nan_never_zero():
    assert math.isnan(percentile([], 50)) and math.isnan(percentile(np.array([]), 99))
    assert math.isnan(percentile([None, float("nan")], 50))
    s = summary([])
    assert s["n"] == 0 and all(math.isnan(s[k]) for k in ("mean", "std", "median", "p50", "p90", "p99"))


def test_summary_keys_and_values():
    s = summary(range(1, 101), percentiles=(50, 99.9))
    assert set(s) == {"n", "mean", "std", "median", "p50", "p99.9"}
    assert s["n"] == 100 and s["mean"] == 50.5 and s["median"] == 50.5
    assert s["std"] == pytest.approx(np.std(np.arange(1, 101)))
    assert s["p99.9"] == pytest.approx(99.901)  # linear between 99 and 100 at rank 98.901
    assert (percentile_key(50), percentile_key(99.9), percentile_key(90.0)) == ("p50", "p99.9", "p90")


def test_ratio_interval_divides_round_by_round():
    from labkit.stats import ratio_interval

    r = ratio_interval([2.0, 4.0, 2.2, 2.0, 1.8], [1.0, 2.0, 1.0, 1.0, 1.0])  # ratios 2.0, 2.0, 2.2, 2.0, 1.8
    assert r["n"] == 5 and r["median"] == pytest.approx(2.0)
    assert r["lo"] == pytest.approx(1.8) and r["hi"] == pytest.approx(2.2)
    r = ratio_interval([2.0, 4.0, 6.0], [1.0, 2.0, 4.0])  # per-round ratios 2, 2, 1.5
    assert r["n"] == 3 and r["median"] == 2.0 and r["lo"] == 1.5 and r["hi"] == 2.0
    with pytest.raises(ValueError, match="same number"):
        ratio_interval([1.0, 2.0], [1.0])
