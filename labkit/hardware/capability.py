"""Which number format should this machine compute in? Decided once, from what the hardware does
(chapters 00 and 04 teach it; every chapter that loads a model asks here).

16-bit formats halve the bytes a decode step reads, but they only pay where the hardware has
16-bit arithmetic. A CPU with AVX-512 BF16 or AMX multiplies bf16 natively; an AVX2-only CPU
(older Intel, most AMD EPYC/Ryzen before Zen 4) has no bf16 instructions, and torch falls back to
converting element by element, so a bf16 matmul there is many times *slower* than fp32 (chapter 04
measures it where it runs).
So the choice is made per device:

* CUDA: bf16 where the GPU supports it (compute capability 8.0+), else fp16.
* Apple MPS: bf16 where this torch/macOS accepts it, else fp16.
* CPU: bf16 where oneDNN reports native bf16 (and ``ONEDNN_MAX_CPU_ISA`` does not cap it away), or
  where a short measured matmul shows bf16 at least as fast as fp32; otherwise fp32.

:func:`choose_dtype` is the pure rule (unit-tested with every combination); :func:`capability`
gathers the facts on this machine once per process and applies it; :func:`compute_dtype` is
what chapters call.
"""

from __future__ import annotations

import functools
import os
import time
from dataclasses import dataclass

# oneDNN ISA caps (``ONEDNN_MAX_CPU_ISA``) that leave out bf16 instructions.
NO_BF16_ISA_CAPS = ("SSE41", "AVX", "AVX2", "AVX2_VNNI", "AVX2_VNNI_2", "AVX512_CORE", "AVX512_CORE_VNNI")


@dataclass(frozen=True)
class Capability:
    """What this device can do with 16-bit numbers, and the compute dtype chosen from it.

    ``isa``: torch's CPU kernel level (``AVX512``, ``AVX2``, ``DEFAULT`` for ARM, ...).
    ``bf16_native`` / ``fp16_native``: the hardware multiplies these formats itself.
    ``bf16_speedup``: fp32 matmul seconds / bf16 matmul seconds, measured (CPU only, when the
    flags did not settle it; ``None`` otherwise). ``dtype``: the chosen torch dtype name.
    ``reason``: one sentence saying why."""

    device: str
    isa: str
    bf16_native: bool
    fp16_native: bool
    bf16_speedup: float | None
    dtype: str
    reason: str


def choose_dtype(device: str, bf16_native: bool, fp16_native: bool = False,
                 bf16_speedup: float | None = None) -> tuple[str, str]:
    """The rule: ``(torch dtype name, reason)`` for ``device`` (``cpu``/``cuda``/``mps``) given what
    it supports. ``bf16_speedup`` (fp32 time / bf16 time of the same matmul) lets a CPU without
    the native flag still pick bf16 when it measured at least as fast as fp32."""
    base = device.split(":")[0]
    if base == "cuda":
        if bf16_native:
            return "bfloat16", "this GPU has bf16 tensor cores (compute capability 8.0 or newer)"
        return "float16", "this GPU has no bf16 support (compute capability below 8.0): fp16 instead"
    if base == "mps":
        if bf16_native:
            return "bfloat16", "Apple MPS accepts bf16 on this macOS/torch"
        return "float16", "Apple MPS here has no bf16 (needs macOS 14+): fp16 instead"
    if base != "cpu":
        raise ValueError(f"unknown device {device!r}; use cpu, cuda or mps")
    if bf16_native:
        return "bfloat16", "the CPU multiplies bf16 natively (AVX-512 BF16 or AMX, reported by oneDNN)"
    if bf16_speedup is not None and bf16_speedup >= 1.0:
        return "bfloat16", f"no native-bf16 flag, but a bf16 matmul measured {bf16_speedup:.2f}x fp32's speed"
    slower = f": a bf16 matmul measured {1 / bf16_speedup:.0f}x slower than fp32" if bf16_speedup else ""
    return "float32", f"no native bf16 on this CPU (torch converts it element by element){slower}"


def _onednn_caps_bf16() -> bool:
    cap = os.environ.get("ONEDNN_MAX_CPU_ISA", "").strip().upper()
    return cap not in NO_BF16_ISA_CAPS


def cpu_flags() -> tuple[str, bool, bool]:
    """``(torch CPU kernel level, oneDNN bf16 native, oneDNN fp16 native)`` for this process.
    torch's level follows ``ATEN_CPU_CAPABILITY``; the oneDNN flags ignore ``ONEDNN_MAX_CPU_ISA``,
    so a cap below bf16 is applied here (that is how an AVX2-only CPU is emulated on a newer one)."""
    import torch

    isa = torch.backends.cpu.get_cpu_capability()
    mkldnn = torch.ops.mkldnn
    bf16 = bool(mkldnn._is_mkldnn_bf16_supported()) and _onednn_caps_bf16()
    fp16 = bool(getattr(mkldnn, "_is_mkldnn_fp16_supported", lambda: False)()) and _onednn_caps_bf16()
    return isa, bf16, fp16


def measure_bf16_speedup(n: int = 256, repeats: int = 3) -> float:
    """fp32 seconds / bf16 seconds for an n×n matmul on the CPU (best of ``repeats``, the two
    dtypes interleaved). Above 1: bf16 is faster. About 0.015 on an AVX2-only CPU."""
    import torch

    a32, b32 = torch.randn(n, n), torch.randn(n, n)
    a16, b16 = a32.bfloat16(), b32.bfloat16()
    best = {"fp32": float("inf"), "bf16": float("inf")}
    (a32 @ b32), (a16 @ b16)  # warm-up
    for _ in range(repeats):
        for name, (a, b) in (("fp32", (a32, b32)), ("bf16", (a16, b16))):
            t0 = time.perf_counter()
            a @ b
            best[name] = min(best[name], time.perf_counter() - t0)
    return best["fp32"] / best["bf16"]


def _mps_bf16() -> bool:
    import torch

    try:
        x = torch.ones(2, 2, dtype=torch.bfloat16, device="mps")
        (x @ x).cpu()
        return True
    except (RuntimeError, TypeError):
        return False


@functools.cache
def capability(device: str = "cpu") -> Capability:
    """Facts about ``device`` on this machine and the dtype :func:`choose_dtype` picks, worked out
    once per process (a CPU without the native flag pays one ~0.1 s matmul measurement)."""
    import torch

    base = device.split(":")[0]
    isa = torch.backends.cpu.get_cpu_capability()
    speedup = None
    if base == "cuda":
        bf16, fp16 = torch.cuda.is_bf16_supported(including_emulation=False), True
    elif base == "mps":
        bf16, fp16 = _mps_bf16(), True
    elif base == "cpu":
        isa, bf16, fp16 = cpu_flags()
        if not bf16:
            speedup = measure_bf16_speedup()
    else:
        raise ValueError(f"unknown device {device!r}; use cpu, cuda or mps")
    dtype, reason = choose_dtype(base, bf16, fp16, speedup)
    return Capability(base, isa, bf16, fp16, speedup, dtype, reason)


def compute_dtype(device: str = "cpu") -> str:
    """The torch dtype name this machine should compute in on ``device`` (see the module doc)."""
    return capability(device).dtype


def format_capability(cap: Capability) -> str:
    """Two lines for ``labkit doctor`` and chapter 00: what the device can do, and the choice."""
    native = [name for name, ok in (("bf16", cap.bf16_native), ("fp16", cap.fp16_native)) if ok]
    measured = f"; bf16 matmul {cap.bf16_speedup:.3f}x fp32's speed" if cap.bf16_speedup is not None else ""
    return (f"capability    {cap.device}: ISA {cap.isa}; native 16-bit: {', '.join(native) or 'none'}"
            f"{measured}\ncompute dtype {cap.dtype}: {cap.reason}")
