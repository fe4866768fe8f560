"""labkit.media.multimodal: VLM KV-cache and concurrency arithmetic, TTS real-time ceilings (chapter 07)."""

import math

import pytest

from labkit.hardware.catalog import ACCELERATORS
from labkit.llm.architecture import load_config, param_count
from labkit.media.multimodal import max_concurrency, realtime_margin, tts_rows, vlm_kv_bytes, vlm_rows


def test_each_image_adds_a_thousand_tokens_of_kv_cache():
    c = load_config("Qwen3-4B")  # 36 layers, 8 KV heads, head_dim 128
    per_token = 2 * c["num_hidden_layers"] * c["num_key_value_heads"] * c["head_dim"] * 2
    assert per_token == 147_456
    assert vlm_kv_bytes(c, 500, 0) == 500 * per_token
    assert vlm_kv_bytes(c, 500, 3) - vlm_kv_bytes(c, 500, 2) == 1000 * per_token
    assert vlm_kv_bytes(c, 0, 1, dtype_bytes=1) == 1000 * per_token // 2
    with pytest.raises(ValueError):
        vlm_kv_bytes(c, 10, -1)


def test_max_concurrency_is_free_memory_over_kv_per_request():
    assert max_concurrency(100, 40, 5, utilization=0.9) == 10
    assert max_concurrency(100, 95, 5, utilization=0.9) == 0  # weights alone do not fit
    with pytest.raises(ValueError):
        max_concurrency(100, 10, 0)


def test_more_images_fewer_concurrent_requests():
    c = load_config("Qwen3-4B")
    rows = vlm_rows(c, param_count(c)["total"], ACCELERATORS["H100 SXM"].memory_bytes, image_counts=(0, 1, 4))
    conc = [r["max_concurrency"] for r in rows]
    assert conc[0] > conc[1] > conc[2] > 0
    assert rows[1]["tokens"] == 1500


def test_tts_ceiling_is_bandwidth_over_weight_bytes():
    rows = {r["accelerator"]: r for r in tts_rows(ACCELERATORS, 3e9, dtypes=("bf16", "q4_0"), required=100)}
    h100 = ACCELERATORS["H100 SXM"]
    assert rows["H100 SXM"]["bf16"] == pytest.approx(h100.bandwidth_bytes_per_s / 6e9)
    assert rows["H100 SXM"]["bf16_realtime"] is True
    assert rows["Apple M4"]["bf16_realtime"] is False  # 120 GB/s / 6 GB = 20 tokens/s
    tiny = {"tiny": type(h100)("tiny", 1e9, 1e12)}
    assert math.isnan(tts_rows(tiny, 3e9, dtypes=("bf16",))[0]["bf16"])  # does not fit
    assert realtime_margin(50, 100) == 0.5
