"""What serving costs: per-token API prices against dedicated GPUs by the hour (chapter 08,
"Production deployment").

The tutorial: "API pricing ($/million tokens) is simple to model. Dedicated GPU pricing
($/GPU-hour) depends on batch sizes, traffic patterns, sequence lengths, and utilization rates
... the crossover point is often later than you'd expect." This module prices one workload both ways.

* :func:`load_prices`: the dated example prices in ``data/prices.json`` (inputs to replace with
  your own quotes; nothing is looked up live), validated.
* :func:`api_cost`: $ for a number of input and output tokens at an API tier's $ per 1M tokens;
  :func:`discounted` prices a tier with its published prompt-cache and batch discounts.
* :func:`dedicated_cost`: $ for GPU replicas kept on for some hours, busy or idle.
* :func:`replicas_needed`: replicas for a peak output rate (tokens/s) at a utilization target.
* :func:`monthly_costs`: one month (30.4 days) of a workload, given requests per day and tokens
  per request. Batch efficiency comes from a throughput curve you *measured* (chapter 02's
  sweep): ``{concurrency: aggregate output tokens/s of one replica}``. The latency target caps
  the concurrency a replica may run at (``slo_concurrency``), and its capacity is the curve
  there. Replicas are sized for the peak (mean x ``peak_to_mean``) at ``utilization_target`` and
  stay on all month, so at low traffic you pay for idle GPUs.
* :func:`crossover`: the requests per day at which the dedicated fleet becomes cheaper;
  :func:`crossover_table` tabulates it for several replicas against several API tiers.
* :func:`roofline_curve`: a throughput curve computed instead of measured, for a GPU you do not
  have: each decode step reads the weights and every sequence's KV cache at the datasheet
  bandwidth, or does the datasheet FLOPs, whichever takes longer (an upper bound).
"""

from __future__ import annotations

import datetime as dt
import json
import math
from pathlib import Path
from typing import Any

import numpy as np

from ..hardware import roofline
from ..hardware.catalog import Accelerator
from ..llm.architecture import param_count
from ..llm.kvcache import kv_cache_bytes_for_config
from ..paths import data

SECONDS_PER_DAY = 86_400.0
DAYS_PER_MONTH = 30.4  # 365 / 12, rounded as cloud bills do (730 h / 24)
HOURS_PER_MONTH = DAYS_PER_MONTH * 24
HOURS_PER_YEAR = 8_760.0
OWNED_FIELDS = ("purchase_usd", "lifetime_years", "watts", "usd_per_kwh")


def _number(value: Any, what: str, positive: bool = False) -> float:
    """``value`` as a finite float >= 0 (> 0 when ``positive``); ``ValueError`` naming ``what``."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) \
            or value < 0 or (positive and value == 0):
        raise ValueError(f"{what} must be a finite number {'> 0' if positive else '>= 0'}, got {value!r}")
    return float(value)


def _price(entry: dict[str, Any], key: str) -> float:
    """``entry[key]`` as a price >= 0; ``ValueError`` when it is missing or not a number."""
    if not isinstance(entry, dict) or key not in entry:
        name = entry.get("name", entry) if isinstance(entry, dict) else entry
        raise ValueError(f"price entry {name!r} has no {key!r}: pass an entry of load_prices()['api'] "
                         "or load_prices()['gpus']")
    return _number(entry[key], key)


def owned_gpu_hour(purchase_usd: float, lifetime_years: float, watts: float, usd_per_kwh: float) -> float:
    """$ per hour of a GPU you own and run all day: purchase written off evenly over its lifetime,
    plus electricity (``watts`` at the wall x ``usd_per_kwh``)."""
    return (_number(purchase_usd, "purchase_usd") / (_number(lifetime_years, "lifetime_years", True)
                                                     * HOURS_PER_YEAR)
            + _number(watts, "watts") / 1000 * _number(usd_per_kwh, "usd_per_kwh"))


def _check_citations(entry: dict[str, Any], where: str) -> None:
    """An entry's optional ``cited`` list: each item names its ``url`` and the price ``field`` it
    bears on, with the figures the page gives as ``low`` <= ``high``. ``ValueError`` says which."""
    cited = entry.get("cited", [])
    if not isinstance(cited, list):
        raise ValueError(f"{where}.cited must be a list of citations")
    for i, c in enumerate(cited):
        if not (isinstance(c, dict) and isinstance(c.get("url"), str) and isinstance(c.get("field"), str)):
            raise ValueError(f"{where}.cited[{i}] needs a 'url' and the 'field' it gives a figure for")
        low, high = (_number(c.get(k), f"{where}.cited[{i}].{k}") for k in ("low", "high"))
        if low > high:
            raise ValueError(f"{where}.cited[{i}]: low {c['low']} is above high {c['high']}")


def load_prices(path: str | Path | None = None) -> dict[str, Any]:
    """The price table (default ``data/prices.json``): ``as_of``, ``note``, ``units``, ``api``
    (tier name -> ``input_per_mtok``, ``output_per_mtok`` in $ per 1M tokens) and ``gpus`` (name ->
    ``per_gpu_hour`` in $). Owned GPUs give ``owned`` assumptions instead; their ``per_gpu_hour`` is
    computed here (:func:`owned_gpu_hour`). Each entry gains its ``name``. ``ValueError`` says which
    field of which entry is wrong."""
    path = Path(path) if path is not None else data("prices.json")
    try:
        raw = json.loads(Path(path).read_text())
    except json.JSONDecodeError as e:
        raise ValueError(f"{path} is not valid JSON: {e}") from e
    missing = [k for k in ("as_of", "note", "units", "api", "gpus") if k not in raw]
    if missing:
        raise ValueError(f"{path}: missing top-level field(s) {missing}; see data/prices.json for the layout")
    try:
        dt.date.fromisoformat(str(raw["as_of"]))
    except ValueError as e:
        raise ValueError(f"{path}: as_of must be a date like '2026-12-01', got {raw['as_of']!r}") from e
    out = dict(raw, api={}, gpus={})
    for section, need in (("api", ("input_per_mtok", "output_per_mtok")), ("gpus", ())):
        if not isinstance(raw[section], dict) or not raw[section]:
            raise ValueError(f"{path}: {section!r} must be a non-empty object of named entries")
        for name, entry in raw[section].items():
            where = f"{path}: {section}.{name}"
            if not isinstance(entry, dict) or not isinstance(entry.get("source"), str):
                raise ValueError(f"{where} needs a 'source' string saying what kind of price it approximates")
            entry = dict(entry, name=name)
            _check_citations(entry, where)
            for key in need:
                if key not in entry:
                    raise ValueError(f"{where} is missing {key!r} ($ per 1M tokens)")
                _number(entry[key], f"{where}.{key}")
            if section == "api":
                if "cached_input_per_mtok" in entry:
                    _number(entry["cached_input_per_mtok"], f"{where}.cached_input_per_mtok")
                if "batch_discount" in entry and not 0 <= _number(entry["batch_discount"],
                                                                 f"{where}.batch_discount") < 1:
                    raise ValueError(f"{where}.batch_discount is a fraction off (0 to 1), "
                                     f"got {entry['batch_discount']!r}")
            if section == "gpus":
                if ("per_gpu_hour" in entry) == ("owned" in entry):
                    raise ValueError(f"{where} needs exactly one of 'per_gpu_hour' ($) "
                                     f"or 'owned' {OWNED_FIELDS}")
                if "owned" in entry:
                    own = entry["owned"]
                    absent = [k for k in OWNED_FIELDS if not isinstance(own, dict) or k not in own]
                    if absent:
                        raise ValueError(f"{where}.owned is missing {absent}")
                    assumed = entry.get("assumed", [])
                    if not (isinstance(assumed, list) and set(assumed) <= set(OWNED_FIELDS)):
                        raise ValueError(f"{where}.assumed must list which of {OWNED_FIELDS} are "
                                         f"assumptions, got {assumed!r}")
                    entry["per_gpu_hour"] = owned_gpu_hour(**{k: own[k] for k in OWNED_FIELDS})
                _number(entry["per_gpu_hour"], f"{where}.per_gpu_hour", positive=True)
            out[section][name] = entry
    return out


def api_cost(input_tokens: float, output_tokens: float, tier: dict[str, Any]) -> float:
    """$ for ``input_tokens`` and ``output_tokens`` at ``tier``'s ``input_per_mtok`` and
    ``output_per_mtok`` ($ per 1,000,000 tokens)."""
    return (_number(input_tokens, "input_tokens") * _price(tier, "input_per_mtok")
            + _number(output_tokens, "output_tokens") * _price(tier, "output_per_mtok")) / 1e6


def discounted(tier: dict[str, Any], cached_share: float = 0.0, batch: bool = False) -> dict[str, Any]:
    """``tier`` priced as a workload would pay it: ``cached_share`` (0-1) of its input tokens read
    from the vendor's prompt cache at ``cached_input_per_mtok``, and with ``batch`` both prices cut by
    ``batch_discount`` (asynchronous jobs). A copy with the effective ``input_per_mtok`` and
    ``output_per_mtok``; ``ValueError`` when the tier publishes no such price."""
    if not 0 <= _number(cached_share, "cached_share") <= 1:
        raise ValueError(f"cached_share is a fraction of the input tokens (0 to 1), got {cached_share!r}")
    name = tier.get("name", "this tier")
    if cached_share and "cached_input_per_mtok" not in tier:
        raise ValueError(f"{name} publishes no prompt-cache price: use cached_share=0")
    if batch and "batch_discount" not in tier:
        raise ValueError(f"{name} publishes no batch discount: use batch=False")
    keep = 1 - (_number(tier["batch_discount"], "batch_discount") if batch else 0.0)
    cached = _price(tier, "cached_input_per_mtok") if cached_share else 0.0
    inp = (1 - cached_share) * _price(tier, "input_per_mtok") + cached_share * cached
    return dict(tier, input_per_mtok=inp * keep, output_per_mtok=_price(tier, "output_per_mtok") * keep)


def dedicated_cost(hours: float, replicas: int, gpu: dict[str, Any], gpus_per_replica: int = 1) -> float:
    """$ for ``replicas`` x ``gpus_per_replica`` GPUs kept on for ``hours`` at ``gpu['per_gpu_hour']``."""
    for value, what, least in ((replicas, "replicas", 0), (gpus_per_replica, "gpus_per_replica", 1)):
        if isinstance(value, bool) or not isinstance(value, int) or value < least:
            raise ValueError(f"{what} must be a whole number >= {least}, got {value!r}")
    return _number(hours, "hours") * replicas * gpus_per_replica * _price(gpu, "per_gpu_hour")


def replicas_needed(peak_output_tok_s: float, per_replica_tok_s: float, headroom: float = 0.7) -> int:
    """Replicas that serve ``peak_output_tok_s`` (output tokens/s) when each runs at no more than
    ``headroom`` (0-1] of its capacity ``per_replica_tok_s``: ``ceil(peak / (capacity x headroom))``
    (0 for no traffic). A whole replica is bought for any fraction of one: a step function."""
    peak = _number(peak_output_tok_s, "peak_output_tok_s")
    cap = _number(per_replica_tok_s, "per_replica_tok_s", positive=True)
    if not 0 < headroom <= 1:
        raise ValueError(f"headroom must be in (0, 1] (the fraction of capacity used at peak), "
                         f"got {headroom!r}")
    x = peak / (cap * headroom)
    n = round(x)
    return int(n) if math.isclose(x, n, rel_tol=1e-9, abs_tol=1e-12) else math.ceil(x)


def capacity(throughput_curve: dict[int, float], slo_concurrency: int | None = None) -> tuple[float, float]:
    """(concurrency, output tokens/s) one replica sustains within the latency target:
    the best point of the measured curve at concurrency <= ``slo_concurrency`` (linear
    interpolation between measured points; ``None``: the whole curve). The curve is never
    extrapolated: a limit outside the measured concurrencies raises ``ValueError``."""
    if not isinstance(throughput_curve, dict) or not throughput_curve:
        raise ValueError("throughput_curve must be a non-empty {concurrency: output tokens/s} dict, measured")
    try:  # keys read back from JSON are strings: "8" -> 8
        pts = sorted((float(c), t) for c, t in throughput_curve.items())
    except (TypeError, ValueError) as e:
        raise ValueError(f"throughput_curve keys must be concurrencies (numbers), "
                         f"got {list(throughput_curve)}") from e
    pts = [(_number(c, "throughput_curve concurrency", True),
            _number(t, f"throughput at concurrency {c:g}", True)) for c, t in pts]
    cs, ts = np.array([p[0] for p in pts]), np.array([p[1] for p in pts])
    limit = cs[-1] if slo_concurrency is None else _number(slo_concurrency, "slo_concurrency", True)
    if not cs[0] <= limit <= cs[-1]:
        raise ValueError(f"slo_concurrency {slo_concurrency} is outside the measured concurrencies "
                         f"{cs[0]:g}-{cs[-1]:g}: measure the curve there instead of extrapolating")
    cand_c = np.append(cs[cs <= limit], limit)
    cand_t = np.append(ts[cs <= limit], np.interp(limit, cs, ts))
    best = int(np.argmax(cand_t))
    return float(cand_c[best]), float(cand_t[best])


def monthly_costs(requests_per_day: float, input_tokens: float, output_tokens: float, tier: dict[str, Any],
                  gpu: dict[str, Any], throughput_curve: dict[int, float], slo_concurrency: int | None = None,
                  peak_to_mean: float = 2.0, utilization_target: float = 0.7, min_replicas: int = 1,
                  gpus_per_replica: int = 1, prefill_s_per_token: float = 0.0) -> dict[str, Any]:
    """One month (:data:`DAYS_PER_MONTH` days) of ``requests_per_day`` requests of ``input_tokens``
    in and ``output_tokens`` out each, priced on the API ``tier`` and on always-on replicas of ``gpu``
    (``gpus_per_replica`` GPUs each, e.g. the tensor-parallel size).

    Replicas: :func:`replicas_needed` for the peak output rate (mean x ``peak_to_mean``) at
    ``utilization_target`` of the per-replica capacity from :func:`capacity`, at least
    ``min_replicas``. Prompt tokens cost both ways: the API bills them, and a replica spends
    ``input_tokens x prefill_s_per_token`` s (measured TTFT slope) per prompt decoding nothing, so its
    capacity becomes ``out / (out / capacity + that)`` (``prefill_share``: prefill's share of its
    time). Returns $ both ways (``api_usd``, ``dedicated_usd``), ``replicas``, ``gpus``,
    the replica's ``concurrency`` and ``per_replica_tok_s``, ``utilization`` (mean load / provisioned
    capacity), $ per 1M output tokens each way (inf with no traffic) and which is ``cheaper``."""
    rpd = _number(requests_per_day, "requests_per_day")
    out_tok = _number(output_tokens, "output_tokens")
    if _number(peak_to_mean, "peak_to_mean") < 1:
        raise ValueError(f"peak_to_mean is peak / mean traffic and must be >= 1, got {peak_to_mean!r}")
    if isinstance(min_replicas, bool) or not isinstance(min_replicas, int) or min_replicas < 0:
        raise ValueError(f"min_replicas must be a whole number >= 0, got {min_replicas!r}")
    concurrency, cap = capacity(throughput_curve, slo_concurrency)
    in_tok = _number(input_tokens, "input_tokens")
    prefill_s = _number(prefill_s_per_token, "prefill_s_per_token") * in_tok
    if out_tok > 0 and prefill_s > 0:  # decode time per request + its prompt's prefill time
        cap = out_tok / (out_tok / cap + prefill_s)
    mean_tok_s = rpd * out_tok / SECONDS_PER_DAY
    replicas = max(min_replicas, replicas_needed(mean_tok_s * peak_to_mean, cap, utilization_target))
    requests = rpd * DAYS_PER_MONTH
    api = api_cost(requests * _number(input_tokens, "input_tokens"), requests * out_tok, tier)
    dedicated = dedicated_cost(HOURS_PER_MONTH, replicas, gpu, gpus_per_replica)
    mtok_out = requests * out_tok / 1e6
    return {
        "requests_per_month": requests, "output_tokens_per_month": requests * out_tok,
        "api_usd": api, "dedicated_usd": dedicated, "replicas": replicas, "gpus": replicas * gpus_per_replica,
        "concurrency": concurrency, "per_replica_tok_s": cap, "mean_output_tok_s": mean_tok_s,
        "prefill_share": prefill_s / (out_tok / cap) if out_tok and cap else 0.0,
        "utilization": mean_tok_s / (replicas * cap) if replicas else 0.0,
        "api_usd_per_mtok_out": api / mtok_out if mtok_out else math.inf,
        "dedicated_usd_per_mtok_out": dedicated / mtok_out if mtok_out else math.inf,
        "cheaper": "dedicated" if dedicated < api else "api",
    }


def crossover(input_tokens: float, output_tokens: float, tier: dict[str, Any], gpu: dict[str, Any],
              throughput_curve: dict[int, float], lo: float = 1.0, hi: float = 1e9, points: int = 2001,
              **kwargs: Any) -> float:
    """Requests per day at which the dedicated fleet first costs no more than the API: the
    smallest traffic where ``dedicated_usd <= api_usd`` (``kwargs`` go to :func:`monthly_costs`).

    Found on a log grid of ``points`` traffic levels from ``lo`` to ``hi`` requests/day, then
    refined by bisection between the last grid point where the API was cheaper and the first
    where it was not; there both bills are equal (the dedicated bill only jumps *up*, at each new
    replica, so the crossing itself lies on a flat step). Returns ``lo`` when dedicated is already
    cheaper there and ``math.inf`` when it never is within ``[lo, hi]`` (the API's $ per token is
    below what even a fully used replica costs per token). Just past a crossing, a new replica
    can make the API cheaper again for a while."""
    if not 0 < _number(lo, "lo") < _number(hi, "hi"):
        raise ValueError(f"need 0 < lo < hi (requests/day), got lo={lo!r}, hi={hi!r}")

    def gap(r: float) -> float:
        c = monthly_costs(r, input_tokens, output_tokens, tier, gpu, throughput_curve, **kwargs)
        return c["api_usd"] - c["dedicated_usd"]

    grid = np.geomspace(lo, hi, max(int(points), 2))
    hit = next((i for i, r in enumerate(grid) if gap(float(r)) >= 0), None)
    if hit is None:
        return math.inf
    if hit == 0:
        return float(lo)
    a, b = float(grid[hit - 1]), float(grid[hit])
    for _ in range(200):
        if b - a <= 1e-12 * b:
            break
        m = 0.5 * (a + b)
        a, b = (a, m) if gap(m) >= 0 else (m, b)
    return b


def roofline_curve(config: dict[str, Any], gpu: Accelerator, batches: tuple[int, ...] = (1, 8, 32, 64),
                   context_tokens: int = 1024, dtype: str = "bf16",
                   dtype_bytes: float = 2) -> dict[int, float]:
    """``{batch: decode output tokens/s}`` of the model ``config`` on ``gpu`` (a catalog entry),
    ``batch`` sequences of ``context_tokens`` each: a step takes the longer of the memory roof
    (weights + KV caches, ``dtype_bytes`` per number, over the bandwidth) and the compute roof
    (2 x params FLOPs per sequence at ``gpu.tflops[dtype]``)."""
    params = param_count(config)["total"]
    kv_seq = kv_cache_bytes_for_config(config, context_tokens, dtype_bytes)
    peak = gpu.tflops[dtype] * 1e12

    def step_s(b: int) -> float:
        return max(roofline.forward_bytes(dtype_bytes * params, b * kv_seq) / gpu.bandwidth_bytes_per_s,
                   roofline.forward_flops(params, b) / peak)
    return {b: b / step_s(b) for b in batches}


Case = tuple[Any, ...]  # (gpu price entry, throughput curve, concurrency[, prefill s per prompt token])


def crossover_table(cases: dict[str, Case], tiers: dict[str, Any], input_tokens: float,
                    output_tokens: float) -> tuple[list[dict[str, Any]], dict[tuple[str, str], float]]:
    """Rows for a table, one per case ``name: (gpu price entry, throughput curve, concurrency[, prefill s per
    prompt token])``: its $/hour, $ per 1M output tokens fully used (decode only), the :func:`crossover`
    (requests/day or "never", prompts counted) against each tier. Also ``{(case, tier): requests/day}``."""
    rows, crossings = [], {}
    for case, (gpu, curve, conc, *pre) in cases.items():
        replica_tok_s = capacity(curve, conc)[1]
        row = {"replica": case.split(" (")[0], "$/h": f"{gpu['per_gpu_hour']:.2f}",
               "$/1M out, fully used": f"{gpu['per_gpu_hour'] / (replica_tok_s * 3600 / 1e6):.3f}"}
        for name, tier in tiers.items():
            x = crossings[(case, name)] = crossover(input_tokens, output_tokens, tier, gpu, curve,
                                                    slo_concurrency=conc, prefill_s_per_token=sum(pre))
            label = f"{name} (${tier['output_per_mtok']:g}/1M out)"
            row[label] = "never" if math.isinf(x) else f"{x:,.0f}/day"
        rows.append(row)
    return rows, crossings
