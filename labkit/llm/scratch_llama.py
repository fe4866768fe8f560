"""A llama-architecture LLM forward pass from scratch, in plain PyTorch (chapter 03, "How LLMs work").

Reads the same ``model.safetensors`` the transformers model loads and reproduces its logits:
token embedding, then per layer RMSNorm -> grouped-query attention with rotary position
embeddings (RoPE) -> residual add -> RMSNorm -> SwiGLU MLP -> residual add, then a final RMSNorm
and the LM head (tied to the embedding in SmolLM2). An optional KV cache (a list of ``(k, v)``
per layer) turns each decode step from "reprocess the whole sequence" into "process one token".
Qwen3's per-head query/key norms and Qwen2's q/k/v biases are honoured when the weights have them.
In the style of gpt-fast: functions over a dict of tensors, no framework.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from ..hardware.microbench import timed
from .architecture import head_dim, kv_heads
from .attention import attention

Weights = dict[str, torch.Tensor]
Cache = list[tuple[torch.Tensor, torch.Tensor]]
#: A forward pass ``(tokens (B, T), cache or None) -> logits (B, T, vocab)``, extending the cache in place:
#: chapter 03's page writes one; ``partial(forward, w, cfg)`` is this module's.
Forward = Callable[[torch.Tensor, Cache | None], torch.Tensor]


@dataclass(frozen=True)
class Config:
    """The numbers of a llama-style model that the forward pass needs (from ``config.json``)."""

    dim: int
    n_layers: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    ffn_dim: int
    vocab_size: int
    rope_theta: float
    norm_eps: float


def config_from_dict(c: dict[str, Any]) -> Config:
    """:class:`Config` from a transformers ``config.json`` dict (old ``rope_theta`` or new
    ``rope_parameters`` spelling). Only the default RoPE is implemented."""
    rope = c.get("rope_parameters") or c.get("rope_scaling") or {}
    if rope.get("rope_type", rope.get("type", "default")) != "default":
        raise ValueError(f"RoPE scaling {rope!r} is not implemented in the from-scratch model")
    return Config(
        dim=c["hidden_size"],
        n_layers=c["num_hidden_layers"],
        n_heads=c["num_attention_heads"],
        n_kv_heads=kv_heads(c),
        head_dim=head_dim(c),
        ffn_dim=c["intermediate_size"],
        vocab_size=c["vocab_size"],
        rope_theta=float(rope.get("rope_theta", c.get("rope_theta", 10000.0))),
        norm_eps=float(c["rms_norm_eps"]),
    )


def load(folder: str | Path, device: str = "cpu", dtype: torch.dtype | None = None) -> tuple[Weights, Config]:
    """Weights (every ``*.safetensors`` file in ``folder``, via ``safetensors.torch.load_file``)
    and :class:`Config` of a transformers checkpoint folder, e.g. ``labkit.models.llm_dir()``."""
    from safetensors.torch import load_file

    folder = Path(folder)
    files = sorted(folder.glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"no .safetensors file in {folder}; pass a transformers checkpoint folder")
    weights: Weights = {}
    for f in files:
        weights.update(load_file(f, device=str(device)))
    if dtype is not None:
        weights = {k: v.to(dtype) for k, v in weights.items()}
    return weights, config_from_dict(json.loads((folder / "config.json").read_text()))


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """RMSNorm: scale ``x`` to unit root-mean-square over its last axis (in fp32), times ``weight``."""
    xf = x.float()
    return weight * (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype)


def rope_cos_sin(
    cfg: Config, positions: torch.Tensor, dtype: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor]:
    """Rotary embedding tables for ``positions``: ``cos``, ``sin`` of shape ``(T, head_dim)``."""
    inv_freq = 1.0 / cfg.rope_theta ** (torch.arange(0, cfg.head_dim, 2, device=positions.device).float()
                                        / cfg.head_dim)
    angles = positions.float()[:, None] * inv_freq[None, :]
    angles = torch.cat([angles, angles], dim=-1)
    return angles.cos().to(dtype), angles.sin().to(dtype)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate each (i, i + D/2) pair of ``x`` (``B, H, T, D``) by its position's angle."""
    x1, x2 = x.chunk(2, dim=-1)
    return x * cos + torch.cat([-x2, x1], dim=-1) * sin


def _linear(x: torch.Tensor, w: Weights, name: str) -> torch.Tensor:
    return F.linear(x, w[name + ".weight"], w.get(name + ".bias"))


def cache_len(cache: Cache | None) -> int:
    """Number of tokens a cache holds (0 for ``None`` or empty)."""
    return cache[0][0].shape[2] if cache else 0


def qkv(w: Weights, cfg: Config, layer: int, h: torch.Tensor, cos: torch.Tensor,
        sin: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Queries ``(B, heads, T, head_dim)``, keys and values ``(B, kv_heads, T, head_dim)`` of layer
    ``layer`` for its normalised input ``h`` ``(B, T, dim)``: the three projections, Qwen3's
    per-head RMSNorm on q and k where the weights have it, then RoPE on q and k (chapter 03)."""
    b, t, _ = h.shape
    p = f"model.layers.{layer}.self_attn."
    q = _linear(h, w, p + "q_proj").view(b, t, cfg.n_heads, cfg.head_dim).transpose(1, 2)
    k = _linear(h, w, p + "k_proj").view(b, t, cfg.n_kv_heads, cfg.head_dim).transpose(1, 2)
    v = _linear(h, w, p + "v_proj").view(b, t, cfg.n_kv_heads, cfg.head_dim).transpose(1, 2)
    if p + "q_norm.weight" in w:  # Qwen3: RMSNorm over each head's query and key
        q = rms_norm(q, w[p + "q_norm.weight"], cfg.norm_eps)
        k = rms_norm(k, w[p + "k_norm.weight"], cfg.norm_eps)
    return apply_rope(q, cos, sin), apply_rope(k, cos, sin), v


def forward(
    w: Weights,
    cfg: Config,
    tokens: torch.Tensor,
    cache: Cache | None = None,
    attn_maps: list[torch.Tensor] | None = None,
) -> torch.Tensor:
    """Logits ``(B, T, vocab)`` for ``tokens`` ``(B, T)``.

    ``cache``: ``None`` (no cache: the tokens are the whole sequence) or a list, empty at first,
    that this call extends in place with each layer's keys and values; the tokens then continue
    the sequence the cache holds. ``attn_maps``: a list to which each layer's attention weights
    ``(B, heads, T, T_total)`` are appended (to plot them).
    """
    b, t = tokens.shape
    start = cache_len(cache)
    positions = torch.arange(start, start + t, device=tokens.device)
    cos, sin = rope_cos_sin(cfg, positions, w["model.norm.weight"].dtype)
    x = F.embedding(tokens, w["model.embed_tokens.weight"])
    for i in range(cfg.n_layers):
        p = f"model.layers.{i}."
        h = rms_norm(x, w[p + "input_layernorm.weight"], cfg.norm_eps)
        q, k, v = qkv(w, cfg, i, h, cos, sin)
        if cache is not None:
            if len(cache) > i:
                k, v = torch.cat([cache[i][0], k], dim=2), torch.cat([cache[i][1], v], dim=2)
                cache[i] = (k, v)
            else:
                cache.append((k, v))
        out, probs = attention(q, k, v, causal=True)
        if attn_maps is not None:
            attn_maps.append(probs)
        out = out.transpose(1, 2).reshape(b, t, cfg.n_heads * cfg.head_dim)
        x = x + _linear(out, w, p + "self_attn.o_proj")
        h = rms_norm(x, w[p + "post_attention_layernorm.weight"], cfg.norm_eps)
        gate, up = _linear(h, w, p + "mlp.gate_proj"), _linear(h, w, p + "mlp.up_proj")
        x = x + _linear(F.silu(gate) * up, w, p + "mlp.down_proj")
    x = rms_norm(x, w["model.norm.weight"], cfg.norm_eps)
    return F.linear(x, w.get("lm_head.weight", w["model.embed_tokens.weight"]))  # tied head: reuse embedding


def greedy(logits: torch.Tensor) -> torch.Tensor:
    """Most likely next token of each sequence: ``(B, T, V)`` -> ``(B, 1)``."""
    return logits[:, -1].argmax(-1, keepdim=True)


@torch.no_grad()
def generate(
    forward: Forward,
    prompt: torch.Tensor,
    max_new_tokens: int,
    use_cache: bool = True,
    pick: Callable[[torch.Tensor], torch.Tensor] = greedy,
    eos_id: int | None = None,
) -> dict[str, Any]:
    """Generate up to ``max_new_tokens`` after ``prompt`` ``(1, T)`` with ``forward``, timing each pass.

    Returns ``{"tokens": list[int] (new tokens), "prefill_s": float (first forward: the whole
    prompt, gives the first token), "step_s": list[float] (each later forward, seconds)}``.
    Without a cache every step re-runs the whole sequence so far; with one it feeds one token.
    ``pick`` turns logits into the next token (greedy by default; see :mod:`labkit.llm.sampling`).
    """
    device = prompt.device
    cache: Cache | None = [] if use_cache else None
    seq, new, times = prompt, [], []

    def step_on(feed: torch.Tensor) -> torch.Tensor:
        return pick(forward(feed, cache))

    for step in range(max_new_tokens):
        feed = seq if (step == 0 or cache is None) else seq[:, -1:]
        nxt, seconds = timed(partial(step_on, feed), str(device))
        times.append(seconds)
        new.append(int(nxt))
        seq = torch.cat([seq, nxt.view(1, 1).to(device)], dim=1)
        if eos_id is not None and new[-1] == eos_id:
            break
    return {"tokens": new, "prefill_s": times[0], "step_s": times[1:]}


def crop(cache: Cache, n: int) -> Cache:
    """The first ``n`` tokens of a cache (views of its tensors: nothing is copied or changed)."""
    return [(k[:, :, :n], v[:, :, :n]) for k, v in cache]


@torch.no_grad()
def decode_step_seconds(
    forward: Forward,
    tokens: torch.Tensor,
    start: int,
    use_cache: bool,
    steps: int = 3,
    prefilled: Cache | None = None,
) -> list[float]:
    """Seconds of each of ``steps`` decode steps of ``forward`` that read ``tokens[:, start:start + steps]``
    one at a time, each predicting the next token from everything before it (``tokens``: ``(1, n)``).

    With a cache, each step feeds one token; the first ``start`` tokens are put in the cache
    beforehand, untimed (cropped from ``prefilled`` when it holds at least that many, which saves
    re-running the prefill for every length of a sweep). Without a cache, each step re-runs the
    whole prefix, recomputing every key and value.
    """
    if tokens.shape[1] < start + steps:
        raise ValueError(f"need at least start + steps = {start + steps} tokens, got {tokens.shape[1]}")
    cache: Cache | None = None
    if use_cache:
        if prefilled is not None and cache_len(prefilled) >= start:
            cache = crop(prefilled, start)
        else:
            cache = []
            if start:
                forward(tokens[:, :start], cache)
    device, out = tokens.device, []

    def step_on(feed: torch.Tensor) -> torch.Tensor:
        return greedy(forward(feed, cache))

    for i in range(start, start + steps):
        feed = tokens[:, i:i + 1] if cache is not None else tokens[:, :i + 1]
        out.append(timed(partial(step_on, feed), str(device))[1])
    return out


def power_law_exponent(lengths: list[int], seconds: list[float]) -> float:
    """The exponent ``e`` of ``seconds ~ lengths ** e``: the least-squares slope of log time on log
    length over every point of a sweep (not two endpoints), as for decode step times (chapter 03)."""
    if len(lengths) < 3 or len(lengths) != len(seconds):
        raise ValueError("need at least three (length, time) pairs of equal count")
    return float(np.polyfit(np.log(lengths), np.log(seconds), 1)[0])


def kv_scaling_sentence(e_uncached: float, e_cached: float, longest: int, crossover: float) -> str:
    """How decode step time grew with context, fitted exponents beside what attention alone would
    give (2 without the cache, 1 with it), and why they differ below ``crossover`` tokens, where
    weight work outweighs attention work (:func:`labkit.llm.architecture.attention_crossover_tokens`)."""
    text = (f"Fitted over the sweep, a decode step grows like n^{e_uncached:.2f} without the cache and "
            f"n^{e_cached:.2f} with it; attention alone would give n^2 and n^1. ")
    if longest < crossover:
        return text + (f"Up to {longest} tokens this model's weights outweigh its attention (the two match "
                       f"near {crossover:,.0f} tokens), so a step is mostly weight work, which grows like n "
                       "without the cache and stays fixed with it: exponents near 1 and 0 are expected here.")
    return text + (f"Past {crossover:,.0f} tokens attention outweighs the weights, so the fit nears "
                   "those powers.")
