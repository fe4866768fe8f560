"""Chapter 00's figures for the report, read from the page's variables once the chapter has run
(its closing cell calls :func:`labkit.figures.keep`)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from ..llm.memory import bytes_per_param, weight_bytes
from ..results import record
from . import take


def keep(page: Mapping[str, Any]) -> None:
    """Record chapter 00's figures from ``page``, the notebook's variables at its end."""

    # What is this machine?
    calls, one_liner = take(page, "calls one_liner")
    record("setup", "cuda_check_runs", one_liner["ran"], "", one_liner["output"])
    record("setup", "cuda_one_liner_calls_exist", calls, "",
           f"torch {torch.__version__} has both calls the one-liner makes (what a CUDA machine runs)")

    # A first run of the bundled model
    (best_dtype, bundled_params, bw, cap, decode_intensity, gemv, mm, model, new, prof, ridge, tok) = take(
        page, "best_dtype bundled_params bw cap decode_intensity gemv mm model new prof ridge tok")
    text = tok.decode(new, skip_special_tokens=True).strip()
    fastest = max(mm, key=lambda d: mm[d]["tflops_best"])
    record("setup", "bandwidth_gbps", bw["gbps"], "GB/s", "256 MiB copy, bytes read + written, median")
    record("setup", "matmul_tflops", mm[cap.dtype]["tflops"], "TFLOPS", f"{cap.dtype} matmul, median")
    record("setup", "compute_dtype", cap.dtype, "", cap.reason)
    record("setup", "compute_dtype_over_fastest", mm[cap.dtype]["tflops_best"] / mm[fastest]["tflops_best"],
           "x", ", ".join(f"{d} {r['tflops_best']:.3f}" for d, r in mm.items()) + " TFLOPS best")
    record("setup", "ridge_flops_per_byte", ridge["median"], "FLOPs/byte",
           f"{best_dtype} matmul FLOP/s ÷ copy bytes/s, {ridge['n']} rounds",
           spread=(ridge["lo"], ridge["hi"], ridge["n"]))
    record("setup", "ridge_over_decode_intensity_lo", ridge["lo"] / decode_intensity, "x",
           f"lowest ops:byte round ÷ {decode_intensity:.1f} FLOPs per byte of batch-1 decode in {cap.dtype}")
    record("setup", "decode_gemv_over_copy", gemv["median"], "x",
           f"{cap.dtype} 8192x8192 matrix x vector: weight bytes/s ÷ the copy's, {gemv['n']} runs",
           spread=(gemv["lo"], gemv["hi"], gemv["n"]))
    record("setup", "generated_tokens", len(new), "tokens", f"{prof.llm}, greedy, offline")
    record("setup", "generated_chars", len(text), "characters", "decoded text, special tokens skipped")
    record("setup", "loaded_llm", prof.llm, "", "the model the first run loaded")
    record("setup", "bundled_params_file", bundled_params, "parameters", "the bundled weights file's header")
    record("setup", "loaded_params", sum(p.numel() for p in model.parameters()), "parameters",
           "loaded, a tied tensor once")

    # What the tutorial's sizing rules say, computed
    for (name, params, fmt), gb in take(page, "four_bit_gb")[0].items():
        record("setup", f"{fmt}_{name.lower()}_gb", gb, "GB",
               f"{params / 1e9:.1f}e9 parameters x {bytes_per_param(fmt):.3f} bytes")
    record("setup", "q4_k_m_4b_need_gb", weight_bytes(4.02e9, "q4_k_m") * 1.2 / 1e9, "GB",
           "Qwen3-4B in Q4_K_M, +20% headroom")
