"""AWQ-style activation-aware scaling before round-to-nearest (chapter 06, "Quantization"): a second
baseline beside asymmetric round-to-nearest for GPTQ to be compared with.

AWQ (Lin et al., 2024) starts from an observation: a few input channels of a linear layer carry much
larger activations than the rest, so rounding error in the weights they multiply costs most. It
multiplies input channel ``j`` of the weight by ``s_j = mean|x_j|^alpha`` before rounding and divides
the input by ``s_j`` (deployed, the division folds into the preceding norm or linear layer and costs
nothing), which gives the busy channels a finer grid. ``alpha`` is searched per layer, ``0, 0.05, ...
1``, for the least output error on calibration inputs; ``alpha = 0`` is plain round-to-nearest. Then
the clip search of :func:`labkit.llm.quantize.quantize_weight_asym` runs on the scaled weight.

Simplified, and said so in the chapter: inputs come from the unquantized model (AWQ runs block by
block on already-scaled blocks) and the layer keeps ``Q(W·diag(s))·diag(s)⁻¹`` as float weights, the
weight a deployed layer computes with; its bytes are asymmetric RTN's (the scales fold away).
"""

from __future__ import annotations

import torch
from torch import nn

from . import quantize as Q

ALPHAS = tuple(i / 20 for i in range(21))


@torch.no_grad()
def layer_inputs(model: nn.Module, calib: torch.Tensor, rows: int = 256, seed: int = 0
                 ) -> dict[str, torch.Tensor]:
    """``{layer name: float32 (rows, in_features)}``: ``rows`` input vectors of each linear layer
    :func:`~labkit.llm.quantize.quantizable_linears` selects, sampled (fixed ``seed``) from the tokens of
    the calibration windows ``calib`` ``(windows, tokens)`` run through ``model``."""
    seen: dict[str, list[torch.Tensor]] = {}
    hooks = [lin.register_forward_pre_hook(lambda _m, a, n=name: seen.setdefault(n, []).append(
        a[0].reshape(-1, a[0].shape[-1]).float())) for name, lin in Q.quantizable_linears(model)]
    try:
        for i in range(0, len(calib), 4):  # four windows a pass
            model(calib[i:i + 4].to(next(model.parameters()).device))
    finally:
        for h in hooks:
            h.remove()
    out = {}
    for name, xs in seen.items():
        x = torch.cat(xs)
        pick = torch.randperm(x.shape[0], generator=torch.Generator().manual_seed(seed))[:rows]
        out[name] = x[pick].cpu()
    return out


def scaled_weight(w: torch.Tensor, s: torch.Tensor, bits: int, group_size: int,
                  clip: tuple[float, ...] = (1.0,)) -> torch.Tensor:
    """``Q(w·diag(s))·diag(s)⁻¹`` in float32: ``w`` ``(out, in)`` scaled per input channel by ``s``, rounded
    by asymmetric RTN over the ``clip`` grid, scaled back."""
    parts = Q.quantize_weight_asym(w.float() * s, bits, group_size, clip)
    return Q.dequantize_weight_asym(*parts, bits, w.shape[1], group_size) / s


def search_scale(w: torch.Tensor, x: torch.Tensor, bits: int = 4, group_size: int = 128
                 ) -> tuple[float, torch.Tensor, dict[float, float]]:
    """AWQ's grid search for one layer: ``(best alpha, its per-channel scales, {alpha: output error})``,
    the error ``||x·wᵀ - x·w_qᵀ||²`` on the calibration inputs ``x`` ``(rows, in)``. ``alpha = 0`` (all
    scales 1) is plain asymmetric RTN, so the best is never worse than it."""
    w = w.float()
    mean_abs = x.abs().mean(0).clamp_min(1e-8)
    ref, errs, best = x @ w.t(), {}, (float("inf"), 0.0, torch.ones_like(mean_abs))
    for a in ALPHAS:
        s = mean_abs.pow(a)
        s = s / (s.max() * s.min()).sqrt()  # centred on 1: the grid's scale, not its shape, is what moves
        err = float((ref - x @ scaled_weight(w, s, bits, group_size).t()).square().sum())
        errs[a] = err
        if err < best[0]:
            best = (err, a, s)
    return best[1], best[2], errs


@torch.no_grad()
def awq_model_(model: nn.Module, inputs: dict[str, torch.Tensor], bits: int = 4, group_size: int = 128
               ) -> dict:
    """AWQ-style quantization of ``model`` in place (see the module docstring), each layer's scales
    searched on its ``inputs`` (:func:`layer_inputs`), then the clip search on the scaled weight.
    Returns ``{"alpha": {layer: best alpha}, "gain": {layer: error at alpha 0 / error at the best}}``."""
    report: dict[str, dict[str, float]] = {"alpha": {}, "gain": {}}
    for name, lin in Q.quantizable_linears(model):
        a, s, errs = search_scale(lin.weight, inputs[name], bits, group_size)
        w = scaled_weight(lin.weight, s, bits, group_size, Q.CLIP_GRID)
        lin.weight.copy_(w.to(lin.weight.dtype))
        report["alpha"][name], report["gain"][name] = a, errs[0.0] / max(errs[a], 1e-30)
    return report
