"""What machine is this? Device detection for chapter 00 ("Hardware Lab") and ``labkit doctor``.

:func:`detect` returns a plain dict describing the accelerator torch would use (CUDA, Apple
MPS or the CPU) plus the CPU and RAM, and :func:`resolve_device` turns a preference such
as ``"auto"`` into a device torch accepts, with a clear error when it is unavailable.
"""

from __future__ import annotations

import os
import platform
from typing import Any

DEVICES = ("auto", "cpu", "cuda", "mps")
ISA_FLAGS = ("avx", "avx2", "fma", "avx512f", "avx512_bf16", "avx512_vnni", "amx_tile",
             "amx_bf16", "amx_int8", "neon", "asimd", "sve")


def resolve_device(pref: str = "auto") -> str:
    """``auto`` -> ``cuda`` if available, else ``mps``, else ``cpu``. An explicit device that
    is not available raises ``RuntimeError`` saying what is; an unknown name ``ValueError``."""
    import torch

    base = pref.split(":")[0].lower()
    if base not in DEVICES:
        raise ValueError(f"unknown device {pref!r}; use one of {DEVICES}")
    cuda = torch.cuda.is_available()
    mps = bool(getattr(torch.backends, "mps", None)) and torch.backends.mps.is_available()
    if base == "auto":
        return "cuda" if cuda else "mps" if mps else "cpu"
    if base == "cuda" and not cuda:
        raise RuntimeError(
            "device 'cuda' requested but torch sees no CUDA GPU (torch "
            f"{torch.__version__}, built for CUDA {torch.version.cuda}); use device='auto' or 'cpu', "
            "or install a CUDA build of torch on a machine with an NVIDIA driver"
        )
    if base == "mps" and not mps:
        raise RuntimeError("device 'mps' requested but Apple MPS is not available here; use 'auto' or 'cpu'")
    return pref.lower()


def synchronize(device: str) -> None:
    """Wait for queued work on ``device`` to finish. GPU calls return before the kernel is
    done, so a timer that skips this measures the launch, not the work."""
    import torch

    if device.startswith("cuda"):
        torch.cuda.synchronize()
    elif device.startswith("mps"):
        torch.mps.synchronize()


def cpu_info() -> dict[str, Any]:
    """CPU model name, logical/physical cores, RAM (bytes) and notable ISA flags."""
    import psutil

    name, flags = platform.processor() or platform.machine(), set()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                key, _, value = line.partition(":")
                key = key.strip()
                if key == "model name":
                    name = value.strip()
                elif key in ("flags", "Features"):
                    flags.update(value.split())
    except OSError:
        try:
            import cpuinfo  # py-cpuinfo, for macOS and Windows

            info = cpuinfo.get_cpu_info()
            name = info.get("brand_raw", name)
            flags.update(info.get("flags", []))
        except Exception:  # noqa: BLE001 - best effort, the name above stays
            pass
    if platform.system() == "Darwin" and platform.machine() == "arm64":
        flags.add("neon")
    return {
        "name": name,
        "arch": platform.machine(),
        "logical_cores": os.cpu_count() or 1,
        "physical_cores": psutil.cpu_count(logical=False) or os.cpu_count() or 1,
        "ram_bytes": psutil.virtual_memory().total,
        "ram_available_bytes": psutil.virtual_memory().available,
        "isa": [f for f in ISA_FLAGS if f in flags],
    }


def detect() -> dict[str, Any]:
    """Describe this machine: ``{"device": "cuda"|"mps"|"cpu", "accelerator": {...}, "cpu": {...},
    "torch": version}``. For CUDA: name, memory (bytes), compute capability and whether
    bf16/fp8 tensor cores exist (fp8 needs compute capability 8.9 or newer)."""
    import torch

    device = resolve_device("auto")
    acc: dict[str, Any]
    if device == "cuda":
        props = torch.cuda.get_device_properties(0)
        cc = (props.major, props.minor)
        acc = {
            "name": props.name,
            "memory_bytes": props.total_memory,  # the tutorial's `total_mem` does not exist
            "compute_capability": f"{cc[0]}.{cc[1]}",
            "multiprocessors": props.multi_processor_count,
            "bf16": torch.cuda.is_bf16_supported(including_emulation=False),
            "fp8": cc >= (8, 9),
            "count": torch.cuda.device_count(),
        }
    elif device == "mps":
        import psutil

        acc = {
            "name": f"Apple GPU ({platform.machine()}, unified memory)",
            "memory_bytes": psutil.virtual_memory().total,  # shared with the CPU
            "bf16": True,
            "fp8": False,
            "count": 1,
        }
    else:
        c = cpu_info()
        acc = {
            "name": c["name"],
            "memory_bytes": c["ram_bytes"],
            "bf16": any(f in c["isa"] for f in ("avx512_bf16", "amx_bf16")),
            "fp8": False,
            "count": 1,
        }
    return {
        "device": device,
        "accelerator": acc,
        "cpu": cpu_info(),
        "torch": torch.__version__,
        "torch_threads": torch.get_num_threads(),
        "python": platform.python_version(),
        "os": f"{platform.system()} {platform.release()}",
    }


def nvidia_smi_snapshot() -> list[dict[str, Any]]:
    """Utilisation and memory of each NVIDIA GPU via NVML (nvidia-ml-py); empty list when
    there is no NVIDIA driver. Memory in bytes, utilisation in percent."""
    try:
        import pynvml

        pynvml.nvmlInit()
    except Exception:  # noqa: BLE001 - no driver / no library: nothing to report
        return []
    out = []
    try:
        for i in range(pynvml.nvmlDeviceGetCount()):
            h = pynvml.nvmlDeviceGetHandleByIndex(i)
            mem = pynvml.nvmlDeviceGetMemoryInfo(h)
            util = pynvml.nvmlDeviceGetUtilizationRates(h)
            out.append({"index": i, "name": pynvml.nvmlDeviceGetName(h),
                        "memory_used_bytes": mem.used, "memory_total_bytes": mem.total,
                        "gpu_util_pct": util.gpu, "mem_util_pct": util.memory,
                        "driver": pynvml.nvmlSystemGetDriverVersion()})
    finally:
        pynvml.nvmlShutdown()
    return out


def format_report(info: dict[str, Any]) -> str:
    """Human-readable text of :func:`detect`'s dict (used by ``labkit doctor``)."""
    acc, cpu = info["accelerator"], info["cpu"]
    gib = 1024**3
    lines = [
        f"device        {info['device']}",
        f"accelerator   {acc['name']}",
        f"memory        {acc['memory_bytes'] / gib:.1f} GiB"
        + (" (unified with the CPU)" if info["device"] == "mps" else ""),
    ]
    if "compute_capability" in acc:
        lines.append(f"compute cap.  {acc['compute_capability']}  ({acc['count']} GPU(s))")
    lines += [
        f"bf16 / fp8    {'yes' if acc['bf16'] else 'no'} / {'yes' if acc['fp8'] else 'no'}",
        f"CPU           {cpu['name']} ({cpu['arch']})",
        f"cores         {cpu['physical_cores']} physical, {cpu['logical_cores']} logical",
        f"RAM           {cpu['ram_bytes'] / gib:.1f} GiB ({cpu['ram_available_bytes'] / gib:.1f} GiB free)",
        f"ISA           {' '.join(cpu['isa']) or '-'}",
        f"torch         {info['torch']} ({info['torch_threads']} threads)",
        f"python / OS   {info['python']} / {info['os']}",
    ]
    return "\n".join(lines)


def memory_in_use(device: str) -> int:
    """Bytes of memory in use that a model load would add to: allocated CUDA or MPS memory on a
    GPU, the process's resident set size (RSS) on the CPU (chapter 01)."""
    import torch

    if device.startswith("cuda"):
        torch.cuda.synchronize()
        return torch.cuda.memory_allocated()
    if device.startswith("mps"):
        torch.mps.synchronize()
        return torch.mps.current_allocated_memory()
    import psutil

    return psutil.Process().memory_info().rss
