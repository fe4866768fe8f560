"""Chapter 04's figures for the report, read from the page's variables once the chapter has run
(its closing cell calls :func:`labkit.figures.keep`)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from ..engines import llamacpp
from ..hardware import roofline
from ..hardware.catalog import ACCELERATORS
from ..llm.memory import bytes_per_param
from ..results import record, unmeasured
from . import take


def keep(page: Mapping[str, Any]) -> None:
    """Record chapter 04's figures from ``page``, the notebook's variables at its end."""

    # Measured: what limits each phase here
    (bandwidth, cap, device, dt, matmul_points, mm_dtype, peak, prof, results, ridge_here, scaling) = take(
        page, "bandwidth cap device dt matmul_points mm_dtype peak prof results ridge_here scaling")
    r = results[dt]  # the chapter's compute dtype's roofline figures
    record("hardware", "page_roofline_same", bool(take(page, "page_roofline_same")[0]), "",
           "the chapter's ridge_point, attainable and gemm_intensity against labkit.hardware.roofline, "
           "on the chapter's matmuls, roofs and the H100's datasheet figures")
    half = cap.dtype if cap.dtype != "float32" else next(d for d in peak if d != "float32")
    record("hardware", "device", device)
    record("hardware", "compute_dtype", cap.dtype, "", cap.reason)
    record("hardware", "half_over_fp32_matmul", peak[half] / peak["float32"], "x",
           f"{half} vs float32 matmul roof")
    record("hardware", "matmul_m1024_over_m1",
           matmul_points[-1]["flops_per_s"] / matmul_points[0]["flops_per_s"], "x",
           f"achieved FLOP/s, 4096x4096 {mm_dtype} weight")
    record("hardware", "bandwidth_gbps", bandwidth / 1e9, "GB/s", "best copy bandwidth (the roof)")
    record("hardware", "ridge_flops_per_byte", ridge_here[dt], "FLOPs/byte",
           f"{dt} matmul roof ÷ bandwidth roof")
    record("hardware", "decode_intensity", r["decode_ai"], "FLOPs/byte",
           f"computed from sizes: {prof.llm}, batch 1, {dt}")
    record("hardware", "decode_intensity_over_ridge", r["decode_ai"] / ridge_here[dt], "x",
           "computed intensity ÷ measured ridge (below 1: memory-bound)")
    record("hardware", "prefill_intensity", r["prefill_ai"], "FLOPs/byte",
           f"computed: {prof.llm}, 128 tokens, {dt}")
    record("hardware", "prefill_over_decode_flops", r["prefill_flops"] / r["decode_flops"], "x",
           "achieved FLOP/s, measured")
    record("hardware", "decode_achieved", r["achieved"], "fraction",
           "decode tokens/s x bytes per token ÷ bandwidth")
    for key, (what, s) in zip(("decode_b8_over_b1_step", "prefill_512_over_128"), scaling.items(),
                              strict=True):
        record("hardware", key, s["median"], "x",
               f"{what}, {prof.llm} {dt}, median of {s['n']} alternating rounds",
               spread=(s["lo"], s["hi"], s["n"]))
    models = take(page, "models")[0]
    for key, value, unit in [("matmul_roof_tflops", peak[dt] / 1e12, "TFLOPS"),
                             ("decode_params", r["params"], "params"),
                             ("decode_element_bytes", next(models[dt].parameters()).element_size(), "B"),
                             ("decode_kv_bytes", r["kv"], "B"),
                             ("decode_bytes_per_token", r["bytes_per_token"], "B"),
                             ("decode_ceiling_tps", r["ceiling"], "tokens/s")]:
        record("hardware", key, value, unit,
               f"{prof.llm} {dt}: what the ridge and the decode ceiling are computed from")
    lc, lc_row, threads = take(page, "lc lc_row threads")
    record("hardware", "llamacpp_measured", lc is not None, "",
           "llama-bench ran" if lc else llamacpp.unavailable_reason())
    if not lc:
        unmeasured("hardware", "llamacpp_decode_achieved", llamacpp.unavailable_reason())
    if lc:
        how = (f"llama-bench tg{lc['gen']}, {lc['type']}, {threads} thread(s), faster of "
               f"{len(lc_row['tps_rounds'])} rounds")
        shares = [roofline.bandwidth_achieved(t, lc_row["bytes_per_token"], lc_row["bandwidth"])
                  for t in lc_row["tps_rounds"]]
        record("hardware", "llamacpp_decode_tps", lc_row["tps"], "tokens/s", how,
               spread=(min(lc_row["tps_rounds"]), lc_row["tps"], len(lc_row["tps_rounds"])))
        record("hardware", "llamacpp_decode_achieved", lc_row["achieved"], "fraction",
               f"{how}: tokens/s x bytes per token ÷ copy bandwidth",
               spread=(min(shares), max(shares), len(shares)))
        record("hardware", "llamacpp_bytes_per_token", lc_row["bytes_per_token"], "B",
               "GGUF tensor bytes + f16 KV cache")
        record("hardware", "llamacpp_decode_ceiling", lc_row["ceiling"], "tokens/s",
               "copy bandwidth ÷ bytes per token")
        record("hardware", "llamacpp_bandwidth_gbps", lc_row["bandwidth"] / 1e9, "GB/s",
               f"best copy, {threads} thread(s)")
        record("hardware", "model_set_over_dram_copy", lc_row["model_set_bandwidth"] / lc_row["bandwidth"],
               "x", "copy rate with a working set the size of the weights ÷ with 512 MiB")
        if lc["llc_bytes"]:
            record("hardware", "llc_over_model_weights", lc["llc_bytes"] / lc["bytes"]["weights"], "x",
                   "last-level cache the system reports ÷ the GGUF's tensor bytes")
        record("hardware", "llamacpp_over_torch_decode_tps", lc_row["tps"] / r["tps"], "x",
               f"llama.cpp vs the lab's {dt} decode")
        for o in (row for row in lc["rows"] if row is not lc_row):  # llama.cpp's own thread count, if other
            note = f"{o['threads']} vs {threads} threads, one round"
            record("hardware", "llamacpp_more_threads_tps_gain", o["tps"] / lc_row["tps"], "x",
                   f"llama-bench tokens/s, {note}")
            record("hardware", "llamacpp_more_threads_bandwidth_gain", o["bandwidth"] / lc_row["bandwidth"],
                   "x", f"copy, {note}")
            record("hardware", "llamacpp_more_threads_achieved", o["achieved"], "fraction",
                   f"{o['threads']} threads")
    decode_ai, h100_ridge, max_fit, q_prefill_ai, w14, w8 = take(
        page, "decode_ai h100_ridge max_fit q_prefill_ai w14 w8")
    h100, b200, rtx, m4 = (ACCELERATORS[n] for n in ("H100 SXM", "B200", "RTX 3060 12GB", "Apple M4"))
    share = 2 / 3  # macOS's default GPU memory limit at these sizes
    q4 = bytes_per_param("q4_k_m") * 1.2  # Q4_K_M bytes per parameter, with 20% headroom
    record("hardware", "h100_ops_per_byte", h100_ridge, "FLOPs/byte", "989.4 TFLOPS fp16 dense ÷ 3.35 TB/s")
    record("hardware", "h100_fp8_tflops", h100.tflops["fp8"], "TFLOPS", "catalog: H100 SXM dense fp8")
    record("hardware", "b200_over_h100_fp8", b200.tflops["fp8"] / h100.tflops["fp8"], "x",
           "catalog: dense fp8")
    record("hardware", "b200_over_h100_bandwidth", b200.bandwidth_bytes_per_s / h100.bandwidth_bytes_per_s,
           "x", "catalog")
    record("hardware", "rtx3060_bandwidth_gbps", rtx.bandwidth_bytes_per_s / 1e9, "GB/s", "catalog")
    record("hardware", "rtx3060_fp32_tflops", rtx.tflops["fp32"], "TFLOPS", "catalog")
    record("hardware", "rtx3060_has_fp8", "fp8" in rtx.tflops, "", "catalog: a dense fp8 rate listed")
    record("hardware", "m4_bandwidth_gbps", m4.bandwidth_bytes_per_s / 1e9, "GB/s", "catalog")
    record("hardware", "m4_over_rtx3060_bandwidth", m4.bandwidth_bytes_per_s / rtx.bandwidth_bytes_per_s, "x",
           "catalog")
    record("hardware", "llama3_8b_bf16_weights_gb", w8, "GB",
           "Llama-3-8B's shipped config, 2 bytes per parameter")
    record("hardware", "b14_bf16_weights_gb", w14, "GB", "14e9 parameters x 2 bytes")
    for key, (name, mem, d) in {"rtx3060_max_b_bf16": ("RTX 3060 12GB", 12e9, "bf16"),
                                "rtx3060_max_b_q4": ("RTX 3060 12GB", 12e9, "q4_k_m"),
                                "m4_max_b_bf16": ("Apple M4", 16e9, "bf16"),
                                "m4_max_b_q4": ("Apple M4", 16e9, "q4_k_m"),
                                "m4_24gb_max_b_bf16": ("Apple M4", 24e9, "bf16"),
                                "m4_24gb_max_b_q4": ("Apple M4", 24e9, "q4_k_m")}.items():
        record("hardware", key, max_fit[(name, mem, d)] / 1e9, "B params",
               f"{mem / 1e9:.0f} GB, {d}, 20% headroom")
    for gb in (16, 24, 32):
        record("hardware", f"m4_{gb}gb_gpu_cap_max_b_q4", gb * share / q4, "B params",
               f"{gb} GB x 2/3 (macOS GPU limit), q4_k_m, headroom")
    record("hardware", "m4_32gb_max_b_q4", 32 / q4, "B params", "32 GB, q4_k_m, 20% headroom")
    record("hardware", "m4_smallest_max_b_q4", min(gb * share / q4 for gb in (16, 24, 32)), "B params",
           "smallest over the 16, 24 and 32 GB options under macOS's default GPU limit, q4_k_m, 20% headroom")
    record("hardware", "qwen3_4b_decode_b1_intensity", decode_ai[1], "FLOPs/byte",
           "computed: bf16, batch 1, 1,024 context")
    record("hardware", "qwen3_4b_prefill_2048_intensity", q_prefill_ai, "FLOPs/byte",
           "computed: bf16, 2,048-token prefill")
    record("hardware", "mps_check_exists", callable(getattr(torch.backends.mps, "is_available", None)), "",
           f"torch {torch.__version__} has torch.backends.mps.is_available")

    # What we learned: the decode at half the bytes, fp32 beside 16-bit
    results, dtypes = take(page, "results dtypes")
    if len(results) > 1:  # fp32 and the 16-bit compute dtype decoded side by side: half the bytes per token
        h16, ri, bytes_ratio, read_share = take(page, "h16 ri bytes_ratio read_share")
        record("hardware", "decode_16bit_over_fp32_tps", ri["median"], "x",
               f"{h16} ÷ float32 decode tokens/s, median of the ratios of {ri['n']} interleaved rounds "
               "with its interval", spread=(ri["lo"], ri["hi"], int(ri["n"])))
        record("hardware", "decode_fp32_over_16bit_bytes", bytes_ratio, "x", f"bytes per token, vs {h16}")
        record("hardware", "decode_weight_read_share", read_share(ri["median"]), "fraction",
               "share of a float32 decode step that scales with the bytes read, from the speed-up at "
               "fewer bytes",
               spread=(read_share(ri["lo"]), read_share(ri["hi"]), int(ri["n"])))
    else:
        for key in ("decode_16bit_over_fp32_tps", "decode_weight_read_share"):
            unmeasured("hardware", key, f"only {dtypes[0]} decoded here, so no decode at half the bytes: "
                       + (cap.reason if cap.dtype == "float32" else "float32 does not fit this device"))

    # A CPU's cores beside a GPU's, in numbers
    (by_threads, cdt, clock, cpu_isa, gains, here, lanes_worth, sides, thread_gain) = take(
        page, "by_threads cdt clock cpu_isa gains here lanes_worth sides thread_gain")
    h, rtx_ = sides[1], sides[2]
    record("hardware", "cpu_physical_cores", here["cores"], "cores", f"{here['logical_cores']} logical")
    record("hardware", "cpu_simd_fp32_lanes", here["simd_torch"], "lanes",
           f"torch's {cpu_isa} kernels; flags: {here['simd_flags']}")
    record("hardware", "cpu_fp32_lanes", here["lanes"], "lanes", "physical cores x SIMD fp32 lanes")
    record("hardware", "h100_cuda_cores", h["lanes"], "lanes", f"catalog: {h['cores']} SMs x 128 fp32 lanes")
    record("hardware", "rtx3060_cuda_cores", rtx_["lanes"], "lanes",
           f"catalog: {rtx_['cores']} SMs x 128 fp32 lanes")
    record("hardware", "h100_over_cpu_lanes", gains["H100 SXM"]["lanes"], "x",
           "fp32 lanes, datasheet ÷ this CPU")
    record("hardware", "h100_over_cpu_fp32_flops", gains["H100 SXM"]["flops"], "x",
           "datasheet fp32 ÷ best fp32 matmul here")
    record("hardware", "h100_over_cpu_bandwidth", gains["H100 SXM"]["bandwidth"], "x",
           "datasheet ÷ best copy here")
    record("hardware", "h100_prefill_gain_over_decode_gain",
           gains["H100 SXM"]["flops_dt"] / gains["H100 SXM"]["bandwidth"], "x",
           f"({cdt} FLOP/s ratio) ÷ (bandwidth ratio), H100 vs this CPU")
    for key, s in (("thread_speedup_matmul", thread_gain["matmul"]),
                   ("thread_speedup_copy", thread_gain["copy"])):
        record("hardware", key, s["median"], "x",
               f"{by_threads['threads'][-1]} vs 1 torch threads, median of {s['n']} rounds",
               spread=(s["lo"], s["hi"], s["n"]))
    if lanes_worth:
        record("hardware", "cpu_clock_ghz", clock, "GHz", "psutil / /proc/cpuinfo")
        record("hardware", "matmul_fp32_lanes_per_cycle", lanes_worth, "FMA/cycle",
               "1-thread fp32 matmul FLOP/s ÷ (2 x clock)")
