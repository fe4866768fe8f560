"""KV-cache size formula vs the tensors a cache holds (labkit.llm.kvcache, chapter 03)."""

import pytest
import torch

from labkit.llm.architecture import load_config
from labkit.llm.kvcache import cache_tensor_bytes, kv_cache_bytes, kv_cache_bytes_for_config


def test_formula():
    assert kv_cache_bytes(1, 1, 1, 1, dtype_bytes=1) == 2
    assert kv_cache_bytes(30, 3, 64, 100, dtype_bytes=4) == 2 * 30 * 3 * 64 * 100 * 4
    assert kv_cache_bytes(2, 2, 8, 10, batch=3) == 3 * kv_cache_bytes(2, 2, 8, 10)
    with pytest.raises(ValueError):
        kv_cache_bytes(0, 1, 1, 1)


def test_published_per_token_sizes():
    # Llama-3-8B in bf16: 2 x 32 layers x 8 KV heads x 128 x 2 bytes = 128 KiB per token.
    assert kv_cache_bytes_for_config(load_config("Llama-3-8B"), 1) == 128 * 1024
    # DeepSeek-V3 MLA: (512 latent + 64 rope) x 61 layers x 2 bytes per token.
    assert kv_cache_bytes_for_config(load_config("DeepSeek-V3"), 1) == 576 * 61 * 2


def test_formula_matches_a_real_transformers_cache(tiny_llama):
    model = tiny_llama(hidden_size=32, intermediate_size=48, num_hidden_layers=3, vocab_size=64)
    cfg = model.config
    with torch.no_grad():
        out = model(torch.randint(0, 64, (2, 7)), use_cache=True)
    measured = cache_tensor_bytes(out.cache)
    assert measured == kv_cache_bytes(3, 2, 8, 7, dtype_bytes=4, batch=2)
    assert measured == kv_cache_bytes_for_config(cfg.to_dict(), 7, dtype_bytes=4, batch=2)


def test_measures_a_list_of_pairs():
    pairs = [(torch.zeros(1, 2, 5, 4), torch.zeros(1, 2, 5, 4)) for _ in range(3)]
    assert cache_tensor_bytes(pairs) == kv_cache_bytes(3, 2, 4, 5, dtype_bytes=4)
