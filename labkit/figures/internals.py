"""Chapter 03's figures for the report, read from the page's variables once the chapter has run
(its closing cell calls :func:`labkit.figures.keep`)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..llm.architecture import param_count
from ..llm.attention_memory import resolution_bytes
from ..llm.kvcache import kv_cache_bytes_for_config
from ..llm.sampling import entropy_bits, probabilities
from ..results import record, unmeasured
from . import take


def keep(page: Mapping[str, Any]) -> None:
    """Record chapter 03's figures from ``page``, the notebook's variables at its end."""

    # Sections 1-7: layers, the forward pass, attention, prefill and decode, sampling
    (additivity, attn_err, collapse, configs, decode_tps, diff_cached, diff_prefill, logits, n_new,
     prefill_tps, same_tokens, sampling_match) = take(page, (
        "additivity attn_err collapse configs decode_tps diff_cached diff_prefill logits n_new "
        "prefill_tps same_tokens sampling_match "))
    qwen235, qwen4 = param_count(configs["Qwen3-235B-A22B"]), configs["Qwen3-4B"]
    q4_weights, q4_ctx = param_count(qwen4)["total"] * 2, qwen4["max_position_embeddings"]
    at_max = kv_cache_bytes_for_config(qwen4, q4_ctx) / q4_weights
    record("internals", "linear_collapse_rel_diff", collapse.item(), "",
           "two stacked linear maps vs their product")
    record("internals", "swiglu_additivity", additivity["SwiGLU block"], "",
           "|f(a+b) - f(a) - f(b)| / |f(a+b)|, SwiGLU block")
    record("internals", "scratch_max_diff", max(diff_prefill, diff_cached), "",
           "max |logit diff| vs transformers, fp32")
    record("internals", "scratch_same_tokens", same_tokens, "",
           f"{n_new} greedy tokens: cached, uncached, transformers")
    record("internals", "attention_max_diff", attn_err, "",
           "written-out attention vs scaled_dot_product_attention")
    record("internals", "sampling_matches_transformers", sampling_match, "",
           "temperature, top-k, top-p vs logits processors")
    record("internals", "prefill_over_decode_tps", prefill_tps / decode_tps, "x",
           "tokens/s of prefill vs decode, one generation")
    record("internals", "entropy_bits_t03", entropy_bits(probabilities(logits, 0.3)).item(), "bits",
           "next-token distribution, T = 0.3")
    record("internals", "entropy_bits_t15", entropy_bits(probabilities(logits, 1.5)).item(), "bits",
           "next-token distribution, T = 1.5")
    record("internals", "entropy_t15_over_t03",
           (entropy_bits(probabilities(logits, 1.5)) / entropy_bits(probabilities(logits, 0.3))).item(), "x",
           "entropy at T = 1.5 over T = 0.3")

    head_share, prev_spread, routers = take(page, "head_share prev_spread routers")
    record("internals", "head_prev_token_spread", prev_spread, "",
           "share of attention on the previous token, most minus least such head, 3 prompts")
    for target, share in head_share.items():
        record("internals", f"heads_majority_{target.replace(' ', '_')}", int((share > 0.5).sum()), "heads",
               f"of {share.numel()}: over half their attention on the {target}")
    record("internals", "moe_router_share_of_active_max", max(r["of_active"] for r in routers.values()), "",
           "router weights over the parameters one token uses, the larger of "
           + " and ".join(routers))

    # The KV cache, mixture of experts and the configs
    (balanced, cached_ms, crossover, e_cached, e_uncached, formula, lengths, measured_hf,
     measured_scratch, n_prompt, prof, uncached_ms, usage) = take(page, (
        "balanced cached_ms crossover e_cached e_uncached formula lengths measured_hf measured_scratch "
        "n_prompt prof uncached_ms usage "))
    fitted = f"fitted over n = {', '.join(map(str, lengths))}"
    record("internals", "kv_formula_matches", measured_hf == formula == measured_scratch, "",
           f"{formula:,} bytes for {n_prompt} tokens")
    record("internals", "uncached_step_exponent", e_uncached, "", f"no cache: step time ~ n^e, {fitted}")
    record("internals", "cached_step_exponent", e_cached, "", f"KV cache: step time ~ n^e, {fitted}")
    record("internals", "kv_cache_exponent_gap", e_uncached - e_cached, "",
           f"powers of n the cache takes off a step, {fitted}")
    record("internals", "kv_cache_speedup_longest", uncached_ms[-1] / cached_ms[-1], "x",
           f"decode step at {lengths[-1]} tokens")
    record("internals", "kv_attention_crossover_tokens", crossover, "tokens",
           f"{prof.llm}: attention work = weight work per step")
    record("internals", "qwen3_4b_kv_over_weights_max_context", at_max, "x",
           f"one {q4_ctx:,}-token request, bf16")
    record("internals", "qwen3_4b_kv_over_weights_two_conversations",
           kv_cache_bytes_for_config(qwen4, q4_ctx, batch=2) / q4_weights, "x",
           f"two concurrent {q4_ctx:,}-token requests, bf16")
    record("internals", "qwen3_4b_kv_equals_weights_tokens", q4_weights / kv_cache_bytes_for_config(qwen4, 1),
           "tokens", "tokens in the cache (summed over requests) whose bf16 KV bytes equal the weights'")
    record("internals", "qwen3_4b_params_b", param_count(qwen4)["total"] / 1e9, "B params",
           "counted from the shipped config.json")
    record("internals", "qwen3_235b_total_b", qwen235["total"] / 1e9, "B params",
           "counted from the shipped config.json")
    record("internals", "qwen3_235b_active_b", qwen235["active"] / 1e9, "B params",
           "one token: 8 of 128 experts per layer")
    record("internals", "moe_experts_used_1", usage["Qwen3-235B-A22B"][1], "fraction",
           "1 token routed, 8 of 128 experts")
    record("internals", "moe_real_used_256", usage["Qwen3-235B-A22B"][256], "fraction",
           "256 real token states in one step, 8 of 128")
    record("internals", "moe_real_used_256_deepseek", usage["DeepSeek-V3"][256], "fraction",
           "256 real token states, 8 of 256")
    record("internals", "moe_balanced_used_256", balanced["Qwen3-235B-A22B"][256], "fraction",
           "1-(1-8/128)^256, a balanced router")

    # Going further: the memory a fused attention kernel saves
    mem, cfg, device, LONG = take(page, "mem cfg device LONG")
    if mem is None:
        unmeasured("internals", "attention_fused_over_written_out_memory", take(page, "mem_skipped")[0])
    else:
        last, grow = mem[-1], take(page, "grow")[0]
        floor = resolution_bytes(device)  # below it the probe cannot tell: the fused peak is at most that
        record("internals", "attention_fused_over_written_out_memory",
               max(last["fused_bytes"], floor) / last["written_out_bytes"], "x",
               f"peak memory added, {last['n']} tokens, {cfg.n_heads} heads, fp32, {device}; at most: the "
               f"fused kernel's reading ({last['fused_bytes'] / 1e6:.1f} MB) or, where higher, the probe's "
               f"resolution ({floor / 2**20:.0f} MiB)")
        record("internals", "attention_written_out_memory_exponent", grow, "",
               f"memory ~ n^e over n = {LONG}")
