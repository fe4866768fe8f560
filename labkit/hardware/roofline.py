"""The roofline model: is a piece of work limited by compute or by memory bandwidth? (chapter 04).

A device does at most ``peak_flops`` floating-point operations per second and moves at most
``bandwidth`` bytes per second between memory and its compute units. Work that does ``I`` FLOPs
per byte it moves (its *arithmetic intensity*) runs at most at ``min(peak_flops, I * bandwidth)``.
The two roofs meet at the *ridge point* ``peak_flops / bandwidth`` (the device's ops:byte ratio):
below it the work is memory-bound, above it compute-bound.

Units everywhere: FLOPs (not TFLOPs), bytes, seconds, FLOP/s, bytes/s, tokens/s.
LLM decode at batch 1 reads every weight once per token and does about 2 FLOPs per weight,
so its intensity is about 2 / bytes-per-weight: far left of every ridge. Hence
:func:`decode_ceiling_tokens_per_s`: tokens/s <= bandwidth / bytes read per token.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np


def matmul_flops(m: int, n: int, k: int) -> int:
    """FLOPs of an (m×k)·(k×n) matmul: one multiply and one add per term, 2·m·n·k."""
    return 2 * m * n * k


def ridge_point(peak_flops: float, bandwidth_bytes_per_s: float) -> float:
    """Ridge point (FLOPs per byte) in SI units: peak FLOP/s ÷ bytes/s, the device's ops:byte ratio
    (the tutorial's H100: 989e12 / 3.35e12 ≈ 295). Catalog entries have
    ``Accelerator.ops_per_byte(dtype)``, which calls this."""
    if peak_flops <= 0 or bandwidth_bytes_per_s <= 0:
        raise ValueError(f"peak_flops and bandwidth must be > 0, got {peak_flops}, {bandwidth_bytes_per_s}")
    return peak_flops / bandwidth_bytes_per_s


def attainable_flops(intensity: float, peak_flops: float, bandwidth_bytes_per_s: float) -> float:
    """Roofline bound in FLOP/s for work of ``intensity`` FLOPs/byte: min(peak, intensity × bandwidth)."""
    return min(peak_flops, intensity * bandwidth_bytes_per_s)


def is_memory_bound(intensity: float, peak_flops: float, bandwidth_bytes_per_s: float) -> bool:
    """True when ``intensity`` (FLOPs/byte) lies left of the device's ridge point."""
    return intensity < ridge_point(peak_flops, bandwidth_bytes_per_s)


def gemm_bytes(m: int, n: int, k: int, dtype_bytes: float = 2) -> float:
    """Minimum bytes moved by an (m×k) @ (k×n) product: read both inputs once, write the output once."""
    return (m * k + k * n + m * n) * dtype_bytes


def gemm_intensity(m: int, n: int, k: int, dtype_bytes: float = 2) -> float:
    """Arithmetic intensity (FLOPs/byte) of a GEMM. For a linear layer, ``m`` is the number of
    tokens in flight (batch × sequence), ``k``×``n`` the weight: with ``m`` small it tends to
    2·m / dtype_bytes, so batching is what moves a layer toward the compute roof."""
    return matmul_flops(m, n, k) / gemm_bytes(m, n, k, dtype_bytes)


def forward_flops(params: float, tokens: int) -> float:
    """Approximate FLOPs of a forward pass over ``tokens`` tokens: 2 × params per token
    (one multiply-add per weight; attention's extra FLOPs are ignored, small at short context)."""
    return 2.0 * params * tokens


def forward_bytes(weight_bytes: float, kv_bytes: float = 0.0, activation_bytes: float = 0.0) -> float:
    """Bytes one forward pass reads/writes: every weight once, the KV cache read, plus activations."""
    return weight_bytes + kv_bytes + activation_bytes


def step_intensity(params: float, tokens: int, weight_bytes: float, kv_bytes: float = 0.0) -> float:
    """Intensity (FLOPs/byte) of one forward step that processes ``tokens`` tokens together:
    decode at batch B has ``tokens = B``, a prefill of a P-token prompt has ``tokens = P``.
    The weights are read once however many tokens share them, which is why prefill (and
    batching) raises intensity."""
    return forward_flops(params, tokens) / forward_bytes(weight_bytes, kv_bytes)


def decode_ceiling_tokens_per_s(bandwidth_bytes_per_s: float, bytes_per_token: float) -> float:
    """Upper bound on single-stream decode speed (tokens/s): every generated token must read
    ``bytes_per_token`` bytes (weights + KV cache) at ``bandwidth_bytes_per_s``."""
    if bandwidth_bytes_per_s <= 0 or bytes_per_token <= 0:
        raise ValueError(
            f"bandwidth and bytes per token must be > 0, got {bandwidth_bytes_per_s}, {bytes_per_token}"
        )
    return bandwidth_bytes_per_s / bytes_per_token


def bandwidth_achieved(tokens_per_s: float, bytes_per_token: float, bandwidth_bytes_per_s: float) -> float:
    """Fraction of the bandwidth ceiling a measured decode reached (gpt-fast's "bandwidth achieved"):
    tokens/s × bytes per token ÷ bandwidth. 1.0 means the memory system did nothing else."""
    return tokens_per_s * bytes_per_token / bandwidth_bytes_per_s


def roofline_plot(
    roofs: Sequence[dict[str, Any]],
    points: Sequence[dict[str, Any]] = (),
    marks: Sequence[dict[str, Any]] = (),
    ax: Any = None,
    intensity_range: tuple[float, float] = (0.1, 10_000.0),
    title: str = "Roofline",
) -> Any:
    """Log-log roofline chart; returns the matplotlib ``Figure``.

    ``roofs``: dicts with ``name``, ``peak_flops`` (FLOP/s), ``bandwidth`` (bytes/s); each is drawn
    as one line labelled with its name, its ridge point marked.
    ``points``: dicts with ``label``, ``intensity`` (FLOPs/byte), ``flops_per_s`` (measured FLOP/s);
    each is drawn as one marker series labelled ``label``.
    ``marks``: dicts with ``label`` and ``intensity``: a computed (not measured) intensity, drawn
    as a dashed vertical line labelled ``label``.
    """
    import matplotlib.pyplot as plt

    if ax is None:
        fig, ax = plt.subplots(figsize=(8, 5))
    else:
        fig = ax.figure
    x = np.logspace(np.log10(intensity_range[0]), np.log10(intensity_range[1]), 400)
    for roof in roofs:
        y = np.minimum(roof["peak_flops"], x * roof["bandwidth"])
        (line,) = ax.loglog(x, y, label=roof["name"])
        ridge = ridge_point(roof["peak_flops"], roof["bandwidth"])
        ax.plot([ridge], [roof["peak_flops"]], marker="|", markersize=12, color=line.get_color())
    markers = "os^Dv<>pP*X"
    for i, p in enumerate(points):
        ax.loglog([p["intensity"]], [p["flops_per_s"]], linestyle="none", marker=markers[i % len(markers)],
                  markersize=8, label=p["label"])
    for i, m in enumerate(marks):
        ax.axvline(m["intensity"], linestyle="--", color=f"C{(i + len(roofs) + len(points)) % 10}",
                   alpha=0.7, label=m["label"])
    ax.set_xlabel("arithmetic intensity (FLOPs / byte)")
    ax.set_ylabel("FLOP/s")
    ax.set_title(title)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8, loc="lower right")
    return fig
