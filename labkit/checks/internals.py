"""Chapter 03's own checks (internals): is the lab's code right on this machine? Each is evaluated on
the figures ``notebooks/03_llm_internals.ipynb`` records, and each names the unit test
(``tests/test_lab_checks_internals.py``) that runs a broken implementation through it and sees it fail.

The chapter's claims (prefill against decode, what the KV cache saves, SwiGLU's nonlinearity, the MoE
and KV sizes) are judged by the ledger, ``data/claims/03_internals.toml``; parameter counts from the
shipped configs and seeded sampling are unit tests (``tests/test_llm_architecture.py``,
``tests/test_sampling.py``).
"""

from __future__ import annotations

from . import Values, check

BROKEN = "tests/test_lab_checks_internals.py::"


@check("internals", "two linear maps in a row equal their product matrix (the identity the lab's "
       "nonlinearity demonstration rests on)",
       needs=("linear_collapse_rel_diff",),
       broken=BROKEN + "test_linear_pair_with_an_activation_left_in_fails",
       # the model's first MLP run with its SiLU left in, called "linear": what test_linear_pair... records
       fails_on={"linear_collapse_rel_diff": 0.8},
       holds_on={"linear_collapse_rel_diff": 3e-7})  # fp32 rounding
def linear_collapse(v: Values) -> tuple[bool, str]:
    x = v["linear_collapse_rel_diff"]
    return x < 1e-5, f"relative difference {x:.1e} (fp32 rounding is about 1e-7)"


@check("internals", "the from-scratch forward pass matches transformers' logits in fp32, whole prompt "
       "and cached", needs=("scratch_max_diff",),
       broken=BROKEN + "test_scratch_forward_with_a_rope_slip_fails",
       fails_on={"scratch_max_diff": 3e-2},  # a RoPE slip, or bf16 rounding alone
       holds_on={"scratch_max_diff": 5e-5})  # fp32 rounding over 30 layers and logits up to about 20
def scratch_matches(v: Values) -> tuple[bool, str]:
    return v["scratch_max_diff"] <= 1e-4, f"max |diff| {v['scratch_max_diff']:.1e}"


@check("internals", "cached and uncached greedy decode give the same tokens as transformers' generate",
       needs=("scratch_same_tokens",), broken=BROKEN + "test_cache_cropped_one_token_short_changes_tokens",
       fails_on={"scratch_same_tokens": False}, holds_on={"scratch_same_tokens": True})
def same_tokens(v: Values) -> tuple[bool, str]:
    ok = bool(v["scratch_same_tokens"])
    return ok, "identical" if ok else "the token lists differ"


@check("internals", "attention written out as softmax(QK^T/sqrt(d))V equals PyTorch's fused attention",
       needs=("attention_max_diff",), broken=BROKEN + "test_attention_without_its_scale_fails",
       fails_on={"attention_max_diff": 0.41},  # the 1/sqrt(d) scale or the causal mask left out
       holds_on={"attention_max_diff": 6e-8})
def attention_matches(v: Values) -> tuple[bool, str]:
    return v["attention_max_diff"] < 1e-5, f"max |diff| {v['attention_max_diff']:.1e}"


@check("internals", "the chapter's temperature, top-k and top-p filters agree with transformers' logits "
       "processors", needs=("sampling_matches_transformers",), broken=BROKEN + "test_top_p_off_by_one_fails",
       fails_on={"sampling_matches_transformers": False}, holds_on={"sampling_matches_transformers": True})
def sampling_matches(v: Values) -> tuple[bool, str]:
    ok = bool(v["sampling_matches_transformers"])
    return ok, "all filters agree" if ok else "a filter keeps other tokens than transformers"


@check("internals", "the bytes the caches hold equal 2 x layers x KV heads x head dim x tokens x bytes",
       needs=("kv_formula_matches",), broken=BROKEN + "test_cache_one_token_short_breaks_the_formula",
       fails_on={"kv_formula_matches": False},  # e.g. a cache cropped one token short, or a sliding window
       holds_on={"kv_formula_matches": True})
def kv_formula(v: Values) -> tuple[bool, str]:
    ok = bool(v["kv_formula_matches"])
    return ok, "transformers, from-scratch and formula agree" if ok else "the caches hold other byte counts"
