"""Chapter 06b's figures for the report, read from the page's variables once the chapter has run
(its closing cell calls :func:`labkit.figures.keep`)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from ..experiments.draft_model import DraftRounds
from ..llm import parallelism
from ..llm import speculative as spec
from ..llm.architecture import load_config, param_count
from ..results import record, unmeasured
from ..settings import STUDY_SKIPPED
from ..stats import median_interval
from . import take


def keep(page: Mapping[str, Any]) -> None:
    """Record chapter 06b's figures from ``page``, the notebook's variables at its end."""

    # The early-exit drafter: what it costs and what it accepts
    (K, L_run, SAMPLED, SEEDS, accept, emitted, greedy_ok, prompts, same_ee, tpp) = take(
        page, "K L_run SAMPLED SEEDS accept emitted greedy_ok prompts same_ee tpp")
    record("speculation", "spec_greedy_identical_share", sum(greedy_ok) / len(greedy_ok), "fraction",
           f"prompt-lookup greedy runs identical to plain greedy ({len(greedy_ok)} runs, four prompts, k = "
           f"4, 8)")
    page_spec_same = take(page, "page_spec_same")[0]
    record("speculation", "page_spec_same", bool(page_spec_same), "",
           "the chapter's speculate_greedy against labkit's speculative_generate: prompt lookup, k = 4, copy "
           "prompt, the same tokens and target passes")
    record("speculation", "spec_early_exit_identical", bool(same_ee), "",
           f"early exit L={L_run}, k = 2, copy prompt")
    record("speculation", "spec_greedy_identical", bool(all(greedy_ok) and same_ee), "",
           "every greedy run of both drafters")
    record("speculation", "spec_worked_example_tokens", len(emitted), "tokens",
           "the tutorial's drafts and the target's picks through labkit's greedy acceptance rule: tokens "
           "one pass emits")
    for t in prompts:
        record("speculation", f"spec_{t}_tokens_per_pass_k4", tpp[K][t], "tokens/pass",
               f"prompt lookup, {t} prompt, greedy, k = 4")
    record("speculation", "spec_tokens_per_pass_median", float(np.median(list(tpp[K].values()))),
           "tokens/pass",
           "prompt lookup, greedy, k = 4 (fixed before the runs), median of four prompts: "
           + ", ".join(f"{t} {v:.2f}" for t, v in tpp[K].items()))
    record("speculation", "spec_tokens_per_pass_median_k8", float(np.median(list(tpp[8].values()))),
           "tokens/pass", "the same at k = 8: " + ", ".join(f"{t} {v:.2f}" for t, v in tpp[8].items()))
    a0, a12 = accept[0.0][0], median_interval(accept[1.2])
    record("speculation", "spec_accept_t0", a0, "fraction", "prompt lookup, copy prompt, k = 4, greedy")
    record("speculation", "spec_accept_t12", a12["median"], "fraction",
           f"copy prompt, k = 4, temperature 1.2, {SAMPLED} tokens, seeds {SEEDS}",
           spread=(a12["lo"], a12["hi"], int(a12["n"])))
    record("speculation", "spec_accept_t12_hi", a12["hi"], "fraction", "upper end of that interval")
    record("speculation", "spec_accept_t12_over_t0", a12["median"] / a0, "x", "acceptance at 1.2 / greedy",
           spread=(a12["lo"] / a0, a12["hi"] / a0, int(a12["n"])))
    alpha_ee, cost, depths, expect_speed, spec_rounds, spec_speed = take(
        page, "alpha_ee cost depths expect_speed spec_rounds spec_speed")
    sp, st = spec_speed["copy"], spec_rounds["copy"][1]
    shallow, deep = depths[0], depths[-1]
    for name, L in (("shallow", shallow), ("deep", deep)):
        record("speculation", f"ee_cost_{name}", cost[L], "x",
               f"early-exit draft step at L={L} / full decode step")
        record("speculation", f"ee_alpha_{name}", float(np.mean([alpha_ee[t][L] for t in prompts])),
               "fraction", f"greedy acceptance of the exit at L={L}, mean over four prompts")
    record("speculation", "spec_copy_speedup_k4", sp["median"], "x",
           "decode time per token, plain / speculative, "
           f"copy prompt, k = 4, {st.new_tokens} tokens each, median of {sp['n']} paired rounds in "
           f"alternating order", spread=(sp["lo"], sp["hi"], sp["n"]))
    record("speculation", "spec_copy_speedup_expected_k4", expect_speed["copy"], "x",
           f"copy prompt, k = 4: tokens per pass / the measured cost of a {K + 1}-token pass (drafting free)")

    # A draft model of its own (llama.cpp): a smaller model of the family, and the lab's model at 4 bits
    draft_runs, draft_skips, studied = take(page, "draft_runs draft_skips STUDY")
    pairs = {"family": ("draft_family", "Qwen2.5-Coder 1.5B target, 0.5B draft, both Q4_K_M"),
             "self": ("draft_model", "the lab's model: F32 target, its Q4_1 as draft")}
    for pair, (prefix, what) in pairs.items():
        if pair in draft_runs:
            _draft_figures(prefix, what, draft_runs[pair])
        else:
            unmeasured("speculation", f"{prefix}_speedup", draft_skips.get(pair) or (
                "llama.cpp is not built here (make llamacpp)" if studied else STUDY_SKIPPED))

    # Put the stable part first
    order_rows = take(page, "order_rows")[0]
    record("speculation", "prefix_tutorial_shared_first_tokens", int(order_rows[0]["cached"]), "tokens",
           "computed: tokens 'Weather in Paris?' and 'Weather in Tokyo?' share as a prefix, this tokenizer")
    record("speculation", "prefix_tutorial_varying_first_tokens", int(order_rows[1]["cached"]), "tokens",
           "computed: tokens 'Paris weather?' and 'Tokyo weather?' share as a prefix, this tokenizer")

    # Parallelism: how many GPUs, and how to split a model over them
    (b200_tutorial, cache_rows, cache_sizes, cap, device, factor, prof) = take(
        page, "b200_tutorial cache_rows cache_sizes cap device factor prof")
    by = {r["shared"]: r for r in cache_rows}
    short, long = by[cache_sizes[0]], by[cache_sizes[-1]]
    ds = load_config("DeepSeek-V3")
    rule = parallelism.min_gpus_rule(param_count(ds)["total"], "fp8", b200_tutorial)
    text = "; ".join(f"{k}: {v:.2f}x" for k, v in factor.items())
    for name, row in (("short", short), ("long", long)):
        record("speculation", f"prefix_miss_ms_{name}", row["miss_s"] * 1e3, "ms",
               f"{row['shared']} shared tokens prefilled")
        record("speculation", f"prefix_hit_ms_{name}", row["hit_s"] * 1e3, "ms",
               f"{row['shared']} shared tokens cached")
    record("speculation", "prefix_hit_over_miss_ttft", long["hit_s"] / long["miss_s"], "x",
           f"{prof.llm} KV cache on {device}: TTFT with {long['shared']} shared tokens cached vs prefilled")
    record("speculation", "prefix_max_logit_diff", max(r["max_abs_diff"] for r in cache_rows), "",
           f"largest |logit difference|, cached prefix vs full prefill, {cap.dtype} (the check uses "
           f"float32's)")
    record("speculation", "deepseek_v3_params_b", param_count(ds)["total"] / 1e9, "B",
           "computed from its config")
    record("speculation", "deepseek_v3_b200_rule_gpus", rule["exact"], "GPUs",
           "counted params x 1 byte x 1.8 / 192 GB")
    tp = parallelism.round_up_tp(int(rule["ceil"]), ds)
    if tp is None:
        unmeasured("speculation", "deepseek_v3_b200_tp", "no tensor-parallel size in a node fits the rule")
    else:
        record("speculation", "deepseek_v3_b200_tp", tp, "GPUs",
               "computed: the next tensor-parallel size its attention heads allow")
    record("speculation", "kv_aware_factor_max", max(factor.values()), "x",
           f"computed, KV-aware / weight bytes: {text}")
    record("speculation", "kv_aware_factor_deepseek_v3", factor["DeepSeek-V3 32k x 16"], "x",
           "32k tokens x 16 users")
    record("speculation", "kv_aware_factor_qwen3_4b_many", factor["Qwen3-4B 40k x 64"], "x",
           "40k tokens x 64 users")
    cache_sizes, diff32 = take(page, "cache_sizes diff32")
    record("speculation", "prefix_max_logit_diff_fp32", diff32, "",
           "largest |logit difference|, cached prefix vs "
           f"full prefill, float32 on the CPU, shared prefixes of {cache_sizes[0]} and 512 tokens")
    cache_target, prefix_vllm = take(page, "cache_target prefix_vllm")
    record("speculation", "prefix_server_kind", cache_target.kind, "", cache_target.engine)
    if prefix_vllm is not None:
        v = prefix_vllm
        record("speculation", "prefix_vllm_hit_over_miss_ttft", v["ratio"], "x",
               "TTFT stable part first / varying first")
        for kind, order in (("hit", "stable"), ("miss", "varying")):
            record("speculation", f"prefix_vllm_{order}_first_hit_rate", v[f"{kind}_rate"], "fraction",
                   f"{cache_target.engine} /metrics: cached / looked-up tokens, {order} part first")
            record("speculation", f"prefix_vllm_{order}_first_ttft_ms", v[f"{kind}_ttft_s"] * 1e3, "ms",
                   f"median TTFT, {order} part first, {v['shared_tokens']}-token system prompt")

    # Why large batches erase the gain
    h100, params, pl = take(page, "h100 params pl")
    at = {(b, c): spec.roofline_speedup(pl[("copy", 4, 0.0)].alpha, 4, b, params, 2 * params,
                                        h100.tflops["bf16"] * 1e12, h100.bandwidth_bytes_per_s, c=c)
          for b in (1, 256, 512) for c in (0.0, 0.1)}
    how = "computed: k = 4, the copy prompt's alpha, bf16 on the H100 roofline"
    record("speculation", "spec_h100_speedup_b1", at[(1, 0.0)], "x", f"{how}, free drafter, batch 1")
    record("speculation", "spec_h100_speedup_b256", at[(256, 0.0)], "x", f"{how}, free drafter, batch 256")
    record("speculation", "spec_h100_speedup_b512", at[(512, 0.0)], "x", f"{how}, free drafter, batch 512")
    record("speculation", "spec_h100_speedup_b512_c01", at[(512, 0.1)], "x",
           f"{how}, a drafter costing 0.1 target steps per guess, batch 512")

    # Going further: paged KV blocks against a contiguous reservation (no claim reads these)
    if not studied:
        return
    r = take(page, "paged_rows")[0][2048]  # the section's rows, at a 2,048-token reservation
    record("speculation", "paged_kv_live_share", r["paged_live_share"], "fraction",
           f"live KV tokens / tokens in 16-token blocks, {r['sequences']} requests of the lab's prompts and "
           f"greedy answers")
    record("speculation", "contiguous_2048_live_share", r["contiguous_live_share"], "fraction",
           "live KV tokens / a contiguous 2,048-token reservation per sequence, the same requests")
    record("speculation", "paged_over_contiguous_fit_2048", r["fit_paged"] / r["fit_contiguous"], "x",
           "computed: sequences of this mix a Qwen3-4B KV budget on an H100 holds, paged / contiguous at "
           "2,048")
    kv_meter = take(page, "kv_meter")[0]  # vLLM's own meter, the same prompts (None: no vLLM here)
    record("speculation", "vllm_kv_metered", kv_meter is not None, "", "vLLM ran the paged-KV meter")
    if kv_meter is not None:
        lo, hi = kv_meter.expected
        how = (f"{len(kv_meter.prompt_tokens)} of the lab's prompts at once, {kv_meter.tokens} new tokens "
               f"each, {kv_meter.block_size}-token blocks (the server's own)")
        record("speculation", "vllm_kv_blocks_used", kv_meter.used_blocks, "blocks",
               f"measured: vLLM's KV usage x its {kv_meter.total_blocks} blocks while every request ran, "
               f"{how}")
        record("speculation", "vllm_kv_blocks_lo", lo, "blocks",
               f"computed: paged arithmetic after the first token, {how}")
        record("speculation", "vllm_kv_blocks_hi", hi, "blocks",
               f"computed: paged arithmetic at the last token, {how}")


def _draft_figures(prefix: str, what: str, run: DraftRounds) -> None:
    """Record one pair's draft-model run as ``{prefix}_*``."""
    sp, acc = run.speedup, run.acceptance
    how = f"llama-server, {what}, k = {run.k}, copy and open prompts, greedy"
    record("speculation", f"{prefix}_speedup", sp["median"], "x",
           f"decode tokens/s with the draft / without, {how}: median of {sp['n']} rounds in rotating "
           "order, band their range", spread=(sp["lo"], sp["hi"], int(sp["n"])))
    record("speculation", f"{prefix}_acceptance", acc["p"], "fraction",
           f"draft tokens kept, {run.accepted} of {run.drafted}, Wilson 95%",
           spread=(acc["lo"], acc["hi"], run.drafted))
    record("speculation", f"{prefix}_tokens_per_pass", run.tokens_per_pass, "tokens/pass", how)
    record("speculation", f"{prefix}_step_cost", run.ratio("target", "draft")["median"], "x",
           f"a draft step's time / a target step's ({what}), median of the rounds")
    record("speculation", f"{prefix}_pass_cost", run.pass_cost(), "steps",
           "computed from the medians: a target pass over the drafts, in single target steps")
    record("speculation", f"{prefix}_if_pass_cost_1", run.if_pass_cost(), "x",
           "computed: the speed-up these counts and the draft's cost give if a pass costs one step")
    record("speculation", f"{prefix}_same_text", run.same, "answers",
           f"greedy answers with the draft equal to the target's own, of {run.compared}")
