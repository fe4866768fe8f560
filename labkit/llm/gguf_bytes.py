"""What one batch-1 decode step of a GGUF model reads from memory (chapter 04: the bandwidth ceiling of
llama.cpp's decode, ``benchmarks/llamacpp_roofline.py``).

Every weight tensor once per generated token (a model with tied embeddings reads its embedding
matrix whole as the output head, for the logits), plus the KV cache of the tokens the step attends
to (llama.cpp keeps it in f16 by default). These are tensor bytes, not the file's size: the file
also carries the tokenizer (SmolLM2: 49k strings) and metadata.

    from labkit.llm.gguf_bytes import gguf_bytes_per_token
    gguf_bytes_per_token(gguf_path(), context=32)["total"]   # bytes per token
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from .kvcache import kv_cache_bytes
from .weight_formats import gguf_summary


def gguf_bytes_per_token(gguf: str | Path, context: float = 0.0,
                         kv_dtype_bytes: float = 2.0) -> dict[str, Any]:
    """Bytes one batch-1 decode step of ``gguf`` reads: ``weights`` (all tensor bytes), ``kv`` (the cache
    at ``context`` tokens, rounded: ``2 x layers x KV heads x head dim x context x kv_dtype_bytes``),
    ``total``; also ``file_bytes`` and the ``layers``, ``kv_heads``, ``head_dim`` read from the GGUF's
    metadata (``<arch>.block_count``, ``.attention.head_count_kv``, ``.attention.key_length`` or
    embedding length / heads)."""
    s = gguf_summary(gguf)
    meta = s["metadata"]
    arch = meta.get("general.architecture", "llama")
    try:
        layers = int(meta[f"{arch}.block_count"])
        heads = int(meta[f"{arch}.attention.head_count"])
        embedding = int(meta[f"{arch}.embedding_length"])
    except KeyError as e:
        raise ValueError(f"{gguf}: no {e.args[0]} in its metadata, so its KV cache size is unknown") from None
    kv_heads = int(meta.get(f"{arch}.attention.head_count_kv", heads))
    head_dim = int(meta.get(f"{arch}.attention.key_length", embedding // heads))
    kv = kv_cache_bytes(layers, kv_heads, head_dim, round(context), kv_dtype_bytes)
    return {"weights": float(s["bytes"]), "kv": float(kv), "total": float(s["bytes"] + kv),
            "file_bytes": float(Path(gguf).stat().st_size), "layers": layers, "kv_heads": kv_heads,
            "head_dim": head_dim}
