"""Chapter 04's llama.cpp point on the roofline (labkit.engines.llamacpp_roofline): the arithmetic against
hand-computed answers, and the measurement's bookkeeping with llama-bench and the copy benchmark
replaced by fakes (the fastest round, the best bandwidth, torch's threads restored, the KV depth)."""

from __future__ import annotations

import pytest
import torch

from labkit.engines import llamacpp_roofline as lr
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
