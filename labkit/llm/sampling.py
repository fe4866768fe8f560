"""Turning a logit vector into the next token (chapter 03, "How LLMs work").

Temperature divides the logits (low: sharper, high: flatter); top-k keeps the k most likely
tokens; top-p (nucleus) keeps the smallest set of most likely tokens whose probabilities add up
to at least p. Filters set removed logits to ``-inf``, as transformers' logits processors do
(the chapter checks these against ``TemperatureLogitsWarper``, ``TopKLogitsWarper``,
``TopPLogitsWarper``). :func:`sample` draws a token; temperature 0 means greedy (argmax).
"""

from __future__ import annotations

import torch


def apply_temperature(logits: torch.Tensor, temperature: float) -> torch.Tensor:
    """``logits / temperature`` (temperature > 0)."""
    if temperature <= 0:
        raise ValueError(f"temperature must be > 0 to divide by it (use greedy for 0), got {temperature}")
    return logits / temperature


def top_k_filter(logits: torch.Tensor, k: int) -> torch.Tensor:
    """Keep the ``k`` largest logits of the last axis (and any tied with the k-th), rest ``-inf``."""
    if k < 1:
        raise ValueError(f"top_k must be at least 1, got {k}")
    k = min(k, logits.shape[-1])
    kth = torch.topk(logits, k, dim=-1).values[..., -1:]
    return logits.masked_fill(logits < kth, float("-inf"))


def top_p_filter(logits: torch.Tensor, p: float) -> torch.Tensor:
    """Nucleus filter: keep the most likely tokens until their probability reaches ``p``
    (always at least one), rest ``-inf``. A token is dropped when the tokens ranked above it
    already hold ``p`` or more of the probability."""
    if not 0 < p <= 1:
        raise ValueError(f"top_p must be in (0, 1], got {p}")
    sorted_logits, order = torch.sort(logits, descending=True, dim=-1)
    probs = sorted_logits.softmax(-1)
    mass_before = probs.cumsum(-1) - probs
    drop_sorted = mass_before >= p
    drop_sorted[..., 0] = False
    drop = drop_sorted.scatter(-1, order, drop_sorted)
    return logits.masked_fill(drop, float("-inf"))


def probabilities(
    logits: torch.Tensor, temperature: float = 1.0, top_k: int | None = None, top_p: float | None = None
) -> torch.Tensor:
    """Sampling distribution after temperature, then top-k, then top-p (transformers' order)."""
    x = apply_temperature(logits.float(), temperature)
    if top_k is not None:
        x = top_k_filter(x, top_k)
    if top_p is not None and top_p < 1.0:
        x = top_p_filter(x, top_p)
    return x.softmax(-1)


def sample(
    logits: torch.Tensor,
    temperature: float = 1.0,
    top_k: int | None = None,
    top_p: float | None = None,
    generator: torch.Generator | None = None,
) -> torch.Tensor:
    """Next token ids (shape ``logits.shape[:-1]``) from ``logits`` (``..., vocab``).
    ``temperature == 0``: greedy argmax (deterministic). Otherwise a draw from
    :func:`probabilities`, reproducible when ``generator`` is seeded the same way."""
    if temperature == 0:
        return logits.argmax(-1)
    probs = probabilities(logits, temperature, top_k, top_p)
    flat = probs.reshape(-1, probs.shape[-1])
    return torch.multinomial(flat, 1, generator=generator).view(probs.shape[:-1])


def entropy_bits(probs: torch.Tensor) -> torch.Tensor:
    """Shannon entropy of distributions on the last axis, in bits (how spread the choice is)."""
    p = probs.clamp_min(1e-30)
    return -(probs * p.log2()).sum(-1)
