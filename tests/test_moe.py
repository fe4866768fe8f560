"""The small MoE layer vs transformers' Qwen3-MoE block (labkit.llm.moe, chapter 03)."""

import pytest
import torch
import torch.nn.functional as F

from labkit.llm.moe import (
    expected_used_fraction,
    experts_used_fraction,
    init_moe,
    moe_forward,
    moe_params,
    route,
    router_share,
)


def test_matches_transformers_qwen3_moe_block():
    from transformers import Qwen3MoeConfig
    from transformers.models.qwen3_moe.modeling_qwen3_moe import Qwen3MoeSparseMoeBlock

    p = init_moe(d_model=16, d_expert=8, n_experts=12, seed=3)
    cfg = Qwen3MoeConfig(hidden_size=16, moe_intermediate_size=8, num_experts=12, num_experts_per_tok=4,
                         norm_topk_prob=True)
    block = Qwen3MoeSparseMoeBlock(cfg).eval()
    with torch.no_grad():
        block.gate.weight.copy_(p["router"] * 50)  # sharper scores: no near-ties in the top-k
        block.experts.gate_up_proj.copy_(p["gate_up_proj"])
        block.experts.down_proj.copy_(p["down_proj"])
        p["router"] = p["router"] * 50
        x = torch.randn(2, 10, 16, generator=torch.Generator().manual_seed(0))
        ref = block(x).reshape(20, 16)
        out, ids = moe_forward(p, x.reshape(20, 16), top_k=4)
    assert torch.allclose(out, ref, atol=1e-6)
    assert ids.shape == (20, 4)


def test_shared_expert_is_added_for_every_token():
    p = init_moe(8, 4, n_experts=6, n_shared=1, seed=1)
    x = torch.randn(5, 8, generator=torch.Generator().manual_seed(1))
    out, _ = moe_forward(p, x, top_k=2)
    routed = {k: v for k, v in p.items() if not k.startswith("shared")}
    gate, up = F.linear(x, p["shared_gate_up_proj"]).chunk(2, -1)
    shared = F.linear(F.silu(gate) * up, p["shared_down_proj"])
    assert torch.allclose(out, moe_forward(routed, x, top_k=2)[0] + shared, atol=1e-7)


def test_router_weights_are_a_distribution_over_distinct_experts():
    p = init_moe(8, 4, n_experts=10)
    w, ids = route(torch.randn(7, 8), p["router"], top_k=3)
    assert torch.allclose(w.sum(-1), torch.ones(7))
    assert all(len(set(row.tolist())) == 3 for row in ids)


def test_param_counts():
    d, f, e, k = 8, 4, 10, 2
    expert = 3 * d * f
    assert moe_params(init_moe(d, f, e), k) == {"total": e * d + e * expert, "active": e * d + k * expert}
    assert moe_params(init_moe(d, f, e, n_shared=1), k)["active"] == e * d + (k + 1) * expert


def test_usage_fraction_and_its_expectation():
    assert experts_used_fraction(torch.tensor([[0, 1], [1, 2]]), 8) == 3 / 8
    assert expected_used_fraction(128, 8, 1) == 8 / 128
    assert expected_used_fraction(128, 8, 200) > 0.99
    p = init_moe(32, 8, n_experts=64, seed=0)
    _, ids = moe_forward(p, torch.randn(256, 32, generator=torch.Generator().manual_seed(0)), top_k=4)
    assert experts_used_fraction(ids, 64) > 0.9


def test_real_like_states_route_lopsided_and_usage_by_batch_draws_rows():
    from labkit.llm.moe import to_router_width, usage_by_batch, usage_sentence

    g = torch.Generator().manual_seed(1)
    p = init_moe(32, 8, n_experts=64, seed=0)
    uniform = usage_by_batch(p["router"], torch.randn(300, 32, generator=g), 4, [1, 64, 256])
    # rows that share one common direction, as real hidden states do
    shared = torch.randn(1, 96, generator=g) * 3 + 0.3 * torch.randn(300, 96, generator=g)
    lopsided = usage_by_batch(p["router"], to_router_width(shared, 32), 4, [1, 64, 256])
    assert uniform[1] == lopsided[1] == 4 / 64
    assert uniform[256] > 0.95 and lopsided[256] < uniform[256] - 0.2
    assert to_router_width(shared, 32).shape == (300, 32)
    with pytest.raises(ValueError, match="at least that many rows"):
        usage_by_batch(p["router"], torch.randn(10, 32), 4, [16])
    text = usage_sentence("X", {1: 0.0625, 256: 0.71}, {256: 1.0}, 256)
    assert "most of them" in text and "71%" in text and "100%" in text
    assert "nearly all" in usage_sentence("X", {1: 0.0625, 256: 0.97}, {256: 1.0}, 256)


def test_router_share_counts_one_matrix_per_moe_layer():
    from labkit.llm.architecture import load_config
    qwen = router_share(load_config("Qwen3-235B-A22B"))
    assert qwen["params"] == 94 * 128 * 4096                  # every layer is MoE, no router bias
    deepseek = router_share(load_config("DeepSeek-V3"))
    assert deepseek["params"] == (61 - 3) * 256 * (7168 + 1)  # 3 dense layers first; a bias per expert
    assert 0 < qwen["of_total"] < qwen["of_active"] < 1
