"""Chapter 06's figures for the report, read from the page's variables once the chapter has run
(its closing cell calls :func:`labkit.figures.keep`)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from ..engines import llamacpp
from ..experiments import gguf_levels as GL
from ..hardware.catalog import ACCELERATORS
from ..llm import quant_bench as QB
from ..llm.architecture import load_config
from ..llm.memory import weight_bytes
from ..results import record, unmeasured
from ..settings import STUDY_SKIPPED
from ..stats import median_interval
from . import take


def keep(page: Mapping[str, Any]) -> None:
    """Record chapter 06's figures from ``page``, the notebook's variables at its end."""

    # Quantization: fewer bits per weight
    fp_name, tok_s_rounds = take(page, "fp_name tok_s_rounds")
    ROUNDS = len(tok_s_rounds[fp_name])
    int8_steps = take(page, "int8_steps")[0]
    page_rtn_same, page_gptq_ratio, w0 = take(page, "page_rtn_same page_gptq_ratio w0")
    record("optimization", "page_rtn_same", bool(page_rtn_same), "",
           f"the chapter's rtn at 8 bits against labkit's quantize_weight on layer 0's q_proj "
           f"({w0.shape[0]} x {w0.shape[1]}): the same codes and scales")
    record("optimization", "page_gptq_over_labkit", page_gptq_ratio, "x",
           "the chapter's gptq (INT4, one scale per row, columns in order) ÷ labkit's gptq_quantize_weight "
           "with the same settings: relative output error of layer 0's q_proj on its calibration inputs")
    record("optimization", "int8_torchao_max_steps", int8_steps, "steps",
           "largest |labkit INT8 weight - torchao INT8 weight| over the quantized layers, in labkit's "
           "per-row step")

    # A quantized KV cache at long context
    STRIDE, WINDOW, ev, k_us, n_par, ppl_ci, prof = take(page, "STRIDE WINDOW ev k_us n_par ppl_ci prof")
    how_ppl = (f"{prof.llm}, all {ev.numel()} held-out tokens, sliding window {WINDOW}/{STRIDE}; 95% "
               f"bootstrap interval over {n_par} paragraphs")
    for key, name in (("ppl_fp", fp_name), ("ppl_int8_rtn", "INT8 RTN"), ("ppl_int4_rtn", "INT4 RTN"),
                      ("ppl_int4_rtn_asym", "INT4 RTN asym"), ("ppl_int4_gptq", "INT4 GPTQ"),
                      ("ppl_int4_awq", "INT4 AWQ-style")):
        c = ppl_ci[name]
        record("optimization", key, c["ppl"], "", f"{name} perplexity: {how_ppl}",
               spread=(c["lo"], c["hi"], c["n"]))
    c = take(page, "ppl_ratio")[0]["INT8 RTN / " + fp_name]
    record("optimization", "int8_rtn_ppl_over_fp", c["ratio"], "x",
           f"INT8 RTN / {fp_name} perplexity, paired: {how_ppl}", spread=(c["lo"], c["hi"], c["n"]))
    if "torch fused INT4 kernel" in k_us:
        record("optimization", "fused_int4_kernel_us", k_us["torch fused INT4 kernel"], "us",
               "down_proj, batch 1")
        record("optimization", "labkit_int4_kernel_us", k_us["labkit INT4 (unpack + dequantize + matmul)"],
               "us", "down_proj, batch 1")
        record("optimization", "fused_int8_over_float_kernel_speed",
               k_us["float matmul"] / k_us["torch fused INT8 kernel"], "x",
               f"down_proj at batch 1: {fp_name} matmul time / fused INT8 kernel time")
    (calib_ratio, cont, ctx_len, damps, gptq_rep, kv_bits, kv_long, ppl_ratio, raised, ranked, repa,
     widest) = take(
        page, "calib_ratio cont ctx_len damps gptq_rep kv_bits kv_long ppl_ratio raised ranked repa widest")
    for key, label in (("gptq_over_rtn_ppl", "INT4 GPTQ / INT4 RTN"),
                       ("gptq_over_rtn_asym_ppl", "INT4 GPTQ / INT4 RTN asym"),
                       ("rtn_asym_over_rtn_ppl", "INT4 RTN asym / INT4 RTN"),
                       ("gptq_over_awq_ppl", "INT4 GPTQ / INT4 AWQ-style"),
                       ("awq_over_rtn_asym_ppl", "INT4 AWQ-style / INT4 RTN asym")):
        c = ppl_ratio[label]
        record("optimization", key, c["ratio"], "x", f"{label} perplexity, paired: {how_ppl}",
               spread=(c["lo"], c["hi"], c["n"]))
    record("optimization", "gptq_calib_err_ratio_max", max(calib_ratio.values()), "x",
           "largest GPTQ / RTN (same grid) "
           f"output error on a layer's own calibration inputs, over {len(calib_ratio)} layers")
    record("optimization", "gptq_calib_err_ratio_median", float(np.median(list(calib_ratio.values()))), "x",
           "median of the same over the layers")
    record("optimization", "int4_rtn_asym_bits_per_weight", repa["q_bytes"] * 8 / repa["params"], "bits",
           "INT4 codes, float16 scale and uint8 zero point per 128 weights, from the tensors")
    record("optimization", "gptq_calib_tokens", gptq_rep["tokens"], "tokens",
           "calibration tokens per Hessian")
    record("optimization", "gptq_widest_input", widest, "inputs",
           "the widest input of a quantized linear layer")
    record("optimization", "gptq_damp_max", max(damps.values()), "",
           "largest damping a layer needed (x mean diagonal)")
    record("optimization", "gptq_layers_damp_raised", len(raised), "layers",
           "layers whose Cholesky needed more than 0.01")
    for n, r in ranked.items():
        record("optimization", f"gptq_h_rank.{n}", r["rank"], "",
               f"numerical rank (float32) of H, {r['inputs']} inputs")
    for label, key in (("INT8, prefix only", "kv_int8_prefix"), ("INT8, prefix and continuation", "kv_int8"),
                       ("INT4 per token", "kv_int4_per_token"), ("INT4 KIVI-style", "kv_int4_kivi")):
        how = (f"{label}, after {ctx_len} tokens, next {cont.shape[1]}, {kv_bits[label]:.2f} bits per "
               "element with scales")
        record("optimization", f"{key}_same_next_token", kv_long[label]["top1"], "fraction",
               f"same next token: {how}")
        record("optimization", f"{key}_kl", kv_long[label]["kl"], "nats/token",
               f"KL from the unrounded cache: {how}")
        record("optimization", f"{key}_bits_per_element", kv_bits[label], "bits",
               f"{label}: codes and scales, per element")
    r = take(page, "speed_ratio")[0]["INT8 RTN"]
    (GROUP, bits_per_w, ceil8b, emb, int4_ratio, kind8, params_all, r8, rep4, whole4) = take(
        page, "GROUP bits_per_w ceil8b emb int4_ratio kind8 params_all r8 rep4 whole4")
    shipped = [load_config(n) for n in ("DeepSeek-V3", "Llama-3-8B", "Qwen3-235B-A22B", "Qwen3-4B")]
    record("optimization", "int8_over_fp_decode", r8["median"], "x",
           f"INT8 ({kind8}) vs {fp_name} decode tokens/s, {ROUNDS} interleaved rounds",
           spread=(r8["lo"], r8["hi"], r8["n"]))
    record("optimization", "int8_labkit_over_fp_decode", r["median"], "x",
           f"labkit INT8 (dequantizing) vs {fp_name} " "decode tokens/s", spread=(r["lo"], r["hi"], r["n"]))
    record("optimization", "int4_over_fp_decode", int4_ratio, "x",
           f"labkit INT4 vs {fp_name} decode tokens/s, one run")
    record("optimization", "h100_int8_over_bf16_ceiling_8b", ceil8b, "x",
           "computed: Llama-3-8B decode ceiling, INT8 vs BF16 linears, embedding/head in 16 bits (bandwidth "
           "bound)")
    record("optimization", "int4_linear_over_fp16", rep4["q_bytes"] / (rep4["params"] * 2), "x",
           f"computed: INT4 codes + float16 scales (groups of {GROUP}) / 2 bytes per weight, from the "
           f"tensors")
    record("optimization", "int4_7b_gb", 7e9 * bits_per_w / 8 / 1e9, "GB",
           f"computed: 7B weights at {bits_per_w:.3f} bits")
    record("optimization", "fp16_7b_gb", weight_bytes(7e9, "fp16") / 1e9, "GB",
           "computed: 7B weights at 2 bytes")
    record("optimization", "configs_16bit_share",
           float(np.mean([c.get("torch_dtype") in ("bfloat16", "float16")
           and "quantization_config" not in c for c in shipped])),
           "", "shipped configs stored in 16 bits")
    record("optimization", "int4_model_bytes_per_param", whole4 / params_all, "bytes/param",
           f"whole {prof.llm} with INT4 linears, embedding kept in {emb.dtype}")
    for fmt in ("q4_k_m", "q4_0"):
        record("optimization", f"{fmt}_bytes_per_param", weight_bytes(1.0, fmt), "bytes/param",
               f"computed: GGUF {fmt.upper()} average bytes per parameter (labkit.llm.memory)")
    record("optimization", "qwen3_14b_q4_k_m_gb", weight_bytes(14.8e9, "q4_k_m") / 1e9, "GB",
           "computed: 14.8B parameters (Qwen3-14B's model card) at Q4_K_M's 4.85 bits")
    speed_ratio, step, step_bytes = take(page, "speed_ratio step step_bytes")
    top = max(step, key=step.__getitem__)
    record("optimization", "lowprec_flops_ratio_max", step[top], "x",
           f"datasheets, like for like: largest FLOPS ratio of one halving ({top[0]}, {top[1]} to {top[2]})")
    record("optimization", "lowprec_flops_ratio_min", min(step.values()), "x",
           "datasheets, like for like: smallest FLOPS ratio of one halving")
    r4090 = ACCELERATORS["RTX 4090"].tflops
    record("optimization", "rtx4090_int8_over_fp16_fp32acc", r4090["int8"] / r4090["fp16"], "x",
           "datasheet INT8 over the FP16-at-FP32-accumulate figure listed: not like for like")
    record("optimization", "int8_step_bytes_ratio", step_bytes, "x",
           f"bytes a decode step reads, {fp_name} / INT8 linears")
    if "INT8 fused kernel" in speed_ratio:
        f8 = speed_ratio["INT8 fused kernel"]
        record("optimization", "int8_decode_speedup_over_bytes", f8["median"] / step_bytes, "x",
               f"fused INT8 vs {fp_name} decode tokens/s ({f8['n']} interleaved rounds) over the bytes ratio",
               spread=(f8["lo"] / step_bytes, f8["hi"] / step_bytes, f8["n"]))
    else:
        unmeasured("optimization", "int8_decode_speedup_over_bytes",
                   "no fused INT8 weight-only kernel ran here "
                   "(PyTorch's are CPU kernels); labkit's INT8 builds a float weight on every call, reading "
                   "more bytes")

    # Integer or float: what the exponent bits buy
    fp8_mse, peak, picked, range_err = take(page, "fp8_mse peak picked range_err")
    e = range_err["outliers"]
    for k, n in picked.items():
        record("optimization", f"fp8_over_int8_mse_{k}", fp8_mse[k], "x",
               f"FP8 E4M3 / INT8 mean squared error, one scale per "
               f"tensor, {n} (max/mean |w| {peak[n]:.0f}: the {k} of {len(peak)} linear weights)")
    record("optimization", "fp8_over_int8_small_error_outliers",
           e["float8_e4m3fn"]["small"] / e["int8"]["small"], "x",
           f"{picked['outliers']}: mean relative error of the weights at or below the median |w|, FP8 E4M3 "
           f"/ INT8")

    # The same levels with fused kernels: llama.cpp
    gguf_rows, studied = take(page, "gguf_rows STUDY")
    for key, (value, unit, note, spread) in GL.figures(gguf_rows).items():
        record("optimization", key, value, unit, note, spread=spread)
    if not gguf_rows:  # llama.cpp is not built here: the claims on its levels say why they have no figure
        for key in ("gguf_q8_0_over_f16_decode", "gguf_q4_0_over_q8_0_decode", "gguf_q4_k_m_over_q8_0_decode",
                    "gguf_q4_0_over_f16_decode", "gguf_f16_over_q4_0_size", "gguf_f16_over_q4_k_m_size",
                    "gguf_q4_0_bits_per_weight", "gguf_q4_k_m_bits_per_weight", "gguf_q4_0_bytes_per_param",
                    "gguf_q4_k_m_bytes_per_param", "gguf_q4_0_ppl_over_base", "gguf_q4_k_m_ppl_over_base",
                    "gguf_q8_0_ppl_over_base"):
            unmeasured("optimization", key, llamacpp.unavailable_reason() if studied else STUDY_SKIPPED)

    # The tutorial's AutoGPTQ example
    (fp_w, gain_kept, layer_err, one, one_err, one_rank, probe) = take(
        page, "fp_w gain_kept layer_err one one_err one_rank probe")
    record("optimization", "gptq_one_sentence_gain_kept", gain_kept, "fraction",
           "share of the 1,536-token GPTQ's cut in "
           "the mean held-out layer error below RTN's (six probed layers) that GPTQ calibrated on the "
           "tutorial's sentence keeps")
    record("optimization", "gptq_one_sentence_rank_max", max(one_rank.values()), "",
           f"largest rank of H from the {one.shape[1]}-token sentence over the six probed layers (inputs "
           f"{min(w.shape[1] for w in fp_w.values())} to {max(w.shape[1] for w in fp_w.values())})")
    record("optimization", "gptq_one_sentence_over_rtn_layer_error",
           float(np.mean([one_err[n] / layer_err[n]["RTN"]
           for n in probe])), "x",
           "mean GPTQ (one sentence) / RTN output error of the six probed layers, held out")

    # The tutorial's Ollama exercise: a 14B model at 4 bits against a 4B one
    four_b = None
    if four_b:
        record("optimization", "ollama_qwen3_4b_16bit", four_b.upper() in ("F16", "BF16", "F32"), "",
               f"Ollama's qwen3:4b reports quantization level {four_b}")
    else:
        unmeasured("optimization", "ollama_qwen3_4b_16bit",
                   "no Ollama server with qwen3:4b answers here. The tutorial's "
                   "own line gives qwen3:14b's default tag as Q4_K_M, and Ollama's default tags are 4-bit "
                   "at every size "
                   "(16-bit copies carry an -fp16 tag), so qwen3:4b is most likely Q4_K_M, not full "
                   "precision")
    risk, steps = take(page, "risk steps")
    kl8 = [risk[(s, 8)]["kl"] for s in steps]  # the four places, in the tutorial's order
    record("optimization", "gptq_over_rtn_layer_error",
           float(np.mean([e["GPTQ"] / e["RTN"] for e in layer_err.values()])), "x",
           "mean GPTQ / RTN output error of six probed layers on held-out activations")
    record("optimization", "gptq_over_rtn_asym_layer_error",
           float(np.mean([e["GPTQ"] / e["RTN asym"] for e in layer_err.values()])), "x",
           "mean GPTQ / asymmetric RTN (clip search) output error of six probed layers on held-out "
           "activations")
    for s in steps:
        record("optimization", f"kl_{s.split()[0].lower()}_8bit", risk[(s, 8)]["kl"], "nats/token",
               f"KL from the unquantized model, {s} alone at 8 bits, 128 held-out tokens")
    record("optimization", "risk_order_pairs_in_order",
           sum(a < b for a, b in zip(kl8, kl8[1:], strict=False)), "of 3",
           "neighbouring steps of weights < activations < KV < attention whose 8-bit KL rises as ranked")
    for b in (8, 4):
        record("optimization", f"kl_kv_{b}bit_per_token", risk[("KV cache", b)]["kl"], "nats/token",
               f"KV cache alone at {b} bits, keys and values per token, 128 held-out tokens")
        record("optimization", f"kl_kv_{b}bit_kivi", risk[(QB.KIVI, b)]["kl"], "nats/token",
               f"KV cache alone at {b} bits, KIVI-style (asymmetric, keys per channel), 128 held-out tokens")

    if not studied:  # attention rounded to INT8, three 512-token stretches, float32 (a Going further study)
        unmeasured("optimization", "attention_error_carried_share", STUDY_SKIPPED)
    else:
        carry = take(page, "carry")[0]
        for key, figure, unit, how in (
                ("attention_error_carried_share", "carried", "fraction",
                 "KL at the 384 tokens after the first 128 ÷ KL at those 128, when only the first 128 query "
                 "rows' attention probabilities were rounded to INT8"),
                ("attention_error_growth_every_row", "growth", "x",
                 "KL in a window's last 128 positions ÷ its first 128, every row's attention probabilities "
                 "at INT8")):
            iv = median_interval(carry[figure])
            record("optimization", key, iv["median"], unit,
                   f"{how}; float32, median and range over {iv['n']} 512-token stretches of the held-out "
                   "text",
                   spread=(iv["lo"], iv["hi"], int(iv["n"])))

    aq, aq_ratio, aq_div = take(page, "aq aq_ratio aq_div")  # W8A8 (torchao) against the float model
    rows = f"the first block's {aq['layers']} linear layers at {aq['tokens']} rows"
    for key, figure, how in (
            ("w8a8_prefill_speedup", "prefill",
             f"W8A8 / {fp_name} prefill tokens/s, {aq['tokens']} held-out tokens"),
            ("w8a8_int8_matmul_speedup", "matmul",
             f"{fp_name} matmul time / INT8 x INT8 matmul alone, {rows}"),
            ("w8a8_layer_speedup", "layer", f"{fp_name} matmul time / the whole W8A8 call, {rows}"),
            ("w8a8_gain_kept", "kept", f"INT8 x INT8 matmul alone / the whole W8A8 call (time), {rows}")):
        r = aq_ratio[figure]
        record("optimization", key, r["median"], "x",
               f"{how}; median of {r['n']} interleaved rounds' ratios, torchao W8A8, run eagerly",
               spread=(r["lo"], r["hi"], int(r["n"])))
    record("optimization", "w8a8_prefill_kl", aq_div["kl"], "nats/token",
           f"KL from the {fp_name} model, W8A8 in every quantized layer, {aq['tokens']} held-out tokens")

    # Going further: how much calibration text GPTQ needs
    if "sweep_vs" in page:
        for label, (vs, tokens) in page["sweep_vs"].items():
            record("optimization", f"gptq_sweep_{label}_over_rtn_asym_ppl", vs["ratio"], "x",
                   f"GPTQ calibrated on "
                   f"{tokens} tokens / asymmetric RTN, held-out perplexity, paired: {how_ppl}",
                   spread=(vs["lo"], vs["hi"], vs["n"]))
    else:
        for label in take(page, "sweep_windows")[0]:
            unmeasured("optimization", f"gptq_sweep_{label}_over_rtn_asym_ppl",
                       take(page, "sweep_skipped")[0])
