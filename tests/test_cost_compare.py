"""The API-or-dedicated comparison in figures and sentences (labkit.production.cost_compare, chapter 08)."""

import math

import pytest

from labkit.production import cost, cost_compare

TIER = {"input_per_mtok": 1.0, "output_per_mtok": 10.0}
GPU = {"per_gpu_hour": 1.0}


def test_naive_break_even_is_one_replicas_bill_over_the_api_price_per_request():
    # a request of 100 in + 100 out tokens costs $0.0011; one replica $730 a month
    x = cost_compare.naive_break_even(100, 100, TIER, GPU)
    assert x == pytest.approx(cost.HOURS_PER_MONTH / (cost.DAYS_PER_MONTH * 0.0011))
    # with a replica that carries that traffic, the real crossover is the naive one
    curve = {1: 100.0, 8: 400.0}
    real = cost.crossover(100, 100, TIER, GPU, curve, slo_concurrency=8)
    assert real == pytest.approx(x, rel=1e-6)
    # a slow replica needs more replicas for the same traffic: the crossover comes later or never
    slow = cost.crossover(100, 100, TIER, GPU, {1: 0.5, 8: 2.0}, slo_concurrency=8)
    assert slow > 1.05 * x


def test_api_over_dedicated_grows_with_traffic():
    curve = {1: 100.0, 8: 400.0}
    low, high = (cost_compare.api_over_dedicated(r, 100, 100, TIER, GPU, curve, 8) for r in (1e3, 1e5))
    assert low < 1 < high
    assert high == pytest.approx(cost.api_cost(1e5 * 100, 1e5 * 100, TIER) * cost.DAYS_PER_MONTH
                                 / cost.dedicated_cost(cost.HOURS_PER_MONTH, 1, GPU))


def test_roofline_prefill_is_two_flops_per_parameter_at_peak():
    from labkit.hardware.catalog import ACCELERATORS
    from labkit.llm.architecture import load_config, param_count

    q, h100 = load_config("Qwen3-4B"), ACCELERATORS["H100 SXM"]
    s = cost_compare.roofline_prefill_s_per_token(q, h100)
    assert s == pytest.approx(2 * param_count(q)["total"] / (h100.tflops["bf16"] * 1e12))
    assert 1e-6 < s < 1e-4  # a few microseconds of an H100 per prompt token


def test_matched_tier_by_size_class():
    prices = cost.load_prices()["api"]
    name, why = cost_compare.matched_tier(4.02e9, prices)
    assert name == "api-open-small" and "within" in why
    name, why = cost_compare.matched_tier(135e6, prices)
    assert name == "api-open-small" and "no API sells" in why
    with pytest.raises(ValueError, match="no tier"):
        cost_compare.matched_tier(70e9, prices)


def test_prompts_counted_on_both_sides_move_the_crossover():
    # a replica that prefills fast: long prompts cost the API more than the replica, so dedicated wins sooner
    tier = {"input_per_mtok": 0.05, "output_per_mtok": 0.10}
    gpu, curve = {"per_gpu_hour": 0.08}, {1: 15.0, 8: 70.0}
    rows = cost_compare.crossover_sensitivity([50, 4000], [0.7], 40, tier, gpu, curve, slo_concurrency=8,
                                              prefill_s_per_token=0.00017)
    short, long = (r["crossover_rpd"] for r in rows)
    assert math.isinf(short) and math.isfinite(long)
    cases = {"m": (gpu, curve, 8, 0.00017), "n": (gpu, curve, 8), "slow prefill": (gpu, curve, 8, 0.01)}
    table, x = cost.crossover_table(cases, {"t": tier}, 4000, 40)
    assert x[("m", "t")] == pytest.approx(long, rel=1e-3) and x[("n", "t")] <= x[("m", "t")]
    assert math.isinf(x[("slow prefill", "t")]) and table[2]["t ($0.1/1M out)"] == "never"


def test_plot_sensitivity():
    import matplotlib

    matplotlib.use("Agg")
    rows = [{"input_tokens": i, "utilization": u, "crossover_rpd": math.inf if i < 100 else 1e4 * u}
            for i in (50, 500, 5000) for u in (0.5, 0.9)]
    ax = cost_compare.plot_sensitivity(rows)
    assert len(ax.lines) == 2
    ax.figure.canvas.draw()  # the log axes' ticks are computed only when drawn
    assert [t.get_text() for t in ax.get_xticklabels()] == ["50", "500", "5000"]
    same = [dict(r, crossover_rpd=1e4 if r["input_tokens"] >= 100 else math.inf) for r in rows]
    ax = cost_compare.plot_sensitivity(same)  # targets that give the same crossovers: one line saying so
    assert len(ax.lines) == 1
    assert "50%, 90% (crossovers within 2%)" in ax.get_legend().get_texts()[0].get_text()
    never = [dict(r, crossover_rpd=math.inf) for r in rows]  # an AVX2 run of chapter 08: no point at all
    ax = cost_compare.plot_sensitivity(never)
    ax.figure.canvas.draw()  # a log axis with no positive point raised here ("cannot be log-scaled")
    assert ax.get_yscale() == "linear" and "never" in ax.texts[0].get_text()
