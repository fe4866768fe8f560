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
import functools
import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from . import perplexity as P
from . import quantize as Q
from . import runtime_quant as RQ
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

    def keep(name: str) -> Callable[..., None]:
        def hook(_module: Any, args: Any, _out: Any) -> None:
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


EVAL_BATCH_TOKENS = 4096  # held-out windows scored together, up to this many tokens per forward pass


def eval_logits(model: nn.Module, ev: torch.Tensor | P.Sliding) -> torch.Tensor:
    """Logits of ``model`` on the held-out text ``ev``, as :func:`measure_format` scores every format:
    a :class:`~labkit.llm.perplexity.Sliding` cut (:func:`~labkit.llm.perplexity.sliding_logits`,
    ``(N - 1, vocab)``) or windows ``(n, window)`` (:func:`~labkit.llm.perplexity.window_logits`),
    :data:`EVAL_BATCH_TOKENS` per pass. The baseline's logits must come from here too, so that both
    round alike."""
    if isinstance(ev, P.Sliding):
        return P.sliding_logits(model, ev, EVAL_BATCH_TOKENS)
    return P.window_logits(model, ev, EVAL_BATCH_TOKENS)


@dataclass
class Baseline:
    """What every format is compared with: the unquantized ``model``, the held-out text ``ev`` (a
    :class:`~labkit.llm.perplexity.Sliding` cut, or windows), its logits on it (:func:`eval_logits`),
    reference greedy continuations (``n_new`` generated tokens each) and the prompt ids (1 x P)
    decode speed is timed on."""

    model: nn.Module
    ev: torch.Tensor | P.Sliding
    logits: torch.Tensor
    reference: list[torch.Tensor]
    n_new: int
    decode_ids: torch.Tensor

    @functools.cached_property
    def logp(self) -> torch.Tensor:
        """``log_softmax`` of the baseline's logits, computed once for every format compared with it."""
        return torch.log_softmax(self.logits.float(), -1)

    @functools.cached_property
    def ref_stats(self) -> dict[str, torch.Tensor]:
        """What every comparison reuses: ``p`` (the baseline's probabilities), ``p_logp`` (Σ p log p
        per position) and ``top`` (its argmax), for :func:`~labkit.llm.perplexity.divergence_logp`."""
        p = self.logp.exp()
        return {"p": p, "p_logp": torch.linalg.vecdot(p, self.logp), "top": self.logp.argmax(-1)}


def measure_format(model: nn.Module, base: Baseline, nbytes: int, tok_s: float | None = None,
                   keep_logits: bool = False) -> dict[str, Any]:
    """Score ``model`` (a quantized copy, or ``base.model`` itself) against ``base``: ``ppl`` (pooled
    over every scored token), ``nll`` (nats per token), ``tokens``, ``nll_tokens`` (each scored
    token's NLL, for :func:`~labkit.llm.perplexity.ppl_interval` and paired comparisons), ``kl``,
    ``top1``, ``kl_per_pos`` (:func:`~labkit.llm.perplexity.divergence`), ``agree`` (greedy prefix
    kept), ``tok_s`` (``tok_s`` if given, else measured), ``linear_bytes`` (``nbytes``) and ``logits``
    (the first 128 positions of the first window, ``(1, 128, vocab)``, if ``keep_logits``, else None)."""
    same = model is base.model
    logits = base.logits if same else eval_logits(model, base.ev)
    logq = base.logp if same else torch.log_softmax(logits.float(), -1)
    ids = base.ev.ids if isinstance(base.ev, P.Sliding) else base.ev
    nll = P.token_nll(logq, ids, log_probs=True)
    div = ({"kl": 0.0, "top1": 1.0, "kl_per_pos": torch.zeros(logq.shape[1:-1])} if same
           else P.divergence_logp(base.logp, logq, base.ref_stats))
    r = {"ppl": math.exp(float(nll.mean())), "nll": float(nll.mean()), "tokens": int(nll.numel()),
         "nll_tokens": nll, **div}
    r["agree"] = P.greedy_agreement(model, base.reference, base.n_new)["prefix"]
    r["tok_s"] = tok_s or decode_tokens_per_s(model, base.decode_ids)
    r["linear_bytes"] = nbytes
    first = logits[None, :128] if isinstance(base.ev, P.Sliding) else logits[:1, :128]
    r["logits"] = first if keep_logits else None
    return r


def result_line(name: str, r: dict[str, Any], speed_of: str = "") -> str:
    """One printed row of :func:`measure_format`'s result; ``speed_of``: the format whose decode speed
    it was given (same storage and kernel, not timed itself), named instead of a figure."""
    speed = f"{r['tok_s']:5.1f} tok/s" if not speed_of else f"{speed_of}'s (same kernel, not timed)"
    return (f"{name:13s} linear weights {r['linear_bytes'] / 1e6:7.1f} MB  perplexity {r['ppl']:6.2f}  "
            f"KL {r['kl']:.4f}  same next token {r['top1']:.1%}  greedy prefix kept {r['agree']:.0%}  "
            f"decode {speed}")


RISK_STEPS = ("weights", "activations", "KV cache", "attention probs")
KIVI = "KV cache, KIVI-style"  # asymmetric, keys per channel (Liu et al., 2024), beside the per-token KV rung


def risk_ladder(model: nn.Module, ids: torch.Tensor, ref_logits: torch.Tensor,
                bits: tuple[int, ...] = (8, 4)) -> dict[tuple[str, int], dict]:
    """(step, bits) -> :func:`~labkit.llm.perplexity.divergence` from ``ref_logits`` of ``model`` on
    windows ``ids`` with activations (per token, at every linear input), the KV cache (per token and
    head) or the attention probabilities (per query row) fake-quantized to ``bits``, one at a time;
    ``(KIVI, bits)``: the KV cache rounded KIVI-style (asymmetric, keys per channel over 32 tokens,
    values per token, :func:`~labkit.llm.runtime_quant.fake_quant_kivi`), on the same windows. The
    weights' rung comes from the quantized models themselves (see :func:`measure_format`)."""
    out = {}
    for b in bits:
        with RQ.activation_quant(model, b):
            out[("activations", b)] = P.divergence(ref_logits, P.window_logits(model, ids))
        with RQ.attention_quant(model, kv_bits=b):
            out[("KV cache", b)] = P.divergence(ref_logits, P.window_logits(model, ids))
        with RQ.attention_quant(model, kv_bits=b, kivi=True):
            out[(KIVI, b)] = P.divergence(ref_logits, P.window_logits(model, ids))
        with RQ.attention_quant(model, probs_bits=b):
            out[("attention probs", b)] = P.divergence(ref_logits, P.window_logits(model, ids))
    return out


@torch.inference_mode()
def attention_error_carry(model: nn.Module, windows: torch.Tensor, bits: int = 8) -> dict[str, Any]:
    """Does an error made in attention carry on to the tokens after it (chapter 06)? ``windows``
    (n x L) are scored with the same eager attention (:func:`~labkit.llm.runtime_quant.attention_quant`)
    three ways: exact (the reference), every query row's probabilities rounded to ``bits``, and only
    the first quarter's rows rounded. Per window, ``carried``: with only the first quarter rounded, the
    mean KL from the reference at the positions after it ÷ the mean KL at the rounded positions (an
    error that compounds keeps 1 or more; one that fades, near 0); ``growth``: with every row rounded,
    the last quarter's mean KL ÷ the first quarter's. ``by_position``: ``{"first rows": [...], "every
    row": [...]}``, each position's KL averaged over the windows (L values each, nats per position)."""
    first = windows.shape[1] // 4
    with RQ.attention_quant(model):
        ref = torch.log_softmax(P.window_logits(model, windows), -1)
    kl = {}
    for label, rows in (("first rows", first), ("every row", None)):
        with RQ.attention_quant(model, probs_bits=bits, probs_rows=rows):
            logq = torch.log_softmax(P.window_logits(model, windows), -1)
        kl[label] = P.divergence_logp(ref, logq)["kl_tokens"]
    once, every = kl["first rows"], kl["every row"]
    return {"carried": (once[:, first:].mean(1) / once[:, :first].mean(1)).tolist(),
            "growth": (every[:, -first:].mean(1) / every[:, :first].mean(1)).tolist(),
            "by_position": {k: v.mean(0).tolist() for k, v in kl.items()}}


KV_VARIANTS: dict[str, dict[str, Any]] = {  # label -> attention_quant settings for the continuation's pass
    "INT8, prefix and continuation": {"kv_bits": 8},
    "INT4 per token": {"kv_bits": 4},
    "INT4 KIVI-style": {"kv_bits": 4, "kivi": True},
}


@torch.inference_mode()
def kv_cache_long_context(model: nn.Module, ctx: torch.Tensor, cont: torch.Tensor) -> dict[str, Any]:
    """A quantized KV cache at long context (chapter 06): ``ctx`` (1 x P) is prefilled and the next
    tokens ``cont`` (1 x C) are scored through its cache in one pass, every variant with the same
    eager attention (:func:`~labkit.llm.runtime_quant.attention_quant`), against the unrounded cache.
    Returns label -> :func:`~labkit.llm.perplexity.divergence`: ``"INT8, prefix only"`` (the prefilled
    cache rounded once through INT8, the continuation's own keys and values kept exact) and each of
    :data:`KV_VARIANTS` (every key and value attention reads, prefix and continuation, rounded: what
    a quantized cache holds while it generates; per token and head, or KIVI-style); and
    ``"bytes"``: :func:`~labkit.llm.runtime_quant.quantize_cache_`'s byte counts at INT8."""
    cache = model(ctx, use_cache=True).cache

    def score(c: Any, **kw: Any) -> torch.Tensor:
        with RQ.attention_quant(model, **kw):
            return model(cont, cache=copy.deepcopy(c)).logits.float().cpu()

    ref, rounded = score(cache), copy.deepcopy(cache)
    out: dict[str, Any] = {"bytes": RQ.quantize_cache_(rounded, bits=8)}
    out["INT8, prefix only"] = P.divergence(ref, score(rounded))
    for label, kw in KV_VARIANTS.items():
        out[label] = P.divergence(ref, score(cache, **kw))
    return out


def per_tensor_round(w: torch.Tensor, fmt: str) -> torch.Tensor:
    """``w`` rounded through one 8-bit format with a single scale for the whole tensor, set by its
    largest |w|: ``"int8"`` (a uniform grid of 255 codes) or a torch float8 dtype name
    (``"float8_e4m3fn"``, ``"float8_e5m2"``: exponent bits keep small values' relative precision).
    Returned in float32."""
    w = w.detach().float()
    if fmt == "int8":
        s = w.abs().max() / 127
        return torch.round(w / s).clamp(-127, 127) * s
    dt = getattr(torch, fmt)
    s = w.abs().max() / torch.finfo(dt).max
    return (w / s).to(dt).float() * s


def range_errors(w: torch.Tensor, fmts: tuple[str, ...] = ("int8", "float8_e4m3fn", "float8_e5m2"),
                 top: float = 0.001) -> dict[str, dict[str, float]]:
    """For each format of :func:`per_tensor_round`: mean relative error ``|q - w| / |w|`` of the small
    weights (|w| at or below the median) and of the outliers (the largest ``top`` share by |w|), and
    the mean squared error over all weights (chapter 06, integer vs float formats)."""
    w = w.detach().float().flatten()
    a = w.abs()
    med = a.median()
    cut = a.kthvalue(max(1, int(a.numel() * (1 - top)))).values
    small, big = (a <= med) & (a > 0), a > cut
    out = {}
    for f in fmts:
        err = (per_tensor_round(w, f) - w).abs()
        out[f] = {"small": float((err[small] / a[small]).mean()),
                  "outliers": float((err[big] / a[big]).mean()),
                  "mse": float(err.pow(2).mean())}
    return out


def bytes_per_param(total: float, embedding: float, linear_bits: float, embedding_bytes: float) -> float:
    """Whole-model bytes per parameter when every parameter but the ``embedding`` ones (embedding
    and head) takes ``linear_bits`` bits and those take ``embedding_bytes`` bytes each."""
    return ((total - embedding) * linear_bits / 8 + embedding * embedding_bytes) / total
