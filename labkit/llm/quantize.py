"""Round-to-nearest quantization, done by hand (chapter 06, "Quantization").

Weights: symmetric INT8 with one scale per output channel, and INT4 with one scale per group of
``group_size`` input columns (128 by default), stored for real: INT4 codes packed two per byte in a
``uint8`` tensor, scales in float16. :class:`QuantLinear` keeps only those tensors and dequantizes
the weight on every call before an ordinary matmul (no fused low-bit kernel: memory shrinks, speed
need not improve). :func:`quantize_model` swaps a model's linear layers (never the embedding or a
head tied to it) and reports weight bytes measured from the tensors.

Beyond weights, for the tutorial's "what to quantize, by risk": an INT8 KV cache (per token and
head, :func:`quantize_kv`, :func:`quantize_cache_`), INT8 activations at the inputs of linear
layers (per token, :func:`activation_quant`) and 8-bit attention probabilities
(:func:`attention_quant`), each a fake quantization that rounds values exactly as the stored format
would, so their effect on the real model's output can be measured.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch
from torch import nn

SCALE_DTYPE = torch.float16
_MIN_SCALE = 2.0**-24  # smallest float16 subnormal: keeps an all-zero group's scale nonzero


def qmax(bits: int) -> int:
    """Largest code of a symmetric signed ``bits``-bit grid: 127 for INT8, 7 for INT4."""
    return 2 ** (bits - 1) - 1


def group_scales(w: torch.Tensor, bits: int, group_size: int | None) -> torch.Tensor:
    """float16 scales ``(out, ceil(in / group_size))`` so that max|w| of each group maps to the
    largest code; ``group_size=None`` means one scale per output channel. The last group may be
    shorter (SmolLM2's 576 columns are 4.5 groups of 128)."""
    n, k = w.shape
    g = group_size or k
    pad = (-k) % g
    wa = torch.nn.functional.pad(w.float().abs(), (0, pad)).view(n, -1, g)
    return (wa.amax(-1) / qmax(bits)).clamp_min(_MIN_SCALE).to(SCALE_DTYPE)


def expand_scales(scales: torch.Tensor, in_features: int, group_size: int | None) -> torch.Tensor:
    """Per-column scales ``(out, in_features)`` from group scales ``(out, groups)``."""
    return scales.repeat_interleave(group_size or in_features, dim=1)[:, :in_features]


def round_to_grid(w: torch.Tensor, scale: torch.Tensor, bits: int) -> torch.Tensor:
    """Integer codes ``clamp(round(w / scale), -qmax, qmax)`` as int8 (``scale`` broadcasts)."""
    m = qmax(bits)
    return torch.clamp(torch.round(w.float() / scale.float()), -m, m).to(torch.int8)


def pack_int4(q: torch.Tensor) -> torch.Tensor:
    """Pack int8 codes in [-8, 7] of shape ``(out, in)`` (``in`` even) into ``(out, in/2)`` uint8,
    each code stored as code + 8: column j in the low nibble of byte j, column j + in/2 in its high
    nibble (GGML's Q4_0 splits its blocks the same way; unpacking is then two contiguous halves)."""
    k = q.shape[-1]
    if k % 2:
        raise ValueError(f"INT4 packing needs an even number of columns, got {k}")
    u = (q.to(torch.int16) + 8).to(torch.uint8)
    return u[..., : k // 2] | (u[..., k // 2:] << 4)


def _nibbles(packed: torch.Tensor) -> torch.Tensor:
    return torch.cat((packed & 0x0F, packed >> 4), dim=-1)


def unpack_int4(packed: torch.Tensor) -> torch.Tensor:
    """Inverse of :func:`pack_int4`: int8 codes ``(out, 2 × packed columns)``."""
    return _nibbles(packed).to(torch.int8) - 8


def quantize_weight(w: torch.Tensor, bits: int = 4, group_size: int | None = 128
                    ) -> tuple[torch.Tensor, torch.Tensor]:
    """Round-to-nearest: ``(qweight, scales)``. INT8: int8 codes ``(out, in)``, one scale per row
    (``group_size`` ignored). INT4: packed uint8 ``(out, in/2)``, one scale per group."""
    if bits not in (4, 8):
        raise ValueError(f"bits must be 4 or 8, got {bits}")
    g = None if bits == 8 else group_size
    scales = group_scales(w, bits, g)
    q = round_to_grid(w, expand_scales(scales, w.shape[1], g), bits)
    return (pack_int4(q) if bits == 4 else q), scales


def dequantize_weight(qweight: torch.Tensor, scales: torch.Tensor, bits: int, in_features: int,
                      group_size: int | None = 128, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """The float weight ``(out, in_features)`` that ``(qweight, scales)`` stand for."""
    s = scales.to(dtype)
    if bits == 8:
        return qweight.to(dtype) * s
    w = _nibbles(qweight).to(dtype).sub_(8)
    g = group_size or in_features
    full = in_features // g  # whole groups; a short last group (if any) has the last scale
    w[:, : full * g].view(w.shape[0], full, g).mul_(s[:, :full, None])
    if full < s.shape[1]:
        w[:, full * g:].mul_(s[:, full:])
    return w


class QuantLinear(nn.Module):
    """A linear layer holding quantized weights (``qweight``, ``scales`` buffers, optional ``bias``);
    ``forward`` dequantizes to the input's dtype, then calls ``F.linear``."""

    def __init__(self, qweight: torch.Tensor, scales: torch.Tensor, bits: int, in_features: int,
                 bias: torch.Tensor | None = None, group_size: int | None = None):
        super().__init__()
        self.bits, self.in_features, self.group_size = bits, in_features, group_size
        self.out_features = qweight.shape[0]
        self.register_buffer("qweight", qweight)
        self.register_buffer("scales", scales)
        self.register_buffer("bias", bias)

    @classmethod
    def from_linear(cls, linear: nn.Linear, bits: int = 4, group_size: int | None = 128) -> QuantLinear:
        """Round-to-nearest quantize an ``nn.Linear``."""
        qweight, scales = quantize_weight(linear.weight.detach(), bits, group_size)
        bias = None if linear.bias is None else linear.bias.detach().clone()
        return cls(qweight, scales, bits, linear.in_features, bias, None if bits == 8 else group_size)

    def dequantized_weight(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """The dequantized weight in ``dtype``."""
        return dequantize_weight(self.qweight, self.scales, self.bits, self.in_features, self.group_size,
                                 dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b = None if self.bias is None else self.bias.to(x.dtype)
        if self.bits == 8:  # one scale per output row: scale the output, not the whole weight
            y = nn.functional.linear(x, self.qweight.to(x.dtype)) * self.scales.to(x.dtype).view(-1)
            return y if b is None else y + b
        return nn.functional.linear(x, self.dequantized_weight(x.dtype), b)

    def nbytes(self) -> int:
        """Bytes of the stored tensors (codes, scales, bias)."""
        return sum(t.numel() * t.element_size() for t in self.buffers())

    def extra_repr(self) -> str:
        return f"in={self.in_features}, out={self.out_features}, bits={self.bits}, group={self.group_size}"


def quantizable_linears(model: nn.Module, skip: tuple[str, ...] = ("lm_head",)
                        ) -> list[tuple[str, nn.Linear]]:
    """``(name, module)`` of every ``nn.Linear`` except those named in ``skip`` and any whose weight
    is the input embedding's (a tied head), in model order."""
    emb = model.get_input_embeddings() if hasattr(model, "get_input_embeddings") else None
    tied = emb.weight.data_ptr() if emb is not None else None
    return [(n, m) for n, m in model.named_modules()
            if isinstance(m, nn.Linear) and n.split(".")[-1] not in skip and m.weight.data_ptr() != tied]


def quantize_model(model: nn.Module, bits: int = 4, group_size: int | None = 128,
                   quantized: dict[str, tuple[torch.Tensor, torch.Tensor]] | None = None,
                   skip: tuple[str, ...] = ("lm_head",)) -> dict:
    """Replace the linear layers of ``model`` (in place) by :class:`QuantLinear`: round-to-nearest,
    or the ``(qweight, scales)`` given in ``quantized`` by layer name (e.g. from GPTQ).

    Returns ``{"layers", "params", "fp_bytes" (their weights and biases before, measured),
    "fp32_bytes" (the same tensors at 4 bytes each), "q_bytes" (after, measured), "ratio_fp32"}``."""
    report: dict[str, float] = dict(layers=0, params=0, fp_bytes=0, fp32_bytes=0, q_bytes=0)
    for name, lin in quantizable_linears(model, skip):
        tensors = [t for t in (lin.weight, lin.bias) if t is not None]
        report["params"] += sum(t.numel() for t in tensors)
        report["fp_bytes"] += sum(t.numel() * t.element_size() for t in tensors)
        report["fp32_bytes"] += sum(t.numel() * 4 for t in tensors)
        if quantized is not None and name in quantized:
            qw, sc = quantized[name]
            bias = None if lin.bias is None else lin.bias.detach().clone()
            new = QuantLinear(qw.to(lin.weight.device), sc.to(lin.weight.device), bits, lin.in_features,
                              bias, None if bits == 8 else group_size)
        else:
            new = QuantLinear.from_linear(lin, bits, group_size)
        parent, _, attr = name.rpartition(".")
        setattr(model.get_submodule(parent) if parent else model, attr, new)
        report["q_bytes"] += new.nbytes()
        report["layers"] += 1
    report["ratio_fp32"] = report["q_bytes"] / max(report["fp32_bytes"], 1)
    return report


def weight_breakdown(model: nn.Module) -> dict[str, int]:
    """Bytes of a model's stored weights by kind, each tensor counted once (a tied head is the
    embedding): ``embedding``, ``quantized`` (QuantLinear buffers), ``linear`` (plain nn.Linear),
    ``other`` (norms and the rest), ``total``."""
    out = dict(embedding=0, quantized=0, linear=0, other=0)
    seen: set[int] = set()

    def add(kind: str, tensors) -> None:
        for t in tensors:
            if t is not None and t.data_ptr() not in seen:
                seen.add(t.data_ptr())
                out[kind] += t.numel() * t.element_size()

    emb = model.get_input_embeddings()
    add("embedding", [emb.weight])
    for m in model.modules():
        if isinstance(m, QuantLinear):
            add("quantized", m.buffers())
        elif isinstance(m, nn.Linear):
            add("linear", [m.weight, m.bias])
    add("other", list(model.parameters()) + list(model.buffers()))
    out["total"] = sum(out.values())
    return out


# --- beyond weights: KV cache, activations, attention probabilities -----------------------------

def quantize_kv(x: torch.Tensor, bits: int = 8) -> tuple[torch.Tensor, torch.Tensor]:
    """Quantize keys or values ``(batch, heads, tokens, head_dim)`` with one float16 scale per
    token and head: ``(int8 codes, scales (batch, heads, tokens, 1))``."""
    scale = (x.float().abs().amax(-1, keepdim=True) / qmax(bits)).clamp_min(_MIN_SCALE).to(SCALE_DTYPE)
    return round_to_grid(x, scale, bits), scale


def dequantize_kv(q: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Inverse of :func:`quantize_kv` in ``dtype``."""
    return q.to(dtype) * scale.to(dtype)


def fake_quant_kv_per_channel(x: torch.Tensor, bits: int = 4, group: int = 32) -> torch.Tensor:
    """Keys rounded as KIVI stores them (Liu et al., 2024): one float16 scale per channel of each head
    over a group of ``group`` consecutive tokens, instead of one per token. Keys have a few channels
    with large values in every token; a per-token scale spends its range on those channels and
    rounds the rest to nothing, a per-channel one does not. Returns ``x`` rounded, in its dtype.
    ``x``: ``(batch, heads, tokens, head_dim)``."""
    b, h, t, d = x.shape
    pad = (-t) % group
    g = torch.nn.functional.pad(x.float(), (0, 0, 0, pad)).view(b, h, (t + pad) // group, group, d)
    scale = (g.abs().amax(3, keepdim=True) / qmax(bits)).clamp_min(_MIN_SCALE).to(SCALE_DTYPE)
    out = round_to_grid(g, scale, bits).float() * scale.float()
    return out.view(b, h, t + pad, d)[:, :, :t].to(x.dtype)


def quantize_cache_(cache, bits: int = 8) -> dict[str, int]:
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
_ATTN_BITS: dict[str, int | None] = {"kv": None, "probs": None, "keys_per_channel": None}


def _quant_attention(module, query, key, value, attention_mask, scaling, dropout=0.0, **kwargs):
    """Eager attention with optional fake-quantized K/V (per token and head) and probabilities
    (8 bits unsigned, one scale per query row)."""
    if _ATTN_BITS["kv"]:
        if _ATTN_BITS["keys_per_channel"]:
            key = fake_quant_kv_per_channel(key, _ATTN_BITS["kv"])
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
        probs = torch.round(probs / step) * step
    out = torch.matmul(probs.to(query.dtype), value)
    return out.transpose(1, 2).contiguous(), probs


@contextlib.contextmanager
def attention_quant(model: nn.Module, kv_bits: int | None = None, probs_bits: int | None = None,
                    keys_per_channel: bool = False) -> Iterator[None]:
    """Within the block, the model's attention runs :func:`_quant_attention` (eager, with an eager
    mask) with K/V rounded to ``kv_bits`` and/or the softmax output to ``probs_bits``. Values are
    always rounded per token; keys per token too, or per channel (:func:`fake_quant_kv_per_channel`,
    KIVI's layout) with ``keys_per_channel``."""
    from transformers import AttentionInterface
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, eager_mask

    AttentionInterface.register(_ATTN, _quant_attention)
    ALL_MASK_ATTENTION_FUNCTIONS.register(_ATTN, eager_mask)
    before = model.config._attn_implementation
    _ATTN_BITS.update(kv=kv_bits, probs=probs_bits, keys_per_channel=int(keys_per_channel))
    model.config._attn_implementation = _ATTN
    try:
        yield
    finally:
        model.config._attn_implementation = before
        _ATTN_BITS.update(kv=None, probs=None, keys_per_channel=None)
