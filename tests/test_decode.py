"""labkit.llm.decode: the one timed greedy-decode loop (gpucheck, chapters 04 and 06), checked against
transformers' own greedy generate on a tiny random Llama, plus its roofline figures (chapter 04)."""

from types import SimpleNamespace

import numpy as np
import pytest
import torch

from labkit.hardware import roofline
from labkit.llm import decode, kvcache

# A config build_model reads (model_type included), as a shipped config.json would be.
TINY = dict(model_type="llama", vocab_size=96, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128)


@pytest.fixture(scope="module")
def llama(tiny_llama):
    """conftest's tiny random Llama, without an end-of-sequence token (generate never stops early) and
    with untied embeddings (tied ones make a random model repeat its last token)."""
    return tiny_llama(seed=0, bos_token_id=None, eos_token_id=None, tie_word_embeddings=False)


@pytest.mark.parametrize(("version", "kwarg"), [
    ("4.51.3", "torch_dtype"), ("4.55.4", "torch_dtype"), ("4.56.0", "dtype"),
    ("4.57.0.dev0", "dtype"), ("5.0.0rc1", "dtype"), ("5.24.0", "dtype"),
])
def test_dtype_kwarg_follows_transformers_version(version, kwarg):
    assert decode.dtype_kwarg(version) == kwarg


def test_build_model_makes_the_config_in_the_dtype():
    model = decode.build_model(TINY, "float32", "cpu")
    assert type(model).__name__ == "LlamaForCausalLM" and not model.training
    assert model.config.num_hidden_layers == 2 and model.config.vocab_size == 96
    assert {p.dtype for p in model.parameters()} == {torch.float32}
    bf16 = decode.build_model(TINY, "bfloat16", "cpu")
    assert {p.dtype for p in bf16.parameters()} == {torch.bfloat16}


@pytest.mark.parametrize(("tokens", "warmup"), [(6, 2), (3, 0)])
def test_greedy_tokens_equal_generate_and_every_step_is_timed(llama, tokens, warmup):
    prompt = torch.tensor([[5, 17, 42, 8, 3, 60, 11]])
    run = decode.greedy_decode(llama, prompt, tokens, "cpu", warmup=warmup)
    n_new = 1 + warmup + tokens  # the prefill's token, the warm-up steps' and the timed steps'
    with torch.inference_mode():
        gen = llama.generate(prompt, attention_mask=torch.ones_like(prompt), do_sample=False,
                                  max_new_tokens=n_new, pad_token_id=0)
    new = gen[0, prompt.shape[1]:].tolist()
    assert len(set(new)) > 2, "a constant continuation would not test the order of the tokens"
    assert run.token_ids == new[1 + warmup:]
    assert len(run.step_s) == tokens and (run.step_s > 0).all()
    assert run.tokens_per_s == pytest.approx(1.0 / float(np.median(run.step_s)))
    held = kvcache.cache_tensor_bytes(run.cache)
    config = llama.config.to_dict()
    assert held == kvcache.kv_cache_bytes_for_config(config, prompt.shape[1] + warmup + tokens, dtype_bytes=4)


class FakeLM:
    """Logits put all weight on (last input token + 1) % vocab; the cache is the list of fed tokens."""

    vocab = 50

    def __init__(self):
        self.fed = []

    def __call__(self, ids, use_cache=True, **kw):
        return self.forward(ids, use_cache=use_cache, **kw)

    def forward(self, ids, cache=None, use_cache=True):
        cache = (cache or []) + ids[0].tolist()
        self.fed.append(ids[0].tolist())
        logits = torch.zeros(1, ids.shape[1], self.vocab)
        logits[0, -1, (int(ids[0, -1]) + 1) % self.vocab] = 1.0
        return SimpleNamespace(logits=logits, cache=cache)


class OldFakeLM(FakeLM):
    """The same, with the pre-5.x keyword and output field ``past_key_values``."""

    def forward(self, ids, past_key_values=None, use_cache=True):
        out = super().forward(ids, cache=past_key_values, use_cache=use_cache)
        return SimpleNamespace(logits=out.logits, past_key_values=out.cache)


@pytest.mark.parametrize(("cls", "name"), [(FakeLM, "cache"), (OldFakeLM, "past_key_values")])
def test_greedy_decode_threads_the_cache_and_feeds_the_argmax(cls, name):
    model = cls()
    assert decode.cache_argument(model) == name
    run = decode.greedy_decode(model, torch.tensor([[7, 8, 9]]), tokens=4, device="cpu", warmup=2)
    assert len(run.step_s) == 4 and (run.step_s > 0).all()
    assert model.fed[0] == [7, 8, 9] and model.fed[1:] == [[10], [11], [12], [13], [14], [15]]
    assert run.cache == [7, 8, 9, 10, 11, 12, 13, 14, 15]  # prompt + warmup + timed tokens
    assert run.token_ids == [13, 14, 15, 16]  # what the timed steps produced


def test_step_figures_are_the_roofline_formulas():
    f = decode.step_figures(params=1e9, weight_bytes=2e9, kv_bytes=1e8, prefill_tokens=128, prefill_s=0.5,
                            tokens_per_s=20.0, bandwidth=100e9)
    assert f["bytes_per_token"] == pytest.approx(2.1e9)
    assert f["decode_ai"] == pytest.approx(2e9 / 2.1e9)  # 2 FLOPs per parameter, one token
    assert f["prefill_ai"] == pytest.approx(128 * 2e9 / 2.1e9)
    assert f["prefill_flops"] == pytest.approx(2e9 * 128 / 0.5)
    assert f["decode_flops"] == pytest.approx(2e9 * 20)
    assert f["ceiling"] == pytest.approx(100e9 / 2.1e9)
    assert f["achieved"] == pytest.approx(20 * 2.1e9 / 100e9)
    assert f["achieved"] == pytest.approx(20 / f["ceiling"])


def test_interleaved_decode_alternates_the_models(llama, monkeypatch):
    order: list[str] = []

    def bandwidth(device, repeats=3):
        order.append("bw")
        return {"gbps_best": 10.0 + len(order)}

    monkeypatch.setattr(decode.microbench, "memory_bandwidth", bandwidth)
    real = decode.greedy_decode

    def spy(model, *a, **k):
        order.append(model.name)
        return real(model.inner, *a, **k)

    monkeypatch.setattr(decode, "greedy_decode", spy)
    models = {n: _Wrap(n, llama) for n in ("a", "b")}
    prompt, prefill = torch.tensor([[1, 2, 3, 4]]), torch.randint(0, 96, (1, 16))
    res, bws = decode.interleaved_decode(models, prompt, prefill, "cpu", tokens=3, rounds=2)
    assert order == ["a", "bw", "b", "bw", "a", "bw", "b", "bw"]
    assert bws == pytest.approx([12e9, 14e9, 16e9, 18e9])  # one sample after each model, in bytes/s
    assert set(res) == {"a", "b"}
    for r in res.values():
        assert r["prefill_s"] > 0 and r["tps"] > 0 and r["context"] == 4 + decode.DECODE_WARMUP + 3
        assert len(r["tps_rounds"]) == 2 and r["tps"] == pytest.approx(float(np.median(r["tps_rounds"])))


class _Wrap:
    """A model under a name, so the spy can tell the two apart; forwards to the tiny Llama."""

    def __init__(self, name, inner):
        self.name, self.inner = name, inner

    def __call__(self, *a, **k):
        return self.inner(*a, **k)


def test_random_model_run_on_the_cpu():
    f = decode.random_model_run(TINY, "float32", "cpu", tokens=4, prefill=16, bandwidth=10e9, prompt_tokens=8)
    assert type(f["model"]).__name__ == "LlamaForCausalLM" and f["build_s"] > 0
    assert len(f["decode"].step_s) == 4 and f["decode"].cache is None
    assert f["context"] == 8 + decode.DECODE_WARMUP + 4 and f["prompt_tokens"] == 8
    assert f["kv"] == kvcache.kv_cache_bytes_for_config(TINY, f["context"], 4)
    assert f["cache_bytes"] == f["kv"]  # what transformers' cache held = the formula
    assert f["params"] == sum(p.numel() for p in f["model"].parameters())
    assert 4 * f["params"] <= f["weights"] < 1.01 * 4 * f["params"]  # float32 weights, plus small buffers
    assert f["prefill_s"] > 0
    assert f["ceiling"] == pytest.approx(roofline.decode_ceiling_tokens_per_s(10e9, f["weights"] + f["kv"]))
