"""Vision-language models and text-to-speech as LLM workloads: the arithmetic (chapter 07).

* VLM: a vision encoder turns each image into roughly a thousand tokens that are prepended to the
  text, so every image adds a thousand tokens' worth of KV cache to each request. With the GPU
  memory left after the weights fixed, fewer requests fit side by side: :func:`vlm_rows`.
* TTS: LLM-based speech models (Orpheus-style) emit audio tokens that must keep up with playback,
  80-100 tokens/s for one stream. Single-stream decode is memory-bound, so the roofline ceiling
  (bandwidth / bytes per token) says which GPU can sustain it: :func:`tts_rows`.

Bytes, bytes/s and tokens/s throughout.
"""

from __future__ import annotations

import math
from typing import Any

from ..hardware.roofline import decode_ceiling_tokens_per_s
from ..llm.kvcache import kv_cache_bytes_for_config
from ..llm.memory import bytes_per_param, weight_bytes

IMAGE_TOKENS = 1000  # tokens per image after the vision encoder (the tutorial's round figure)
VISION_ENCODER_PARAMS = 2e9  # "typically ~2B parameters" (tutorial); weights the GPU must also hold
TTS_REALTIME_TPS = (80.0, 100.0)  # audio tokens/s one real-time TTS stream needs (tutorial)
GPU_MEMORY_UTILIZATION = 0.9  # fraction of GPU memory a server lets itself use (vLLM's default)


def vlm_kv_bytes(
    config: dict[str, Any],
    text_tokens: int,
    images: int,
    tokens_per_image: int = IMAGE_TOKENS,
    dtype_bytes: float = 2,
) -> int:
    """KV-cache bytes of one request with ``images`` images (``tokens_per_image`` each) before
    ``text_tokens`` text tokens, for the language model described by ``config``."""
    if images < 0 or text_tokens < 0:
        raise ValueError(f"images and text_tokens must be >= 0, got {images}, {text_tokens}")
    return kv_cache_bytes_for_config(config, text_tokens + images * tokens_per_image, dtype_bytes)


def max_concurrency(
    memory_bytes: float,
    weights_bytes: float,
    kv_bytes_per_request: float,
    utilization: float = GPU_MEMORY_UTILIZATION,
) -> int:
    """How many requests' KV caches fit beside the weights: ``floor((utilization x memory - weights)
    / KV bytes per request)``, 0 when the weights alone do not fit."""
    if kv_bytes_per_request <= 0:
        raise ValueError(f"kv_bytes_per_request must be > 0, got {kv_bytes_per_request}")
    free = utilization * memory_bytes - weights_bytes
    return max(0, math.floor(free / kv_bytes_per_request))


def vlm_rows(
    config: dict[str, Any],
    params: float,
    memory_bytes: float,
    image_counts: Any = (0, 1, 2, 4, 8),
    text_tokens: int = 500,
    dtype: str = "bf16",
    encoder_params: float = VISION_ENCODER_PARAMS,
    tokens_per_image: int = IMAGE_TOKENS,
) -> list[dict[str, Any]]:
    """One row per image count: tokens per request, KV bytes per request (``dtype`` for both weights
    and cache) and the max concurrency on a GPU with ``memory_bytes`` holding the LLM's ``params``
    plus a vision encoder of ``encoder_params``."""
    dtype_bytes = bytes_per_param(dtype)
    weights = weight_bytes(params + encoder_params, dtype)
    rows = []
    for n in image_counts:
        kv = vlm_kv_bytes(config, text_tokens, n, tokens_per_image, dtype_bytes)
        rows.append(
            dict(
                images=n,
                tokens=text_tokens + n * tokens_per_image,
                kv_bytes=kv,
                weights_bytes=weights,
                max_concurrency=max_concurrency(memory_bytes, weights, kv),
            )
        )
    return rows


def realtime_margin(tokens_per_s: float, required: float = TTS_REALTIME_TPS[1]) -> float:
    """Decode speed over what real-time TTS needs (>= 1: playback never waits)."""
    return tokens_per_s / required


def tts_rows(
    accelerators: dict[str, Any],
    params: float,
    dtypes: Any = ("bf16", "int8", "q4_0"),
    required: float = TTS_REALTIME_TPS[1],
) -> list[dict[str, Any]]:
    """Single-stream decode ceiling (tokens/s) of a ``params`` model in each dtype on each accelerator
    (bandwidth / weight bytes; the KV cache of a short utterance is negligible next to the weights),
    and whether it clears ``required`` tokens/s. Accelerators too small for the weights are marked."""
    rows = []
    for name, acc in accelerators.items():
        row: dict[str, Any] = {"accelerator": name}
        for dtype in dtypes:
            wb = weight_bytes(params, dtype)
            fits = wb < acc.memory_bytes
            ceiling = decode_ceiling_tokens_per_s(acc.bandwidth_bytes_per_s, wb) if fits else float("nan")
            row[dtype] = ceiling
            row[f"{dtype}_realtime"] = bool(fits and ceiling >= required)
        rows.append(row)
    return rows
