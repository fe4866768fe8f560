"""Attention written out vs PyTorch's fused kernel (labkit.llm.attention, chapter 03)."""

import pytest
import torch
import torch.nn.functional as F

from labkit.llm.attention import attention, causal_mask, repeat_kv


@pytest.mark.parametrize("causal", [True, False])
def test_matches_sdpa(causal):
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 4, 7, 16, generator=g) for _ in range(3))
    out, weights = attention(q, k, v, causal=causal)
    ref = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
    assert torch.allclose(out, ref, atol=1e-6)
    assert torch.allclose(weights.sum(-1), torch.ones(2, 4, 7))
    if causal:  # nothing attends to the future
        assert (weights.triu(1) == 0).all()


def test_grouped_query_attention_matches_sdpa():
    g = torch.Generator().manual_seed(1)
    q = torch.randn(1, 9, 5, 8, generator=g)
    k, v = torch.randn(1, 3, 5, 8, generator=g), torch.randn(1, 3, 5, 8, generator=g)
    out, _ = attention(q, k, v)
    ref = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
    assert torch.allclose(out, ref, atol=1e-6)
    assert torch.equal(repeat_kv(k, 3)[:, 0:3], k[:, :1].expand(1, 3, 5, 8))


def test_decode_query_sees_every_cached_key():
    # One new query against 6 keys: its row equals the last row of full causal attention.
    g = torch.Generator().manual_seed(2)
    q, k, v = (torch.randn(1, 2, 6, 4, generator=g) for _ in range(3))
    full, _ = attention(q, k, v)
    last, w = attention(q[:, :, -1:], k, v)
    assert torch.allclose(last, full[:, :, -1:], atol=1e-6)
    assert causal_mask(1, 6).all() and causal_mask(3, 3).tolist() == [[1, 0, 0], [1, 1, 0], [1, 1, 1]]


def test_rejects_mismatched_heads():
    with pytest.raises(ValueError, match="multiple"):
        attention(torch.zeros(1, 4, 2, 8), torch.zeros(1, 3, 2, 8), torch.zeros(1, 3, 2, 8))
