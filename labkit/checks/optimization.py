"""Chapter 06's own checks (optimization): is the lab's code right on this machine? Each is evaluated on
the figures ``notebooks/06_optimization.ipynb`` records, and each names the unit test
(``tests/test_lab_checks_optimization.py``) that runs a broken implementation through it and sees it
fail.

The chapter's claims (sizes and speeds of the quantized formats, the risk order, the INT8 KV cache,
speculation's tokens per pass and speed-up, prefix caching, the GPU-count rule) are judged by the
ledger, ``data/claims/06_optimization.toml``. What holds by construction of labkit's code is a unit
test: INT4/INT8 storage sizes (``tests/test_quantize.py``), the INT8 KV cache's bytes
(``test_kv_quantization_error_and_bytes``), prompt order as token arithmetic
(``tests/test_prefix_cache.py``), GPU sizing (``tests/test_parallelism.py``) and the sampling rule of
speculative decoding on a toy vocabulary (``tests/test_speculative.py``).
"""

from __future__ import annotations

from . import Values, check

CH = "optimization"
BROKEN = "tests/test_lab_checks_optimization.py::"


@check(CH, "GPTQ's error feedback works: on each layer's own calibration inputs, the objective GPTQ "
       "minimizes, its output error is below round-to-nearest's on the same grid, in every layer",
       needs=("gptq_calib_err_ratio_max",), broken=BROKEN + "test_gptq_without_error_feedback_fails",
       # GPTQ with its error feedback left out is round-to-nearest on the same grid: 1 in every layer
       fails_on={"gptq_calib_err_ratio_max": 1.0}, holds_on={"gptq_calib_err_ratio_max": 0.65})
def gptq_layer_error(v: Values) -> tuple[bool, str]:
    r = v["gptq_calib_err_ratio_max"]
    return r < 1, (f"largest GPTQ / RTN output error over the layers, on their calibration inputs: {r:.2f} "
                   "(needs < 1: GPTQ minimizes exactly this error, starting from RTN's rounding; without its "
                   "error feedback it is round-to-nearest, a ratio of 1)")


@check(CH, "speculative greedy decoding writes what plain greedy decoding writes (prompt lookup and "
       "early exit)", needs=("spec_greedy_identical_share", "spec_early_exit_identical"),
       broken=BROKEN + "test_a_verify_loop_that_keeps_a_rejected_draft_fails",
       fails_on={"spec_greedy_identical_share": 11 / 12, "spec_early_exit_identical": True},
       holds_on={"spec_greedy_identical_share": 1.0, "spec_early_exit_identical": True})
def spec_lossless(v: Values) -> tuple[bool, str]:
    s, ee = v["spec_greedy_identical_share"], v["spec_early_exit_identical"]
    return s == 1 and bool(ee), f"prompt lookup: {s:.0%} of greedy runs identical; early exit identical: {ee}"


@check(CH, "reusing a cached prefix gives the next-token logits of a full prefill (float32)",
       needs=("prefix_max_logit_diff_fp32",), broken=BROKEN + "test_a_cache_cropped_one_token_short_fails",
       fails_on={"prefix_max_logit_diff_fp32": 2.7},  # the question read against a prefix one token short
       holds_on={"prefix_max_logit_diff_fp32": 2e-5})  # fp32 rounding of matmuls of other shapes
def prefix_logits(v: Values) -> tuple[bool, str]:
    d = v["prefix_max_logit_diff_fp32"]
    return d <= 1e-3, f"largest |difference| {d:.1e} (tolerance 1e-3: fp32 rounding is about 1e-5)"


def _no_llamacpp(v: Values) -> str | None:
    return "llama.cpp is not built here (make llamacpp)" if v.get("gguf_levels") == 0 else None


@check(CH, "llama.cpp's Q8_0 level, made from the shipped Q4_1 file, keeps its perplexity within 1% (8-bit "
       "blocks hold the 4-bit values almost exactly)", needs=("gguf_q8_0_ppl_over_base",), when=_no_llamacpp,
       broken=BROKEN + "test_an_8bit_level_made_from_the_wrong_file_fails",
       fails_on={"gguf_q8_0_ppl_over_base": 1.18},  # Q8_0 made from the Q4_0 file: two roundings
       holds_on={"gguf_q8_0_ppl_over_base": 1.0004})
def gguf_q8_quality(v: Values) -> tuple[bool, str]:
    r = v["gguf_q8_0_ppl_over_base"]
    return abs(r - 1) <= 0.01, f"Q8_0 perplexity {r - 1:+.2%} against the Q4_1 file it was made from"
