"""labkit.llm.awq (chapter 06): the AWQ-style scale search against plain asymmetric round-to-nearest."""

import torch

from labkit.llm import awq
from labkit.llm import quantize as Q


def _layer(busy: float = 30.0, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(64, 256, generator=g) * 0.05
    x = torch.randn(512, 256, generator=g)
    x[:, :4] *= busy  # four input channels carry much larger activations, as in a trained model
    return w, x


def test_scales_of_one_are_plain_asymmetric_rtn():
    w, _ = _layer()
    parts = Q.quantize_weight_asym(w, 4, 128, (1.0,))
    plain = Q.dequantize_weight_asym(*parts, 4, w.shape[1], 128)
    assert torch.equal(awq.scaled_weight(w, torch.ones(w.shape[1]), 4, 128), plain)


def test_search_protects_the_busy_channels():
    w, x = _layer()
    alpha, s, errs = awq.search_scale(w, x, bits=4, group_size=128)
    assert min(errs.values()) == errs[alpha] <= errs[0.0]  # alpha = 0 is in the grid: never worse
    assert alpha > 0 and errs[alpha] < 0.8 * errs[0.0]  # busy channels: scaling them pays
    assert s[:4].min() > s[4:].max()  # the busy channels got the largest scales


def test_awq_model_lowers_output_error_on_its_inputs(tiny_llama):
    model = tiny_llama()
    calib = torch.randint(0, 256, (4, 32), generator=torch.Generator().manual_seed(0))
    inputs = awq.layer_inputs(model, calib, rows=64)
    assert set(inputs) == {n for n, _ in Q.quantizable_linears(model)}
    rep = awq.awq_model_(model, inputs, bits=4, group_size=32)
    assert all(g >= 1 for g in rep["gain"].values())
    assert set(rep["alpha"].values()) <= set(awq.ALPHAS)
