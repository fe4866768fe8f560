"""llama.cpp's batch-1 decode on chapter 04's roofline: how much of this machine's bandwidth ceiling
llama-bench's generation speed reaches (chapter 04).

Bytes read per token are the GGUF's tensor bytes plus its f16 KV cache at llama-bench's mean depth
(:func:`labkit.llm.gguf_bytes.gguf_bytes_per_token`: a generation test starts from an empty cache,
so at ``gen`` tokens the mean depth is ``gen / 2``). The ceiling is the copy bandwidth
(:func:`labkit.hardware.microbench.memory_bandwidth`, a 256 MiB buffer: 512 MiB moved, read +
write) measured with as many threads as llama.cpp gets (on a virtual machine each core brings its own
share of the bandwidth), ÷ bytes per token (:func:`labkit.hardware.roofline.decode_ceiling_tokens_per_s`).
A copy with a working set the size of the weights is measured beside it: where it runs faster than
the 512 MiB copy, a cache can serve the model and decode may beat the DRAM ceiling.
:func:`formats_on_roofline` does the same for several GGUFs of one model (Q4_1, Q8_0, F16...) with every
run kept, and fits seconds per token = fixed + bytes ÷ effective bandwidth across them
(:func:`fixed_cost_fit`): the fixed part is why a small quantized model reaches a smaller share of the
ceiling than the same model with more bytes per token (``benchmarks/llamacpp_roofline.py``).
Units: bytes, bytes/s, tokens/s, FLOPs/byte, FLOP/s.

    from labkit.experiments.llamacpp_roofline import decode_on_roofline
    r = decode_on_roofline(threads=(1, 2))     # a few seconds per thread count and round
    r["rows"][0]["achieved"]                   # fraction of the ceiling, 1 thread
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from ..engines import llamacpp
from ..hardware import roofline
from ..hardware.caches import last_level_cache_bytes
from ..hardware.microbench import memory_bandwidth, time_fn
from ..llm import gguf_header
from ..llm.gguf_bytes import gguf_bytes_per_token
from ..models import gguf_path
from ..settings import torch_threads
from ..stats import median_interval


def decode_point(params: float, bytes_per_token: float, tokens_per_s: float,
                 bandwidth: float) -> dict[str, float]:
    """A batch-1 decode as a roofline point: ``intensity`` (2 FLOPs per weight ÷ bytes per token),
    ``flops_per_s`` (achieved), ``ceiling`` (tokens/s the ``bandwidth`` in bytes/s allows) and
    ``achieved`` (the fraction of it ``tokens_per_s`` reached)."""
    ceiling = roofline.decode_ceiling_tokens_per_s(bandwidth, bytes_per_token)  # ValueError unless both > 0
    return {"bytes_per_token": bytes_per_token, "ceiling": ceiling,
            "intensity": roofline.forward_flops(params, 1) / bytes_per_token,
            "flops_per_s": roofline.forward_flops(params, 1) * tokens_per_s,
            "achieved": roofline.bandwidth_achieved(tokens_per_s, bytes_per_token, bandwidth)}


def decode_on_roofline(gguf: str | Path | None = None, threads: Sequence[int] = (1,), gen: int = 32,
                       reps: int = 2, rounds: Mapping[int, int] | None = None,
                       bandwidth: Mapping[int, float] | None = None) -> dict[str, Any]:
    """llama-bench's batch-1 generation on ``gguf`` (default the bundled model) with each thread count
    in ``threads``: ``rounds[t]`` rounds (default 1) of a copy-bandwidth sample with ``t`` torch threads
    (best of 3), a model-sized copy and ``llamacpp.bench(threads=t, prompt=0, gen=gen, reps=reps)``.
    Background load only slows a run, so a row keeps the fastest round (``tps``; every round's mean in
    ``tps_rounds``) and the best bandwidth, ``bandwidth[t]`` (bytes/s measured elsewhere, e.g. by the
    chapter) included. Returns ``type``, ``params``, ``bytes`` (:func:`gguf_bytes_per_token`),
    ``llc_bytes`` (None where unreported) and ``rows``: per thread count ``threads``, ``bandwidth``,
    ``model_set_bandwidth`` (bytes/s), ``tps``, ``tps_sd``, ``tps_rounds``, ``tps_samples`` (every
    llama-bench repetition of every round, tok/s) and :func:`decode_point`'s
    figures against ``bandwidth``. ``RuntimeError`` where llama.cpp is not built."""
    if gguf is None:
        gguf = gguf_path()
    head = gguf_header.summary(gguf)
    per_token = gguf_bytes_per_token(gguf, context=gen / 2)
    model_set = int(per_token["weights"]) // 2  # copy source + destination = the weights' bytes
    rows = []
    for t in threads:
        bws, sets, runs = [(bandwidth or {}).get(t, 0.0)], [], []
        for _ in range((rounds or {}).get(t, 1)):
            with torch_threads(t):
                bws.append(memory_bandwidth("cpu", repeats=3)["gbps_best"] * 1e9)
                small = memory_bandwidth("cpu", model_set, repeats=5)
            sets.append(small["gbps_best"] * 1e9)
            runs.append(llamacpp.bench(gguf, threads=t, prompt=0, gen=gen, reps=reps))
        best = max(runs, key=lambda b: b["gen_tps"])
        row = {"threads": t, "bandwidth": max(bws), "model_set_bandwidth": max(sets), "tps": best["gen_tps"],
               "tps_sd": best["gen_tps_sd"], "tps_rounds": [b["gen_tps"] for b in runs], "type": best["type"],
               "tps_samples": [x for b in runs for x in b.get("gen_tps_samples", [b["gen_tps"]])]}
        rows.append(row | decode_point(head["params"], per_token["total"], best["gen_tps"], max(bws)))
    return {"gguf": str(gguf), "type": rows[0]["type"] if rows else "", "params": float(head["params"]),
            "bytes": per_token, "gen": gen, "llc_bytes": last_level_cache_bytes(), "rows": rows}


def read_bandwidth(nbytes: int = 256 * 2**20, repeats: int = 5) -> float:
    """Read-only bandwidth in bytes/s, as decode reads its weights (no writes): the fastest of
    ``repeats`` sums of a float32 buffer of ``nbytes`` with torch's current threads."""
    import torch

    src = torch.ones(nbytes // 4, dtype=torch.float32)
    return nbytes / float(time_fn(lambda: src.sum(), "cpu", warmup=2, repeats=repeats).min())


def fixed_cost_fit(bytes_per_token: Sequence[float], tokens_per_s: Sequence[float]) -> dict[str, float]:
    """Least-squares line through formats' decode times: seconds per token = ``fixed_s`` + bytes per token
    ÷ ``bw_eff`` (bytes/s). ``fixed_s`` is what a token costs whatever its bytes (graph, per-operation
    dispatch and thread barriers, and compute per weight where it is alike across formats);
    ``bw_eff`` the rate extra bytes stream at; ``residuals_s`` each point's measured minus fitted
    seconds (a format whose kernel is faster or slower per weight falls off the line). ``ValueError``
    with fewer than two distinct sizes."""
    x, y = np.asarray(bytes_per_token, float), 1.0 / np.asarray(tokens_per_s, float)
    if len(set(x.tolist())) < 2:
        raise ValueError("the fit needs formats of at least two sizes")
    slope, fixed = np.polyfit(x, y, 1)
    residuals = y - (fixed + slope * x)
    return {"fixed_s": float(fixed), "bw_eff": float(1.0 / slope) if slope > 0 else float("inf"),
            "max_residual_s": float(np.abs(residuals).max()), "residuals_s": residuals.tolist(), "n": len(x)}


def formats_on_roofline(files: Mapping[str, str | Path], threads: Sequence[int] = (1,), gen: int = 64,
                        reps: int = 3, rounds: int = 3) -> dict[str, Any]:
    """Each GGUF of ``files`` (format name -> path) on the roofline, interleaved: every round, for each
    thread count, the copy bandwidth (best of 3, the ceiling as :func:`decode_on_roofline` takes it), the
    read-only bandwidth (:func:`read_bandwidth`) and ``llamacpp.bench`` of every format. ``rows``: per
    format and thread count ``bytes_per_token``, ``samples`` (tok/s of every repetition), ``tps`` (their
    :func:`labkit.stats.median_interval`), ``achieved`` (median, ``lo``, ``hi``: tok/s x bytes per token ÷
    the best copy bandwidth) and ``read_achieved`` (the same against the read-only bandwidth); ``fits``:
    per thread count :func:`fixed_cost_fit` of the formats' medians; ``bandwidth``/``read_bandwidth``:
    per thread count, bytes/s."""
    per_token = {f: gguf_bytes_per_token(p, context=gen / 2)["total"] for f, p in files.items()}
    samples: dict[tuple[str, int], list[float]] = {(f, t): [] for f in files for t in threads}
    copy: dict[int, list[float]] = {t: [] for t in threads}
    read: dict[int, list[float]] = {t: [] for t in threads}
    for _ in range(rounds):
        for t in threads:
            with torch_threads(t):
                copy[t].append(memory_bandwidth("cpu", repeats=3)["gbps_best"] * 1e9)
                read[t].append(read_bandwidth())
            for f, p in files.items():
                b = llamacpp.bench(p, threads=t, prompt=0, gen=gen, reps=reps)
                samples[(f, t)] += b.get("gen_tps_samples", [b["gen_tps"]])
    rows = []
    for (f, t), xs in samples.items():
        tps, bpt = median_interval(xs), per_token[f]
        share = {k: tps[k] * bpt / max(copy[t]) for k in ("median", "lo", "hi")}
        rows.append({"format": f, "threads": t, "bytes_per_token": bpt, "samples": xs, "tps": tps,
                     "achieved": share, "read_achieved": tps["median"] * bpt / max(read[t])})
    fits = {t: fixed_cost_fit([r["bytes_per_token"] for r in rows if r["threads"] == t],
                              [r["tps"]["median"] for r in rows if r["threads"] == t]) for t in threads}
    return {"rows": rows, "fits": fits, "bandwidth": {t: max(v) for t, v in copy.items()},
            "read_bandwidth": {t: max(v) for t, v in read.items()}, "gen": gen, "reps": reps,
            "rounds": rounds}


def format_table(result: dict[str, Any]) -> str:
    """The table :func:`decode_on_roofline` measured, one line per thread count, and its bytes per token."""
    b, mb = result["bytes"], lambda x: f"{x / 1e6:.1f} MB"
    lines = [f"{'llama.cpp ' + result['type']:<22}{'threads':>8}{'copy GB/s':>11}{'ceiling':>10}"
             f"{'measured':>10}{'achieved':>10}"]
    for r in result["rows"]:
        lines.append(f"{'':<22}{r['threads']:>8}{r['bandwidth'] / 1e9:>11.1f}{r['ceiling']:>8.0f}/s"
                     f"{r['tps']:>8.1f}/s{r['achieved']:>10.0%}")
    lines.append(f"bytes per token: {mb(b['weights'])} of tensors (the file: {mb(b['file_bytes'])}) + "
                 f"{b['kv'] / 1e6:.2f} MB of f16 KV cache at depth {result['gen'] // 2} = {mb(b['total'])}")
    return "\n".join(lines)


def describe(result: dict[str, Any], threads: int) -> str:
    """Sentences from :func:`decode_on_roofline`'s figures: the cache against the weights (its row with
    ``threads``: the model-sized copy against the 512 MiB one), and how a second thread count changed
    tokens/s, copy bandwidth and the share of the ceiling."""
    row = next(r for r in result["rows"] if r["threads"] == threads)
    weights, llc = result["bytes"]["weights"], result["llc_bytes"]
    gain = row["model_set_bandwidth"] / row["bandwidth"]
    cache = (f"last-level cache (as the system reports it): {llc / 2**20:.0f} MiB, {llc / weights:.1f}x the "
             "weights" if llc else "the system reports no last-level cache size")
    verdict = ("faster: a cache can serve this model, and decode could beat the DRAM ceiling" if gain > 1.2
               else "under 1.2x: the weights stream from memory, not from the cache")
    out = [f"{cache}; a copy of {weights / 1e6:.0f} MB (the weights' size) ran at {gain:.2f}x the rate "
           f"of the 512 MiB copy ({verdict})"]
    for other in (r for r in result["rows"] if r["threads"] != threads):
        out.append(f"{other['threads']} threads instead of {threads}: {other['tps'] / row['tps']:.2f}x the "
                   f"tokens/s with {other['bandwidth'] / row['bandwidth']:.2f}x the copy bandwidth; the "
                   f"share of the ceiling went from {row['achieved']:.0%} to {other['achieved']:.0%}")
    return "\n".join(out)
