"""From-scratch forward pass vs transformers (labkit.llm.scratch_llama, chapter 03)."""

from functools import partial
from typing import Any

import pytest
import torch

from labkit.llm import scratch_llama as sl
from labkit.llm.kvcache import cache_tensor_bytes, kv_cache_bytes


def _tiny(tmp_path, kind, tiny_llama):
    from transformers import Qwen3Config, Qwen3ForCausalLM

    common = dict(hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, vocab_size=97, rms_norm_eps=1e-6)
    if kind == "llama":
        model = tiny_llama(**common, tie_word_embeddings=True)
    else:
        torch.manual_seed(0)
        model = Qwen3ForCausalLM(Qwen3Config(**common, head_dim=16, tie_word_embeddings=False))
    model.eval().save_pretrained(tmp_path)
    return model


def _check_against(model, w, cfg, ids, atol):
    with torch.no_grad():
        ref = model(ids).logits
        full = sl.forward(w, cfg, ids)
        cache: list[Any] = []
        steps = [sl.forward(w, cfg, ids[:, :3], cache)]
        steps += [sl.forward(w, cfg, ids[:, i:i + 1], cache) for i in range(3, ids.shape[1])]
    assert (full - ref).abs().max() <= atol
    assert (torch.cat(steps, 1) - ref).abs().max() <= atol
    return cache


@pytest.mark.parametrize("kind", ["llama", "qwen3"])
def test_tiny_models_match_transformers(tmp_path, kind, tiny_llama):
    model = _tiny(tmp_path, kind, tiny_llama)
    w, cfg = sl.load(tmp_path)
    ids = torch.randint(0, 97, (2, 9), generator=torch.Generator().manual_seed(1))
    cache = _check_against(model, w, cfg, ids, atol=1e-5)
    assert sl.cache_len(cache) == 9
    assert cache_tensor_bytes(cache) == kv_cache_bytes(2, 2, cfg.head_dim, 9, dtype_bytes=4, batch=2)


def test_generate_with_and_without_cache_agree(tmp_path, tiny_llama):
    _tiny(tmp_path, "llama", tiny_llama)
    w, cfg = sl.load(tmp_path)
    prompt = torch.tensor([[5, 17, 3]])
    fw = partial(sl.forward, w, cfg)
    a, b = sl.generate(fw, prompt, 6, use_cache=True), sl.generate(fw, prompt, 6, use_cache=False)
    assert a["tokens"] == b["tokens"] and len(a["step_s"]) == 5


def test_decode_step_seconds_reuses_a_cropped_cache(tmp_path, tiny_llama):
    _tiny(tmp_path, "llama", tiny_llama)
    w, cfg = sl.load(tmp_path)
    tokens = torch.randint(0, 97, (1, 12), generator=torch.Generator().manual_seed(2))
    long_cache: list[Any] = []
    sl.forward(w, cfg, tokens[:, :10], long_cache)
    short = sl.crop(long_cache, 4)
    assert sl.cache_len(short) == 4 and sl.cache_len(long_cache) == 10
    with torch.no_grad():  # a cropped cache continues exactly like a fresh one
        fresh: list[Any] = []
        sl.forward(w, cfg, tokens[:, :4], fresh)
        nxt = tokens[:, 4:5]
        assert torch.allclose(sl.forward(w, cfg, nxt, short), sl.forward(w, cfg, nxt, fresh), atol=1e-5)
    assert sl.cache_len(long_cache) == 10  # the crop left the original alone
    for use_cache in (True, False):
        times = sl.decode_step_seconds(partial(sl.forward, w, cfg), tokens, 8, use_cache, steps=3,
                                       prefilled=long_cache)
        assert len(times) == 3 and all(t > 0 for t in times)
    with pytest.raises(ValueError, match="at least"):
        sl.decode_step_seconds(partial(sl.forward, w, cfg), tokens, 11, True, steps=3)


def test_rope_keeps_norms_and_rejects_scaled_rope():
    small = dict(hidden_size=8, num_hidden_layers=1, num_attention_heads=2, intermediate_size=8, vocab_size=4,
                 rms_norm_eps=1e-6)
    cfg = sl.config_from_dict(small)
    cos, sin = sl.rope_cos_sin(cfg, torch.arange(5), torch.float32)
    x = torch.randn(1, 2, 5, 4)
    assert torch.allclose(sl.apply_rope(x, cos, sin).norm(dim=-1), x.norm(dim=-1), atol=1e-6)
    with pytest.raises(ValueError, match="not implemented"):
        sl.config_from_dict({**small, "rope_scaling": {"rope_type": "llama3"}})


@pytest.mark.slow
def test_bundled_model_matches_transformers_fp32():
    from labkit.models import llm_dir, load_llm
    from labkit.settings import set_threads

    set_threads()
    model, tok = load_llm(dtype="float32")
    w, cfg = sl.load(llm_dir("float32"))
    assert (cfg.n_heads, cfg.n_kv_heads, cfg.head_dim) == (9, 3, 64)
    ids = tok("Attention lets each token look at the tokens before it.", return_tensors="pt").input_ids
    _check_against(model, w, cfg, ids, atol=1e-4)
    hf = model.generate(ids, max_new_tokens=8, do_sample=False)[0, ids.shape[1]:].tolist()
    assert sl.generate(partial(sl.forward, w, cfg), ids, 8)["tokens"] == hf


def test_power_law_exponent_fits_every_point():
    n = [32, 64, 128, 256, 512]
    assert sl.power_law_exponent(n, [3e-6 * x**2 for x in n]) == pytest.approx(2.0)
    assert sl.power_law_exponent(n, [0.09] * 5) == pytest.approx(0.0, abs=1e-12)
    noisy = [0.05 * x * f for x, f in zip(n, [1.3, 1.0, 1.0, 1.0, 0.8], strict=True)]  # endpoints off
    two_point = torch.tensor(noisy[-1] / noisy[0]).log().item() / torch.tensor(16.0).log().item()
    assert abs(sl.power_law_exponent(n, noisy) - 1) < abs(two_point - 1)
    with pytest.raises(ValueError, match="three"):
        sl.power_law_exponent([1, 2], [1.0, 2.0])


def test_kv_scaling_sentence_says_which_work_dominates():
    below = sl.kv_scaling_sentence(0.90, 0.06, 512, 3892)
    assert "n^0.90" in below and "n^0.06" in below and "3,892 tokens" in below and "weights outweigh" in below
    assert "attention outweighs" in sl.kv_scaling_sentence(1.8, 0.9, 65536, 3892)
