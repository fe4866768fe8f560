"""GPTQ (chapter 06) against direct reconstruction-error computations on small layers."""

import pytest
import torch

from labkit.llm import gptq as G
from labkit.llm import quantize as Q


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
    packed = G.gptq_quantize_model(model, calib, bits=4, group_size=32, progress=False)
    names = [n for n, _ in Q.quantizable_linears(ref)]
    assert sorted(packed) == sorted(names)
    assert len(list((tmp_path / "gptq").glob("*.safetensors"))) == 1
    # the model's weights now hold the dequantized values of the packed tensors
    for n in names:
        qw, sc = packed[n]
        assert torch.equal(model.get_submodule(n).weight, Q.dequantize_weight(qw, sc, 4, qw.shape[1] * 2, 32))
    # a second call on a fresh copy loads the same tensors from the cache
    again = G.gptq_quantize_model(tiny_llama(), calib, bits=4, group_size=32, progress=False)
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
        G.autogptq_quantize("Qwen/Qwen2.5-1.5B")
    assert "gptqmodel" in str(e.value) and "gptq_quantize_model" in str(e.value)
