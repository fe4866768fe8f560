"""What machine is this? Device detection for chapter 00 ("Hardware Lab") and ``labkit doctor``.

:func:`detect` returns a plain dict describing the accelerator torch would use (CUDA, Apple
MPS or the CPU) plus the CPU and RAM, and :func:`resolve_device` turns a preference such
as ``"auto"`` into a device torch accepts, with a clear error when it is unavailable.
:func:`nvidia_smi_snapshot` reads each NVIDIA GPU's memory (bytes), utilisation (%) and power (W)
through NVML, for chapter 00 and chapter 08's monitor.
"""

from __future__ import annotations

import os
import platform
from typing import Any

import psutil

DEVICES = ("auto", "cpu", "cuda", "mps")
ISA_FLAGS = ("avx", "avx2", "fma", "avx512f", "avx512_bf16", "avx512_vnni", "amx_tile",
             "amx_bf16", "amx_int8", "neon", "asimd", "sve")
_NVML: list[Any] = []  # [the initialised pynvml module, or None: no library/driver]; empty until tried


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


def _nvml() -> Any:
    """The initialised ``pynvml`` module, or ``None`` (no library, driver or GPU); tried once."""
    if not _NVML:
        try:
            import pynvml

            pynvml.nvmlInit()
            _NVML.append(pynvml)
        except Exception:  # noqa: BLE001 - ImportError, NVMLError_LibraryNotFound, NVMLError_DriverNotLoaded
            _NVML.append(None)
    return _NVML[0]


def _nvml_read(nv: Any, fn: str, *args: Any) -> Any:
    try:
        value = getattr(nv, fn)(*args)
    except Exception:  # noqa: BLE001 - what NVML cannot read here (not supported, no such call) is left out
        return None
    return value.decode() if isinstance(value, bytes) else value


def nvidia_smi_snapshot() -> list[dict[str, Any]]:
    """Each NVIDIA GPU now, read through NVML (nvidia-ml-py; what ``nvidia-smi`` reads): ``index``,
    ``name``, ``driver``, ``memory_used_bytes``, ``memory_total_bytes`` (bytes), ``gpu_util_pct``,
    ``mem_util_pct`` (%), ``power_w`` (W). A field NVML cannot read on this GPU is left out; no
    library, driver or GPU gives ``[]``. NVML is initialised on the first call and kept open, so
    sampling it often (chapter 08's monitor) costs only the reads."""
    nv = _nvml()
    if nv is None:
        return []
    driver, out = _nvml_read(nv, "nvmlSystemGetDriverVersion"), []
    for i in range(_nvml_read(nv, "nvmlDeviceGetCount") or 0):
        h = _nvml_read(nv, "nvmlDeviceGetHandleByIndex", i)
        name = _nvml_read(nv, "nvmlDeviceGetName", h)
        mem = _nvml_read(nv, "nvmlDeviceGetMemoryInfo", h)
        util = _nvml_read(nv, "nvmlDeviceGetUtilizationRates", h)
        mw = _nvml_read(nv, "nvmlDeviceGetPowerUsage", h)  # milliwatts
        gpu = {"index": i, "name": name, "driver": driver,
               "memory_used_bytes": mem and mem.used, "memory_total_bytes": mem and mem.total,
               "gpu_util_pct": util and util.gpu, "mem_util_pct": util and util.memory,
               "power_w": None if mw is None else mw / 1000.0}
        out.append({k: v for k, v in gpu.items() if v is not None})
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
        f"torch         {info['torch']} ({info['torch_threads']} thread{'s' * (info['torch_threads'] != 1)})",
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

    return psutil.Process().memory_info().rss


def cuda_one_liner() -> dict[str, Any]:
    """The setup guide's one-line CUDA check (chapter 00), run as written: whether CUDA is available,
    then the name of device 0. ``{"ran": bool, "output": what it printed, or the exception it raised}``:
    without a CUDA GPU the name lookup raises rather than printing ``False``."""
    import torch

    try:
        return {"ran": True, "output": f"{torch.cuda.is_available()} {torch.cuda.get_device_name(0)}"}
    except Exception as e:  # noqa: BLE001 - whatever it raises is the answer
        return {"ran": False, "output": f"{type(e).__name__}: {' '.join(str(e).split())}"}
