"""How much memory a model needs: bytes per parameter, rules of thumb, what fits (chapters 00-01).

All sizes in bytes. A "GB" in the tutorial's rules of thumb is 1e9 bytes.
"""

from __future__ import annotations

import math
from typing import Any

# Bytes per parameter. GGUF block formats store a scale (and a minimum) per block of 32:
# Q8_0 = 34 bytes / 32 weights, Q4_0 = 18 / 32, Q4_1 = 20 / 32, Q4_K_M ≈ 4.85 bits on average.
BYTES_PER_PARAM: dict[str, float] = {
    "float32": 4, "fp32": 4, "f32": 4, "f16": 2,
    "float16": 2, "fp16": 2, "bfloat16": 2, "bf16": 2,
    "fp8": 1, "int8": 1, "q8_0": 34 / 32,
    "q4_1": 20 / 32, "q4_0": 18 / 32, "q4_k_m": 4.85 / 8, "int4": 0.5, "fp4": 0.5,
}


def bytes_per_param(dtype: str) -> float:
    """Bytes one parameter takes in ``dtype`` (a torch dtype name or a quantization name)."""
    key = str(dtype).removeprefix("torch.").lower()
    if key not in BYTES_PER_PARAM:
        raise KeyError(f"unknown dtype {dtype!r}; known: {', '.join(sorted(BYTES_PER_PARAM))}")
    return BYTES_PER_PARAM[key]


def weight_bytes(params: float, dtype: str) -> float:
    """Bytes of the weights alone: ``params`` × bytes per parameter."""
    return params * bytes_per_param(dtype)


def rule_of_thumb_gb(params: float, dtype: str) -> tuple[float, float]:
    """The tutorial's VRAM rule of thumb as a (low, high) range in GB: FP16 ≈ 2 × billions of
    parameters, Q4 ≈ 0.5-0.6 ×; other dtypes scale with their bytes per parameter."""
    b = params / 1e9
    key = str(dtype).lower()
    if key.startswith("q4") or key in ("int4", "fp4"):
        return 0.5 * b, 0.6 * b
    per = bytes_per_param(dtype)
    return per * b, per * b


def fits(params: float, dtype: str, memory_bytes: float, overhead: float = 1.2) -> bool:
    """Whether weights × ``overhead`` (KV cache, activations, runtime) fit in ``memory_bytes``."""
    return weight_bytes(params, dtype) * overhead <= memory_bytes


def fit_table(memory_bytes: float, models: dict[str, float],
              dtypes: tuple[str, ...] = ("fp32", "bf16", "int8", "q4_k_m"),
              overhead: float = 1.2) -> list[dict]:
    """One row per model: weight GB per dtype and whether it fits ``memory_bytes`` with ``overhead``."""
    rows = []
    for name, params in models.items():
        row: dict = {"model": name, "params_b": params / 1e9}
        for d in dtypes:
            row[f"{d}_gb"] = weight_bytes(params, d) / 1e9
            row[f"{d}_fits"] = fits(params, d, memory_bytes, overhead)
        rows.append(row)
    return rows


def safetensors_params(path: Any) -> int:
    """Number of parameters stored in a ``.safetensors`` file, read from its header only
    (no tensor is loaded)."""
    from safetensors import safe_open

    total = 0
    with safe_open(str(path), framework="pt") as f:
        for key in f.keys():
            total += math.prod(f.get_slice(key).get_shape())
    return total


def tensor_bytes(module: Any, buffers: bool = True) -> int:
    """Bytes held by a torch module's parameters (and buffers, unless ``buffers=False``): each
    tensor's numel × element size, tied tensors counted once."""
    seen, total = set(), 0
    for t in list(module.parameters()) + (list(module.buffers()) if buffers else []):
        if t.data_ptr() in seen:
            continue
        seen.add(t.data_ptr())
        total += t.numel() * t.element_size()
    return total
