"""Check the lab's CUDA code paths on an NVIDIA GPU and print the figures (chapters 00, 04 and 07):
``labkit gpu-check``, or ``PYTHONPATH=. python -m labkit.gpucheck`` with a CUDA torch; nothing is
downloaded. A runner on top of every layer: the work is in :mod:`labkit.hardware.microbench` (whose
timers synchronize the device), :mod:`labkit.hardware.catalog`, :mod:`labkit.llm.decode` and
:mod:`labkit.media.diffusion`; this module prints. Sections: ``SECTIONS``. Units: GB/s (1e9 bytes/s,
read + write), TFLOPS (1e12 FLOP/s), FLOPs/byte, tokens/s, s or ms as labelled. Exit status: 0 if
every section not skipped ran, 1 if one failed, 2 if torch sees no CUDA GPU.
"""

from __future__ import annotations

import argparse
import gc
import importlib.util
import os
import sys
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field

from .hardware import capability, machine, microbench, roofline
from .hardware.catalog import CATALOG_DTYPE, Accelerator, datasheet_tflops, match_accelerator
from .llm import architecture, decode, memory
from .media import diffusion
from .stats import percentile

MATMUL_N = 8192  # n of the n x n matmuls: 1.1e12 FLOPs each, large enough to reach the peak
BANDWIDTH_BYTES = 1 << 30  # 1 GiB copied into another 1 GiB buffer


class Skipped(Exception):
    """A section cannot run here (a missing optional package, a model too large): not a failure."""


@dataclass
class Context:
    """What the sections share: options, the GPU, and figures measured by earlier sections."""

    config: str = "Qwen3-4B"
    tokens: int = 64
    prefill: int = 2048
    device: str = "cuda"
    dtype: str = "bfloat16"  # compute dtype (torch dtype name)
    dtype_note: str = ""
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


def run_section(name: str, title: str, fn: Callable[[Context], str], ctx: Context) -> Result:
    """Print ``title`` and run ``fn(ctx)`` (it prints, and returns a one-line summary): a :class:`Skipped`
    is a skip, any other exception a failure (traceback printed); then free the GPU memory it used."""
    print(f"\n== {title} ==", flush=True)
    t0 = time.perf_counter()  # the section's wall time for the summary, not a device figure
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
    gc.collect()
    if (torch := sys.modules.get("torch")) is not None and torch.cuda.is_initialized():
        torch.cuda.empty_cache()
    sys.stdout.flush()
    return Result(name, status, seconds, summary)


def dtype_with_note(device: str = "cuda") -> tuple[str, str]:
    """``(compute dtype name, the line explaining it)`` from :mod:`labkit.hardware.capability`."""
    cap = capability.capability(device)
    return cap.dtype, capability.format_capability(cap)


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


def section_model(ctx: Context) -> str:
    """Section 3: decode tokens/s vs the bandwidth ceiling, prefill TFLOPS vs the matmul peak."""
    import torch

    if importlib.util.find_spec("transformers") is None:
        raise Skipped("transformers not installed")
    config = architecture.load_config(ctx.config)
    need = architecture.param_count(config)["total"] * memory.bytes_per_param(ctx.dtype)
    free = torch.cuda.mem_get_info()[0] if ctx.device.startswith("cuda") else float("inf")
    if need > 0.85 * free:
        raise Skipped(f"{ctx.config} needs {need / 1e9:.0f} GB of {ctx.dtype} weights; "
                      f"{free / 1e9:.0f} GB of GPU memory is free")
    if ctx.bandwidth is None or ctx.dtype not in ctx.tflops:  # section 2 did not run: it does now
        section_peaks(ctx)
    assert ctx.bandwidth is not None
    f = decode.random_model_run(config, ctx.dtype, ctx.device, ctx.tokens, ctx.prefill, ctx.bandwidth)
    model, times, tps = f.pop("model"), f["decode"].step_s, f["decode"].tokens_per_s
    print(f"model         {ctx.config} ({type(model).__name__}), {f['params'] / 1e9:.2f} B parameters, "
          f"{f['weights'] / 1e9:.2f} GB in {ctx.dtype}, random weights made on {ctx.device} in "
          f"{f['build_s']:.1f} s; attention {model.config._attn_implementation}")
    print(f"decode        {ctx.tokens} greedy tokens at batch 1 after a {f['prompt_tokens']}-token prompt: "
          f"median {percentile(times, 50) * 1e3:.2f} ms/token (p90 {percentile(times, 90) * 1e3:.2f}) "
          f"= {tps:.1f} tokens/s")
    print(f"KV cache      {f['kv'] / 1e6:.1f} MB at {f['context']} tokens (kvcache.kv_cache_bytes_for_config)"
          + (f", the cache object holds {f['cache_bytes'] / 1e6:.1f} MB" if f["cache_bytes"] is not None
             else " (cache size not readable in this transformers)"))
    sheet = ctx.accelerator.bandwidth_bytes_per_s / f["bytes_per_token"] if ctx.accelerator else None
    print(f"ceiling       {ctx.bandwidth / 1e9:.0f} GB/s measured / {f['bytes_per_token'] / 1e9:.3f} GB per "
          f"token (weights + KV) = {f['ceiling']:.0f} tokens/s; achieved {f['achieved']:.2f} of it"
          + (f"\n              datasheet bandwidth ceiling {sheet:.0f} tokens/s" if sheet else ""))
    if f["achieved"] < 0.5:
        print("              (eager transformers decode at batch 1 is bound by Python and kernel launches, "
              "not bandwidth; torch.compile with a static KV cache, as gpt-fast does, closes most of it)")
    peak, pre_tflops = ctx.tflops[ctx.dtype] * 1e12, f["prefill_flops"] / 1e12
    ridge = roofline.ridge_point(peak, ctx.bandwidth)
    pre_i = roofline.step_intensity(f["params"], ctx.prefill, f["weights"])  # a prefill reads no cache
    for what, ai in (("decode", f["decode_ai"]), ("prefill", pre_i)):
        print(f"intensity     {what} {ai:.2f} FLOPs/byte vs ridge {ridge:.0f}: "
              f"{'memory' if ai < ridge else 'compute'}-bound")
    print(f"prefill       {ctx.prefill} tokens in {f['prefill_s'] * 1e3:.1f} ms (median of 3) = "
          f"{ctx.prefill / f['prefill_s']:.0f} tokens/s; {pre_tflops:.0f} TFLOPS achieved (2 x params x "
          f"tokens, attention not counted) = {f['prefill_flops'] / peak:.2f} of the {ctx.dtype} matmul peak "
          f"{peak / 1e12:.0f}")
    return (f"decode {tps:.0f} tok/s = {f['achieved']:.2f} of {f['ceiling']:.0f} ceiling; "
            f"prefill {pre_tflops:.0f} TFLOPS = {f['prefill_flops'] / peak:.2f} of peak")


def section_diffusion(ctx: Context, per_digit: int = 5, steps: int = 25, guidance: float = 5.0) -> str:
    """Section 4: the shipped digits SDXL pipeline in fp16 on the GPU: ``per_digit`` images of each
    digit in one batch, as chapter 07 draws them; seconds per batch and digit accuracy."""
    if importlib.util.find_spec("diffusers") is None:
        raise Skipped("diffusers not installed")

    pipe, info = diffusion.load_pipeline("digits-sdxl", device=ctx.device)
    print(f"pipeline      {info['source']} in {info['dtype']} on {info['device']}, "
          f"loaded in {info['load_s']:.1f} s" + (f"; {'; '.join(info['notes'])}" if info["notes"] else ""))
    r = diffusion.digits_batch(pipe, per_digit, steps, guidance)
    n, sec = len(r["asked"]), r["seconds"]
    print(f"generate      {n} images, {steps} steps, guidance {guidance:g}: {sec:.3f} s per batch "
          f"(median of 3) = {n / sec:.0f} images/s, {sec / steps * 1e3:.1f} ms per step")
    print(f"UNet          {r['unet_evals_per_image']:.0f} evaluations/image counted, "
          f"{r['expected_evals_per_image']} by diffusion.unet_evaluations")
    if r["blank"]:
        print(f"WARNING       images are blank or not finite (std {r['pixel_std']:.4f}): fp16 overflow?")
    summary = f"{n / sec:.0f} images/s ({steps} steps, CFG {guidance:g})"
    if r["accuracy"] is None:
        print(f"SKIP accuracy: {r['accuracy_note']}")
        return summary
    acc, judge = r["accuracy"], r["judge_accuracy"]
    print(f"accuracy      {acc:.0%} of the images read as the digit asked for (digits.classifier)"
          + ("" if judge is None else f"; the judge reads real digits at {judge:.0%}"))
    return f"{summary}, accuracy {acc:.0%}"


def section_timing(ctx: Context, n: int = MATMUL_N, k: int = 10) -> str:
    """Section 5: ``k`` matmuls timed without synchronizing (the launch) and with (the work)."""
    import torch

    a, b, c = (torch.randn(n, n, device=ctx.device, dtype=getattr(torch, ctx.dtype)) for _ in range(3))
    t = microbench.launch_vs_work(lambda: [torch.mm(a, b, out=c) for _ in range(k)], ctx.device)
    flops, ratio = k * roofline.matmul_flops(n, n, n), t["launch"] / t["synced"]
    print(f"no sync       {t['launch'] / k * 1e3:8.3f} ms per {n}x{n} {ctx.dtype} matmul "
          f"-> an impossible {flops / t['launch'] / 1e12:,.0f} TFLOPS: it timed the kernel launches")
    print(f"synchronized  {t['synced'] / k * 1e3:8.3f} ms per matmul (microbench.time_fn, median of 5) "
          f"-> {flops / t['synced'] / 1e12:.0f} TFLOPS")
    print(f"              the same clock read after a synchronize: {t['drained'] / k * 1e3:.3f} ms/matmul")
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
    parser = argparse.ArgumentParser(prog="labkit gpu-check", description=__doc__.splitlines()[0])
    parser.add_argument("--config", default="Qwen3-4B", help="architecture for the model section: "
                        f"{sorted(architecture.SHIPPED)} or a config.json path (default Qwen3-4B)")
    parser.add_argument("--tokens", type=int, default=64, help="timed decode tokens (default 64)")
    parser.add_argument("--prefill", type=int, default=2048, help="prefill length in tokens (default 2048)")
    parser.add_argument("--only", default="", help=f"comma-separated sections to run, of {list(SECTIONS)}")
    args = parser.parse_args(argv)
    args.only = [s.strip() for s in args.only.split(",") if s.strip()] or list(SECTIONS)
    if unknown := [s for s in args.only if s not in SECTIONS]:
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
    gpu, (dtype, note) = torch.cuda.get_device_name(0), dtype_with_note("cuda")
    ctx = Context(args.config, args.tokens, args.prefill, dtype=dtype, dtype_note=note,
                  accelerator=match_accelerator(gpu))
    print(f"gpu-check on {gpu}, compute dtype {ctx.dtype}, sections {', '.join(args.only)}")
    results = [run_section(name, *SECTIONS[name], ctx) for name in args.only]
    print("\n== summary ==\n" + format_summary(results))
    return exit_code(results)


if __name__ == "__main__":
    sys.exit(main())
