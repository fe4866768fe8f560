"""Low-bit matmul kernels, compared with labkit's own (chapter 06, "Quantization").

labkit's :class:`~labkit.llm.quantize.QuantLinear` dequantizes its weight before an ordinary
matmul, so it saves memory but not time. The kernels here multiply the low-bit codes directly:
PyTorch's fused weight-only CPU kernels (``aten._weight_int8pack_mm``, ``_weight_int4pack_mm_for_cpu``;
:func:`kernel_calls`, :func:`kernel_times` in microseconds, :func:`fused_int8_model`) and torchao's
INT8 weight-only format (:func:`torchao_int8`).
"""

from __future__ import annotations

import copy
import logging
from collections.abc import Callable

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from ..hardware.microbench import time_fn
from . import quantize as Q


def torchao_int8(model: nn.Module) -> tuple[nn.Module, int]:
    """A copy of ``model`` in torchao's INT8 weight-only format on the layers labkit quantizes, and
    the bytes of its quantized weights (the tensors inside torchao's tensor subclass)."""
    logging.getLogger("torchao").setLevel(logging.ERROR)
    from torchao.quantization import Int8WeightOnlyConfig, quantize_

    names = {n for n, _ in Q.quantizable_linears(model)}
    m = copy.deepcopy(model)
    quantize_(m, Int8WeightOnlyConfig(), filter_fn=lambda mod, fqn: fqn in names)
    nbytes = 0
    for n in names:
        w = m.get_submodule(n).weight
        nbytes += sum(getattr(w, k).numel() * getattr(w, k).element_size() for k in w.__tensor_flatten__()[0])
    return m, nbytes


def has_fused_cpu_kernels() -> bool:  # the fused weight-only INT8/INT4 CPU matmuls (torch.ops.aten)
    return hasattr(torch.ops.aten, "_weight_int4pack_mm_for_cpu")


def fused_int4_operands(weight: torch.Tensor, group: int = 128) -> tuple[torch.Tensor, int, torch.Tensor]:
    """``(packed codes, group size, scales and zeros)`` for ``aten._weight_int4pack_mm_for_cpu``:
    round-to-nearest INT4 codes of ``weight`` ``(out, in)`` shifted to 0..15, packed by
    ``_convert_weight_to_int4pack_for_cpu``; float32 ``(groups, out, 2)`` scale/zero pairs (zero 0).
    The kernel needs whole groups, so a width ``group`` does not divide uses groups of 64."""
    g = group if weight.shape[1] % group == 0 else 64
    scales = Q.group_scales(weight, 4, g)
    codes = Q.round_to_grid(weight, Q.expand_scales(scales, weight.shape[1], g), 4).to(torch.int32) + 8
    packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(codes, 1)
    s = scales.float().t()
    return packed, g, torch.stack([s, torch.zeros_like(s)], -1).contiguous()


def kernel_calls(lin: nn.Linear, x: torch.Tensor, group: int = 128, device: str = "cpu"
                 ) -> dict[str, Callable[[], torch.Tensor]]:
    """Label -> a call multiplying ``x`` (1 x in) by ``lin``'s weight: the float matmul, labkit's
    INT8 and INT4 :class:`~labkit.llm.quantize.QuantLinear` and, on a CPU whose torch has them,
    PyTorch's fused INT8/INT4 weight-only kernels (fed ``x`` and the scales in ``x``'s dtype: in float32
    these kernels take a slow path on some CPUs, in bfloat16 a fast one where the CPU has it)."""
    q8, q4 = Q.QuantLinear.from_linear(lin, 8), Q.QuantLinear.from_linear(lin, 4, group)
    calls = {"float matmul": lambda: F.linear(x, lin.weight),
             "labkit INT8 (dequantize + matmul)": lambda: q8(x),
             "labkit INT4 (unpack + dequantize + matmul)": lambda: q4(x)}
    if device == "cpu" and has_fused_cpu_kernels():
        s8 = q8.scales.to(x.dtype).flatten()
        calls["torch fused INT8 kernel"] = lambda: torch.ops.aten._weight_int8pack_mm(x, q8.qweight, s8)
        w4, g4, sz = fused_int4_operands(lin.weight.detach().float(), group)
        sz = sz.to(x.dtype)
        calls["torch fused INT4 kernel"] = lambda: torch.ops.aten._weight_int4pack_mm_for_cpu(x, w4, g4, sz)
    return calls


def kernel_times(lin: nn.Linear, group: int = 128, device: str = "cpu", repeats: int = 15
                 ) -> dict[str, float]:
    """Median microseconds of one batch-1 call of each of :func:`kernel_calls` on a random input in
    the weight's dtype (2 untimed calls first, ``repeats`` timed)."""
    x = torch.randn(1, lin.in_features, dtype=lin.weight.dtype, device=device)
    calls = kernel_calls(lin, x, group, device)
    with torch.inference_mode():
        return {k: float(np.median(time_fn(f, device, warmup=2, repeats=repeats))) * 1e6
                for k, f in calls.items()}


class FusedInt8Linear(nn.Module):
    """A linear layer whose INT8 codes (one scale per output row) are multiplied by PyTorch's fused
    weight-only CPU kernel ``aten._weight_int8pack_mm`` in the input's dtype: no float copy of the
    weight is kept. The kernel serves one input row (a decode step, what chapter 06 times); several
    rows (a prefill) are multiplied by a float copy made for that call, as weight-only engines do for
    large batches: without AVX-512 the kernel handles rows one at a time, over a second each for the
    135M model's 40-token prompt."""

    def __init__(self, linear: nn.Linear):
        super().__init__()
        q = Q.QuantLinear.from_linear(linear, 8)
        self.register_buffer("qweight", q.qweight)
        self.register_buffer("scales", q.scales.to(linear.weight.dtype).flatten())
        self.register_buffer("bias", q.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x2 = x.reshape(-1, x.shape[-1])
        scales = self.scales.to(x.dtype)
        if x2.shape[0] == 1:
            y = torch.ops.aten._weight_int8pack_mm(x2, self.qweight, scales)
        else:
            y = nn.functional.linear(x2, self.qweight.to(x.dtype) * scales[:, None])
        y = y.reshape(*x.shape[:-1], -1)
        return y if self.bias is None else y + self.bias.to(x.dtype)

    def nbytes(self) -> int:
        """Bytes of the stored tensors (codes, scales, bias)."""
        return sum(t.numel() * t.element_size() for t in self.buffers())


def fused_int8_model(model: nn.Module) -> tuple[nn.Module, int]:
    """A copy of ``model`` with :class:`FusedInt8Linear` in every layer labkit quantizes, and the
    bytes of those layers. ``RuntimeError`` when this torch lacks the kernel."""
    if not hasattr(torch.ops.aten, "_weight_int8pack_mm"):
        raise RuntimeError("this torch has no aten._weight_int8pack_mm")
    m = copy.deepcopy(model)
    nbytes = 0
    for name, lin in Q.quantizable_linears(m):
        parent, _, child = name.rpartition(".")
        fused = FusedInt8Linear(lin)
        setattr(m.get_submodule(parent) if parent else m, child, fused)
        nbytes += fused.nbytes()
    return m, nbytes


def int8_step_distance(model: nn.Module) -> float:
    """Chapter 06's check that labkit's INT8 rounding is right: the largest |labkit's INT8 weight -
    torchao's| over the layers labkit quantizes, in units of labkit's own step (its per-row scale),
    both made from ``model``'s weights in float32 (in bfloat16 the dequantized weights themselves round
    by up to a quarter step). Each rounds a row to 8-bit codes of its absmax, torchao dividing by 127.5
    where labkit divides by 127, so each lands within half its own step of the weight: under 1 step apart."""
    m32 = copy.deepcopy(model).float()
    theirs_model = torchao_int8(m32)[0]
    worst = 0.0
    for name, lin in Q.quantizable_linears(m32):
        mine = Q.QuantLinear.from_linear(lin, bits=8)
        theirs = theirs_model.get_submodule(name).weight.dequantize().float()
        step = mine.scales.float().view(-1, 1)
        worst = max(worst, float(((mine.dequantized_weight() - theirs).abs() / step).max()))
    return worst
