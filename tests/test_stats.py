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


def test_wilson_matches_the_formula_and_the_issue_figures():
    import math

    from labkit.stats import wilson

    k, n, z = 8, 30, 1.959963984540054
    p = k / n
    scale = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / scale
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / scale
    w = wilson(k, n)
    assert math.isclose(w["lo"], centre - half, rel_tol=1e-9)
    assert math.isclose(w["hi"], centre + half, rel_tol=1e-9)
    assert round(w["lo"], 2) == 0.14 and round(w["hi"], 2) == 0.44  # base 8/30: 14-44%
    assert wilson(0, 10)["lo"] == 0 and wilson(10, 10)["hi"] == 1
    assert math.isnan(wilson(0, 0)["p"])
    with pytest.raises(ValueError):
        wilson(5, 3)


def test_mcnemar_counts_discordant_items_and_is_exact():
    from labkit.stats import mcnemar

    a = [True] * 8 + [False] * 22
    b = [True] * 8 + [True] * 6 + [False] * 16
    r = mcnemar(a, b)
    assert (r["a_only"], r["b_only"]) == (0, 6) and abs(r["p"] - 2 * 0.5**6) < 1e-12
    assert mcnemar(a, a)["p"] == 1.0
    # 14 vs 8 right with 8 discordant against 2: p = P(X <= 2 | 10, 1/2) * 2
    c = [True] * 6 + [False] * 2 + [True] * 8 + [False] * 14
    d = [True] * 6 + [True] * 2 + [False] * 8 + [False] * 14
    assert mcnemar(c, d)["a_only"] == 8 and mcnemar(c, d)["b_only"] == 2
    with pytest.raises(ValueError):
        mcnemar([True], [True, False])


def test_paired_bootstrap_is_exact_for_a_constant_shift_and_wider_by_cluster():
    from labkit.stats import paired_bootstrap

    a = np.arange(20.0)
    r = paired_bootstrap(a.tolist(), (a + 2).tolist())
    assert all(abs(r[k] - 2.0) < 1e-9 for k in ("value", "lo", "hi")) and r["n"] == 20
    rng = np.random.default_rng(1)
    x = rng.normal(size=40)
    y = x + rng.normal(0.5, 1.0, size=40) + np.repeat(rng.normal(0, 2, size=8), 5)  # clustered by 5
    free = paired_bootstrap(x.tolist(), y.tolist())
    clustered = paired_bootstrap(x.tolist(), y.tolist(), groups=np.repeat(np.arange(8), 5).tolist())
    assert clustered["n"] == 8 and clustered["hi"] - clustered["lo"] > free["hi"] - free["lo"]
    assert paired_bootstrap([2.0, 4.0], [1.0, 2.0], stat="ratio")["value"] == 0.5
    with pytest.raises(ValueError):
        paired_bootstrap([1.0], [1.0, 2.0])
