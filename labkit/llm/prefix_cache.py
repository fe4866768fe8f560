"""Prefix caching with a real KV cache, and what a cached prefix costs to keep (chapter 06b).

Requests that start with the same tokens (a system prompt, a shared document) produce the same
keys and values for those tokens. :func:`prefill_prefix` runs the shared part once and keeps its
``DynamicCache``; :func:`reuse` copies that cache and prefills only the varying suffix, so the
time to first token no longer grows with the shared part. :func:`ttft_sweep` times both ways side
by side as the shared part grows.

:func:`cached_tokens` is the longest common token prefix of two requests: what an engine that
caches prefixes can skip (vLLM counts it in whole blocks, :func:`cached_tokens` ``block=``).

:func:`tier_table` prices keeping a prefix's KV somewhere instead of recomputing it: reloading
``tokens x bytes per token`` at a tier's bandwidth (seconds) vs recomputing the prefill, whose
cost is ``2 x params x tokens`` FLOPs at a given TFLOPS (:func:`tier_rows`: the same, printable;
:func:`prefill_tflops`: the rate a measured prefill achieved).
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from ..hardware.microbench import interleaved_times

# Bandwidths of the slower KV tiers: stated assumptions (bytes/s), not measurements.
PCIE5_X16_BYTES_PER_S = 64e9  # PCIe 5.0 x16, one direction, before protocol overhead (GPU <-> CPU memory)
NVME_BYTES_PER_S = 7e9  # sequential read of a PCIe 4.0 x4 NVMe SSD (datasheets print 7.0-7.4 GB/s)


@torch.no_grad()
def prefill(model: Any, ids: torch.Tensor, cache: Any = None) -> tuple[torch.Tensor, Any]:
    """Run ``ids`` (shape ``[1, n]``) through ``model`` on top of ``cache`` (a transformers
    ``DynamicCache``; a new one when ``None``). Returns (logits of the last position as float32,
    the cache, which now also holds ``ids``)."""
    from transformers import DynamicCache

    cache = DynamicCache(config=model.config) if cache is None else cache
    out = model(input_ids=ids, cache=cache, use_cache=True, logits_to_keep=1)
    return out.logits[0, -1].float(), cache


def prefill_prefix(model: Any, prefix_ids: torch.Tensor) -> Any:
    """Prefill the shared part once; the returned cache is what a prefix cache stores."""
    return prefill(model, prefix_ids)[1]


def reuse(model: Any, prefix_cache: Any, suffix_ids: torch.Tensor) -> tuple[torch.Tensor, Any]:
    """A prefix-cache hit: copy the stored cache (the original stays valid for the next request)
    and prefill only ``suffix_ids``. Returns (last-position logits, the request's own cache)."""
    return prefill(model, suffix_ids, copy.deepcopy(prefix_cache))


def cropped(prefix_cache: Any, n_tokens: int) -> Any:
    """A copy of ``prefix_cache`` holding only its first ``n_tokens`` tokens: one long prefill serves
    every shorter shared prefix (``DynamicCache.crop(-k)`` drops the last ``k`` tokens in transformers 5)."""
    c = copy.deepcopy(prefix_cache)
    extra = c.get_seq_length() - n_tokens
    if extra < 0:
        raise ValueError(f"the cache holds {c.get_seq_length()} tokens, fewer than {n_tokens}")
    c.crop(-extra)
    return c


def cached_tokens(prev_ids: Sequence[int], ids: Sequence[int], block: int = 1) -> int:
    """Tokens of ``ids`` a prefix cache holding ``prev_ids`` can skip: their longest common
    prefix, rounded down to whole blocks of ``block`` tokens (vLLM caches and matches blocks:
    16 tokens on GPUs, 128 in its CPU build), and never all of ``ids`` (the last token must be
    computed to get logits)."""
    n = 0
    for a, b in zip(prev_ids, ids, strict=False):
        if a != b:
            break
        n += 1
    n = min(n, len(ids) - 1) if ids else 0
    return max(0, n - n % block)


def ttft_sweep(model: Any, shared_ids: torch.Tensor, suffix_ids: torch.Tensor, sizes: Sequence[int],
               device: str = "cpu", repeats: int = 3) -> list[dict[str, Any]]:
    """Time to first token (seconds, medians of ``repeats``) with and without a prefix-cache hit,
    for each shared length in ``sizes`` (tokens of ``shared_ids[:, :size]``) followed by
    ``suffix_ids``. A miss prefills the whole prompt; a hit copies the stored cache and prefills
    the suffix. All runs are interleaved (:func:`labkit.hardware.microbench.interleaved_times`).
    Rows: ``shared``, ``suffix``, ``miss_s``, ``hit_s``, ``speedup``, ``max_abs_diff`` (largest
    difference of the next-token logits, hit vs miss), ``same_argmax``."""
    if max(sizes) > shared_ids.shape[1]:
        raise ValueError(f"sizes go up to {max(sizes)} tokens but shared_ids holds {shared_ids.shape[1]}")
    stored = prefill_prefix(model, shared_ids[:, :max(sizes)])
    caches = {n: cropped(stored, n) for n in sizes}
    last: dict[str, torch.Tensor] = {}  # each function's latest logits, kept for the comparison

    def keep(name: str, logits: torch.Tensor) -> None:
        last[name] = logits

    fns: dict[str, Any] = {}
    for n in sizes:
        full = torch.cat([shared_ids[:, :n], suffix_ids], dim=1)
        fns[f"miss{n}"] = lambda n=n, full=full: keep(f"miss{n}", prefill(model, full)[0])
        fns[f"hit{n}"] = lambda n=n: keep(f"hit{n}", reuse(model, caches[n], suffix_ids)[0])
    times = interleaved_times(fns, device, repeats=repeats, warmup=0)
    rows = []
    for n in sizes:
        miss, hit = last[f"miss{n}"], last[f"hit{n}"]
        m, h = float(np.median(times[f"miss{n}"])), float(np.median(times[f"hit{n}"]))
        rows.append({"shared": n, "suffix": suffix_ids.shape[1], "miss_s": m, "hit_s": h, "speedup": m / h,
                     "max_abs_diff": float((miss - hit).abs().max()),
                     "same_argmax": bool(miss.argmax() == hit.argmax())})
    return rows


def reload_seconds(tokens: int, bytes_per_token: float, bandwidth_bytes_per_s: float) -> float:
    """Seconds to move a prefix's KV (``tokens x bytes_per_token`` bytes) at a tier's bandwidth."""
    return tokens * bytes_per_token / bandwidth_bytes_per_s


def recompute_seconds(tokens: int, params: float, tflops: float) -> float:
    """Seconds to prefill ``tokens`` again: ``2 x params x tokens`` FLOPs at ``tflops`` (1e12 FLOP/s).
    Attention's own FLOPs (growing with context) are left out, so this is a lower bound."""
    return 2 * params * tokens / (tflops * 1e12)


def tier_table(tokens: int, bytes_per_token: float, params: float, tflops: float,
               tiers: dict[str, float]) -> list[dict[str, Any]]:
    """For each tier (name -> bandwidth in bytes/s): seconds to reload ``tokens`` of cached KV,
    seconds to recompute them at ``tflops``, and ``reload_wins`` (reloading is faster). Rows
    ordered as ``tiers`` (fastest first by convention)."""
    redo = recompute_seconds(tokens, params, tflops)
    return [{"tier": name, "bandwidth_gbps": bw / 1e9, "tokens": tokens,
             "kv_mb": tokens * bytes_per_token / 1e6, "reload_s": reload_seconds(tokens, bytes_per_token, bw),
             "recompute_s": redo, "reload_wins": reload_seconds(tokens, bytes_per_token, bw) < redo}
            for name, bw in tiers.items()]


def breakeven_bandwidth(bytes_per_token: float, params: float, tflops: float) -> float:
    """Bandwidth (bytes/s) at which reloading a prefix's KV takes as long as recomputing it: any
    slower tier loses to recomputation. Independent of the prefix length:
    ``bytes_per_token x tflops x 1e12 / (2 x params)``."""
    return bytes_per_token * tflops * 1e12 / (2 * params)


def prefill_tflops(params: float, tokens: int, seconds: float) -> float:
    """The prefill rate (TFLOPS, 1e12 FLOP/s) of ``tokens`` prefilled in ``seconds``, counting
    ``2 x params`` FLOPs per token (the rule :func:`recompute_seconds` prices with)."""
    return 2 * params * tokens / seconds / 1e12


def tier_rows(label: str, tokens: int, bytes_per_token: float, params: float, tflops: float,
              tiers: dict[str, float]) -> list[dict[str, str]]:
    """:func:`tier_table` as printable rows (column -> text), each labelled ``label`` (the model
    and machine), times in milliseconds, and which way to keep the prefix."""
    return [{"model / machine": label, "tier": r["tier"], "GB/s": f"{r['bandwidth_gbps']:,.1f}",
             f"reload {tokens} tok ms": f"{r['reload_s'] * 1e3:.2f}",
             "recompute ms": f"{r['recompute_s'] * 1e3:.2f}",
             "keep it": "reload" if r["reload_wins"] else "recompute"}
            for r in tier_table(tokens, bytes_per_token, params, tflops, tiers)]
