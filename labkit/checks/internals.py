"""Chapter 03's final checks (internals): rules over the figures ``notebooks/03_llm_internals.ipynb``
records.

Parameter counts from the shipped configs and seeded sampling give the same result on every machine;
they are unit tests (``tests/test_architecture.py``, ``tests/test_sampling.py``), not rules.
"""

from __future__ import annotations

from . import Values, rule

# the figures of a run on Intel AMX, 2 cores, 2026-12-01 (build/03_llm_internals.ipynb), for holds_on
RUN = {"scratch_max_diff": 5.0e-05, "attention_max_diff": 6.0e-08, "prefill_over_decode_tps": 15.8,
       "kv_cache_speedup_longest": 22.5, "uncached_step_exponent": 0.90, "cached_step_exponent": 0.06}


@rule("internals", "a nonlinearity matters: two stacked linear maps equal one, the SwiGLU block is far "
      "from linear",
      needs=("linear_collapse_rel_diff", "swiglu_additivity"),
      # illustrative: the block with its activation left out is linear, so f(a+b) = f(a) + f(b) to rounding
      fails_on={"linear_collapse_rel_diff": 3e-8, "swiglu_additivity": 4e-8},
      holds_on={"linear_collapse_rel_diff": 3e-8, "swiglu_additivity": 0.9})
def nonlinearity(v: Values) -> tuple[bool, str]:
    c, s = v["linear_collapse_rel_diff"], v["swiglu_additivity"]
    return c < 1e-5 and s > 0.1, f"linear pair vs product {c:.1e}; SwiGLU additivity error {s:.2f}"


@rule("internals", "the from-scratch forward pass matches transformers' logits in fp32, whole prompt "
      "and cached",
      needs=("scratch_max_diff",),
      fails_on={"scratch_max_diff": 3e-2},  # illustrative: what bf16 rounding alone gives, or a RoPE slip
      holds_on={"scratch_max_diff": RUN["scratch_max_diff"]})
def scratch_matches(v: Values) -> tuple[bool, str]:
    return v["scratch_max_diff"] <= 1e-4, f"max |diff| {v['scratch_max_diff']:.1e}"


@rule("internals", "cached and uncached greedy decode give the same tokens as transformers' generate",
      needs=("scratch_same_tokens",),
      fails_on={"scratch_same_tokens": False},  # e.g. a cache cropped one token short
      holds_on={"scratch_same_tokens": True})
def same_tokens(v: Values) -> tuple[bool, str]:
    ok = bool(v["scratch_same_tokens"])
    return ok, "identical" if ok else "the token lists differ"


@rule("internals", "attention written out as softmax(QK^T/sqrt(d))V equals PyTorch's fused attention",
      needs=("attention_max_diff",),
      fails_on={"attention_max_diff": 0.41},  # illustrative: the causal mask left out
      holds_on={"attention_max_diff": RUN["attention_max_diff"]})
def attention_matches(v: Values) -> tuple[bool, str]:
    return v["attention_max_diff"] < 1e-5, f"max |diff| {v['attention_max_diff']:.1e}"


@rule("internals", "the lab's temperature, top-k and top-p filters agree with transformers' logits "
      "processors",
      needs=("sampling_matches_transformers",),
      fails_on={"sampling_matches_transformers": False}, holds_on={"sampling_matches_transformers": True})
def sampling_matches(v: Values) -> tuple[bool, str]:
    ok = bool(v["sampling_matches_transformers"])
    return ok, "all filters agree" if ok else "a filter keeps other tokens than transformers"


@rule("internals", "prefill handles tokens over 3x faster than decode (all prompt tokens in one pass)",
      needs=("prefill_over_decode_tps",),
      # illustrative: a device on which a matrix-matrix product costs per token what a matrix-vector one does
      fails_on={"prefill_over_decode_tps": 1.4},
      holds_on={"prefill_over_decode_tps": RUN["prefill_over_decode_tps"]})
def prefill_parallel(v: Values) -> tuple[bool, str]:
    x = v["prefill_over_decode_tps"]
    return x > 3, f"{x:.1f}x the tokens/s of decode"


@rule("internals", "the bytes the caches hold equal 2 x layers x KV heads x head dim x tokens x bytes",
      needs=("kv_formula_matches",),
      fails_on={"kv_formula_matches": False},  # e.g. a cache that keeps a sliding window only
      holds_on={"kv_formula_matches": True})
def kv_formula(v: Values) -> tuple[bool, str]:
    ok = bool(v["kv_formula_matches"])
    return ok, "transformers, from-scratch and formula agree" if ok else "the caches hold other byte counts"


@rule("internals", "the KV cache makes a decode step at the longest context over 1.5x faster",
      needs=("kv_cache_speedup_longest",),
      fails_on={"kv_cache_speedup_longest": 1.2},  # illustrative: contexts so short the fixed cost hides it
      holds_on={"kv_cache_speedup_longest": RUN["kv_cache_speedup_longest"]})
def kv_cache_faster(v: Values) -> tuple[bool, str]:
    x = v["kv_cache_speedup_longest"]
    return x > 1.5, f"{x:.1f}x"


@rule("internals", "the cache takes about one power of n off a decode step (fitted exponents differ "
      "by 0.5 to 1.5)",
      needs=("uncached_step_exponent", "cached_step_exponent"),
      # illustrative: at contexts of 8 to 32 tokens both steps are nearly flat (fixed per-step cost)
      fails_on={"uncached_step_exponent": 0.25, "cached_step_exponent": 0.03},
      holds_on={"uncached_step_exponent": RUN["uncached_step_exponent"],
                "cached_step_exponent": RUN["cached_step_exponent"]})
def kv_exponent_gap(v: Values) -> tuple[bool, str]:
    u, c = v["uncached_step_exponent"], v["cached_step_exponent"]
    return 0.5 <= u - c <= 1.5, f"n^{u:.2f} without the cache, n^{c:.2f} with it: gap {u - c:.2f}"


@rule("internals", "MoE on real hidden states: a 256-token step reads over half the experts, but "
      "fewer than a balanced router would", needs=("moe_real_used_256", "moe_balanced_used_256"),
      # the notebook before this rule routed random vectors, uniform by construction: 100% = the formula
      fails_on={"moe_real_used_256": 1.0, "moe_balanced_used_256": 1.0},
      holds_on={"moe_real_used_256": 0.74, "moe_balanced_used_256": 1.0})  # Intel AMX, 2026-12-01
def moe_real_routing(v: Values) -> tuple[bool, str]:
    real, bal = v["moe_real_used_256"], v["moe_balanced_used_256"]
    return 0.5 < real < bal - 0.02, f"{real:.0%} of the experts vs {bal:.0%} for a balanced router"
