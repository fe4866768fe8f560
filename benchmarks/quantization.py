"""Weight formats side by side on the bundled LLM (chapter 06): bytes, quality, decode speed.

Formats: the model's float format (FP32 here; BF16 too where this CPU multiplies it natively),
labkit's INT8 and INT4 round-to-nearest, labkit's INT4 GPTQ (act-order, sequential), and torchao's
INT8 weight-only. For each: bytes of the quantized linear layers measured from their tensors,
perplexity and KL divergence on ``data/texts/heldout.txt``, and greedy decode tokens/s, timed
interleaved (each repetition runs every format once) so background load hits all of them alike.
Then one MLP projection at batch 1: the float matmul, labkit's dequantizing layers and PyTorch's
fused INT8/INT4 CPU kernels. Ratios are against the float model of the same run.

    .venv/bin/python benchmarks/quantization.py [--quick] [--no-cache]

``--quick`` (under a minute on 2 shared cores, GPTQ included; less once it is cached) scores 2
windows of 128 tokens and decodes 8 tokens; the default scores 6 windows of 256 and decodes 24,
calibrating GPTQ on 12 windows.
"""

from __future__ import annotations

import argparse
import copy
import time
from functools import partial

import numpy as np
import torch

from labkit.hardware.capability import compute_dtype
from labkit.hardware.microbench import interleaved_times
from labkit.llm import gptq as G
from labkit.llm import lowbit_kernels as LK
from labkit.llm import perplexity as P
from labkit.llm import quant_bench as QB
from labkit.llm import quantize as Q
from labkit.models import load_llm
from labkit.settings import set_threads

PROMPT = "Write a short paragraph about why libraries still matter."


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="fewer tokens: under a minute")
    ap.add_argument("--no-cache", action="store_true", help="run GPTQ even if its result is cached")
    args = ap.parse_args()
    set_threads()
    t_start = time.perf_counter()
    group = 128
    window, n_windows, calib_windows, new_tokens, repeats = (
        (128, 2, 4, 8, 2) if args.quick else (256, 6, 12, 24, 3))
    model, tok = load_llm(dtype="float32", device="cpu")
    ev = P.token_windows(tok, P.load_text("heldout"), window, n_windows)
    calib = G.calibration_windows(tok, P.load_text("calibration"), calib_windows, 128)

    formats: dict[str, tuple] = {}  # name -> (model, linear bytes)
    fp_bytes = QB.linear_bytes(model)
    formats["FP32"] = (model, fp_bytes)
    if compute_dtype("cpu") == "bfloat16":
        formats["BF16"] = (copy.deepcopy(model).to(torch.bfloat16), fp_bytes // 2)
    else:
        print("BF16: skipped, this CPU has no native bf16 (a bf16 model here would be tens of times slower)")
    for name, bits in (("INT8 RTN", 8), ("INT4 RTN", 4)):
        m = copy.deepcopy(model)
        formats[name] = (m, Q.quantize_model(m, bits, group)["q_bytes"])
    m = copy.deepcopy(model)
    t0 = time.perf_counter()
    packed = G.gptq_quantize_model(m, calib, 4, group, damp=0.1, act_order=True, cache=not args.no_cache)
    gptq_s = time.perf_counter() - t0
    formats["INT4 GPTQ"] = (m, Q.quantize_model(m, 4, group, quantized=packed)["q_bytes"])
    formats["torchao INT8"] = LK.torchao_int8(model)  # the same function chapter 06 calls
    print(f"GPTQ on {calib.shape[0]}x{calib.shape[1]} calibration tokens: {gptq_s:.1f} s; scoring "
          f"{ev.shape[0]}x{ev.shape[1]} held-out tokens")

    ref = P.window_logits(model, ev)
    quality = {}
    for name, (m, _) in formats.items():
        logits = ref if m is model else P.window_logits(m, ev)
        quality[name] = dict(P.perplexity_from_logits(logits, ev), **P.divergence(ref, logits))

    enc = tok(PROMPT, return_tensors="pt")
    kw = dict(max_new_tokens=new_tokens, min_new_tokens=new_tokens, do_sample=False,
              pad_token_id=tok.eos_token_id)
    with torch.inference_mode():
        times = interleaved_times({n: partial(m.generate, **enc, **kw) for n, (m, _) in formats.items()},
                                  repeats=repeats)
    tok_s = {n: new_tokens / float(np.median(t)) for n, t in times.items()}

    print(f"\n{'format':13s} {'linear MB':>10s} {'x FP32':>7s} {'ppl':>7s} {'x FP32':>7s} {'KL':>8s} "
          f"{'top-1':>6s} {'tok/s':>6s} {'x FP32':>7s}")
    for n, (_, b) in formats.items():
        q = quality[n]
        ppl_x = q["ppl"] / quality["FP32"]["ppl"]
        print(f"{n:13s} {b / 1e6:10.1f} {b / fp_bytes:7.3f} {q['ppl']:7.2f} {ppl_x:7.3f} {q['kl']:8.4f}"
              f" {q['top1']:6.1%} {tok_s[n]:6.1f} {tok_s[n] / tok_s['FP32']:7.2f}")
    print(f"(tok/s: {new_tokens} greedy tokens after a {enc.input_ids.shape[1]}-token prompt, "
          f"median of {repeats}, interleaved)")

    us = LK.kernel_times(model.model.layers[0].mlp.down_proj, group, "cpu", repeats=10 if args.quick else 30)
    print("\none MLP down_proj at batch 1:")
    for k, v in us.items():
        print(f"  {k:44s} {v:8.0f} us  {v / us['float matmul']:5.1f}x the float matmul")
    print(f"\ntotal {time.perf_counter() - t_start:.0f} s")


if __name__ == "__main__":
    main()
