"""A CPU's few wide cores beside a GPU's thousands of narrow ones, in numbers (chapter 04).

The tutorial contrasts a CPU's handful of powerful cores with a GPU's thousands of simpler ones.
Counting "cores" alone compares unlike things: one CPU core runs a SIMD instruction on 16 fp32
numbers at once (AVX-512; 8 with AVX2, 4 with ARM NEON), while one of NVIDIA's "CUDA cores" is a
single fp32 lane of a streaming multiprocessor (SM). So this module lines up, for this machine and a
catalog GPU: cores, fp32 lanes (cores × SIMD width, or SMs × lanes per SM), clock (GHz), fp32 FLOP/s
and memory bandwidth (bytes/s); the CPU's last two are *measured* (chapter 04's roofs), the GPU's are
datasheet figures (:mod:`labkit.hardware.catalog`).

:func:`thread_scaling` measures what more cores buy on this CPU: the same fp32 matmul (compute-bound)
and the same large copy (bandwidth-bound) at each thread count, so the speedup per thread of each
can be compared. :func:`implied_speedups` turns the two ratios into what they mean for inference:
prefill (compute-bound) gains the FLOP/s ratio at most, batch-1 decode (bandwidth-bound) the
bandwidth ratio.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import psutil

from ..settings import torch_threads
from .catalog import Accelerator
from .microbench import time_fn
from .roofline import matmul_flops

# fp32 lanes of one SIMD instruction, by CPU flag (/proc/cpuinfo names), widest first.
FLAG_LANES = (("avx512f", 16), ("avx2", 8), ("avx", 8), ("asimd", 4), ("neon", 4), ("sse2", 4))
# fp32 lanes of the kernels torch picked (``torch.backends.cpu.get_cpu_capability()``); follows
# ``ATEN_CPU_CAPABILITY``, so an AVX2 cap on an AVX-512 CPU shows here and not in the flags.
TORCH_ISA_LANES = {"AVX512": 16, "AVX2": 8, "DEFAULT": 4, "NO AVX": 4, "ZVECTOR": 4, "VSX": 4, "SVE256": 8}


def simd_lanes(flags: Sequence[str]) -> int:
    """fp32 lanes of the widest SIMD unit the CPU ``flags`` name: 16 (AVX-512), 8 (AVX2/AVX), 4
    (NEON, SSE2); 1 when none is named."""
    have = set(flags)
    return next((lanes for flag, lanes in FLAG_LANES if flag in have), 1)


def cpu_clock_ghz() -> float | None:
    """This CPU's clock in GHz: the maximum ``psutil`` reports, else its current reading, else the
    first ``cpu MHz`` line of /proc/cpuinfo (a VM often reports its nominal clock only); None if none."""
    try:
        f = psutil.cpu_freq()
    except (OSError, NotImplementedError):  # some VMs and containers
        f = None
    if f and (f.max or f.current):
        return (f.max or f.current) / 1e3
    try:
        with open("/proc/cpuinfo") as fh:
            mhz = next((line.split(":")[1] for line in fh if line.startswith("cpu MHz")), None)
    except OSError:
        return None
    return float(mhz) / 1e3 if mhz else None


def cpu_side(cpu: Mapping[str, Any], torch_isa: str, clock_ghz: float | None, fp32_flops: float,
             bandwidth: float, name: str = "this CPU") -> dict[str, Any]:
    """This machine's row: ``cpu`` is :func:`labkit.hardware.machine.cpu_info`'s dict, ``torch_isa`` the
    kernel level torch uses, ``fp32_flops`` (FLOP/s) and ``bandwidth`` (bytes/s) measured. ``lanes``
    counts fp32 lanes as physical cores × the SIMD width torch's kernels use (the flags' width is
    ``simd_flags``); ``peak_fp32`` is lanes × 2 (a fused multiply-add) × clock for *one* FMA unit per
    core (many server cores have two), None without a clock. ``amx``: the CPU has Intel AMX tiles
    (bf16/int8 matrix units; fp32 does not use them)."""
    cores = int(cpu["physical_cores"])
    flags = list(cpu.get("isa", []))
    lanes_per_core = min(TORCH_ISA_LANES.get(torch_isa.upper(), 4), max(simd_lanes(flags), 4))
    peak = cores * lanes_per_core * 2 * clock_ghz * 1e9 if clock_ghz else None
    return {"name": name, "cores": cores, "logical_cores": int(cpu["logical_cores"]),
            "simd_flags": simd_lanes(flags), "simd_torch": lanes_per_core, "lanes": cores * lanes_per_core,
            "amx": any(f.startswith("amx") for f in flags), "clock_ghz": clock_ghz,
            "peak_fp32": peak, "fp32_flops": fp32_flops, "bandwidth": bandwidth, "measured": True}


def gpu_side(acc: Accelerator) -> dict[str, Any]:
    """A catalog GPU's row, all datasheet figures: ``cores`` is SMs (each a wide SIMD unit),
    ``lanes`` the "CUDA cores", ``peak_fp32`` lanes × 2 × boost clock, ``fp32_flops`` the catalog's
    fp32 figure (FLOP/s), ``bandwidth`` bytes/s. ``ValueError`` for an entry without SM figures."""
    if not acc.cuda_cores or "fp32" not in acc.tflops:
        raise ValueError(f"{acc.name} has no SM count or fp32 figure in labkit.hardware.catalog; "
                         "pick an NVIDIA entry such as 'H100 SXM' or 'RTX 3060 12GB'")
    return {"name": acc.name, "cores": acc.sms, "logical_cores": acc.sms, "simd_flags": acc.fp32_lanes_per_sm,
            "simd_torch": acc.fp32_lanes_per_sm, "lanes": acc.cuda_cores, "amx": False,
            "clock_ghz": acc.boost_clock_ghz, "peak_fp32": acc.cuda_cores * 2 * acc.boost_clock_ghz * 1e9,
            "fp32_flops": acc.tflops["fp32"] * 1e12, "bandwidth": acc.bandwidth_bytes_per_s,
            "measured": False}


def format_sides(rows: Sequence[Mapping[str, Any]]) -> str:
    """A plain-text table of :func:`cpu_side` / :func:`gpu_side` rows."""
    def num(x: float | None, fmt: str) -> str:
        return "-" if x is None else format(x, fmt)

    def tf(x: float | None) -> str:
        return num(x and x / 1e12, ".3f")

    lines = [f"{'':<16}{'cores':>7}{'lanes/core':>11}{'fp32 lanes':>11}{'GHz':>6}{'fp32 peak':>11}"
             f"{'fp32 matmul':>13}{'bandwidth':>11}  source"]
    for r in rows:
        lines.append(f"{r['name'][:16]:<16}{r['cores']:>7}{r['simd_torch']:>11}{r['lanes']:>11,}"
                     f"{num(r['clock_ghz'], '.2f'):>6}{tf(r['peak_fp32']):>8} TF"
                     f"{r['fp32_flops'] / 1e12:>10.3f} TF{r['bandwidth'] / 1e9:>7.0f} GB/s  "
                     + ("measured here (peak: 1 FMA unit/core)" if r["measured"] else "datasheet"))
    return "\n".join(lines)


def implied_speedups(cpu: Mapping[str, Any], gpu: Mapping[str, Any]) -> dict[str, float]:
    """GPU ÷ CPU for each figure: ``lanes``, ``flops`` (fp32 FLOP/s: what a compute-bound prefill
    can gain at most) and ``bandwidth`` (what a bandwidth-bound batch-1 decode can gain at most)."""
    return {"lanes": gpu["lanes"] / cpu["lanes"], "flops": gpu["fp32_flops"] / cpu["fp32_flops"],
            "bandwidth": gpu["bandwidth"] / cpu["bandwidth"]}


def thread_scaling(threads: Sequence[int] = (1, 2), rounds: int = 3, n: int = 1024,
                   nbytes: int = 256 * 2**20, repeats: int = 3) -> dict[str, Any]:
    """Measure an n×n fp32 matmul (compute-bound) and a copy of ``nbytes`` (bandwidth-bound, read +
    write counted) on the CPU at each torch thread count, ``rounds`` times alternating the counts so
    background load hits all alike; torch's thread count is restored afterwards. Returns
    ``{"threads", "matmul_gflops": {t: median GFLOP/s}, "copy_gbps": {t: median GB/s}, "speedup":
    {"matmul": [per round], "copy": [per round]}}``, each speedup the largest thread count's rate ÷
    the first's in the same round."""
    import torch

    if len(threads) < 2 or rounds < 1:
        raise ValueError("give at least two thread counts, e.g. (1, 2), and rounds >= 1")
    if any(t < 1 for t in threads):
        raise ValueError(f"thread counts must be >= 1, got {list(threads)}")
    a, b = torch.randn(n, n), torch.randn(n, n)
    src = torch.ones(nbytes // 4)
    dst = torch.empty_like(src)
    mm: dict[int, list[float]] = {t: [] for t in threads}
    cp: dict[int, list[float]] = {t: [] for t in threads}
    for _ in range(rounds):
        for t in threads:
            with torch_threads(t):
                mm_s = float(np.median(time_fn(lambda: a @ b, repeats=repeats)))
                copy_s = float(np.median(time_fn(lambda: dst.copy_(src), repeats=repeats)))
            mm[t].append(matmul_flops(n, n, n) / mm_s)
            cp[t].append(2 * src.numel() * 4 / copy_s)
    lo, hi = threads[0], threads[-1]
    return {"threads": list(threads),
            "matmul_gflops": {t: float(np.median(v)) / 1e9 for t, v in mm.items()},
            "copy_gbps": {t: float(np.median(v)) / 1e9 for t, v in cp.items()},
            "speedup": {"matmul": [h / low for h, low in zip(mm[hi], mm[lo], strict=True)],
                        "copy": [h / low for h, low in zip(cp[hi], cp[lo], strict=True)]},
            "cpu_count": os.cpu_count() or 1}


#: The panels of :func:`bar_plot`: title, y-axis unit, and the figure read from a row.
PANELS: dict[str, tuple[str, Any]] = {
    "fp32 lanes": ("lanes", lambda r: r["lanes"]),
    "clock": ("GHz", lambda r: r["clock_ghz"] or np.nan),
    "fp32 compute": ("TFLOP/s", lambda r: r["fp32_flops"] / 1e12),
    "memory bandwidth": ("GB/s", lambda r: r["bandwidth"] / 1e9),
}


def _bar_text(v: float) -> str:
    return "" if v != v else f"{v:,.0f}" if v >= 100 else f"{v:.3g}"


def bar_plot(rows: Sequence[Mapping[str, Any]], title: str = "CPU vs GPU") -> Any:
    """One small panel per quantity of :data:`PANELS` (fp32 lanes, clock, fp32 TFLOP/s, bandwidth),
    each with its unit on its y axis and one bar per row, its value written on it. A panel whose bars
    span more than 10x gets a log axis (said in its label). A row without a clock shows "n/a"."""
    import matplotlib.pyplot as plt

    names = [r["name"] + ("\n(measured)" if r["measured"] else "\n(datasheet)") for r in rows]
    fig, axes = plt.subplots(1, len(PANELS), figsize=(3.1 * len(PANELS), 3.6), layout="constrained")
    for ax, (what, (unit, figure)) in zip(axes, PANELS.items(), strict=True):
        values = [float(figure(r)) for r in rows]
        bars = ax.bar(range(len(rows)), values, color=[f"C{i}" for i in range(len(rows))])
        ax.bar_label(bars, labels=[_bar_text(v) for v in values], fontsize=8)  # a NaN bar gets none
        for i in (i for i, v in enumerate(values) if v != v):
            ax.text(i, 0.02, "n/a", transform=ax.get_xaxis_transform(), ha="center", va="bottom", fontsize=8)
        shown = [v for v in values if v == v and v > 0]
        log = bool(shown) and max(shown) > 10 * min(shown)
        if log:
            ax.set_yscale("log")
        ax.margins(y=0.15)  # room for the value above the tallest bar
        ax.set_xticks(range(len(rows)), names, fontsize=7)
        ax.set(title=what, ylabel=unit + (", log scale" if log else ""))
        ax.grid(True, axis="y", which="major", alpha=0.3)
    fig.suptitle(title)
    return fig
