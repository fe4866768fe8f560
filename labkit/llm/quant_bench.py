"""Measuring quantized models against the unquantized one (chapter 06, "Quantization").

:func:`measure_format` scores one copy of a model: perplexity and KL divergence on held-out windows
(:mod:`labkit.llm.perplexity`), how much of the reference greedy continuations it keeps, its decode
speed (:func:`decode_tokens_per_s`, through :func:`labkit.llm.decode.greedy_decode`) and the bytes
of its linear layers. :func:`first_inputs` keeps, with forward hooks, the first input each probed
layer sees, for GPTQ's layer-wise error. :func:`torchao_int8` is torchao's INT8 weight-only format
on the layers labkit quantizes; :func:`kernel_times` times one layer's matmul at batch 1 in every
form this machine offers (float, labkit's dequantizing layers, PyTorch's fused INT8/INT4 CPU
kernels, whose INT4 operands :func:`fused_int4_operands` packs); :func:`fused_int8_model` puts the
fused INT8 kernel in every linear layer and :func:`decode_rounds` times several models' decode in
turn, round after round, so :func:`labkit.stats.ratio_interval` gives a speed ratio with its
spread and :func:`speed_sentence` says it in words. :func:`risk_ladder` is the
tutorial's "what to quantize, by risk". :func:`bytes_per_param` is the whole-model size rule.
Units: bytes, tokens/s, microseconds (:func:`kernel_times`), nats (KL).
"""

from __future__ import annotations

import contextlib
import copy
import logging
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from ..hardware.microbench import time_fn
from . import perplexity as P
from . import quantize as Q
from .decode import greedy_decode


def probe_layers(model: nn.Module) -> dict[str, str]:
    """Label -> module path of the query and MLP output projections of the first, middle and last
    decoder layers (``"layer 0 q_proj"`` -> ``"model.layers.0.self_attn.q_proj"``)."""
    n = len(model.model.layers)
    return {f"layer {i} {kind}": f"model.layers.{i}.{path}" for i in (0, n // 2, n - 1)
            for kind, path in (("q_proj", "self_attn.q_proj"), ("down_proj", "mlp.down_proj"))}


@contextlib.contextmanager
def first_inputs(model: nn.Module, paths: dict[str, str]) -> Iterator[dict[str, torch.Tensor]]:
    """Within the block, forward hooks keep the input of each module in ``paths`` (label -> path)
    from its first call only, as float32 ``(tokens, in_features)``; yields that label -> tensor dict.
    The hooks are removed on exit."""
    kept: dict[str, torch.Tensor] = {}

    def keep(name: str):
        def hook(_module, args, _out):
            kept.setdefault(name, args[0].reshape(-1, args[0].shape[-1]).float())
        return hook

    hooks = [model.get_submodule(p).register_forward_hook(keep(n)) for n, p in paths.items()]
    try:
        yield kept
    finally:
        for h in hooks:
            h.remove()


def layer_weights(model: nn.Module, paths: dict[str, str]) -> dict[str, torch.Tensor]:
    """Label -> the float32 weight of each module in ``paths`` (a copy; dequantized for a
    :class:`~labkit.llm.quantize.QuantLinear`)."""
    out = {}
    for name, path in paths.items():
        m = model.get_submodule(path)
        quantized = isinstance(m, Q.QuantLinear)
        out[name] = m.dequantized_weight() if quantized else m.weight.detach().float().clone()
    return out


def linear_bytes(model: nn.Module) -> int:
    """Bytes of the weights of the linear layers :func:`~labkit.llm.quantize.quantizable_linears` selects."""
    return sum(m.weight.numel() * m.weight.element_size() for _, m in Q.quantizable_linears(model))


def decode_tokens_per_s(model: nn.Module, prompt_ids: torch.Tensor, tokens: int = 4) -> float:
    """Greedy decode speed (tokens/s, the median step of ``tokens`` timed steps after the prompt's
    prefill and two untimed steps) of ``model`` on ``prompt_ids`` (1 x P, on the model's device)."""
    return greedy_decode(model, prompt_ids, tokens, device=str(prompt_ids.device)).tokens_per_s


EVAL_BATCH_TOKENS = 2048  # held-out windows scored together, up to this many tokens per forward pass


def eval_logits(model: nn.Module, ev: torch.Tensor) -> torch.Tensor:
    """Logits of ``model`` on held-out windows ``ev``, as :func:`measure_format` scores every format
    (:func:`~labkit.llm.perplexity.window_logits`, :data:`EVAL_BATCH_TOKENS` per pass): the
    baseline's logits must come from here too, so that both round alike."""
    return P.window_logits(model, ev, EVAL_BATCH_TOKENS)


@dataclass
class Baseline:
    """What every format is compared with: the unquantized ``model``, held-out windows ``ev``, its
    logits on them (:func:`eval_logits`), reference greedy continuations (``n_new`` generated tokens
    each) and the prompt ids (1 x P) decode speed is timed on."""

    model: nn.Module
    ev: torch.Tensor
    logits: torch.Tensor
    reference: list[torch.Tensor]
    n_new: int
    decode_ids: torch.Tensor


def measure_format(model: nn.Module, base: Baseline, nbytes: int, tok_s: float | None = None,
                   keep_logits: bool = False) -> dict[str, Any]:
    """Score ``model`` (a quantized copy, or ``base.model`` itself) against ``base``: ``ppl``,
    ``nll``, ``tokens``, ``ppl_windows`` (each window's own), ``kl``, ``top1``, ``kl_per_pos``
    (:func:`~labkit.llm.perplexity.divergence`), ``agree`` (greedy prefix kept), ``tok_s`` (``tok_s``
    if given, else measured), ``linear_bytes`` (``nbytes``) and ``logits`` (the first window's first
    128 positions if ``keep_logits``, else None)."""
    logits = base.logits if model is base.model else eval_logits(model, base.ev)
    r = dict(P.perplexity_from_logits(logits, base.ev), **P.divergence(base.logits, logits))
    r["ppl_windows"] = P.window_perplexities(logits, base.ev)
    r["agree"] = P.greedy_agreement(model, base.reference, base.n_new)["prefix"]
    r["tok_s"] = tok_s or decode_tokens_per_s(model, base.decode_ids)
    r["linear_bytes"] = nbytes
    r["logits"] = logits[:1, :128] if keep_logits else None
    return r


def result_line(name: str, r: dict[str, Any]) -> str:
    """One printed row of :func:`measure_format`'s result."""
    return (f"{name:12s} linear weights {r['linear_bytes'] / 1e6:7.1f} MB  perplexity {r['ppl']:6.2f}  "
            f"KL {r['kl']:.4f}  same next token {r['top1']:.1%}  greedy prefix kept {r['agree']:.0%}  "
            f"decode {r['tok_s']:5.1f} tok/s")


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


RISK_STEPS = ("weights", "activations", "KV cache", "attention probs")
KIVI = "KV cache, keys per channel"  # KIVI's layout (Liu et al., 2024), beside the per-token KV rung


def risk_ladder(model: nn.Module, ids: torch.Tensor, ref_logits: torch.Tensor,
                bits: tuple[int, ...] = (8, 4)) -> dict[tuple[str, int], dict]:
    """(step, bits) -> :func:`~labkit.llm.perplexity.divergence` from ``ref_logits`` of ``model`` on
    windows ``ids`` with activations (per token, at every linear input), the KV cache (per token and
    head) or the attention probabilities (per query row) fake-quantized to ``bits``, one at a time;
    ``(KIVI, bits)``: the KV cache with values per token and keys per channel (groups of 32 tokens,
    :func:`~labkit.llm.quantize.fake_quant_kv_per_channel`), on the same windows. The weights' rung
    comes from the quantized models themselves (see :func:`measure_format`)."""
    out = {}
    for b in bits:
        with Q.activation_quant(model, b):
            out[("activations", b)] = P.divergence(ref_logits, P.window_logits(model, ids))
        with Q.attention_quant(model, kv_bits=b):
            out[("KV cache", b)] = P.divergence(ref_logits, P.window_logits(model, ids))
        with Q.attention_quant(model, kv_bits=b, keys_per_channel=True):
            out[(KIVI, b)] = P.divergence(ref_logits, P.window_logits(model, ids))
        with Q.attention_quant(model, probs_bits=b):
            out[("attention probs", b)] = P.divergence(ref_logits, P.window_logits(model, ids))
    return out


KV_VARIANTS: dict[str, dict[str, Any]] = {  # label -> attention_quant settings for the continuation's pass
    "INT8, prefix and continuation": {"kv_bits": 8},
    "INT4 per token": {"kv_bits": 4},
    "INT4 KIVI (keys per channel)": {"kv_bits": 4, "keys_per_channel": True},
}


@torch.inference_mode()
def kv_cache_long_context(model: nn.Module, ctx: torch.Tensor, cont: torch.Tensor) -> dict[str, Any]:
    """A quantized KV cache at long context (chapter 06): ``ctx`` (1 x P) is prefilled and the next
    tokens ``cont`` (1 x C) are scored through its cache in one pass, every variant with the same
    eager attention (:func:`~labkit.llm.quantize.attention_quant`), against the unrounded cache.
    Returns label -> :func:`~labkit.llm.perplexity.divergence`: ``"INT8, prefix only"`` (the prefilled
    cache rounded once through INT8, the continuation's own keys and values kept exact) and each of
    :data:`KV_VARIANTS` (every key and value attention reads, prefix and continuation, rounded: what
    a quantized cache holds while it generates; per token and head, keys per channel for KIVI); and
    ``"bytes"``: :func:`~labkit.llm.quantize.quantize_cache_`'s byte counts at INT8."""
    cache = model(ctx, use_cache=True).cache

    def score(c, **kw) -> torch.Tensor:
        with Q.attention_quant(model, **kw):
            return model(cont, cache=copy.deepcopy(c)).logits.float().cpu()

    ref, rounded = score(cache), copy.deepcopy(cache)
    out: dict[str, Any] = {"bytes": Q.quantize_cache_(rounded, bits=8)}
    out["INT8, prefix only"] = P.divergence(ref, score(rounded))
    for label, kw in KV_VARIANTS.items():
        out[label] = P.divergence(ref, score(cache, **kw))
    return out


def bytes_per_param(total: float, embedding: float, linear_bits: float, embedding_bytes: float) -> float:
    """Whole-model bytes per parameter when every parameter but the ``embedding`` ones (embedding
    and head) takes ``linear_bits`` bits and those take ``embedding_bytes`` bytes each."""
    return ((total - embedding) * linear_bits / 8 + embedding * embedding_bytes) / total


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
