"""Datasheet figures of common inference accelerators (chapters 00 and 04).

Each entry cites where its numbers come from. Compute figures are *dense* peak TFLOPS
(NVIDIA datasheets often print the 2:4-sparse figure, twice as large; we halve it).
Bandwidth is bytes/s, memory is bytes (decimal: 1 GB = 1e9 bytes, as datasheets use).
NVIDIA entries also give the streaming multiprocessors (SMs), fp32 lanes per SM and boost clock (GHz)
from the architecture whitepapers: SMs × lanes is what NVIDIA calls "CUDA cores" (chapter 04 sets them
beside this CPU's cores), and cores × 2 (a fused multiply-add) × clock gives the fp32 figure.
:func:`this_machine` builds an entry for the machine you run on from *measured* figures;
:func:`match_accelerator` finds the entry of a GPU from the name torch gives it, and
:func:`datasheet_tflops` its figure for a torch dtype name (``labkit gpu-check`` compares with them).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .roofline import ridge_point

GB = 1e9
TB = 1e12
# Catalog dtype keys of torch dtype names.
CATALOG_DTYPE = {"float32": "fp32", "float16": "fp16", "bfloat16": "bf16"}


@dataclass(frozen=True)
class Accelerator:
    """One device: memory (bytes), memory bandwidth (bytes/s), dense peak TFLOPS per dtype; for a GPU
    whose whitepaper gives them, ``sms`` (streaming multiprocessors), ``fp32_lanes_per_sm`` and
    ``boost_clock_ghz`` (0 where unknown)."""

    name: str
    memory_bytes: float
    bandwidth_bytes_per_s: float
    tflops: dict[str, float] = field(default_factory=dict)
    source: str = ""
    notes: str = ""
    sms: int = 0
    fp32_lanes_per_sm: int = 0
    boost_clock_ghz: float = 0.0

    @property
    def cuda_cores(self) -> int:
        """fp32 lanes on the chip (SMs × lanes per SM): NVIDIA's "CUDA cores"; 0 where unknown."""
        return self.sms * self.fp32_lanes_per_sm

    def ops_per_byte(self, dtype: str = "fp16") -> float:
        """Ridge point of the roofline: peak FLOP/s ÷ bandwidth (FLOPs per byte moved).
        Work with fewer FLOPs per byte than this is memory-bound (chapter 04)."""
        if dtype not in self.tflops:
            raise KeyError(f"{self.name} has no {dtype!r} figure; known: {sorted(self.tflops)}")
        return ridge_point(self.tflops[dtype] * 1e12, self.bandwidth_bytes_per_s)


ACCELERATORS: dict[str, Accelerator] = {
    a.name: a
    for a in [
        Accelerator(
            "H100 SXM", 80 * GB, 3.35 * TB,
            {"fp32": 67.0, "tf32": 494.7, "fp16": 989.4, "bf16": 989.4, "fp8": 1978.9, "int8": 1978.9},
            "https://www.nvidia.com/en-us/data-center/h100/ (H100 SXM datasheet; sparse figures halved)",
            "HBM3; the tutorial's ops:byte example (989 / 3.35 ≈ 295)",
            sms=132, fp32_lanes_per_sm=128, boost_clock_ghz=1.98,
        ),
        Accelerator(
            "H200", 141 * GB, 4.8 * TB,
            {"fp32": 67.0, "tf32": 494.7, "fp16": 989.4, "bf16": 989.4, "fp8": 1978.9, "int8": 1978.9},
            "https://www.nvidia.com/en-us/data-center/h200/ (H200 SXM datasheet; sparse figures halved)",
            "same compute die as H100, more and faster HBM3e",
            sms=132, fp32_lanes_per_sm=128, boost_clock_ghz=1.98,
        ),
        Accelerator(
            "B200", 180 * GB, 8.0 * TB,
            {"tf32": 1100.0, "fp16": 2250.0, "bf16": 2250.0, "fp8": 4500.0, "int8": 4500.0, "fp4": 9000.0},
            "https://www.nvidia.com/en-us/data-center/hgx/ (HGX B200 per-GPU figures; sparse halved)",
            "HBM3e; 192 GB on the package, 180 GB usable per GPU in HGX/DGX B200 (the tutorial uses 192)",
        ),
        Accelerator(
            "A100 80GB", 80 * GB, 2.039 * TB,
            {"fp32": 19.5, "tf32": 156.0, "fp16": 312.0, "bf16": 312.0, "int8": 624.0},
            "https://www.nvidia.com/en-us/data-center/a100/ (A100 80GB SXM datasheet; sparse halved)",
            "Ampere: no FP8 tensor cores",
            sms=108, fp32_lanes_per_sm=64, boost_clock_ghz=1.41,
        ),
        Accelerator(
            "L4", 24 * GB, 300 * GB,
            {"fp32": 30.3, "tf32": 60.0, "fp16": 121.0, "bf16": 121.0, "fp8": 242.5, "int8": 242.5},
            "https://www.nvidia.com/en-us/data-center/l4/ (L4 datasheet; sparse figures halved)",
            "Ada, 72 W inference card, GDDR6",
            sms=58, fp32_lanes_per_sm=128, boost_clock_ghz=2.04,
        ),
        Accelerator(
            "RTX 3060 12GB", 12 * GB, 360 * GB,
            {"fp32": 12.7, "fp16": 25.6, "bf16": 25.6, "int8": 102.0},
            "https://www.nvidia.com/en-us/geforce/graphics-cards/30-series/rtx-3060-3060ti/ and the "
            "NVIDIA Ampere GA102 whitepaper (GeForce tensor rates, FP32 accumulate)",
            "consumer Ampere: no FP8; FP16 tensor rate with FP16 accumulate is twice the FP32-accumulate "
            "figure used here",
            sms=28, fp32_lanes_per_sm=128, boost_clock_ghz=1.777,
        ),
        Accelerator(
            "RTX 4090", 24 * GB, 1008 * GB,
            {"fp32": 82.6, "fp16": 165.2, "bf16": 165.2, "fp8": 330.3, "int8": 660.6},
            "https://images.nvidia.com/aem-dam/Solutions/geforce/ada/nvidia-ada-gpu-architecture.pdf "
            "(Ada whitepaper, dense, FP32 accumulate)",
            "GDDR6X",
            sms=128, fp32_lanes_per_sm=128, boost_clock_ghz=2.52,
        ),
        Accelerator(
            "Apple M4", 16 * GB, 120 * GB,
            {"fp32": 4.3, "fp16": 4.3},
            "https://www.apple.com/newsroom/2024/05/apple-introduces-m4-chip/ (120 GB/s unified memory); "
            "GPU FLOPS are third-party estimates for the 10-core GPU",
            "MacBook Air M4: 16 or 24 GB (32 GB option) unified memory shared by CPU and GPU",
        ),
    ]
}


def this_machine(name: str, memory_bytes: float, bandwidth_bytes_per_s: float,
                 tflops: dict[str, float]) -> Accelerator:
    """An entry for the machine you run on, from figures measured by :mod:`labkit.hardware.microbench`."""
    return Accelerator(f"{name} (measured here)", memory_bytes, bandwidth_bytes_per_s, dict(tflops),
                       "measured by labkit.hardware.microbench on this machine", "measured, not a datasheet")


# How torch.cuda.get_device_name() spellings map to catalog entries: (tokens all present, tokens
# none present). Entries not listed here match when every word of their name is in the GPU's name.
MATCH_RULES: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "H100 SXM": (("H100",), ("PCIE", "NVL")),  # "NVIDIA H100 80GB HBM3"
    "H200": (("H200",), ("NVL",)),  # "NVIDIA H200"; the NVL card has lower clocks
    "A100 80GB": (("A100", "80GB"), ()),  # "NVIDIA A100-SXM4-80GB", "NVIDIA A100 80GB PCIe"
    "RTX 3060 12GB": (("RTX", "3060"), ("TI", "LAPTOP")),
    "RTX 4090": (("RTX", "4090"), ("D", "LAPTOP")),
}


def _tokens(name: str) -> set[str]:
    return set(name.upper().replace("-", " ").replace("_", " ").split())


def match_accelerator(gpu_name: str, catalog: dict[str, Accelerator] | None = None) -> Accelerator | None:
    """The catalog entry describing the GPU torch calls ``gpu_name`` (e.g. ``"NVIDIA H100 80GB HBM3"``
    -> ``H100 SXM``), or None. A PCIe or NVL variant does not match an SXM entry: their clocks and
    bandwidth differ, so a measured/datasheet fraction against them would mislead."""
    catalog = ACCELERATORS if catalog is None else catalog
    words = _tokens(gpu_name)
    for name, acc in catalog.items():
        need, never = MATCH_RULES.get(name, (tuple(_tokens(name)), ()))
        if need and all(w in words for w in need) and not any(w in words for w in never):
            return acc
    return None


def datasheet_tflops(acc: Accelerator | None, dtype: str, tf32: bool = False) -> float | None:
    """Datasheet dense TFLOPS of ``acc`` for a torch dtype name (float32 counts as tf32 when torch
    lets matmuls use TF32 tensor cores), or None when unknown."""
    if acc is None:
        return None
    key = "tf32" if dtype == "float32" and tf32 else CATALOG_DTYPE.get(dtype, dtype)
    return acc.tflops.get(key)
