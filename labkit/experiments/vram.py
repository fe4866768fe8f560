"""Will a ``vllm serve`` command fit a GPU's memory? (chapter 05, "The inference software stack").

vLLM loads the weights, then keeps room for the KV cache of at least one sequence as long as the
model's context (``--max-model-len``; by default the config's ``max_position_embeddings``), inside
``--gpu-memory-utilization`` of the GPU's memory; it refuses to start otherwise. The lab uses the
tutorial's 0.9 (:data:`UTILIZATION`); vLLM 0.32.0 defaults to 0.92 (``vllm/config/cache.py``).
:func:`serve_need` adds those two up from a model config; sizes in bytes (1 GB = 1e9 bytes).
Activations and CUDA graphs take a little more on a real GPU, so these are lower bounds.
"""

from __future__ import annotations

from typing import Any

from ..llm.architecture import param_count, text_config
from ..llm.kvcache import kv_cache_bytes_for_config

UTILIZATION = 0.9  # the tutorial's --gpu-memory-utilization (vLLM 0.32.0's default: 0.92)


def default_max_len(config: dict[str, Any]) -> int:
    """The context vLLM serves when ``--max-model-len`` is not given: the config's
    ``max_position_embeddings``."""
    return int(text_config(config)["max_position_embeddings"])


def serve_need(config: dict[str, Any], dtype_bytes: float = 2,
               max_model_len: int | None = None) -> dict[str, float]:
    """Bytes ``vllm serve`` needs at least: ``weights`` (parameters x ``dtype_bytes``), ``kv`` (one
    sequence of ``max_model_len`` tokens, KV cache in the same dtype), ``total`` and ``max_model_len``."""
    n = default_max_len(config) if max_model_len is None else int(max_model_len)
    if n < 1 or dtype_bytes <= 0:
        raise ValueError(f"need max_model_len >= 1 and dtype_bytes > 0, got {n} and {dtype_bytes}")
    weights = param_count(config)["total"] * dtype_bytes
    kv = kv_cache_bytes_for_config(config, n, dtype_bytes)
    return {"weights": weights, "kv": kv, "total": weights + kv, "max_model_len": n}


def budget(memory_bytes: float, utilization: float = UTILIZATION) -> float:
    """Bytes vLLM lets itself use on a GPU with ``memory_bytes``: ``utilization`` of it."""
    if not 0 < utilization <= 1:
        raise ValueError(f"utilization must be in (0, 1], got {utilization}")
    return memory_bytes * utilization


def longest_context(config: dict[str, Any], memory_bytes: float, dtype_bytes: float = 2,
                    utilization: float = UTILIZATION) -> int:
    """The longest ``--max-model-len`` whose one-sequence KV cache fits beside the weights in the
    budget (0 when the weights alone do not fit)."""
    room = budget(memory_bytes, utilization) - serve_need(config, dtype_bytes, 1)["weights"]
    per_token = kv_cache_bytes_for_config(config, 1, dtype_bytes)
    return max(0, int(room // per_token))
