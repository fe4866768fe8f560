"""Attention's memory at long context (chapter 03, "Going further"): the written-out attention of
:mod:`labkit.llm.attention` holds every query-key score, ``heads x n x n`` numbers, while PyTorch's
fused ``scaled_dot_product_attention`` works through the keys a block at a time (FlashAttention's
tiling) and never holds them all.

:func:`peak_extra_bytes` measures how far one call raised the process's memory above where it began:
on CUDA from the allocator's peak (``torch.cuda.max_memory_allocated``), on Linux from the kernel's
resident-set high-water mark (``VmHWM``, reset through ``/proc/self/clear_refs``). Elsewhere (macOS,
Windows) it raises :class:`MemoryProbeUnavailable` with the reason. On a CPU it counts only memory
the process had to take from the system: glibc maps blocks over 32 MB (its largest threshold) and
returns them on free, so those show, but a smaller block may be served from freed memory the process
already holds and then adds nothing. :func:`sweep` times both
implementations and measures their peaks for each context length, in bytes and seconds (its growth:
:func:`labkit.llm.scratch_llama.power_law_exponent`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from ..hardware.microbench import timed
from .attention import attention

PROC = Path("/proc/self")
#: The smallest peak :func:`peak_extra_bytes` is sure to see on a CPU: glibc's largest mmap threshold on a
#: 64-bit system (DEFAULT_MMAP_THRESHOLD_MAX, 32 MiB); a smaller block may come from memory the process
#: already holds. The CUDA allocator's peak is exact (0).
CPU_RESOLUTION_BYTES = 32 * 2**20


def resolution_bytes(device: str = "cpu") -> int:
    """The smallest peak (bytes) :func:`peak_extra_bytes` resolves on ``device``: 0 on CUDA,
    :data:`CPU_RESOLUTION_BYTES` elsewhere. A reading below it bounds the peak from above by it."""
    return 0 if device.startswith("cuda") else CPU_RESOLUTION_BYTES


class MemoryProbeUnavailable(RuntimeError):
    """This platform offers no resettable peak-memory reading (no ``/proc/self/clear_refs``, no CUDA)."""


def _status_bytes(field: str) -> int:
    for line in (PROC / "status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024  # kB
    raise MemoryProbeUnavailable(f"/proc/self/status has no {field}")


def peak_extra_bytes(fn: Callable[[], Any], device: str = "cpu") -> int:
    """Bytes by which running ``fn()`` raised the memory in use above where it started: on CUDA the
    allocator's peak over its allocation at the start; on a CPU the resident set's high-water mark over
    the resident set at the start (Linux). What ``fn`` returns is dropped before the call returns."""
    if device.startswith("cuda"):
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        start = torch.cuda.memory_allocated()
        out = fn()
        torch.cuda.synchronize()
        del out
        return int(torch.cuda.max_memory_allocated() - start)
    if not (PROC / "clear_refs").exists():
        raise MemoryProbeUnavailable("peak memory on a CPU is read from Linux's /proc/self (VmHWM, reset "
                                     "via clear_refs); this system has no /proc: run the section on Linux "
                                     "or a GPU")
    (PROC / "clear_refs").write_text("5")  # resets VmHWM to the current resident set
    start = _status_bytes("VmRSS")
    out = fn()
    del out
    return max(_status_bytes("VmHWM") - start, 0)


def score_bytes(heads: int, n: int, dtype: torch.dtype = torch.float32) -> int:
    """Bytes of the ``heads x n x n`` attention scores of one sequence in ``dtype``."""
    return heads * n * n * torch.finfo(dtype).bits // 8


def _written_out(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    return attention(q, k, v, causal=True)[0]


def _peak_and_seconds(fn: Callable[[], torch.Tensor], device: str) -> tuple[int, float]:
    """One call of ``fn``: (the peak memory it added, its seconds through the lab's timer)."""
    seconds = 0.0

    def run() -> None:
        nonlocal seconds
        seconds = timed(fn, device)[1]

    return peak_extra_bytes(run, device), seconds


def sweep(lengths: Sequence[int], heads: int, head_dim: int, device: str = "cpu", repeats: int = 3,
          seed: int = 0) -> list[dict[str, Any]]:
    """For each context length ``n``: causal self-attention of one sequence (``heads`` heads of
    ``head_dim``, fp32, random inputs) written out and through the fused kernel. Returns rows with
    ``n``, ``written_out_bytes`` and ``fused_bytes`` (peak memory above the inputs, the smallest of
    ``repeats`` calls), ``written_out_s`` and ``fused_s`` (median seconds), ``score_bytes`` (one
    set of scores) and ``max_abs_diff`` between the two outputs."""
    gen = torch.Generator().manual_seed(seed)
    rows = []
    for n in lengths:
        q, k, v = (torch.randn(1, heads, n, head_dim, generator=gen).to(device) for _ in range(3))
        impls: dict[str, Callable[[], torch.Tensor]] = {
            "written_out": partial(_written_out, q, k, v),
            "fused": partial(F.scaled_dot_product_attention, q, k, v, is_causal=True)}
        row: dict[str, Any] = {"n": n, "score_bytes": score_bytes(heads, n)}
        for name, fn in impls.items():
            peaks, times = zip(*(_peak_and_seconds(fn, device) for _ in range(repeats)), strict=True)
            row[f"{name}_bytes"], row[f"{name}_s"] = min(peaks), float(np.median(times))
        row["max_abs_diff"] = float((impls["written_out"]() - impls["fused"]()).abs().max())
        rows.append(row)
    return rows


def plot_sweep(rows: Sequence[dict[str, Any]], ax: Any = None) -> Any:
    """Peak memory added (MB) against the context (tokens) for both implementations, with one set of
    scores (``heads x n x n``) dotted. Returns the Axes."""
    if ax is None:
        import matplotlib.pyplot as plt

        ax = plt.subplots(figsize=(6, 3.5))[1]
    n = [r["n"] for r in rows]
    for key in ("written_out", "fused"):
        ax.plot(n, [r[f"{key}_bytes"] / 1e6 for r in rows], "o-", label=key.replace("_", " "))
    ax.plot(n, [r["score_bytes"] / 1e6 for r in rows], "k:", label="one set of scores (grows as n²)")
    ax.set(xlabel="context (tokens)", ylabel="peak memory added (MB)",
           title="Fused attention never holds the scores")
    ax.legend(fontsize=8)
    return ax
