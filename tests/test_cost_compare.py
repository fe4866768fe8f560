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


def test_crossover_sentence_says_what_the_table_says():
    prices = {"cheap": {"output_per_mtok": 0.1}, "dear": {"output_per_mtok": 15}}
    s = cost_compare.crossover_sentence("this machine", {"cheap": math.inf, "dear": 2668.5}, prices)
    assert s == ("this machine costs less than dear ($15/1M out) above 2,668 requests/day, and never costs "
                 "less than cheap ($0.1/1M out) at any traffic.")
    assert "never" not in cost_compare.crossover_sentence("x", {"dear": 10.0}, prices)
