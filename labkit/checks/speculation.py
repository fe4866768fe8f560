"""Chapter 06b's own checks (speculation): is the lab's code right on this machine? Each is evaluated on
the figures ``notebooks/06b_speculation_caching.ipynb`` records, and each names the unit test
(``tests/test_lab_checks_speculation.py``) that runs a broken implementation through it and sees it
fail.

The chapter's claims (speculation's tokens per pass and speed-up, prefix caching, the GPU-count rule)
are judged by the ledger, ``data/claims/06b_speculation.toml``. What holds by construction of
labkit's code is a unit test: prompt order as token arithmetic (``tests/test_prefix_cache.py``), GPU
sizing (``tests/test_parallelism.py``) and the sampling rule of speculative decoding on a toy
vocabulary (``tests/test_speculative.py``).
"""

from __future__ import annotations

from . import Values, check, studied

CH = "speculation"
BROKEN = "tests/test_lab_checks_speculation.py::"


@check(CH, "speculative greedy decoding with prompt lookup writes what plain greedy decoding writes, in "
       "every run", needs=("spec_greedy_identical_share",),
       broken=BROKEN + "test_a_verify_loop_that_keeps_a_rejected_draft_fails",
       fails_on={"spec_greedy_identical_share": 11 / 12}, holds_on={"spec_greedy_identical_share": 1.0})
def spec_lossless(v: Values) -> tuple[bool, str]:
    s = v["spec_greedy_identical_share"]
    return s == 1, f"prompt lookup: {s:.0%} of greedy runs identical to plain greedy decoding"


@check(CH, "the chapter's speculate_greedy writes the tokens of labkit's speculative_generate in as many "
       "target passes", needs=("page_spec_same",),
       broken=BROKEN + "test_a_page_loop_that_keeps_one_draft_too_many_fails",
       fails_on={"page_spec_same": False}, holds_on={"page_spec_same": True})
def page_spec_matches(v: Values) -> tuple[bool, str]:
    ok = bool(v["page_spec_same"])
    return ok, "the same tokens and passes" if ok else "the page's loop wrote other tokens or passes"


@check(CH, "speculative greedy decoding with the early-exit drafter (the model's own first layers) writes "
       "what plain greedy decoding writes", needs=("spec_early_exit_identical",),
       broken=BROKEN + "test_a_verify_loop_that_keeps_a_rejected_draft_fails",
       fails_on={"spec_early_exit_identical": False}, holds_on={"spec_early_exit_identical": True})
def spec_early_exit_lossless(v: Values) -> tuple[bool, str]:
    ee = bool(v["spec_early_exit_identical"])
    return ee, f"early exit: identical to plain greedy decoding: {ee}"


@check(CH, "reusing a cached prefix gives the next-token logits of a full prefill (float32)",
       needs=("prefix_max_logit_diff_fp32",), broken=BROKEN + "test_a_cache_cropped_one_token_short_fails",
       fails_on={"prefix_max_logit_diff_fp32": 2.7},  # the question read against a prefix one token short
       holds_on={"prefix_max_logit_diff_fp32": 2e-5})  # fp32 rounding of matmuls of other shapes
def prefix_logits(v: Values) -> tuple[bool, str]:
    d = v["prefix_max_logit_diff_fp32"]
    return d <= 1e-3, f"largest |difference| {d:.1e} (tolerance 1e-3: fp32 rounding is about 1e-5)"


def _vllm_metered(v: Values) -> str | None:
    return studied(v) or (None if v.get("vllm_kv_metered") else "vLLM cannot run here (make serve-setup)")


@check(CH, "while every request ran, vLLM's own KV meter showed the blocks the paged arithmetic gives at "
       "the server's block size", needs=("vllm_kv_blocks_used", "vllm_kv_blocks_lo", "vllm_kv_blocks_hi"),
       when=_vllm_metered, broken=BROKEN + "test_paged_arithmetic_that_rounds_blocks_down_fails",
       # 30 prompts of 35-260 tokens, 32 new tokens each, 128-token blocks: 38-40; rounded down 12-20
       fails_on={"vllm_kv_blocks_used": 40, "vllm_kv_blocks_lo": 12, "vllm_kv_blocks_hi": 20,
                 "study": True, "vllm_kv_metered": True},
       holds_on={"vllm_kv_blocks_used": 40, "vllm_kv_blocks_lo": 38, "vllm_kv_blocks_hi": 40,
                 "study": True, "vllm_kv_metered": True})
def vllm_kv_meter(v: Values) -> tuple[bool, str]:
    used, lo, hi = v["vllm_kv_blocks_used"], v["vllm_kv_blocks_lo"], v["vllm_kv_blocks_hi"]
    return lo <= used <= hi, f"vLLM: {used} blocks in use; the paged arithmetic: {lo} to {hi}"
