"""Round-to-nearest quantization, done by hand (chapter 06, "Quantization").

Weights: symmetric INT8 with one scale per output channel, and INT4 with one scale per group of
``group_size`` input columns (128 by default), stored for real: INT4 codes packed two per byte in a
``uint8`` tensor, scales in float16. :class:`QuantLinear` keeps only those tensors and dequantizes
the weight on every call before an ordinary matmul (no fused low-bit kernel: memory shrinks, speed
need not improve). :func:`quantize_model` swaps a model's linear layers (never the embedding or a
head tied to it) and reports weight bytes measured from the tensors. :func:`rtn_asym_model_` is the
stronger baseline: asymmetric INT4 (a zero point per group) with an MSE clip search.
Beyond weights (the KV cache, activations, attention probabilities): :mod:`labkit.llm.runtime_quant`.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

SCALE_DTYPE = torch.float16
MIN_SCALE = 2.0**-24  # smallest float16 subnormal: keeps an all-zero group's scale nonzero


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
    return (wa.amax(-1) / qmax(bits)).clamp_min(MIN_SCALE).to(SCALE_DTYPE)


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


CLIP_GRID = tuple(1 - i / 20 for i in range(10))  # 1.0, 0.95 ... 0.55: shares of each group's range tried


def quantize_weight_asym(w: torch.Tensor, bits: int = 4, group_size: int = 128,
                         clip: tuple[float, ...] = CLIP_GRID
                         ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Asymmetric round-to-nearest with an MSE clip search (the grid of GPTQ's and AWQ's reference
    quantizers): each group of ``group_size`` input columns gets a float16 scale and an integer zero
    point so that codes 0..2^bits-1 span ``[p·min, p·max]`` of the group (its range widened to hold
    0, so 0 stays exact), for the shrink ``p`` of the grid ``clip`` (decreasing) that gives the least
    squared error: every other grid point first, then each group's two neighbours of its best one
    (the whole grid's answer wherever a group's error falls and rises once along the grid).
    Returns ``(codes, scales (out, groups) float16, zeros (out, groups) uint8)``; INT4 codes are
    packed as :func:`pack_int4` packs them (stored minus 8), INT8 codes as uint8."""
    n, k = w.shape
    pad, maxq = (-k) % group_size, 2**bits - 1
    g = torch.nn.functional.pad(w.float(), (0, pad)).view(n, -1, group_size)
    grid = torch.tensor(clip, dtype=torch.float32)
    chunk = max(1, CHUNK // (g.shape[1] * group_size))  # rows searched together: they stay in cache
    parts = [_clip_search(g[r:r + chunk], grid, maxq) for r in range(0, n, chunk)]
    scales, zeros = torch.cat([p[0] for p in parts]), torch.cat([p[1] for p in parts])
    q = torch.clamp(torch.round(g / scales.float()[..., None]) + zeros[..., None], 0, maxq).view(n, -1)[:, :k]
    codes = pack_int4(q.to(torch.int8) - 8) if bits == 4 else q.to(torch.uint8)
    return codes, scales, zeros.to(torch.uint8)


CHUNK = 1 << 18  # weights one step of the clip search works on (1 MB in float32)


def _clip_search(g: torch.Tensor, grid: torch.Tensor, maxq: int) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`quantize_weight_asym`'s search on groups ``g`` ``(rows, groups, size)``: the float16
    scales and the zero points of the least squared error."""
    lo, hi = g.amin(-1).clamp(max=0), g.amax(-1).clamp(min=0)

    def grid_point(p: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:  # range shrunk by p: scale, zero
        s = ((hi - lo) * p / maxq).clamp_min(MIN_SCALE).to(SCALE_DTYPE)
        return s, torch.round(-lo * p / s.float()).clamp(0, maxq)

    if len(grid) == 1:  # nothing to search (AWQ's scale search quantizes this way 21 times a layer)
        return grid_point(grid[0])
    best, at = torch.full(lo.shape, float("inf")), torch.zeros(lo.shape, dtype=torch.long)
    scales, zeros = torch.empty(lo.shape, dtype=SCALE_DTYPE), torch.empty(lo.shape)

    def trial(idx: torch.Tensor) -> None:  # each group tries grid[idx] of its own; keeps it if better
        nonlocal best, at, scales, zeros
        s, z = grid_point(grid[idx])
        sf, zf = s.float()[..., None], z[..., None]
        e = torch.div(g, sf).round_().add_(zf).clamp_(0, maxq).sub_(zf)  # code - zero, on the codes 0..maxq
        err = torch.linalg.vector_norm(e.mul_(sf).sub_(g), dim=-1).square_()  # squared rounding error
        better = err < best
        best, at = torch.where(better, err, best), torch.where(better, idx, at)
        scales, zeros = torch.where(better, s, scales), torch.where(better, z, zeros)

    for i in range(0, len(grid), 2):  # every other grid point, then each group's neighbours of its best
        trial(torch.full(lo.shape, i, dtype=torch.long))
    center = at.clone()
    for d in (-1, 1):
        trial((center + d).clamp(0, len(grid) - 1))
    return scales, zeros


def dequantize_weight_asym(codes: torch.Tensor, scales: torch.Tensor, zeros: torch.Tensor, bits: int,
                           in_features: int, group_size: int = 128,
                           dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """The float weight ``(out, in_features)`` that :func:`quantize_weight_asym`'s output stands for."""
    q, z, s = (_nibbles(codes) if bits == 4 else codes).float(), zeros.float(), scales.float()
    return ((q - z.repeat_interleave(group_size, 1)[:, :in_features])
            * s.repeat_interleave(group_size, 1)[:, :in_features]).to(dtype)


@torch.no_grad()
def rtn_asym_model_(model: nn.Module, bits: int = 4, group_size: int = 128,
                    clip: tuple[float, ...] = CLIP_GRID, skip: tuple[str, ...] = ("lm_head",)) -> dict:
    """Asymmetric RTN with a clip search (:func:`quantize_weight_asym`) on every linear layer
    :func:`quantizable_linears` selects: each weight is set, in place, to the values its codes stand
    for (the model then computes exactly what a kernel reading the codes would). Returns ``{"layers",
    "params", "q_bytes"}``: bytes of the codes, float16 scales and uint8 zero points (and biases)."""
    report = dict(layers=0, params=0, q_bytes=0)
    for _, lin in quantizable_linears(model, skip):
        parts = quantize_weight_asym(lin.weight.detach(), bits, group_size, clip)
        lin.weight.copy_(dequantize_weight_asym(*parts, bits, lin.in_features, group_size, lin.weight.dtype))
        tensors = [*parts, *([lin.bias] if lin.bias is not None else [])]
        report["q_bytes"] += sum(t.numel() * t.element_size() for t in tensors)
        report["params"] += lin.weight.numel()
        report["layers"] += 1
    return report


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

    def add(kind: str, tensors: Any) -> None:
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
