"""Quantizing what the model computes at run time (chapter 06, "what to quantize, by risk").

An INT8 KV cache (per token and head, :func:`quantize_kv`, :func:`quantize_cache_`; KIVI-style,
:func:`fake_quant_kivi`), INT8 activations at the inputs of linear layers (per token,
:func:`activation_quant`) and 8-bit attention probabilities (:func:`attention_quant`), each a fake
quantization that rounds values exactly as the stored format would, so their effect on the real
model's output can be measured. The weights' own rounding: :mod:`labkit.llm.quantize`.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch
from torch import nn

from .quantize import MIN_SCALE, SCALE_DTYPE, QuantLinear, qmax, quantizable_linears, round_to_grid


def quantize_kv(x: torch.Tensor, bits: int = 8) -> tuple[torch.Tensor, torch.Tensor]:
    """Quantize keys or values ``(batch, heads, tokens, head_dim)`` with one float16 scale per
    token and head: ``(int8 codes, scales (batch, heads, tokens, 1))``."""
    scale = (x.float().abs().amax(-1, keepdim=True) / qmax(bits)).clamp_min(MIN_SCALE).to(SCALE_DTYPE)
    return round_to_grid(x, scale, bits), scale


def dequantize_kv(q: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Inverse of :func:`quantize_kv` in ``dtype``."""
    return q.to(dtype) * scale.to(dtype)


KIVI_GROUP = 32  # KIVI's group: keys over 32 tokens per channel, values over 32 channels per token


def fake_quant_asym(x: torch.Tensor, bits: int, dim: int, group: int = KIVI_GROUP) -> torch.Tensor:
    """``x`` rounded asymmetrically, as KIVI (Liu et al., 2024) stores its cache: each run of ``group``
    consecutive entries along ``dim`` keeps a float16 minimum and scale, ``x ≈ min + scale·code`` with
    codes 0..2^bits-1 (a partial last run is padded with its own last entry). Returns ``x``'s shape
    and dtype."""
    xm = x.float().movedim(dim, -1)
    n, pad, maxq = xm.shape[-1], (-xm.shape[-1]) % group, 2**bits - 1
    g = torch.cat([xm, xm[..., -1:].expand(*xm.shape[:-1], pad)], -1).unflatten(-1, (-1, group))
    lo = g.amin(-1, keepdim=True).to(SCALE_DTYPE).float()
    scale = ((g.amax(-1, keepdim=True) - lo) / maxq).clamp_min(MIN_SCALE).to(SCALE_DTYPE).float()
    out = torch.clamp(torch.round((g - lo) / scale), 0, maxq) * scale + lo
    return out.flatten(-2)[..., :n].movedim(-1, dim).to(x.dtype)


def fake_quant_kivi(key: torch.Tensor, value: torch.Tensor, bits: int = 4, group: int = KIVI_GROUP
                    ) -> tuple[torch.Tensor, torch.Tensor]:
    """Keys and values ``(batch, heads, tokens, head_dim)`` rounded as KIVI stores them: asymmetric
    (:func:`fake_quant_asym`), keys per channel over ``group`` tokens, values per token over ``group``
    channels. Keys have a few channels that are large in every token: a per-token scale spends its
    range on them and rounds the rest coarsely, a per-channel one does not. (KIVI also keeps the
    newest tokens, not yet a full group, unrounded; here every token is rounded.) Storage: 2 float16
    numbers per ``group`` codes, so ``bits + 32 / group`` bits per element
    (:func:`labkit.llm.kvcache.kv_bits_per_element`)."""
    return fake_quant_asym(key, bits, -2, group), fake_quant_asym(value, bits, -1, group)


def quantize_cache_(cache: Any, bits: int = 8) -> dict[str, int]:
    """Round every layer's keys and values of a transformers cache through :func:`quantize_kv`,
    in place (attention then reads exactly what an INT8 cache would hand it). Returns
    ``{"fp_bytes": bytes of the cache as it was, "q_bytes": bytes of the codes and scales}``."""
    fp = qb = 0
    for layer in cache.layers:
        for attr in ("keys", "values"):
            t = getattr(layer, attr)
            q, s = quantize_kv(t, bits)
            fp += t.numel() * t.element_size()
            qb += q.numel() * q.element_size() + s.numel() * s.element_size()
            setattr(layer, attr, dequantize_kv(q, s, t.dtype))
    return {"fp_bytes": fp, "q_bytes": qb}


def fake_quant_per_token(x: torch.Tensor, bits: int = 8) -> torch.Tensor:
    """Round ``x`` to a symmetric ``bits``-bit grid with one scale per row of the last dimension
    (per token for activations ``(batch, tokens, features)``), back in ``x``'s dtype."""
    scale = (x.float().abs().amax(-1, keepdim=True) / qmax(bits)).clamp_min(1e-12)
    return (round_to_grid(x, scale, bits).float() * scale).to(x.dtype)


@contextlib.contextmanager
def activation_quant(model: nn.Module, bits: int = 8, skip: tuple[str, ...] = ("lm_head",)) -> Iterator[int]:
    """Within the block, every linear layer :func:`quantizable_linears` selects (or a QuantLinear)
    sees its input fake-quantized per token to ``bits``. Yields the number of layers hooked."""
    mods = [m for _, m in quantizable_linears(model, skip)]
    mods += [m for n, m in model.named_modules()
             if isinstance(m, QuantLinear) and n.split(".")[-1] not in skip]
    hooks = [m.register_forward_pre_hook(lambda _m, args: (fake_quant_per_token(args[0], bits),) + args[1:])
             for m in mods]
    try:
        yield len(hooks)
    finally:
        for h in hooks:
            h.remove()


_ATTN = "labkit_quant_attention"
_ATTN_BITS: dict[str, int | None] = {"kv": None, "probs": None, "kivi": None, "rows": None}


def _quant_attention(module: Any, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                     attention_mask: torch.Tensor | None, scaling: float, dropout: float = 0.0,
                     **kwargs: Any) -> tuple[torch.Tensor, torch.Tensor]:
    """Eager attention with optional fake-quantized K/V (per token and head, or KIVI-style) and
    probabilities (unsigned, one scale per query row; only the first ``rows`` query rows when set)."""
    if _ATTN_BITS["kv"]:
        if _ATTN_BITS["kivi"]:
            key, value = fake_quant_kivi(key, value, _ATTN_BITS["kv"])
        else:
            key = dequantize_kv(*quantize_kv(key, _ATTN_BITS["kv"]), key.dtype)
            value = dequantize_kv(*quantize_kv(value, _ATTN_BITS["kv"]), value.dtype)
    groups = query.shape[1] // key.shape[1]
    key, value = key.repeat_interleave(groups, 1), value.repeat_interleave(groups, 1)
    scores = torch.matmul(query, key.transpose(2, 3)) * scaling
    if attention_mask is not None:
        scores = scores + attention_mask[:, :, :, : key.shape[-2]]
    probs = torch.softmax(scores, dim=-1, dtype=torch.float32)
    if _ATTN_BITS["probs"]:
        levels = 2 ** _ATTN_BITS["probs"] - 1
        step = probs.amax(-1, keepdim=True) / levels
        rounded, rows = torch.round(probs / step) * step, _ATTN_BITS["rows"]
        probs = rounded if rows is None else torch.cat([rounded[..., :rows, :], probs[..., rows:, :]], dim=-2)
    out = torch.matmul(probs.to(query.dtype), value)
    return out.transpose(1, 2).contiguous(), probs


@contextlib.contextmanager
def attention_quant(model: nn.Module, kv_bits: int | None = None, probs_bits: int | None = None,
                    kivi: bool = False, probs_rows: int | None = None) -> Iterator[None]:
    """Within the block, the model's attention runs :func:`_quant_attention` (eager, with an eager
    mask) with K/V rounded to ``kv_bits`` and/or the softmax output to ``probs_bits``. K/V are rounded
    per token and head (symmetric, :func:`quantize_kv`), or KIVI-style with ``kivi``
    (:func:`fake_quant_kivi`: asymmetric, keys per channel, values per token). ``probs_rows``: round
    only the first that many query rows' probabilities (in a pass over a whole window without a
    cache, row i is position i), the rest kept exact."""
    from transformers import AttentionInterface
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, eager_mask

    AttentionInterface.register(_ATTN, _quant_attention)
    ALL_MASK_ATTENTION_FUNCTIONS.register(_ATTN, eager_mask)
    before = model.config._attn_implementation
    _ATTN_BITS.update(kv=kv_bits, probs=probs_bits, kivi=int(kivi), rows=probs_rows)
    model.config._attn_implementation = _ATTN
    try:
        yield
    finally:
        model.config._attn_implementation = before
        _ATTN_BITS.update(kv=None, probs=None, kivi=None, rows=None)
