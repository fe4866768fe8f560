"""Check the lab's CUDA code paths on a machine with an NVIDIA GPU, and print the figures
(chapters 00 "Hardware Lab", 04 "GPU hardware", 07 "Beyond LLMs").

Run from a plain checkout: ``PYTHONPATH=. python -m labkit.hardware.gpucheck`` (or ``labkit gpu-check``).
It needs torch with CUDA; transformers runs section 3, diffusers section 4. Nothing touches the
network: the model in section 3 is a shipped config (``data/configs``) with random weights, the
pipeline in section 4 is the shipped ``data/digits-sdxl``. Sections:

1. ``device``: what torch sees, ``labkit doctor``'s report and the compute dtype (chapter 00).
2. ``peaks``: measured copy bandwidth (GB/s = 1e9 bytes/s, read + write counted) and n x n matmul
   TFLOPS (1e12 FLOP/s) per dtype, the ridge point (FLOPs/byte), each as a fraction of the
   datasheet when the GPU is in :data:`labkit.hardware.catalog.ACCELERATORS` (chapters 00 and 04).
3. ``model``: greedy batch-1 decode of a real architecture (Qwen3-4B by default) with a KV cache,
   tokens/s against the bandwidth ceiling ``bandwidth / (weight bytes + KV bytes)``, and one
   prefill's achieved TFLOPS against the matmul peak (chapter 04's roofline on a real model).
4. ``diffusion``: the digits SDXL pipeline in fp16: seconds per batch, images/s, digit accuracy (07).
5. ``timing``: an unsynchronized timer of a matmul reads the kernel launch, not the work.

Every timed figure comes from :func:`labkit.hardware.microbench.time_fn`, which synchronizes the device
before reading the clock (section 5 shows what happens without). Times in seconds or ms as
labelled, bytes in decimal GB (1e9). Exit status: 0 if every section that was not skipped ran,
1 if one failed, 2 if torch sees no CUDA GPU.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import sys
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..llm import architecture, kvcache, memory
from . import machine, microbench, roofline
from .catalog import ACCELERATORS, Accelerator

DEVICE = "cuda"
MATMUL_N = 8192  # n of the n x n matmuls: 1.1e12 FLOPs each, large enough to reach the peak
BANDWIDTH_BYTES = 1 << 30  # 1 GiB copied into another 1 GiB buffer
PROMPT_TOKENS = 32  # random prompt before the timed decode steps
DECODE_WARMUP = 2  # untimed decode steps (time_fn's warm-up); they grow the cache too
# Catalog dtype keys of torch dtype names.
CATALOG_DTYPE = {"float32": "fp32", "float16": "fp16", "bfloat16": "bf16"}
# How torch.cuda.get_device_name() spellings map to catalog entries: (tokens all present, tokens
# none present). Entries not listed here match when every word of their name is in the GPU's name.
MATCH_RULES: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "H100 SXM": (("H100",), ("PCIE", "NVL")),  # "NVIDIA H100 80GB HBM3"
    "H200": (("H200",), ("NVL",)),  # "NVIDIA H200"; the NVL card has lower clocks
    "A100 80GB": (("A100", "80GB"), ()),  # "NVIDIA A100-SXM4-80GB", "NVIDIA A100 80GB PCIe"
    "RTX 3060 12GB": (("RTX", "3060"), ("TI", "LAPTOP")),
    "RTX 4090": (("RTX", "4090"), ("D", "LAPTOP")),
}


class Skipped(Exception):
    """A section cannot run here (a missing optional package, a model too large): not a failure."""


@dataclass
class Context:
    """What the sections share: options, the GPU, and figures measured by earlier sections."""

    config: str = "Qwen3-4B"
    tokens: int = 64
    prefill: int = 2048
    device: str = DEVICE
    dtype: str = "bfloat16"  # compute dtype (torch dtype name)
    dtype_note: str = ""
    gpu_name: str = ""
    accelerator: Accelerator | None = None  # datasheet entry, when the GPU is in the catalog
    bandwidth: float | None = None  # measured copy bandwidth, bytes/s
    tflops: dict[str, float] = field(default_factory=dict)  # measured matmul TFLOPS per dtype


@dataclass
class Result:
    """One section's outcome: ``status`` is ``ok``, ``skip`` or ``FAIL``; ``seconds`` its wall time."""

    name: str
    status: str
    seconds: float
    summary: str


# ---------------------------------------------------------------------------------------------
# pure helpers


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


def fraction(measured: float, reference: float | None) -> str:
    """``" = 0.87 of datasheet"``-style suffix, empty when there is no reference."""
    return f" = {measured / reference:.2f} of the datasheet's {reference:g}" if reference else ""


def no_cuda_message(torch_version: str, cuda_version: str | None) -> str:
    """The one line printed (to stderr) when torch sees no CUDA GPU."""
    build = f"built for CUDA {cuda_version}" if cuda_version else "a CPU-only build, without CUDA"
    return (f"gpu-check: no CUDA GPU visible to torch (torch {torch_version}, {build}). Run it on a machine "
            "with an NVIDIA GPU and a CUDA build of torch; `labkit doctor` describes this one.")


def format_summary(results: list[Result], width: int = 100) -> str:
    """The closing table: section, status, wall seconds, one-line result (cut to ``width`` chars)."""
    lines = [f"{'section':<10} {'status':<6} {'seconds':>8}  result"]
    for r in results:
        text = " ".join(r.summary.split())
        text = text if len(text) <= width else text[: width - 3] + "..."
        lines.append(f"{r.name:<10} {r.status:<6} {r.seconds:8.1f}  {text}")
    return "\n".join(lines)


def exit_code(results: list[Result]) -> int:
    """0 if every section that was not skipped ran, 1 if any failed."""
    return 1 if any(r.status == "FAIL" for r in results) else 0


def dtype_kwarg(transformers_version: str) -> str:
    """The ``from_config`` keyword for the weights' dtype: ``dtype`` from transformers 4.56 on,
    ``torch_dtype`` before (newer versions still accept it, with a deprecation warning)."""
    parts = [int("".join(c for c in p if c.isdigit()) or 0) for p in transformers_version.split(".")[:2]]
    return "dtype" if tuple(parts) >= (4, 56) else "torch_dtype"


def _free_cuda() -> None:
    """Return a finished section's GPU memory (models, caches) before the next one allocates."""
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_available() and torch.cuda.is_initialized():
        gc.collect()
        torch.cuda.empty_cache()


def run_section(name: str, title: str, fn: Callable[[Context], str], ctx: Context) -> Result:
    """Print ``title``, run ``fn(ctx)`` (it prints its figures and returns a one-line summary) and
    turn what happened into a :class:`Result`: a :class:`Skipped` is a skip, any other exception
    a failure (its traceback printed), and the next section runs either way."""
    print(f"\n== {title} ==", flush=True)
    t0 = time.perf_counter()
    try:
        status, summary = "ok", fn(ctx)
    except Skipped as e:
        status, summary = "skip", str(e)
        print(f"SKIP {e}")
    except Exception as e:  # noqa: BLE001 - report and go on with the next section
        traceback.print_exc(file=sys.stdout)
        status, summary = "FAIL", f"{type(e).__name__}: {e}"
        print(f"FAIL {name}: {summary}")
    seconds = time.perf_counter() - t0
    _free_cuda()
    sys.stdout.flush()
    return Result(name, status, seconds, summary)


def compute_dtype(device: str = DEVICE) -> tuple[str, str]:
    """``(dtype name, note)`` from :mod:`labkit.hardware.capability`, or from ``torch.cuda.is_bf16_supported``
    when that module is not there (the note then starts with ``SKIP``)."""
    try:
        from . import capability

        cap = capability.capability(device)
        return cap.dtype, capability.format_capability(cap)
    except Exception as e:  # noqa: BLE001 - absent or broken: fall back to torch's own answer
        import torch

        dtype = "bfloat16" if torch.cuda.is_bf16_supported(including_emulation=False) else "float16"
        return dtype, (f"SKIP labkit.hardware.capability not available ({type(e).__name__}: {e}); "
                       f"compute dtype {dtype} from torch.cuda.is_bf16_supported()")


# ---------------------------------------------------------------------------------------------
# sections


def section_device(ctx: Context) -> str:
    """Section 1: the GPU as torch sees it, ``labkit doctor``'s report, the compute dtype."""
    import torch

    p = torch.cuda.get_device_properties(0)
    print(f"gpu           {p.name}: {p.total_memory / 2**30:.1f} GiB, compute capability "
          f"{p.major}.{p.minor}, {p.multi_processor_count} SMs, {torch.cuda.device_count()} GPU(s)")
    print(f"torch         {torch.__version__}, CUDA {torch.version.cuda}, "
          f"cuDNN {torch.backends.cudnn.version()}")
    try:
        print(machine.format_report(machine.detect()))
    except ImportError as e:  # detect() reads CPU and RAM through psutil
        print(f"SKIP machine.detect needs {e.name or e} (not installed): {e}")
    print(ctx.dtype_note)
    acc = ctx.accelerator
    print(f"catalog       {acc.name} ({acc.source})" if acc else
          f"catalog       no datasheet entry matches {p.name!r}; fractions of the datasheet are left out")
    return f"{p.name}, cc {p.major}.{p.minor}, {p.total_memory / 1e9:.0f} GB, compute dtype {ctx.dtype}"


def section_peaks(ctx: Context) -> str:
    """Section 2: copy bandwidth, matmul TFLOPS per dtype, ridge point; fractions of the datasheet."""
    import torch

    acc = ctx.accelerator
    bw = microbench.memory_bandwidth(ctx.device, nbytes=BANDWIDTH_BYTES)
    ctx.bandwidth = bw["gbps"] * 1e9
    sheet_gbps = acc.bandwidth_bytes_per_s / 1e9 if acc else None
    print(f"bandwidth     {bw['gbps']:8.1f} GB/s copy, median of 5 (best {bw['gbps_best']:.1f}; "
          f"{bw['bytes'] / 1e9:.2f} GB read + written per copy){fraction(bw['gbps'], sheet_gbps)}")
    tf32 = bool(torch.backends.cuda.matmul.allow_tf32)
    for dtype in microbench.matmul_dtypes(ctx.device):
        r = microbench.matmul_tflops(ctx.device, dtype, n=MATMUL_N)
        ctx.tflops[dtype] = r["tflops"]
        note = " (TF32 tensor cores allowed)" if dtype == "float32" and tf32 else ""
        print(f"matmul {dtype:<8} {r['tflops']:7.1f} TFLOPS, n={r['n']}, {r['seconds'] * 1e3:.2f} ms median"
              f"{note}{fraction(r['tflops'], datasheet_tflops(acc, dtype, tf32))}")
    peak = ctx.tflops.get(ctx.dtype) or max(ctx.tflops.values())
    ridge = roofline.ridge_point(peak * 1e12, ctx.bandwidth)
    key = CATALOG_DTYPE.get(ctx.dtype, ctx.dtype)
    sheet = f"; datasheet {acc.ops_per_byte(key):.0f}" if acc and key in acc.tflops else ""
    print(f"ridge point   {ridge:.0f} FLOPs/byte in {ctx.dtype} (measured TFLOPS / measured GB/s){sheet}: "
          "work with fewer FLOPs per byte is memory-bound")
    return (f"{bw['gbps']:.0f} GB/s, {ctx.dtype} {peak:.0f} TFLOPS, ridge {ridge:.0f} FLOPs/byte"
            + (f" ({bw['gbps'] / sheet_gbps:.2f} of datasheet GB/s)" if sheet_gbps else ""))


def _ensure_peaks(ctx: Context) -> None:
    """Measure bandwidth and the compute dtype's matmul peak if section 2 did not."""
    if ctx.bandwidth is None:
        ctx.bandwidth = microbench.memory_bandwidth(ctx.device, nbytes=BANDWIDTH_BYTES)["gbps"] * 1e9
        print(f"(measured now: bandwidth {ctx.bandwidth / 1e9:.0f} GB/s)")
    if ctx.dtype not in ctx.tflops:
        ctx.tflops[ctx.dtype] = microbench.matmul_tflops(ctx.device, ctx.dtype, n=MATMUL_N)["tflops"]
        print(f"(measured now: {ctx.dtype} matmul {ctx.tflops[ctx.dtype]:.0f} TFLOPS)")


def build_model(config: dict[str, Any], dtype: str, device: str) -> Any:
    """A causal LM of ``config``'s architecture with random weights, created directly on ``device``
    in ``dtype`` (no CPU initialisation, no download), in eval mode."""
    import torch
    import transformers
    from transformers import AutoConfig, AutoModelForCausalLM

    tdtype = getattr(torch, dtype)
    fields = {k: v for k, v in architecture.text_config(config).items()
              if k not in ("torch_dtype", "dtype", "transformers_version")}
    conf = AutoConfig.for_model(**fields)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(conf, **{dtype_kwarg(transformers.__version__): tdtype})
    return model.to(dtype=tdtype).eval()


def cache_argument(model: Any) -> str:
    """The name under which ``model.forward`` takes and returns the KV cache: ``cache`` in recent
    transformers, ``past_key_values`` before (now deprecated there)."""
    import inspect

    return "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"


def greedy_decode(model: Any, prompt_ids: Any, tokens: int, device: str,
                  warmup: int = DECODE_WARMUP) -> tuple[np.ndarray, Any]:
    """Prefill ``prompt_ids`` (shape 1 x P), then decode greedily one token per step with the KV
    cache. Returns (seconds of each of the ``tokens`` timed steps, the final cache); ``warmup``
    untimed steps run first (the cache then holds P + warmup + tokens positions)."""
    import torch

    name = cache_argument(model)
    with torch.inference_mode():
        out = model(prompt_ids, use_cache=True)
        state = {"past": getattr(out, name), "next": out.logits[:, -1:].argmax(-1)}

        def step() -> None:
            o = model(state["next"], use_cache=True, **{name: state["past"]})
            state["past"], state["next"] = getattr(o, name), o.logits[:, -1:].argmax(-1)

        times = microbench.time_fn(step, device, warmup=warmup, repeats=tokens)
    return times, state["past"]


def section_model(ctx: Context) -> str:
    """Section 3: decode tokens/s vs the bandwidth ceiling, prefill TFLOPS vs the matmul peak."""
    import torch

    try:
        import transformers  # noqa: F401
    except ImportError as e:
        raise Skipped(f"transformers not installed: {e}") from e
    config = architecture.load_config(ctx.config)
    dtype_bytes = memory.bytes_per_param(ctx.dtype)
    need = architecture.param_count(config)["total"] * dtype_bytes
    free = torch.cuda.mem_get_info()[0] if ctx.device.startswith("cuda") else float("inf")
    if need > 0.85 * free:
        raise Skipped(f"{ctx.config} needs {need / 1e9:.0f} GB of {ctx.dtype} weights; "
                      f"{free / 1e9:.0f} GB of GPU memory is free")
    _ensure_peaks(ctx)

    t0 = time.perf_counter()
    model = build_model(config, ctx.dtype, ctx.device)
    machine.synchronize(ctx.device)
    params = sum(p.numel() for p in model.parameters())  # tied embeddings counted once
    weight_bytes = memory.tensor_bytes(model)
    print(f"model         {ctx.config} ({type(model).__name__}), {params / 1e9:.2f} B parameters, "
          f"{weight_bytes / 1e9:.2f} GB in {ctx.dtype}, random weights made on {ctx.device} in "
          f"{time.perf_counter() - t0:.1f} s; attention {model.config._attn_implementation}")

    vocab = model.config.vocab_size
    torch.manual_seed(0)
    prompt = torch.randint(0, vocab, (1, PROMPT_TOKENS), device=ctx.device)
    times, cache = greedy_decode(model, prompt, ctx.tokens, ctx.device)
    n_ctx = PROMPT_TOKENS + DECODE_WARMUP + ctx.tokens
    kv_bytes = kvcache.kv_cache_bytes_for_config(config, n_ctx, dtype_bytes)
    try:
        held = f", the cache object holds {kvcache.cache_tensor_bytes(cache) / 1e6:.1f} MB"
    except Exception as e:  # noqa: BLE001 - cache layouts differ across transformers versions
        held = f" (cache size not readable: {type(e).__name__})"
    del cache
    tps = 1.0 / float(np.median(times))
    bytes_per_token = roofline.forward_bytes(weight_bytes, kv_bytes)
    ceiling = roofline.decode_ceiling_tokens_per_s(ctx.bandwidth, bytes_per_token)
    achieved = roofline.bandwidth_achieved(tps, bytes_per_token, ctx.bandwidth)
    print(f"decode        {ctx.tokens} greedy tokens at batch 1 after a {PROMPT_TOKENS}-token prompt: "
          f"median {float(np.median(times)) * 1e3:.2f} ms/token (p90 {np.percentile(times, 90) * 1e3:.2f}) "
          f"= {tps:.1f} tokens/s")
    print(f"KV cache      {kv_bytes / 1e6:.1f} MB at {n_ctx} tokens by kvcache.kv_cache_bytes_for_config"
          f"{held}")
    print(f"ceiling       {ctx.bandwidth / 1e9:.0f} GB/s measured / {bytes_per_token / 1e9:.3f} GB per token "
          f"(weights + KV) = {ceiling:.0f} tokens/s; achieved {achieved:.2f} of it")
    if ctx.accelerator:
        sheet = roofline.decode_ceiling_tokens_per_s(ctx.accelerator.bandwidth_bytes_per_s, bytes_per_token)
        print(f"              datasheet bandwidth ceiling {sheet:.0f} tokens/s")
    if achieved < 0.5:
        print("              (eager transformers decode at batch 1 is bound by Python and kernel "
              "launches, not bandwidth; torch.compile with a static KV cache, as gpt-fast does, "
              "closes most of the gap)")
    peak = ctx.tflops[ctx.dtype] * 1e12
    ridge = roofline.ridge_point(peak, ctx.bandwidth)
    dec_i = roofline.step_intensity(params, 1, weight_bytes, kv_bytes)
    print(f"intensity     decode {dec_i:.2f} FLOPs/byte vs ridge {ridge:.0f}: "
          f"{'memory' if dec_i < ridge else 'compute'}-bound")

    ids = torch.randint(0, vocab, (1, ctx.prefill), device=ctx.device)
    with torch.inference_mode():
        pre = microbench.time_fn(lambda: model(ids, use_cache=False), ctx.device, warmup=1, repeats=3)
    pre_s = float(np.median(pre))
    flops = roofline.forward_flops(params, ctx.prefill)
    pre_i = roofline.step_intensity(params, ctx.prefill, weight_bytes)
    print(f"prefill       {ctx.prefill} tokens in {pre_s * 1e3:.1f} ms (median of 3) = "
          f"{ctx.prefill / pre_s:.0f} tokens/s; {flops / pre_s / 1e12:.0f} TFLOPS achieved "
          f"(2 x params x tokens, attention not counted) = {flops / pre_s / peak:.2f} of the "
          f"{ctx.dtype} matmul peak {peak / 1e12:.0f}")
    print(f"intensity     prefill {pre_i:.0f} FLOPs/byte vs ridge {ridge:.0f}: "
          f"{'memory' if pre_i < ridge else 'compute'}-bound")
    return (f"decode {tps:.0f} tok/s = {achieved:.2f} of {ceiling:.0f} ceiling; "
            f"prefill {flops / pre_s / 1e12:.0f} TFLOPS = {flops / pre_s / peak:.2f} of peak")


def section_diffusion(ctx: Context, per_digit: int = 5, steps: int = 25, guidance: float = 5.0) -> str:
    """Section 4: the shipped digits SDXL pipeline in fp16 on the GPU: ``per_digit`` images of each
    digit in one batch, as chapter 07 draws them; seconds per batch and digit accuracy."""
    try:
        import diffusers  # noqa: F401
    except ImportError as e:
        raise Skipped(f"diffusers not installed: {e}") from e
    from ..media import diffusion, digits

    pipe, info = diffusion.load_pipeline("digits-sdxl", device=ctx.device)
    print(f"pipeline      {info['source']} in {info['dtype']} on {info['device']}, "
          f"loaded in {info['load_s']:.1f} s" + (f"; {'; '.join(info['notes'])}" if info["notes"] else ""))
    asked = [d for _ in range(per_digit) for d in range(10)]
    prompts = [digits.prompt(d) for d in asked]
    runs: list[dict[str, Any]] = []
    times = microbench.time_fn(lambda: runs.append(diffusion.generate(pipe, prompts, steps, guidance)),
                               ctx.device, warmup=1, repeats=3)
    r, sec = runs[-1], float(np.median(times))
    print(f"generate      {len(prompts)} images, {steps} steps, guidance {guidance:g}: {sec:.3f} s per batch "
          f"(median of 3) = {len(prompts) / sec:.0f} images/s, {sec / steps * 1e3:.1f} ms per step")
    print(f"UNet          {r['unet_evals_per_image']:.0f} evaluations/image counted, "
          f"{r['expected_evals_per_image']} by diffusion.unet_evaluations")
    pixels = digits.to_array(r["images"])
    if not np.isfinite(pixels).all() or pixels.std() < 1e-3:
        print(f"WARNING       images are blank or not finite (std {pixels.std():.4f}): fp16 overflow?")
    try:
        acc = digits.accuracy(r["images"], asked, digits.load_classifier())
    except ImportError as e:
        print(f"SKIP accuracy: {e}")
        return f"{len(prompts) / sec:.0f} images/s ({steps} steps, CFG {guidance:g})"
    try:
        log = json.loads((digits.DIGITS_DIR / "train_log.json").read_text())
        ref = f"; the judge reads real digits at {log['classifier']['held_out_accuracy']:.0%}"
    except (OSError, KeyError, ValueError):
        ref = ""
    print(f"accuracy      {acc:.0%} of the images read as the digit asked for (digits.classifier){ref}")
    return f"{len(prompts) / sec:.0f} images/s ({steps} steps, CFG {guidance:g}), accuracy {acc:.0%}"


def section_timing(ctx: Context, n: int = MATMUL_N, k: int = 10) -> str:
    """Section 5: ``k`` matmuls timed without synchronizing (the launch) and with (the work)."""
    import torch

    tdtype = getattr(torch, ctx.dtype)
    a = torch.randn(n, n, device=ctx.device, dtype=tdtype)
    b = torch.randn(n, n, device=ctx.device, dtype=tdtype)
    c = torch.empty(n, n, device=ctx.device, dtype=tdtype)

    def work() -> None:
        for _ in range(k):
            torch.mm(a, b, out=c)

    work()
    machine.synchronize(ctx.device)
    t0 = time.perf_counter()
    work()
    launch = time.perf_counter() - t0  # the pitfall: the clock is read while the GPU still works
    machine.synchronize(ctx.device)
    drained = time.perf_counter() - t0
    synced = float(np.median(microbench.time_fn(work, ctx.device, warmup=1, repeats=5)))
    flops = k * roofline.matmul_flops(n, n, n)
    ratio = launch / synced
    print(f"no sync       {launch / k * 1e3:8.3f} ms per {n}x{n} {ctx.dtype} matmul "
          f"-> an impossible {flops / launch / 1e12:,.0f} TFLOPS: it timed the kernel launches")
    print(f"synchronized  {synced / k * 1e3:8.3f} ms per matmul (microbench.time_fn, median of 5) "
          f"-> {flops / synced / 1e12:.0f} TFLOPS")
    print(f"              the same clock read after a synchronize: {drained / k * 1e3:.3f} ms per matmul")
    print(f"ratio         the unsynchronized timer read {ratio:.3f} x the synchronized one"
          + ("" if ratio < 0.5 else "  (unexpected: launches should return long before the work ends)"))
    return f"unsynchronized timer read {ratio:.3f} x the synchronized one"


SECTIONS: dict[str, tuple[str, Callable[[Context], str]]] = {
    "device": ("1. device: what torch sees, and the compute dtype", section_device),
    "peaks": ("2. peaks: copy bandwidth (GB/s), matmul TFLOPS, ridge point (FLOPs/byte)", section_peaks),
    "model": ("3. model: batch-1 decode (tokens/s) vs the bandwidth ceiling, prefill TFLOPS", section_model),
    "diffusion": ("4. diffusion: digits SDXL pipeline in fp16 (s, images/s, accuracy)", section_diffusion),
    "timing": ("5. timing: unsynchronized vs synchronized timer (ms)", section_timing),
}


def _parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="labkit gpu-check", description="Check the lab's CUDA code paths and print measured figures.")
    parser.add_argument("--config", default="Qwen3-4B",
                        help=f"architecture for the decode/prefill section: {sorted(architecture.SHIPPED)} "
                             "or a config.json path (default Qwen3-4B)")
    parser.add_argument("--tokens", type=int, default=64, help="timed decode tokens (default 64)")
    parser.add_argument("--prefill", type=int, default=2048, help="prefill length in tokens (default 2048)")
    parser.add_argument("--only", default="", help=f"comma-separated sections to run, of {list(SECTIONS)}")
    args = parser.parse_args(argv)
    args.only = [s.strip() for s in args.only.split(",") if s.strip()] or list(SECTIONS)
    unknown = [s for s in args.only if s not in SECTIONS]
    if unknown:
        parser.error(f"unknown section(s) {unknown}; choose from {list(SECTIONS)}")
    if args.tokens < 1 or args.prefill < 1:
        parser.error("--tokens and --prefill must be at least 1")
    return args


def main(argv: list[str] | None = None) -> int:
    """``labkit gpu-check``: run the sections, print a summary; 0 ok, 1 a section failed, 2 no GPU."""
    args = _parse(argv)
    import torch

    if not torch.cuda.is_available():
        print(no_cuda_message(torch.__version__, torch.version.cuda), file=sys.stderr)
        return 2
    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # no network here: fail fast instead of timing out
    ctx = Context(config=args.config, tokens=args.tokens, prefill=args.prefill)
    ctx.gpu_name = torch.cuda.get_device_name(0)
    ctx.accelerator = match_accelerator(ctx.gpu_name)
    ctx.dtype, ctx.dtype_note = compute_dtype(ctx.device)
    print(f"gpu-check on {ctx.gpu_name}, compute dtype {ctx.dtype}, sections {', '.join(args.only)}")
    results = [run_section(name, *SECTIONS[name], ctx) for name in args.only]
    print("\n== summary ==")
    print(format_summary(results))
    return exit_code(results)


if __name__ == "__main__":
    sys.exit(main())
