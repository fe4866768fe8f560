"""labkit.experiments.vram: what a ``vllm serve`` command needs, from shipped configs (chapter 05)."""

import pytest

from labkit.experiments import vram
from labkit.llm.architecture import load_config


def test_qwen3_4b_at_its_default_context_needs_weights_plus_six_gb_of_kv():
    c = load_config("Qwen3-4B")
    need = vram.serve_need(c)  # fp16, --max-model-len left at the config's 40,960
    assert need["max_model_len"] == 40960
    assert need["weights"] == pytest.approx(8.04e9, rel=0.01)
    # 2 (K, V) x 36 layers x 8 KV heads x 128 dims x 2 bytes = 147,456 bytes per token
    assert need["kv"] == 147_456 * 40960
    assert need["total"] == need["weights"] + need["kv"]
    assert need["total"] > vram.budget(12e9)


def test_llama3_8b_in_bf16_does_not_fit_12_gb_at_any_context():
    c = load_config("Llama-3-8B")
    need = vram.serve_need(c, dtype_bytes=2, max_model_len=2048)
    assert need["weights"] == pytest.approx(16.06e9, rel=0.01) and need["kv"] == 2 * 32 * 8 * 128 * 2 * 2048
    assert vram.longest_context(c, 12e9) == 0
    assert vram.longest_context(c, 12e9, dtype_bytes=1) > 2048  # 8-bit weights and cache do fit


def test_longest_context_fits_and_one_more_token_does_not():
    c = load_config("Qwen3-4B")
    n = vram.longest_context(c, 12e9)
    assert 10_000 < n < 40960
    assert vram.serve_need(c, max_model_len=n)["total"] <= vram.budget(12e9)
    assert vram.serve_need(c, max_model_len=n + 1)["total"] > vram.budget(12e9)


def test_bad_inputs_are_refused():
    with pytest.raises(ValueError, match="max_model_len"):
        vram.serve_need(load_config("Qwen3-4B"), max_model_len=0)
    with pytest.raises(ValueError, match="utilization"):
        vram.budget(12e9, 1.5)
