"""The API-or-dedicated comparison put into figures (chapter 08), on top of
:mod:`labkit.production.cost`: the naive break-even (one replica's monthly bill against the API bill,
as a first estimate does it), how many times cheaper one side is at a given volume, and the API tier
a model's size matches. Volumes in requests per day, money in US$ per month.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from ..hardware.roofline import forward_flops
from ..llm.architecture import param_count
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
                       slo_concurrency: int | None = None, **kwargs: Any) -> float:
    """The API's monthly bill ÷ the dedicated fleet's (:func:`~labkit.production.cost.monthly_costs`,
    ``kwargs`` to it, e.g. ``prefill_s_per_token``) at ``requests_per_day``: above 1 dedicated is that
    many times cheaper."""
    c = monthly_costs(requests_per_day, input_tokens, output_tokens, tier, gpu, curve, slo_concurrency,
                      **kwargs)
    return c["api_usd"] / c["dedicated_usd"]


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


def roofline_prefill_s_per_token(config: dict[str, Any], gpu: Any, dtype: str = "bf16") -> float:
    """Seconds of a replica's time per prompt token on a GPU you do not have: prefill is compute-bound,
    2 x params FLOPs per token at the datasheet's ``gpu.tflops[dtype]`` (an upper bound on its speed, as
    :func:`~labkit.production.cost.roofline_curve` is for decode)."""
    return forward_flops(param_count(config)["total"], 1) / (gpu.tflops[dtype] * 1e12)


def matched_tier(params: float, tiers: Mapping[str, dict[str, Any]]) -> tuple[str, str]:
    """The API tier of comparable quality for a model of ``params`` parameters, and why: among the
    tiers that sell open-weight models (``open_params_b``: [lo, hi] billions, data/prices.json), the one
    whose range holds it; a model below every range gets the cheapest such tier (no API sells one that
    small, and that tier's models are stronger, so dedicated must beat at least it). ``ValueError``
    when no tier fits (a larger model needs a tier with its size class added)."""
    b = params / 1e9
    open_tiers = {n: t for n, t in tiers.items() if "open_params_b" in t}
    for name, t in open_tiers.items():
        lo, hi = t["open_params_b"]
        if lo <= b <= hi:
            return name, (f"{b:.1f} B parameters is within {name}'s {lo:g}-{hi:g} B open-weight models: "
                          "the same class of model, sold per token")
    below = [n for n, t in open_tiers.items() if b < t["open_params_b"][0]]
    if not below:
        raise ValueError(f"no tier in {list(tiers)} sells open models of {b:.1f} B parameters")
    name = min(below, key=lambda n: open_tiers[n]["output_per_mtok"])
    lo, hi = open_tiers[name]["open_params_b"]
    return name, (f"no API sells a {b:.2f} B model; {name} ({lo:g}-{hi:g} B open-weight models) is the "
                  "cheapest tier and its models are stronger, so dedicated has to beat at least it")


def plot_sensitivity(rows: list[dict[str, Any]], ax: Any = None, title: str = "") -> Any:
    """:func:`crossover_sensitivity`'s rows: crossover (requests/day, log) against prompt tokens (log, ticked
    at the lengths computed), one line per utilization target, or one line naming them all where their
    crossovers lie within 2% of each other (lines a reader could not tell apart); where dedicated never
    wins the line has no point. Returns the Axes."""
    import matplotlib.pyplot as plt
    from matplotlib.ticker import NullLocator, ScalarFormatter

    if ax is None:
        ax = plt.subplots(figsize=(6, 3.5))[1]
    targets = sorted({r["utilization"] for r in rows})
    x = np.array(sorted({r["input_tokens"] for r in rows}))
    at = {(r["utilization"], r["input_tokens"]): r["crossover_rpd"] for r in rows}
    y = {u: np.array([at[u, i] for i in x], float) for u in targets}
    y = {u: np.where(np.isfinite(v), v, np.nan) for u, v in y.items()}  # never: no point
    if len(targets) > 1 and all(np.allclose(v, y[targets[0]], rtol=0.02, atol=0, equal_nan=True)
                                for v in y.values()):  # the lines would overlap: one, and the legend says so
        ax.plot(x, y[targets[0]], "o-", ms=3,
                label=f"utilization targets {', '.join(f'{u:.0%}' for u in targets)} (crossovers within 2%)")
    else:
        for u in targets:
            ax.plot(x, y[u], "o-", ms=3, label=f"utilization target {u:.0%}")
    ever = any(np.isfinite(r["crossover_rpd"]) and r["crossover_rpd"] > 0 for r in rows)
    ax.set(xscale="log", yscale="log" if ever else "linear", xlabel="prompt tokens per request",
           ylabel="crossover (requests/day)",
           title=title or "where dedicated becomes cheaper (no point: never)")
    ax.set_xticks(x)  # the lengths computed, written out
    ax.xaxis.set_major_formatter(ScalarFormatter())
    ax.xaxis.set_minor_locator(NullLocator())
    if not ever:  # a log axis with no point cannot be drawn
        ax.set_yticks([])
        ax.text(0.5, 0.5, "dedicated never becomes cheaper\nat any prompt length or target", ha="center",
                va="center", transform=ax.transAxes)
    ax.legend(fontsize=8)
    return ax
