"""How big the KV cache gets (chapter 03, "How LLMs work").

Every layer keeps one key and one value vector per KV head for every token seen so far, so the
cache holds ``2 x layers x KV heads x head dim x tokens x batch`` numbers. :func:`kv_cache_bytes`
is that formula; :func:`kv_cache_bytes_for_config` applies it to a model config (DeepSeek's
multi-head latent attention caches one compressed latent instead); :func:`cache_tensor_bytes`
measures what a real cache object holds, to check the formula against. :func:`kv_bits_per_element`
is what a quantized cache costs per number, its scales counted (chapter 06).
"""

from __future__ import annotations

from typing import Any

from .architecture import head_dim, kv_heads, text_config


def kv_cache_bytes(
    n_layers: int, n_kv_heads: int, head_dim: int, n_tokens: int, dtype_bytes: float = 2, batch: int = 1
) -> int:
    """Bytes of a standard (multi-head / grouped-query) KV cache:
    ``2 (K and V) x n_layers x n_kv_heads x head_dim x n_tokens x batch x dtype_bytes``.
    ``dtype_bytes``: 4 for fp32, 2 for fp16/bf16 (default), 1 for fp8/int8."""
    for name, v in dict(n_layers=n_layers, n_kv_heads=n_kv_heads, head_dim=head_dim, batch=batch).items():
        if v < 1:
            raise ValueError(f"{name} must be at least 1, got {v}")
    if n_tokens < 0 or dtype_bytes <= 0:
        raise ValueError(f"need n_tokens >= 0 and dtype_bytes > 0, got {n_tokens} and {dtype_bytes}")
    return int(2 * n_layers * n_kv_heads * head_dim * n_tokens * batch * dtype_bytes)


def kv_cache_bytes_for_config(
    config: dict[str, Any], n_tokens: int, dtype_bytes: float = 2, batch: int = 1
) -> int:
    """KV-cache bytes of the model described by ``config`` (a ``config.json`` dict, e.g. from
    :func:`labkit.llm.architecture.load_config`) for ``n_tokens`` tokens in each of ``batch`` sequences.
    DeepSeek-style MLA (``kv_lora_rank`` set) caches ``kv_lora_rank + qk_rope_head_dim`` numbers
    per token per layer, shared by all heads."""
    c = text_config(config)
    n_layers = c["num_hidden_layers"]
    if c.get("kv_lora_rank"):
        per_token = n_layers * (c["kv_lora_rank"] + c["qk_rope_head_dim"])
        return int(per_token * n_tokens * batch * dtype_bytes)
    return kv_cache_bytes(n_layers, kv_heads(c), head_dim(c), n_tokens, dtype_bytes, batch)


def cache_tensor_bytes(cache: Any) -> int:
    """Bytes actually held by a KV cache: a transformers ``Cache`` (its ``layers`` with ``keys``
    and ``values``) or a list of ``(k, v)`` tensor pairs (the from-scratch model's cache)."""
    layers = getattr(cache, "layers", cache)
    total = 0
    for layer in layers:
        pair = (layer.keys, layer.values) if hasattr(layer, "keys") else layer
        total += sum(t.numel() * t.element_size() for t in pair if t is not None)
    return total


def kv_bits_per_element(bits: int, dim: int, kivi: bool = False, group: int = 32) -> float:
    """Bits a quantized KV cache spends per key or value number, scales included (chapter 06): per
    token and head (:func:`labkit.llm.runtime_quant.quantize_kv`), one float16 scale per ``dim`` (head
    dim) codes; KIVI-style (:func:`labkit.llm.runtime_quant.fake_quant_kivi`), a float16 minimum and
    scale per ``group`` codes."""
    return bits + (32 / group if kivi else 16 / dim)
