"""The API-or-dedicated comparison put into figures and sentences (chapter 08), on top of
:mod:`labkit.production.cost`: the naive break-even (one replica's monthly bill against the API bill,
as a first estimate does it), how many times cheaper one side is at a given volume, and a sentence
that states the crossovers the table printed, tier by tier, so the chapter's prose is always the
run's own numbers. Volumes in requests per day, money in US$ per month.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from . import cost
from .cost import DAYS_PER_MONTH, HOURS_PER_MONTH, api_cost, monthly_costs


def naive_break_even(input_tokens: float, output_tokens: float, tier: dict[str, Any],
                     gpu: dict[str, Any]) -> float:
    """Requests/day at which the API bill equals **one** replica's monthly bill: the first estimate,
    which ignores the replica's capacity, the peak and the utilization target."""
    per_request = api_cost(input_tokens, output_tokens, tier)
    return gpu["per_gpu_hour"] * HOURS_PER_MONTH / (DAYS_PER_MONTH * per_request)


def api_over_dedicated(requests_per_day: float, input_tokens: float, output_tokens: float,
                       tier: dict[str, Any], gpu: dict[str, Any], curve: dict[int, float],
                       slo_concurrency: int | None = None) -> float:
    """The API's monthly bill ÷ the dedicated fleet's (:func:`~labkit.production.cost.monthly_costs`)
    at ``requests_per_day``: above 1 dedicated is that many times cheaper."""
    c = monthly_costs(requests_per_day, input_tokens, output_tokens, tier, gpu, curve, slo_concurrency)
    return c["api_usd"] / c["dedicated_usd"]


def crossover_sentence(replica: str, crossings: Mapping[str, float],
                       prices: Mapping[str, dict[str, Any]]) -> str:
    """One sentence from the crossovers of ``replica`` against each tier (``{tier: requests/day}``,
    ``inf`` for never) and the tiers' prices: which tiers it undercuts, above what traffic, and which
    it never undercuts."""
    def tier(name: str) -> str:
        return f"{name} (${prices[name]['output_per_mtok']:g}/1M out)"
    beats = [f"{tier(t)} above {x:,.0f} requests/day" for t, x in crossings.items() if math.isfinite(x)]
    never = [tier(t) for t, x in crossings.items() if not math.isfinite(x)]
    parts = []
    if beats:
        parts.append("costs less than " + "; ".join(beats))
    if never:
        parts.append("never costs less than " + " or ".join(never) + " at any traffic")
    return f"{replica} " + ", and ".join(parts) + "."


def crossover_sensitivity(input_tokens: list[float], utilizations: list[float], output_tokens: float,
                          tier: dict[str, Any], gpu: dict[str, Any], throughput_curve: dict[int, float],
                          **kwargs: Any) -> list[dict[str, Any]]:
    """:func:`~labkit.production.cost.crossover` (requests/day) for every prompt length in
    ``input_tokens`` and every ``utilization_target`` in ``utilizations`` (``kwargs`` to
    :func:`~labkit.production.cost.monthly_costs`, e.g. ``prefill_s_per_token``): one row each,
    ``inf`` where dedicated never wins."""
    return [{"input_tokens": i, "utilization": u,
             "crossover_rpd": cost.crossover(i, output_tokens, tier, gpu, throughput_curve, points=400,
                                        utilization_target=u, **kwargs)}
            for i in input_tokens for u in utilizations]
