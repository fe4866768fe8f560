"""Chapter 03's own checks (labkit/checks/internals.py) against broken implementations: each test runs
a small mutated version of the chapter's code path on a tiny random model, computes the figure the
notebook records from it, and sees the check fail; the real code path, run the same way, holds."""

from functools import partial
from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F
from transformers import TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper

from labkit.checks import outcome
from labkit.llm import attention as attn
from labkit.llm import sampling
from labkit.llm import scratch_llama as sl
from labkit.llm.kvcache import cache_tensor_bytes, kv_cache_bytes

VOCAB = 97


@pytest.fixture
def tiny(tmp_path, tiny_llama):
    """A tiny tied Llama saved as a checkpoint, and the from-scratch weights and config read from it."""
    model = tiny_llama(seed=1, vocab_size=VOCAB, hidden_size=32, intermediate_size=48, num_attention_heads=4,
                       num_key_value_heads=2, rms_norm_eps=1e-6, initializer_range=0.2)
    model.save_pretrained(tmp_path)
    w, cfg = sl.load(tmp_path)
    return model, w, cfg


def _collapse(w, up_then_down) -> float:
    """The notebook's figure: up then down vs the single product matrix, relative, on a random input."""
    up, down = w["model.layers.0.mlp.up_proj.weight"], w["model.layers.0.mlp.down_proj.weight"]
    a = torch.randn(up.shape[1], generator=torch.Generator().manual_seed(0))
    two = up_then_down(a, up, down)
    return ((two - F.linear(a, down @ up)).norm() / two.norm()).item()


def test_linear_pair_with_an_activation_left_in_fails(tiny):
    _, w, _ = tiny
    linear = _collapse(w, lambda x, up, down: F.linear(F.linear(x, up), down))
    broken = _collapse(w, lambda x, up, down: F.linear(F.silu(F.linear(x, up)), down))  # SiLU left in
    assert outcome("internals", "linear_collapse", {"linear_collapse_rel_diff": broken}).held is False
    assert outcome("internals", "linear_collapse", {"linear_collapse_rel_diff": linear}).held is True


def _scratch_diff(model, w, cfg) -> float:
    """The notebook's figure: max |logit difference| to transformers, whole prompt and cached steps."""
    ids = torch.randint(0, VOCAB, (1, 9), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        ref = model(ids).logits
        full = sl.forward(w, cfg, ids)
        cache: list = []
        steps = [sl.forward(w, cfg, ids[:, :4], cache)]
        steps += [sl.forward(w, cfg, ids[:, i:i + 1], cache) for i in range(4, ids.shape[1])]
    return max((full - ref).abs().max().item(), (torch.cat(steps, 1) - ref).abs().max().item())


def test_scratch_forward_with_a_rope_slip_fails(tiny, monkeypatch):
    model, w, cfg = tiny
    right = _scratch_diff(model, w, cfg)
    real_rope = sl.apply_rope
    # the slip: a sign error that rotates each pair the other way
    monkeypatch.setattr(sl, "apply_rope", lambda x, cos, sin: real_rope(x, cos, -sin))
    broken = _scratch_diff(model, w, cfg)
    assert outcome("internals", "scratch_matches", {"scratch_max_diff": broken}).held is False
    assert outcome("internals", "scratch_matches", {"scratch_max_diff": right}).held is True


def _same_tokens(model, w, cfg) -> bool:
    """The notebook's figure: cached, uncached and transformers' greedy tokens all equal."""
    prompt = torch.tensor([[5, 17, 3, 60, 41, 8]])
    cached = sl.generate(partial(sl.forward, w, cfg), prompt, 12, use_cache=True)["tokens"]
    uncached = sl.generate(partial(sl.forward, w, cfg), prompt, 12, use_cache=False)["tokens"]
    hf = model.generate(prompt, max_new_tokens=12, do_sample=False, pad_token_id=0)[0, prompt.shape[1]:]
    hf = hf.tolist()
    return cached == uncached == hf


def test_cache_cropped_one_token_short_changes_tokens(tiny, monkeypatch):
    model, w, cfg = tiny
    right = _same_tokens(model, w, cfg)
    real_forward = sl.forward

    def forward_with_a_short_cache(w_, cfg_, tokens, cache=None, attn_maps=None):
        if cache:  # a decode step: the cache lost its newest token's keys and values
            cache[:] = sl.crop(cache, sl.cache_len(cache) - 1)
        return real_forward(w_, cfg_, tokens, cache, attn_maps)

    monkeypatch.setattr(sl, "forward", forward_with_a_short_cache)
    broken = _same_tokens(model, w, cfg)
    assert outcome("internals", "same_tokens", {"scratch_same_tokens": broken}).held is False
    assert outcome("internals", "same_tokens", {"scratch_same_tokens": right}).held is True


def _attention_diff(attention) -> float:
    """The notebook's figure: written-out attention vs scaled_dot_product_attention, grouped-query."""
    g = torch.Generator().manual_seed(3)
    q, k, v = torch.randn(1, 6, 7, 16, generator=g), torch.randn(1, 2, 7, 16, generator=g), \
        torch.randn(1, 2, 7, 16, generator=g)
    fused = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
    return (attention(q, k, v)[0] - fused).abs().max().item()


def test_attention_without_its_scale_fails(monkeypatch):
    right = _attention_diff(attn.attention)
    monkeypatch.setattr(attn, "math", SimpleNamespace(sqrt=lambda d: 1.0))  # the 1/sqrt(d) scale left out
    broken = _attention_diff(attn.attention)
    assert outcome("internals", "attention_matches", {"attention_max_diff": broken}).held is False
    assert outcome("internals", "attention_matches", {"attention_max_diff": right}).held is True


def _sampling_match(top_p_filter) -> bool:
    """The notebook's figure: the lab's filters against transformers' logits processors."""
    x2 = torch.randn(1, 500, generator=torch.Generator().manual_seed(4)) * 3
    return all([
        torch.equal(sampling.apply_temperature(x2, 0.7), TemperatureLogitsWarper(0.7)(None, x2.clone())),
        *[torch.equal(sampling.top_k_filter(x2, k), TopKLogitsWarper(k)(None, x2.clone()))
          for k in (1, 10, 50)],
        *[torch.equal(top_p_filter(x2, p).isinf(), TopPLogitsWarper(p)(None, x2.clone()).isinf())
          for p in (0.5, 0.9, 0.95)],
    ])


def _top_p_off_by_one(logits, p):
    """The nucleus filter with the classic slip: it drops the token whose probability crosses p."""
    sorted_logits, order = torch.sort(logits, descending=True, dim=-1)
    drop_sorted = sorted_logits.softmax(-1).cumsum(-1) >= p
    drop_sorted[..., 0] = False
    return logits.masked_fill(drop_sorted.scatter(-1, order, drop_sorted), float("-inf"))


def test_top_p_off_by_one_fails():
    broken, right = _sampling_match(_top_p_off_by_one), _sampling_match(sampling.top_p_filter)
    assert outcome("internals", "sampling_matches", {"sampling_matches_transformers": broken}).held is False
    assert outcome("internals", "sampling_matches", {"sampling_matches_transformers": right}).held is True


def _kv_formula(model, w, cfg, short: bool) -> bool:
    """The notebook's figure: transformers' cache, the from-scratch cache and the formula agree."""
    ids = torch.randint(0, VOCAB, (1, 11), generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        hf = cache_tensor_bytes(model(ids, use_cache=True).cache)
        cache: list = []
        sl.forward(w, cfg, ids, cache)
    if short:  # a cache that kept one token too few
        cache = sl.crop(cache, ids.shape[1] - 1)
    formula = kv_cache_bytes(cfg.n_layers, cfg.n_kv_heads, cfg.head_dim, ids.shape[1], dtype_bytes=4)
    return hf == formula == cache_tensor_bytes(cache)


def test_cache_one_token_short_breaks_the_formula(tiny):
    model, w, cfg = tiny
    broken, right = _kv_formula(model, w, cfg, short=True), _kv_formula(model, w, cfg, short=False)
    assert outcome("internals", "kv_formula", {"kv_formula_matches": broken}).held is False
    assert outcome("internals", "kv_formula", {"kv_formula_matches": right}).held is True
