"""Chapter 05's figures for the report, read from the page's variables once the chapter has run
(its closing cell calls :func:`labkit.figures.keep`)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from ..experiments import engine_runs, vram
from ..llm import fusion
from ..results import record, unmeasured
from . import take


def keep(page: Mapping[str, Any]) -> None:
    """Record chapter 05's figures from ``page``, the notebook's variables at its end."""

    # Weight formats
    only_data = take(page, "only_data")[0]
    record("stack", "safetensors_only_data", only_data, "",
           "8-byte length + JSON header + contiguous tensor ranges = file size")
    record("stack", "pickle_copy_same_tensors", take(page, "same_tensors")[0], "",
           "the torch.save copy timed holds the safetensors file's tensors: names, dtypes and values")

    # GGUF: metadata plus block-quantized tensors
    quantized = take(page, "quantized")[0]
    record("stack", "gguf_quantized_share", quantized, "x",
           "share of the bundled GGUF's parameters in a Q (block-quantized) type")
    full, st_weight = take(page, "full st_weight")
    record("stack", "gguf_copy_max_diff", float(np.abs(full - st_weight).max()), "",
           "blk.0.ffn_down: the GGUF dequantized by the gguf library vs the lab's float32 safetensors copy")

    # The tutorial's vLLM commands on a 12 GB card
    card, cases, qwen = take(page, "card cases qwen")
    q, ll = cases.values()
    record("stack", "qwen3_4b_fp16_default_need_gb", q["total"] / 1e9, "GB",
           f"weights + KV of one {q['max_model_len']:,}-token sequence")
    record("stack", "qwen3_4b_fp16_weights_gb", q["weights"] / 1e9, "GB", "4.02e9 parameters x 2 bytes")
    record("stack", "qwen3_4b_fp16_kv_default_gb", q["kv"] / 1e9, "GB",
           f"one {q['max_model_len']:,}-token sequence, fp16")
    record("stack", "qwen3_4b_fp16_longest_context_12gb", vram.longest_context(qwen, card), "tokens",
           "at utilization 0.9")
    record("stack", "llama3_8b_bf16_need_gb_2048", ll["total"] / 1e9, "GB",
           "weights + KV of one 2,048-token sequence, bf16")
    record("stack", "vllm_budget_12gb", vram.budget(card) / 1e9, "GB",
           "12 GB x the tutorial's --gpu-memory-utilization 0.9 (vLLM 0.32.0's default is 0.92)")

    # Engines side by side
    (comp, cs, fs, hf_run, llama_run, open_ratio, ready_ratio, threads, vllm_run) = take(
        page, "comp cs fs hf_run llama_run open_ratio ready_ratio threads vllm_run")
    hf1 = hf_run.runs[1]  # transformers, one request at a time
    record("stack", "fusion_speedup", fs["median"], "x",
           f"x*2 then *3 ÷ x*6 over 128 MiB, per round, {fs['n']} rounds",
           spread=(fs["lo"], fs["hi"], fs["n"]))
    record("stack", "compile_speedup", cs["median"], "x",
           f"eager ÷ torch.compile, {fusion.CHAIN_OPS} elementwise ops, per round, {cs['n']} rounds",
           spread=(cs["lo"], cs["hi"], cs["n"]))
    record("stack", "compile_max_abs_diff", comp["max_abs_diff"], "",
           "largest |eager - compiled| over the chain's output")
    record("stack", "compile_s", comp["compile_s"], "s",
           "first call into an empty Inductor cache: trace, generate, compile")
    record("stack", "compile_warm_s", comp["warm_s"], "s",
           "first call in a new process that found the compiled code in the cache (its torch import apart)")
    record("stack", "compile_warm_over_cold", comp["warm_over_cold"], "x",
           "the warm first call ÷ the cold one, one of each")
    record("stack", "safetensors_open_over_torch_load", open_ratio["median"], "x",
           "time to open, memory-mapped safetensors ÷ torch.load, 3 batches",
           spread=(open_ratio["lo"], open_ratio["hi"], open_ratio["n"]))
    record("stack", "safetensors_ready_over_torch_load", ready_ratio["median"], "x",
           "time until every page is read, safetensors ÷ torch.load, 3 batches",
           spread=(ready_ratio["lo"], ready_ratio["hi"], ready_ratio["n"]))
    record("stack", "engine_target", vllm_run.kind, "", vllm_run.skipped or vllm_run.name)
    record("stack", "llamacpp_target", llama_run.kind, "",
           llama_run.skipped or f"{llama_run.name}, {llama_run.weights}")
    record("stack", "engine_threads", threads, "",
           "compute threads of every engine (torch, OMP_NUM_THREADS, llama.cpp -t)")
    record("stack", "transformers_weights_mb", hf_run.weight_bytes / 1e6, "MB",
           f"{hf_run.weights}, tensors in the process")
    record("stack", "transformers_tpot_ms", hf1.tpot.median, "ms",
           "generate, one request at a time, median")
    for e, k in ((vllm_run, "vllm"), (llama_run, "llamacpp")):
        if not e.runs:  # the claims on this engine's figures: not measured here, and why
            for key in (f"{k}_c8_over_c1", f"{k}_c8_over_transformers"):
                unmeasured("stack", key, e.skipped or f"{e.name} did not run here")
            continue
        r1, r4, r8, tp = e.runs[1], e.runs[4], e.runs[8], engine_runs.tpot_range_ms(e.runs[1])
        record("stack", f"{k}_c1_tpot_ms", tp["median"], "ms", f"{e.name}, 1 in flight, per request",
               spread=(tp["lo"], tp["hi"], int(tp["n"])))
        record("stack", f"{k}_c1_ttft_ms", r1.ttft.median, "ms", f"{e.name}, 1 in flight, median")
        record("stack", f"{k}_c4_over_c1", r4.output_throughput / r1.output_throughput, "x",
               "output tokens/s, 4 vs 1 in flight")
        if (gain := e.batching_gain) and gain["n"] > 1:
            record("stack", f"{k}_c8_over_c1", gain["median"], "x",
                   f"{e.name}: output tokens/s at 8 vs 1 requests in flight, median of {gain['n']:.0f} "
                   "rounds in alternating order, band their range",
                   spread=(gain["lo"], gain["hi"], int(gain["n"])))
        else:
            record("stack", f"{k}_c8_over_c1", r8.output_throughput / r1.output_throughput, "x",
                   f"{e.name}: output tokens/s at 8 vs 1 requests in flight, one run")
        record("stack", f"{k}_c8_over_transformers", r8.output_throughput / hf1.output_throughput, "x",
               "8 in flight vs transformers generate, sequential")
        if e.memory_bytes:
            record("stack", f"{k}_rss_mb", e.memory_bytes / 1e6, "MB", e.memory_what)
    engine_x, split, tpot_x = take(page, "engine_x split tpot_x")
    if split:
        rounds = (f"{tpot_x['n']} interleaved rounds, both servers up; median of the per-round ratios, band "
                  "their range")
        record("stack", "llamacpp_c1_tps_over_vllm", tpot_x["median"], "x",
               f"vLLM's median TPOT ÷ llama.cpp's, 1 in flight, {rounds}",
               spread=(tpot_x["lo"], tpot_x["hi"], tpot_x["n"]))
        record("stack", "weight_bytes_ratio", split["bytes_ratio"], "x",
               f"{vllm_run.weights} ÷ {llama_run.weights} bytes")
        record("stack", "llamacpp_engine_factor", engine_x["median"], "x",
               f"TPOT ratio ÷ bytes ratio, {rounds}", spread=(engine_x["lo"], engine_x["hi"], tpot_x["n"]))
        record("stack", "llamacpp_bandwidth_share", split["fast_bandwidth_share"], "x",
               "GGUF bytes x tokens/s ÷ bandwidth")
        record("stack", "vllm_bandwidth_share", split["slow_bandwidth_share"], "x",
               "weight bytes x tokens/s ÷ bandwidth")
        for k, side in (("vllm", "slow"), ("llamacpp", "fast")):
            record("stack", f"{k}_step_shared_share", split[f"{side}_fixed_share"], "x",
                   "of a lone step, from TPOT at 1 and 8")
    else:
        unmeasured("stack", "llamacpp_engine_factor",
                   "needs llama.cpp and vLLM's CPU build both measured here")
    ran = take(page, "ran")[0]
    record("stack", "engine_requests_planned", sum(s.n_planned for s in ran), "requests",
           "sent to the servers at 1, 4 and 8 in flight")
    record("stack", "engine_requests_full",
           sum(r.status == "ok" and r.output_tokens == r.max_tokens
           for s in ran for r in s.requests),
           "requests", "answered, each with exactly the tokens asked for")

    # Going further: a long prompt arrives
    interf = take(page, "interf")[0]  # None: the study did not run (no claim reads it)
    for b, r in (interf or {}).items():
        record("stack", f"prefill_stall_s_batch{b}", r.median("stall_s"), "s",
               f"{r.flag}: longest gap of a running answer while a {r.long_tokens}-token prompt "
               f"prefilled, median of {len(r.stall_s)} rounds",
               spread=(min(r.stall_s), max(r.stall_s), len(r.stall_s)))
        record("stack", f"prefill_long_ttft_s_batch{b}", r.median("long_ttft_s"), "s",
               f"{r.flag}: the long prompt's TTFT beside 4 running answers, median of "
               f"{len(r.long_ttft_s)} rounds")
