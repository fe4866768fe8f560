"""Low-bit matmul kernels, compared with labkit's own (chapter 06, "Quantization").

labkit's :class:`~labkit.llm.quantize.QuantLinear` dequantizes its weight before an ordinary
matmul, so it saves memory but not time. The kernels here multiply the low-bit codes directly:
PyTorch's fused weight-only CPU kernels (``aten._weight_int8pack_mm``, ``_weight_int4pack_mm_for_cpu``;
:func:`kernel_calls`, :func:`kernel_times` in microseconds, :func:`fused_int8_model`), torchao's
INT8 weight-only format (:func:`torchao_int8`) and its INT8 activations x INT8 weights
(:func:`torchao_w8a8`, timed against the float model by :func:`w8a8_times`).
"""

from __future__ import annotations

import copy
import logging
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from ..hardware.microbench import interleaved_times, time_fn
from . import quantize as Q


def _torchao_copy(model: nn.Module, config: Any) -> tuple[nn.Module, set[str]]:
    """A copy of ``model`` with torchao's ``config`` on the layers labkit quantizes, and their names."""
    logging.getLogger("torchao").setLevel(logging.ERROR)
    from torchao.quantization import quantize_

    names = {n for n, _ in Q.quantizable_linears(model)}
    m = copy.deepcopy(model)
    quantize_(m, config, filter_fn=lambda mod, fqn: fqn in names)
    return m, names


def torchao_int8(model: nn.Module) -> tuple[nn.Module, int]:
    """A copy of ``model`` in torchao's INT8 weight-only format on the layers labkit quantizes, and
    the bytes of its quantized weights (the tensors inside torchao's tensor subclass)."""
    from torchao.quantization import Int8WeightOnlyConfig

    m, names = _torchao_copy(model, Int8WeightOnlyConfig())
    nbytes = 0
    for n in names:
        w = m.get_submodule(n).weight
        nbytes += sum(getattr(w, k).numel() * getattr(w, k).element_size() for k in w.__tensor_flatten__()[0])
    return m, nbytes


def torchao_w8a8(model: nn.Module) -> nn.Module:
    """A copy of ``model`` with torchao's INT8 activations x INT8 weights
    (``Int8DynamicActivationInt8WeightConfig``) on the layers labkit quantizes: every call rounds its
    input to INT8 with one scale per token, multiplies INT8 by INT8 into INT32 (``aten._int_mm``) and
    rescales the result to the input's dtype; the weights keep one scale per output row. torchao writes
    the CPU path as separate operations for Inductor to fuse; run eagerly, each is its own pass."""
    from torchao.quantization import Int8DynamicActivationInt8WeightConfig

    return _torchao_copy(model, Int8DynamicActivationInt8WeightConfig())[0]


def w8a8_times(model: nn.Module, w8a8: nn.Module, ids: torch.Tensor, rounds: int = 5,
               device: str = "cpu") -> dict[str, Any]:
    """Chapter 06 ("Activations in INT8: what the throughput gain costs"), seconds, the two models
    timed in turn:

    * ``prefill_s``: ``{"float": array, "W8A8": array}``, one prefill of ``ids`` (1 x T token ids,
      the last position's logits only) per round, ``rounds`` rounds after one untimed each;
    * ``linear_s``: the first block's linear layers on T rows in ``model``'s dtype, round by round
      (each round's times summed over the block's layers): ``float matmul``, ``INT8 x INT8 matmul``
      (``aten._int_mm`` alone, on INT8 operands made beforehand, the weight laid out as torchao lays
      it) and ``W8A8 layer`` (torchao's whole call: round the input, multiply, rescale)."""
    with torch.inference_mode():
        prefill = interleaved_times({"float": lambda: model(ids, logits_to_keep=1),
                                     "W8A8": lambda: w8a8(ids, logits_to_keep=1)},
                                    device, repeats=rounds, warmup=1)
        block = [(n, lin) for n, lin in Q.quantizable_linears(model) if ".layers.0." in f".{n}"]
        per_layer = [interleaved_times(_linear_calls(lin, w8a8.get_submodule(name), ids.shape[-1], device),
                                       device, repeats=rounds, warmup=1) for name, lin in block]
    linear = {k: np.sum([t[k] for t in per_layer], axis=0) for k in per_layer[0]}
    return {"prefill_s": prefill, "linear_s": linear, "tokens": int(ids.shape[-1]), "layers": len(block)}


def _linear_calls(lin: nn.Linear, qlin: nn.Module, rows: int, device: str
                  ) -> dict[str, Callable[[], torch.Tensor]]:
    x = torch.randn(rows, lin.in_features, dtype=lin.weight.dtype, device=device)
    xq = Q.round_to_grid(x, Q.group_scales(x, 8, None), 8)  # one scale per row (token), as torchao rounds
    wq_t = qlin.weight.qdata.contiguous().t()
    return {"float matmul": lambda: F.linear(x, lin.weight),
            "INT8 x INT8 matmul": lambda: torch._int_mm(xq, wq_t), "W8A8 layer": lambda: qlin(x)}


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
