"""Measure the two numbers that bound inference: memory bandwidth and matmul throughput
(chapters 00 and 04).

GPU calls return before the work is done, so every timer here calls
:func:`labkit.hardware.machine.synchronize` before starting and before stopping the clock. A timer that
forgets ``torch.cuda.synchronize()`` / ``torch.mps.synchronize()`` measures how fast Python can
queue kernels, not how fast the GPU runs them.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import TypeVar

import numpy as np

from . import machine
from .roofline import matmul_flops

T = TypeVar("T")


def timed(fn: Callable[[], T], device: str = "cpu") -> tuple[T, float]:
    """Run ``fn`` once: ``(its result, seconds)``, with the device synchronized before the clock
    starts and before it stops. Every timer in the lab goes through here."""
    machine.synchronize(device)
    t0 = time.perf_counter()
    out = fn()
    machine.synchronize(device)
    return out, time.perf_counter() - t0


def interleaved_times(fns: Mapping[str, Callable[[], object]], device: str = "cpu", repeats: int = 7,
                      warmup: int = 1) -> dict[str, np.ndarray]:
    """Time several functions side by side: each repetition runs every function once, in turn,
    so background load on a shared machine hits all of them alike (chapter 05 compares fused and
    unfused kernels this way). Returns name -> seconds per run (``repeats`` values), with the
    device synchronized before and after every timed call."""
    if repeats < 1:
        raise ValueError("repeats must be at least 1")
    for _ in range(warmup):
        for fn in fns.values():
            fn()
    times: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(repeats):
        for name, fn in fns.items():
            times[name].append(timed(fn, device)[1])
    return {name: np.asarray(t) for name, t in times.items()}


def time_fn(fn: Callable[[], object], device: str = "cpu", warmup: int = 1, repeats: int = 5) -> np.ndarray:
    """Run ``fn`` ``warmup`` times untimed, then ``repeats`` times; return each run's wall time
    in seconds, with the device synchronized before and after every timed run."""
    return interleaved_times({"fn": fn}, device, repeats=repeats, warmup=warmup)["fn"]


def launch_vs_work(fn: Callable[[], object], device: str = "cpu", repeats: int = 5) -> dict[str, float]:
    """The pitfall, measured on purpose (``labkit gpu-check``'s timing section): after one untimed run,
    ``launch`` is ``fn``'s seconds with the clock read as soon as it returns (on a GPU: the kernel
    launches only), ``drained`` the same clock read again after a synchronize, and ``synced`` the
    median of ``repeats`` :func:`time_fn` runs (the work)."""
    fn()
    machine.synchronize(device)
    t0 = time.perf_counter()
    fn()
    launch = time.perf_counter() - t0  # no synchronize before this read: the mistake being shown
    machine.synchronize(device)
    drained = time.perf_counter() - t0
    synced = float(np.median(time_fn(fn, device, warmup=1, repeats=repeats)))
    return {"launch": launch, "drained": drained, "synced": synced}


def memory_bandwidth(device: str = "cpu", nbytes: int = 256 * 2**20, repeats: int = 5) -> dict:
    """Copy a ``nbytes`` buffer into another (``dst.copy_(src)``) and report bandwidth.

    Counts read + write: bytes moved = 2 × ``nbytes`` (the convention of STREAM's "copy").
    Returns ``{"gbps": GB/s from the median run, "gbps_best": from the fastest run,
    "bytes": bytes moved per run, "seconds": median seconds per run}``.
    """
    import torch

    n = nbytes // 4
    src = torch.ones(n, dtype=torch.float32, device=device)
    dst = torch.empty_like(src)
    times = time_fn(lambda: dst.copy_(src), device, warmup=2, repeats=repeats)
    moved = 2 * n * 4
    med = float(np.median(times))
    return {"gbps": moved / med / 1e9, "gbps_best": moved / float(times.min()) / 1e9,
            "bytes": moved, "seconds": med}


def matmul_tflops(device: str = "cpu", dtype: str = "float32", n: int = 1024, repeats: int = 5) -> dict:
    """Time an n×n by n×n matmul in ``dtype``; return ``{"tflops": from the median run,
    "tflops_best", "n", "seconds": median, "flops"}`` (TFLOPS = 1e12 FLOP/s)."""
    import torch

    tdtype = getattr(torch, dtype, None)
    if not isinstance(tdtype, torch.dtype):
        raise ValueError(f"unknown dtype {dtype!r}; try float32, bfloat16 or float16")
    a = torch.randn(n, n, device=device).to(tdtype)
    b = torch.randn(n, n, device=device).to(tdtype)
    times = time_fn(lambda: a @ b, device, warmup=2, repeats=repeats)
    flops = matmul_flops(n, n, n)
    med = float(np.median(times))
    return {"tflops": flops / med / 1e12, "tflops_best": flops / float(times.min()) / 1e12,
            "n": n, "seconds": med, "flops": flops}


def matmul_dtypes(device: str) -> list[str]:
    """The dtypes worth measuring on ``device``."""
    if device.startswith("cuda"):
        return ["float32", "float16", "bfloat16"]
    if device.startswith("mps"):
        return ["float32", "float16"]
    return ["float32", "bfloat16"]
