"""Chapter 04's llama.cpp point on the roofline (labkit.experiments.llamacpp_roofline): the arithmetic against
hand-computed answers, and the measurement's bookkeeping with llama-bench and the copy benchmark
replaced by fakes (the fastest round, the best bandwidth, torch's threads restored, the KV depth)."""

from __future__ import annotations

from typing import cast

import pytest
import torch

from labkit.experiments import llamacpp_roofline as lr
from labkit.models import gguf_path


def test_decode_point_known_answers():
    p = lr.decode_point(params=100e6, bytes_per_token=50e6, tokens_per_s=80.0, bandwidth=10e9)
    assert p["intensity"] == pytest.approx(4.0)          # 2 FLOPs x 100M weights / 50 MB
    assert p["flops_per_s"] == pytest.approx(16e9)        # 2 x 100M x 80 tokens/s
    assert p["ceiling"] == pytest.approx(200.0)           # 10 GB/s / 50 MB
    assert p["achieved"] == pytest.approx(0.4)            # 80 of 200 tokens/s
    with pytest.raises(ValueError):
        lr.decode_point(1e6, 0.0, 1.0, 1e9)


@pytest.fixture
def fakes(monkeypatch):
    """llama-bench and the copy benchmark replaced: bench answers from ``tps[threads]`` in turn; the copy
    reports ``gbps[(torch threads, buffer is 256 MiB)]``; every call is logged."""
    calls: list[tuple] = []
    tps = {1: [40.0, 50.0], 2: [80.0]}
    gbps = {(1, True): 10.0, (1, False): 11.0, (2, True): 20.0, (2, False): 19.0}

    def bench(gguf, threads, prompt, gen, reps):
        calls.append(("bench", threads, prompt, gen, reps, torch.get_num_threads()))
        return {"gen_tps": tps[threads].pop(0), "gen_tps_sd": 1.0, "type": "Q4_1"}

    def bandwidth(device, nbytes=256 * 2**20, repeats=5):
        calls.append(("copy", torch.get_num_threads(), nbytes))
        return {"gbps_best": gbps[(torch.get_num_threads(), nbytes == 256 * 2**20)]}

    monkeypatch.setattr(lr.llamacpp, "bench", bench)
    monkeypatch.setattr(lr, "memory_bandwidth", bandwidth)
    monkeypatch.setattr(lr, "last_level_cache_bytes", lambda: 300 * 2**20)
    return calls


def test_decode_on_roofline_keeps_fastest_round_and_best_bandwidth(fakes):
    before = torch.get_num_threads()
    r = lr.decode_on_roofline(threads=(1, 2), gen=32, reps=2, rounds={1: 2}, bandwidth={1: 12e9})
    assert torch.get_num_threads() == before
    one, two = r["rows"]
    assert one["tps_rounds"] == [40.0, 50.0] and one["tps"] == 50.0        # the fastest round
    assert one["bandwidth"] == 12e9                                       # the chapter's sample was best
    assert one["model_set_bandwidth"] == 11e9 and two["bandwidth"] == 20e9
    assert one["achieved"] == pytest.approx(50.0 * r["bytes"]["total"] / 12e9)
    assert r["bytes"]["kv"] == pytest.approx(2 * 30 * 3 * 64 * 16 * 2)  # f16 K and V at depth 32 / 2
    assert r["type"] == "Q4_1" and r["params"] == pytest.approx(134_515_008)
    benches = [c for c in fakes if c[0] == "bench"]
    assert [c[1] for c in benches] == [1, 1, 2] and all(c[2:5] == (0, 32, 2) for c in benches)
    copies = [c for c in fakes if c[0] == "copy"]
    assert [c[1] for c in copies] == [1, 1, 1, 1, 2, 2]  # two copies a round, with llama.cpp's threads
    assert any(c[2] == int(r["bytes"]["weights"]) // 2 for c in copies)    # the model-sized working set


def test_table_and_sentences_print_the_figures(fakes):
    r = lr.decode_on_roofline(gguf_path(), threads=(1, 2), rounds={1: 2})
    table = lr.format_table(r)
    assert "llama.cpp Q4_1" in table and "50.0/s" in table and "80.0/s" in table
    assert "96.6 MB of tensors" in table and "depth 16" in table
    text = lr.describe(r, threads=1)
    assert "300 MiB" in text and "under 1.2x" in text                # 11 vs 10 GB/s
    assert "2 threads instead of 1: 1.60x the tokens/s with 2.00x the copy bandwidth" in text


def test_fixed_cost_fit_recovers_a_known_line():
    # 10 ms per token + bytes at 8 GB/s: 100 MB -> 22.5 ms, 150 MB -> 28.75 ms, 270 MB -> 43.75 ms
    sizes = [100e6, 150e6, 270e6]
    fit = lr.fixed_cost_fit(sizes, [1 / (0.010 + b / 8e9) for b in sizes])
    assert fit["fixed_s"] == pytest.approx(0.010) and fit["bw_eff"] == pytest.approx(8e9)
    assert fit["max_residual_s"] < 1e-12 and fit["n"] == 3 and len(cast(list, fit["residuals_s"])) == 3
    with pytest.raises(ValueError):
        lr.fixed_cost_fit([100e6, 100e6], [40.0, 41.0])


def test_formats_on_roofline_interleaves_and_keeps_every_run(monkeypatch):
    """Every round measures both bandwidths, then every format; the share uses the median of all runs
    against the best copy; the fit goes through the formats' medians."""
    calls: list[tuple] = []
    per_token = {"a.gguf": 100e6, "b.gguf": 270e6}
    tps = {"a.gguf": [30.0, 40.0, 50.0], "b.gguf": [20.0, 20.0, 20.0]}

    def bench(gguf, threads, prompt, gen, reps):
        calls.append(("bench", gguf, threads))
        return {"gen_tps": 0.0, "gen_tps_samples": list(tps[gguf])}

    def copy(device, nbytes=256 * 2**20, repeats=5):
        calls.append(("copy", torch.get_num_threads()))
        return {"gbps_best": 10.0 if len(calls) < 3 else 12.0}

    monkeypatch.setattr(lr.llamacpp, "bench", bench)
    monkeypatch.setattr(lr, "memory_bandwidth", copy)
    def read_bandwidth():
        calls.append(("read",))
        return 15e9

    monkeypatch.setattr(lr, "read_bandwidth", read_bandwidth)
    monkeypatch.setattr(lr, "gguf_bytes_per_token", lambda p, context: {"total": per_token[p]})
    r = lr.formats_on_roofline({"A": "a.gguf", "B": "b.gguf"}, threads=(1,), rounds=2)
    assert [c[0] for c in calls] == ["copy", "read", "bench", "bench"] * 2
    a, b = r["rows"]
    assert a["format"] == "A" and a["samples"] == [30.0, 40.0, 50.0] * 2 and a["tps"]["median"] == 40.0
    assert r["bandwidth"][1] == 12e9 and a["achieved"]["median"] == pytest.approx(40 * 100e6 / 12e9)
    assert a["achieved"]["lo"] <= a["achieved"]["median"] <= a["achieved"]["hi"]
    assert a["read_achieved"] == pytest.approx(40 * 100e6 / 15e9)
    fit = r["fits"][1]   # 25 ms at 100 MB, 50 ms at 270 MB
    assert fit["bw_eff"] == pytest.approx(170e6 / 0.025)
    assert fit["fixed_s"] == pytest.approx(0.025 - 100e6 / 6.8e9)
