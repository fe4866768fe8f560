"""GPTQ (chapter 06) against direct reconstruction-error computations on small layers."""

import math

import pytest
import torch

from labkit.llm import gptq as G
from labkit.llm import quantize as Q
from labkit.llm.autogptq import autogptq_quantize


def correlated_layer(seed: int = 0, n_out: int = 96, n_in: int = 256, tokens: int = 1024):
    """A weight and inputs whose features are strongly correlated (low rank plus noise), as a
    transformer's activations are."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(tokens, 16, generator=g) @ torch.randn(16, n_in, generator=g)
    x += 0.05 * torch.randn(tokens, n_in, generator=g)
    w = torch.randn(n_out, n_in, generator=g) * 0.1
    return w, x


def direct_error(w, wq, x):
    return float(torch.linalg.norm(x @ w.t() - x @ wq.t()))


@pytest.mark.parametrize("bits,group,act_order",
                         [(4, 64, False), (4, 64, True), (4, None, False), (8, None, False)])
def test_gptq_reconstructs_better_than_rtn(bits, group, act_order):
    w, x = correlated_layer()
    h = 2 * x.t() @ x / x.shape[0]
    qw, sc, deq = G.gptq_quantize_weight(w, h, bits, group, act_order=act_order)
    rq, rs = Q.quantize_weight(w, bits, group)
    rtn = Q.dequantize_weight(rq, rs, bits, w.shape[1], group)
    e_gptq, e_rtn = direct_error(w, deq, x), direct_error(w, rtn, x)
    assert e_gptq < 0.7 * e_rtn, (e_gptq, e_rtn)
    assert G.layer_error(w, deq, x) == pytest.approx(e_gptq / float(torch.linalg.norm(x @ w.t())), rel=1e-4)
    # the same storage as round-to-nearest: packed codes and float16 scales of the same shapes
    assert qw.dtype == rq.dtype and qw.shape == rq.shape and sc.shape == rs.shape and sc.dtype == rs.dtype
    assert torch.equal(Q.dequantize_weight(qw, sc, bits, w.shape[1], group), deq)


def test_gptq_generalizes_to_fresh_inputs_from_the_same_distribution():
    w, x = correlated_layer(seed=1, tokens=2048)
    h = 2 * x[:1024].t() @ x[:1024] / 1024
    _, _, deq = G.gptq_quantize_weight(w, h, 4, 64)
    rq, rs = Q.quantize_weight(w, 4, 64)
    held = x[1024:]
    assert direct_error(w, deq, held) < 0.7 * direct_error(w, Q.dequantize_weight(rq, rs, 4, 256, 64), held)


def test_gptq_with_uncorrelated_inputs_is_round_to_nearest():
    # a diagonal Hessian gives no other column to push an error onto: GPTQ reduces to RTN exactly
    w, _ = correlated_layer(seed=2)
    h = torch.diag(torch.rand(256) + 0.5)
    qw, sc, _ = G.gptq_quantize_weight(w, h, 4, 64)
    rq, rs = Q.quantize_weight(w, 4, 64)
    assert torch.equal(qw, rq) and torch.equal(sc, rs)


def test_upper_cholesky_of_the_inverse_matches_the_papers_three_steps():
    _, x = correlated_layer(seed=4)
    h = (2 * x.t() @ x / x.shape[0]).double() + 0.01 * torch.eye(256, dtype=torch.float64)
    ref = torch.linalg.cholesky(torch.cholesky_inverse(torch.linalg.cholesky(h)), upper=True)
    u = G._upper_cholesky_of_inverse(h)
    assert torch.allclose(u, ref, atol=1e-9) and torch.allclose(u, u.triu())


def test_dead_inputs_are_zeroed():
    w, x = correlated_layer(seed=3)
    x[:, :8] = 0  # features never active in calibration
    _, _, deq = G.gptq_quantize_weight(w, 2 * x.t() @ x, 4, 64)
    assert torch.all(deq[:, :8] == 0)


def test_gptq_model_sequential_and_cached(tmp_path, monkeypatch, tiny_llama):
    monkeypatch.setenv("LABKIT_CACHE", str(tmp_path))
    model = tiny_llama()
    ref = tiny_llama()
    calib = torch.randint(0, 256, (4, 32))
    cold: dict = {}
    packed = G.gptq_quantize_model(model, calib, bits=4, group_size=32, progress=False, timing=cold)
    assert cold["cached"] is False and cold["seconds"] > 0 and cold["threads"] >= 1
    names = [n for n, _ in Q.quantizable_linears(ref)]
    assert sorted(packed) == sorted(names)
    assert len(list((tmp_path / "gptq").glob("*.safetensors"))) == 1
    # the model's weights now hold the dequantized values of the packed tensors
    for n in names:
        qw, sc = packed[n]
        assert torch.equal(model.get_submodule(n).weight, Q.dequantize_weight(qw, sc, 4, qw.shape[1] * 2, 32))
    # a second call on a fresh copy loads the same tensors from the cache
    warm: dict = {}
    again = G.gptq_quantize_model(tiny_llama(), calib, bits=4, group_size=32, progress=False, timing=warm)
    assert warm == {**cold, "cached": True}  # the cold cost travels with the cached result
    assert all(torch.equal(a, b) for n in names for a, b in zip(again[n], packed[n], strict=True))
    rtn = tiny_llama()
    Q.quantize_model(rtn, 4, 32)
    Q.quantize_model(model, 4, 32, quantized=packed)
    with torch.no_grad():
        fp, gq, rq = (m(calib).logits for m in (ref, model, rtn))
    assert float((gq - fp).norm()) < float((rq - fp).norm())


def test_calibration_windows_shape_and_shortage():
    class Tok:
        def __call__(self, text, return_tensors=None):
            return type("E", (), {"input_ids": torch.arange(len(text))[None]})()

    assert G.calibration_windows(Tok(), "x" * 300, 2, 128).shape == (2, 128)
    with pytest.raises(ValueError):
        G.calibration_windows(Tok(), "x" * 100, 2, 128)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message shown on machines without CUDA")
def test_autogptq_explains_why_it_cannot_run_without_cuda():
    with pytest.raises(RuntimeError, match="CUDA") as e:
        autogptq_quantize("Qwen/Qwen2.5-1.5B")
    assert "gptqmodel" in str(e.value) and "gptq_quantize_model" in str(e.value)


def test_damping_rises_tenfold_until_the_cholesky_succeeds():
    _, x = correlated_layer(seed=5, n_in=64, tokens=8)  # 8 tokens, 64 inputs: H has rank 8
    h = 2 * x.t() @ x / 8
    assert G.hessian_rank(h) == 8
    _, used = G.damped_cholesky(h, damp=1e-8)
    assert used > 1e-8 and math.log10(used / 1e-8) == pytest.approx(round(math.log10(used / 1e-8)))
    x_full = correlated_layer(seed=5, n_in=64, tokens=512)[1]
    full = 2 * x_full.t() @ x_full
    assert G.hessian_rank(full + torch.eye(64)) == 64 and G.damped_cholesky(full, 0.01)[1] == 0.01
    info: dict = {}
    w = torch.randn(16, 64)
    G.gptq_quantize_weight(w, h, 4, 32, damp=1e-8, info=info)
    assert info["damp"] == used  # the weight's quantization used what damped_cholesky needed
    with pytest.raises(torch.linalg.LinAlgError):
        G.damped_cholesky(-torch.eye(4), 0.01)  # no damping of a negative-definite matrix helps


def _mixed_attention_model():
    """A tiny Qwen2 whose first layer attends within a sliding window of 4 tokens, its second fully."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    cfg = Qwen2Config(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2,
                      layer_types=["sliding_attention", "full_attention"], sliding_window=4,
                      use_sliding_window=True, max_window_layers=0)
    cfg._attn_implementation = "eager"
    return Qwen2ForCausalLM(cfg).eval()


def _masks_seen(model, run):
    """The attention mask each decoder layer is called with while ``run()`` runs."""
    seen: dict[int, list] = {0: [], 1: []}

    def keep(i):
        return lambda _m, _a, kw: seen[i].append(kw["attention_mask"].clone())

    hooks = [layer.register_forward_pre_hook(keep(i), with_kwargs=True)
             for i, layer in enumerate(model.model.layers)]
    try:
        run()
    finally:
        for h in hooks:
            h.remove()
    return seen


def test_each_layer_is_calibrated_with_its_own_attention_mask(tmp_path, monkeypatch):
    monkeypatch.setenv("LABKIT_CACHE", str(tmp_path))
    model = _mixed_attention_model()
    calib = torch.randint(0, 256, (2, 12), generator=torch.Generator().manual_seed(0))
    first, kwargs = G.layer_inputs(model, model.model.layers, calib)
    assert len(first) == 2 and [len(k) for k in kwargs] == [2, 2]
    sliding, full = kwargs[0][0]["attention_mask"], kwargs[1][0]["attention_mask"]
    assert int((sliding == 0).sum()) < int((full == 0).sum())  # the window hides tokens a full layer sees
    with torch.no_grad():
        plain = _masks_seen(model, lambda: model(calib[:1], use_cache=False))
    report: dict = {}
    kw = dict(bits=4, group_size=32, progress=False, rank_layers=(1,))
    during = _masks_seen(model, lambda: G.gptq_quantize_model(model, calib, report=report, **kw))
    for i in (0, 1):  # every call GPTQ makes to layer i carries the mask the model itself gives layer i
        assert during[i] and all(torch.equal(m, plain[i][0]) for m in during[i])
    assert not torch.equal(plain[0][0], plain[1][0])
    assert report["tokens"] == 24 and all(r["damp"] == 0.01 for n, r in report.items() if n != "tokens")
    ranked = {n for n, r in report.items() if n != "tokens" and "rank" in r}
    assert ranked and all(n.startswith("model.layers.1.") for n in ranked)
    again: dict = {}
    G.gptq_quantize_model(_mixed_attention_model(), calib, report=again, **kw)
    assert again == report  # the report comes back with the cached tensors


def test_hessian_error_is_the_output_error_on_the_calibration_inputs():
    g = torch.Generator().manual_seed(2)
    x, e = torch.randn(200, 24, generator=g), torch.randn(5, 24, generator=g)
    h = G.hessian_of(x)
    assert torch.allclose(h, 2 * x.t() @ x / 200)
    per_row = G.hessian_error(e, h)
    assert per_row.shape == (5,)
    assert torch.allclose(per_row, 2 * (x @ e.t()).pow(2).mean(0), rtol=1e-4)  # 2 mean ||e x||², per row


def test_gptq_model_reports_its_own_and_rtns_calibration_error(tmp_path, monkeypatch, tiny_llama):
    monkeypatch.setenv("LABKIT_CACHE", str(tmp_path))
    model = tiny_llama()
    calib = torch.randint(0, 256, (3, 40), generator=torch.Generator().manual_seed(1))
    report: dict = {}
    G.gptq_quantize_model(model, calib, bits=4, group_size=32, act_order=True, progress=False, report=report)
    layers = {n: r for n, r in report.items() if n != "tokens"}
    assert layers and all(0 < r["calib_err_gptq"] < r["calib_err_rtn"] for r in layers.values())
    again: dict = {}  # a cached run hands back the same report
    G.gptq_quantize_model(tiny_llama(), calib, bits=4, group_size=32, act_order=True, progress=False,
                          report=again)
    assert again == report
