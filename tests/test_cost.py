"""API vs dedicated GPU cost model (labkit.production.cost, chapter 08)."""

import json
import math
from typing import Any

import numpy as np
import pytest

from labkit import paths
from labkit.production import cost
from labkit.production.cost import (
    OWNED_FIELDS,
    api_cost,
    capacity,
    crossover,
    dedicated_cost,
    load_prices,
    monthly_costs,
    owned_gpu_hour,
    replicas_needed,
)

TIER = {"name": "t", "input_per_mtok": 1.0, "output_per_mtok": 2.0, "source": "test"}
GPU = {"name": "g", "per_gpu_hour": 1.0, "source": "test"}
CURVE = {1: 13.0, 4: 26.0, 8: 37.0, 16: 55.0}  # the shape of a measured sweep: output tok/s per replica


def test_shipped_prices_load_dated_and_sourced():
    p = load_prices()
    assert p["as_of"] == "2026-12-05" and "never looks prices up live" in p["note"]
    assert {"api-small", "api-large"} <= set(p["api"])
    assert {"H100", "H200", "A100-80GB", "L4"} <= set(p["gpus"])
    assert all(e["source"] and e["name"] == n for s in ("api", "gpus") for n, e in p[s].items())
    large, small = p["api"]["api-large"], p["api"]["api-small"]
    assert large["output_per_mtok"] > small["output_per_mtok"] > 0
    assert "units" in p and any("per_gpu_hour" in k for k in p["units"])
    # The owned card's hourly price is computed from its assumptions, by hand here:
    own = p["gpus"]["rtx-3060-owned"]
    a = own["owned"]
    by_hand = a["purchase_usd"] / (a["lifetime_years"] * 8760) + a["watts"] / 1000 * a["usd_per_kwh"]
    assert own["per_gpu_hour"] == pytest.approx(by_hand)
    assert own["per_gpu_hour"] < p["gpus"]["L4"]["per_gpu_hour"]


PRICED = ("input_per_mtok", "output_per_mtok", "cached_input_per_mtok", "batch_discount", "per_gpu_hour")


def test_every_shipped_price_lies_within_what_its_citations_give():
    """A price in data/prices.json is read from its cited pages: each field a citation names lies
    within the lowest and highest figure those pages give; an owned card's fields are cited too, but
    for those its ``assumed`` list names."""
    p = load_prices()
    for section in ("api", "gpus"):
        for name, e in p[section].items():
            fields = {c["field"] for c in e["cited"]}
            if "owned" in e:
                e = dict(e, **e["owned"])
                priced = set(OWNED_FIELDS) - set(e["assumed"])
                assert fields == priced, f"{section}.{name}: cited {sorted(fields)}, not {sorted(priced)}"
            else:
                priced = {k for k in PRICED if k in e}
            assert priced and priced <= fields, f"{section}.{name}: {sorted(priced - fields)} not cited"
            for f in priced:
                lo = min(c["low"] for c in e["cited"] if c["field"] == f)
                hi = max(c["high"] for c in e["cited"] if c["field"] == f)
                assert lo <= e[f] <= hi, f"{section}.{name}.{f} = {e[f]} outside its citations' {lo}..{hi}"
                assert all(c["url"].startswith(("https://", "http://")) for c in e["cited"])


def test_discounted_prices_by_hand():
    tier = dict(TIER, cached_input_per_mtok=0.1, batch_discount=0.5)
    d = cost.discounted(tier, cached_share=0.5, batch=True)
    assert d["input_per_mtok"] == pytest.approx((0.5 * 1.0 + 0.5 * 0.1) * 0.5)
    assert d["output_per_mtok"] == pytest.approx(1.0)
    assert cost.discounted(tier) == dict(tier)
    with pytest.raises(ValueError, match="no prompt-cache price"):
        cost.discounted(TIER, cached_share=0.5)
    with pytest.raises(ValueError, match="no batch discount"):
        cost.discounted(TIER, batch=True)
    with pytest.raises(ValueError, match="cached_share"):
        cost.discounted(tier, cached_share=1.5)


def test_known_answers():
    assert api_cost(1e6, 1e6, TIER) == pytest.approx(3.0)          # $1 + $2
    assert api_cost(250_000, 0, TIER) == pytest.approx(0.25)
    assert dedicated_cost(10, 2, {"per_gpu_hour": 1.5}, gpus_per_replica=2) == pytest.approx(60.0)
    assert dedicated_cost(10, 0, GPU) == 0.0
    assert owned_gpu_hour(8760, 1, 1000, 0.1) == pytest.approx(1.1)   # $1/h written off + 1 kWh at $0.10


def test_replicas_are_a_step_function():
    # capacity 10 tok/s at 50 % headroom: 5 tok/s per replica
    assert [replicas_needed(x, 10, 0.5) for x in (0, 0.1, 5, 5.0001, 10, 10.5, 15)] == [0, 1, 1, 2, 2, 3, 3]
    assert replicas_needed(14, 20, 0.7) == 1       # 14 / (20 x 0.7) is 1.0000000000000002 in floats
    assert replicas_needed(1e6, 1, 1.0) == 1_000_000


def test_capacity_reads_the_measured_curve_under_the_latency_target():
    assert capacity(CURVE) == (16, 55)
    assert capacity(CURVE, 8) == (8, 37)
    assert capacity(CURVE, 6) == (6, pytest.approx(31.5))             # halfway between 4 and 8
    assert capacity({1: 10, 4: 40, 8: 30}, 8) == (4, 40)               # past the knee: run at 4
    assert capacity({"1": 10, "8": 50}, 8) == (8, 50)  # type: ignore[dict-item]  # keys as JSON gives them
    bad: Any
    for bad in (32, 0.5):
        with pytest.raises(ValueError, match="extrapolating"):
            capacity(CURVE, bad)


def test_monthly_costs_by_hand():
    # 86,400 req/day x 100 out = 100 tok/s mean, 200 peak; a replica does 100 tok/s, used to 50 %: 4 replicas
    c = monthly_costs(86_400, 200, 100, TIER, GPU, {1: 50, 8: 100}, peak_to_mean=2.0, utilization_target=0.5)
    assert c["replicas"] == c["gpus"] == 4 and c["per_replica_tok_s"] == 100 and c["concurrency"] == 8
    assert c["dedicated_usd"] == pytest.approx(4 * 30.4 * 24)           # $2,918.40
    requests = 86_400 * 30.4
    assert c["api_usd"] == pytest.approx(requests * (200 * 1 + 100 * 2) / 1e6)   # $1,050.62
    assert c["utilization"] == pytest.approx(0.25)                      # 100 / (4 x 100)
    assert c["api_usd_per_mtok_out"] == pytest.approx(4.0)              # (200 x $1 + 100 x $2) / 100 tokens
    assert c["dedicated_usd_per_mtok_out"] == pytest.approx(2918.4 / (requests * 100 / 1e6))
    assert c["cheaper"] == "api"
    # A tighter latency target allows concurrency 1 only: 50 tok/s per replica, twice the replicas.
    assert monthly_costs(86_400, 200, 100, TIER, GPU, {1: 50, 8: 100}, slo_concurrency=1,
                         utilization_target=0.5)["replicas"] == 8
    # Tensor parallel replicas pay for every GPU.
    two = monthly_costs(86_400, 200, 100, TIER, GPU, {1: 50, 8: 100}, utilization_target=0.5,
                        gpus_per_replica=2)
    assert two["gpus"] == 8 and two["dedicated_usd"] == pytest.approx(2 * c["dedicated_usd"])


def test_no_traffic_still_pays_for_the_warm_replica():
    c = monthly_costs(0, 200, 100, TIER, GPU, CURVE)
    assert c["replicas"] == 1 and c["api_usd"] == 0 and c["dedicated_usd"] == pytest.approx(729.6)
    assert c["utilization"] == 0 and math.isinf(c["dedicated_usd_per_mtok_out"])
    assert monthly_costs(0, 200, 100, TIER, GPU, CURVE, min_replicas=0)["dedicated_usd"] == 0


def test_costs_are_monotone_in_traffic():
    rows = [monthly_costs(r, 500, 300, TIER, GPU, CURVE) for r in np.geomspace(1, 1e7, 200)]
    api, ded, reps = ([r[k] for r in rows] for k in ("api_usd", "dedicated_usd", "replicas"))
    assert all(b > a for a, b in zip(api, api[1:], strict=False))
    assert all(b >= a for a, b in zip(ded, ded[1:], strict=False)) and reps[0] == 1 and reps[-1] > 100
    assert all(b >= a for a, b in zip(reps, reps[1:], strict=False))


def test_crossover_by_hand_where_both_bills_are_equal():
    # $0.0004 a request (200 in at $1/M, 100 out at $2/M); one replica ($729.60/month) serves
    # 1,000 x 0.5 / 2 tok/s mean = 216,000 req/day, so it crosses at 729.6 / (30.4 x 0.0004) = 60,000/day.
    kw: dict[str, Any] = dict(utilization_target=0.5, peak_to_mean=2.0)
    x = crossover(200, 100, TIER, GPU, {1: 1000}, **kw)
    assert x == pytest.approx(60_000, rel=1e-9)
    at = monthly_costs(x, 200, 100, TIER, GPU, {1: 1000}, **kw)
    assert at["api_usd"] == pytest.approx(at["dedicated_usd"], rel=1e-9)
    assert at["dedicated_usd"] <= at["api_usd"]  # the first traffic where dedicated is no dearer
    below = monthly_costs(0.999 * x, 200, 100, TIER, GPU, {1: 1000}, **kw)
    assert below["api_usd"] < below["dedicated_usd"]
    assert crossover(200, 100, TIER, GPU, {1: 1000}, lo=1e5, **kw) == 1e5   # already cheaper at lo


def test_crossover_on_shipped_prices_is_an_equal_cost_point_or_inf():
    p = load_prices()
    curve: dict[int, float] = {1: 150, 8: 900, 32: 2400}  # shaped like a 4B model on a data-center GPU
    found = 0
    for tier in p["api"].values():
        for gpu in p["gpus"].values():
            x = crossover(500, 300, tier, gpu, curve, slo_concurrency=32)
            if math.isinf(x):
                c = monthly_costs(1e9, 500, 300, tier, gpu, curve, slo_concurrency=32)
                assert c["api_usd_per_mtok_out"] <= c["dedicated_usd_per_mtok_out"] * 1.01
                continue
            found += 1
            c = monthly_costs(x, 500, 300, tier, gpu, curve, slo_concurrency=32)
            assert c["api_usd"] == pytest.approx(c["dedicated_usd"], rel=1e-6)
            assert monthly_costs(0.99 * x, 500, 300, tier, gpu, curve, slo_concurrency=32)["cheaper"] == "api"
    assert found >= 3
    # Pricier GPU hours push the crossover later.
    big = p["api"]["api-large"]
    cheap, dear = ({"per_gpu_hour": h} for h in (2.0, 4.0))
    assert crossover(500, 300, big, cheap, curve) < crossover(500, 300, big, dear, curve)


def test_crossover_never_when_tokens_are_cheaper_than_a_full_gpu():
    assert crossover(500, 300, {"input_per_mtok": 0.0, "output_per_mtok": 0.01}, GPU, CURVE) == math.inf


@pytest.mark.parametrize("call, match", [
    (lambda: api_cost(-1, 0, TIER), "input_tokens"),
    (lambda: api_cost(1, 1, {"input_per_mtok": 1}), "output_per_mtok"),
    (lambda: api_cost(1, float("nan"), TIER), "output_tokens"),
    (lambda: dedicated_cost(1, 1.5, GPU), "replicas"),  # type: ignore[arg-type]  # deliberately not whole
    (lambda: dedicated_cost(-1, 1, GPU), "hours"),
    (lambda: replicas_needed(10, 0), "per_replica_tok_s"),
    (lambda: replicas_needed(10, 5, headroom=0), "headroom"),
    (lambda: replicas_needed(10, 5, headroom=1.5), "headroom"),
    (lambda: monthly_costs(10, 1, 1, TIER, GPU, CURVE, peak_to_mean=0.5), "peak_to_mean"),
    (lambda: monthly_costs(10, 1, 1, TIER, GPU, {}), "throughput_curve"),
    (lambda: monthly_costs(10, 1, 1, TIER, GPU, {1: 0}), "throughput"),
    (lambda: monthly_costs(10, 1, 1, TIER, GPU, CURVE, min_replicas=-1), "min_replicas"),
    (lambda: crossover(1, 1, TIER, GPU, CURVE, lo=10, hi=10), "lo < hi"),
])
def test_bad_inputs_raise_value_error(call, match):
    with pytest.raises(ValueError, match=match):
        call()


@pytest.mark.parametrize("edit, match", [
    (lambda d: d.pop("as_of"), "as_of"),
    (lambda d: d.update(as_of="December"), "as_of"),
    (lambda d: d["api"]["api-small"].pop("output_per_mtok"), "api.api-small is missing 'output_per_mtok'"),
    (lambda d: d["api"]["api-small"].update(input_per_mtok=-1), "input_per_mtok"),
    (lambda d: d["api"]["api-small"].pop("source"), "source"),
    (lambda d: d["gpus"]["H100"].update(owned={}), "exactly one"),
    (lambda d: d["gpus"]["H100"].update(per_gpu_hour=0), "per_gpu_hour"),
    (lambda d: d["gpus"]["rtx-3060-owned"]["owned"].pop("watts"), "watts"),
    (lambda d: d["gpus"]["rtx-3060-owned"].update(assumed=True), "must list which"),
    (lambda d: d.update(gpus={}), "non-empty"),
    (lambda d: d["api"]["api-small"].update(batch_discount=1.0), "fraction off"),
    (lambda d: d["gpus"]["H100"]["cited"][0].pop("url"), r"cited\[0\] needs a 'url'"),
    (lambda d: d["gpus"]["H100"]["cited"][0].update(low=9.0), "is above high"),
])
def test_load_prices_says_what_is_wrong(tmp_path, edit, match):
    d = json.loads(paths.data("prices.json").read_text())
    edit(d)
    path = tmp_path / "prices.json"
    path.write_text(json.dumps(d))
    with pytest.raises(ValueError, match=match):
        load_prices(path)
    path.write_text("{not json")
    with pytest.raises(ValueError, match="not valid JSON"):
        load_prices(path)


def test_crossover_known_answer():
    kw: dict[str, Any] = dict(utilization_target=0.5)
    assert crossover(200, 100, TIER, GPU, {1: 1000}, lo=1e3, hi=1e7, **kw) == pytest.approx(60_000)


def test_roofline_curve_by_hand(monkeypatch):
    from labkit.hardware.catalog import Accelerator

    # 1e9 params of 2 bytes, 4 layers x 2 KV heads x 64 dims: 2 x 4 x 2 x 64 x 2 = 2,048 KV bytes a token
    cfg = {"num_hidden_layers": 4, "num_key_value_heads": 2, "num_attention_heads": 8, "hidden_size": 512,
           "head_dim": 64}
    gpu = Accelerator("toy", 1e12, 1e12, {"bf16": 100.0})      # 1 TB/s, 100 TFLOPS
    params = 1e9
    monkeypatch.setattr(cost, "param_count", lambda c: {"total": params, "active": params})
    curve = cost.roofline_curve(cfg, gpu, batches=(1, 1000), context_tokens=1000)
    memory_step = (2e9 + 1 * 1000 * 2048) / 1e12               # batch 1 reads weights + one KV cache
    assert curve[1] == pytest.approx(1 / memory_step)
    compute_step = 2 * params * 1000 / 100e12                  # batch 1000: 2 FLOPs a param a token
    assert compute_step > (2e9 + 1000 * 1000 * 2048) / 1e12
    assert curve[1000] == pytest.approx(1000 / compute_step)


def test_roofline_curve_uses_the_kv_formula_of_the_config():
    from labkit.hardware.catalog import ACCELERATORS
    from labkit.llm.architecture import load_config, param_count
    from labkit.llm.kvcache import kv_cache_bytes_for_config

    q = load_config("Qwen3-4B")
    h100 = ACCELERATORS["H100 SXM"]
    curve = cost.roofline_curve(q, h100, batches=(1, 8), context_tokens=1024)
    step1 = (2 * param_count(q)["total"] + kv_cache_bytes_for_config(q, 1024)) / h100.bandwidth_bytes_per_s
    assert curve[1] == pytest.approx(1 / step1) and curve[8] > 7 * curve[1]   # memory-bound: batching is free


def test_crossover_table_rows_and_never():
    cheap = {"name": "cheap", "input_per_mtok": 0.0, "output_per_mtok": 0.01, "source": "test"}
    case = "toy (measured)"
    rows, x = cost.crossover_table({case: (GPU, {1: 1000}, 1)}, {"t": TIER, "cheap": cheap}, 200, 100)
    assert rows == [{"replica": "toy", "$/h": "1.00", "$/1M out, fully used": f"{1 / 3.6:.3f}",
                     "t ($2/1M out)": f"{x[(case, 't')]:,.0f}/day", "cheap ($0.01/1M out)": "never"}]
    assert x[(case, "t")] == pytest.approx(crossover(200, 100, TIER, GPU, {1: 1000}, slo_concurrency=1))
    assert math.isfinite(x[(case, "t")]) and x[(case, "cheap")] == math.inf


def test_prompt_tokens_shrink_a_replicas_capacity():
    """A long prompt costs replica time (prefill) as well as API tokens: at 2,000 prompt tokens and a
    measured 0.5 ms per prompt token, each 200-token answer also holds the replica 1 s."""
    free = monthly_costs(10_000, 2000, 200, TIER, GPU, CURVE)
    paid = monthly_costs(10_000, 2000, 200, TIER, GPU, CURVE, prefill_s_per_token=0.0005)
    # 55 tok/s -> 200 / (200 / 55 + 1.0) = 43.1 tok/s
    assert paid["per_replica_tok_s"] == pytest.approx(200 / (200 / 55 + 1.0))
    assert paid["prefill_share"] == pytest.approx(1.0 / (200 / 55 + 1.0))  # of the replica's time
    assert free["prefill_share"] == 0 and paid["api_usd"] == free["api_usd"]
    hi = monthly_costs(2e6, 2000, 200, TIER, GPU, CURVE, prefill_s_per_token=0.0005)
    assert hi["replicas"] > monthly_costs(2e6, 2000, 200, TIER, GPU, CURVE)["replicas"]


def test_crossover_sensitivity_grid():
    from labkit.production.cost_compare import crossover_sensitivity

    rows = crossover_sensitivity([100, 4000], [0.4, 0.8], 200, TIER, GPU, CURVE, prefill_s_per_token=0.0005)
    assert [(r["input_tokens"], r["utilization"]) for r in rows] == [(100, 0.4), (100, 0.8), (4000, 0.4),
                                                                    (4000, 0.8)]
    by = {(r["input_tokens"], r["utilization"]): r["crossover_rpd"] for r in rows}
    assert by[(100, 0.8)] <= by[(100, 0.4)]  # a fuller fleet pays off sooner
