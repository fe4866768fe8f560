"""How big one vLLM replica of chapter 08's deploy manifests is (:mod:`labkit.production.deploy`):
chapter 06b's parallelism plan for *one* sequence of the full context (what vLLM checks at start; its
paged KV cache shares what memory is left among the running sequences, so reserving
concurrency x context up front would overstate the GPUs needed), the KV cache's capacity in tokens,
the longest stream's duration at the memory-bound decode rate (the drain a stopping replica needs),
host RAM and the weights volume's size.
"""

from __future__ import annotations

import math
import re
from typing import Any

from ..hardware.catalog import ACCELERATORS
from ..hardware.roofline import decode_ceiling_tokens_per_s
from ..llm.parallelism import plan

CPU_PER_GPU = 4  # CPU cores requested per GPU: API server, tokenizer, engine core
HOST_RAM_PER_WEIGHT_BYTE = 1.5  # host RAM per byte of weights (loading passes through page cache)
RAM_PER_PROCESS_GI = 2  # API server, engine core, and one worker per GPU under tensor parallelism
WEIGHTS_HEADROOM = 1.25  # the weights volume: the files plus tokenizer, configs and slack
GIB = 2**30


def gpu_memory(gpu: str) -> tuple[str, float]:
    """(catalog name, memory in bytes) of ``gpu``: a name of :data:`ACCELERATORS` or an unambiguous
    short form ignoring case, spaces and dashes (``H100`` -> ``H100 SXM``, ``a100-80gb``)."""
    def norm(s: str) -> str:
        return re.sub(r"[\s_-]", "", s).lower()

    found = [n for n in ACCELERATORS if n == gpu] or [n for n in ACCELERATORS if norm(n) == norm(gpu)] \
        or [n for n in ACCELERATORS if norm(n).startswith(norm(gpu))]
    if len(found) != 1:
        raise ValueError(f"gpu {gpu!r} is {'ambiguous' if found else 'unknown'}: "
                         f"use one of {sorted(ACCELERATORS)}")
    return found[0], ACCELERATORS[found[0]].memory_bytes


def layout(model_id: str, config: dict[str, Any], gpu: str, context: int, dtype: str) -> dict[str, Any]:
    """Chapter 06's plan for one sequence of ``context`` tokens (what vLLM needs to start; the paged
    KV cache holds what memory is left), with the GPU's catalog name, bandwidth and KV capacity."""
    gpu_name, vram = gpu_memory(gpu)
    p = plan(config, vram, dtype, context, 1)
    if not p["fits"]:
        raise ValueError(f"{model_id} does not fit {gpu_name} even at tp={p['tp']} x pp={p['pp']}: "
                         "use a larger GPU, a smaller context or a quantized dtype")
    if p["pp"] > 1:
        raise ValueError(f"{model_id} on {gpu_name} needs tp={p['tp']} x pp={p['pp']} = {p['gpus']} GPUs "
                         "across nodes: a multi-node server (LeaderWorkerSet or similar) is out of scope "
                         "here; pick a GPU with more memory or a lower context")
    split = p["per_gpu"]
    kv_capacity = p["budget"] - split["total"] + split["kv"]  # per GPU, bytes
    return {**p, "gpu": gpu_name, "bandwidth": ACCELERATORS[gpu_name].bandwidth_bytes_per_s,
            "kv_capacity": kv_capacity, "kv_tokens": int(kv_capacity / (split["kv"] / context))}


def longest_stream_s(model_id: str, config: dict[str, Any], gpu: str = "L4", context: int = 8192,
                     dtype: str = "bf16") -> float:
    """Seconds a stream of ``context`` tokens takes at the memory-bound decode rate with the KV cache
    full (each step reads the weights and the whole cache, :func:`decode_ceiling_tokens_per_s`): an
    estimate of the longest request the server accepts, the drain it should be given."""
    lay = layout(model_id, config, gpu, context, dtype)
    step_bytes = lay["per_gpu"]["weights"] + lay["kv_capacity"]
    return context / decode_ceiling_tokens_per_s(lay["bandwidth"], step_bytes)


def host_ram_gi(lay: dict[str, Any]) -> int:
    """Host RAM (GiB) for one replica's processes, /dev/shm not included: the weights pass through
    the page cache while loading, plus :data:`RAM_PER_PROCESS_GI` per process."""
    tp = lay["tp"]
    processes = 2 + (tp if tp > 1 else 0)
    load = math.ceil(lay["per_gpu"]["weights"] * tp * HOST_RAM_PER_WEIGHT_BYTE / GIB)
    return load + RAM_PER_PROCESS_GI * processes


def weights_gi(lay: dict[str, Any]) -> int:
    """Size (GiB) of the volume that holds the weights."""
    return math.ceil(lay["per_gpu"]["weights"] * lay["tp"] * WEIGHTS_HEADROOM / GIB)
