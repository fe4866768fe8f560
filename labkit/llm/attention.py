"""Scaled dot-product attention written out (chapter 03, "How LLMs work").

``softmax(Q Kᵀ / √d) V`` in four lines, with the causal mask and grouped-query attention
(several query heads sharing one key/value head), so the chapter can show the attention
weights and check the result against ``torch.nn.functional.scaled_dot_product_attention``.
"""

from __future__ import annotations

import math

import torch


def repeat_kv(x: torch.Tensor, n_rep: int) -> torch.Tensor:
    """Grouped-query attention: repeat each of the ``H_kv`` key/value heads of ``x``
    (shape ``B, H_kv, T, D``) ``n_rep`` times, giving ``B, H_kv * n_rep, T, D``."""
    if n_rep == 1:
        return x
    b, h, t, d = x.shape
    return x[:, :, None].expand(b, h, n_rep, t, d).reshape(b, h * n_rep, t, d)


def causal_mask(q_len: int, k_len: int, device: torch.device | str | None = None) -> torch.Tensor:
    """Boolean ``(q_len, k_len)`` mask, True where a query may look. The queries are the last
    ``q_len`` positions of the ``k_len`` keys (decode with a KV cache: 1 query, many keys)."""
    q_pos = torch.arange(k_len - q_len, k_len, device=device)[:, None]
    return torch.arange(k_len, device=device)[None, :] <= q_pos


def attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = True
) -> tuple[torch.Tensor, torch.Tensor]:
    """``softmax(Q Kᵀ / √d) V``.

    ``q``: ``(B, H, Tq, D)``; ``k``, ``v``: ``(B, H_kv, Tk, D)`` with ``H`` a multiple of ``H_kv``.
    Returns ``(output (B, H, Tq, D), weights (B, H, Tq, Tk))``; each row of ``weights`` is a
    probability distribution over the keys that query attends to.
    """
    if q.shape[1] % k.shape[1]:
        raise ValueError(f"query heads ({q.shape[1]}) must be a multiple of key/value heads ({k.shape[1]})")
    n_rep = q.shape[1] // k.shape[1]
    k, v = repeat_kv(k, n_rep), repeat_kv(v, n_rep)
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    if causal:
        scores = scores.masked_fill(~causal_mask(q.shape[-2], k.shape[-2], q.device), float("-inf"))
    weights = torch.softmax(scores.float(), dim=-1).to(q.dtype)
    return weights @ v, weights
