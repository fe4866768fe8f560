"""Chapter 00's final checks (setup): rules over the figures ``notebooks/00_setup.ipynb`` records.

Only measured figures are rules. What holds by construction is a unit test: the loaded model has the
parameters its file declares (``tests/test_architecture.py``), the fit table's arithmetic
(``tests/test_memory.py``); sizes from configs are ``computed`` ledger rows.
"""

from __future__ import annotations

from . import Values, rule


@rule("setup", "the dtype the lab computes in here is the fastest matmul measured, within 20%",
      needs=("compute_dtype_over_fastest",),
      # bf16 chosen on an AVX2-only CPU, where torch emulates it: chapter 00 measured its bf16 matmul
      # 45x slower than fp32 on such a machine (compute_dtype note), so 1/45 of the fastest
      fails_on={"compute_dtype_over_fastest": 0.022},
      holds_on={"compute_dtype_over_fastest": 1.0})  # Intel AMX, fp32 chosen, 2026-12-01
def compute_dtype_fastest(v: Values) -> tuple[bool, str]:
    x = v["compute_dtype_over_fastest"]
    return x >= 0.8, f"the chosen dtype's best matmul is {x:.2f}x the fastest dtype's"


@rule("setup", "batch-1 decode would wait on memory here: the ops:byte ratio (lowest of the repeats) "
      "exceeds decode's FLOPs per byte",
      needs=("ridge_over_decode_intensity_lo",),
      # an emulated-bf16 matmul (0.0025 TFLOPS) against a 10 GB/s copy: ridge 0.25 FLOPs/byte, half
      # of fp32 decode's 0.5 (illustrative of a wrong dtype choice)
      fails_on={"ridge_over_decode_intensity_lo": 0.5},
      holds_on={"ridge_over_decode_intensity_lo": 21.0})  # Intel AMX, fp32, 2026-12-01
def decode_waits_on_memory(v: Values) -> tuple[bool, str]:
    x = v["ridge_over_decode_intensity_lo"]
    return x > 1, f"the ridge is {x:.1f}x the 2 FLOPs per weight's bytes of batch-1 decode"


@rule("setup", "the bundled model generated text offline",
      needs=("generated_tokens", "generated_chars"),
      # the model stopped at once (end-of-sequence first): 1 token, empty text; illustrative
      fails_on={"generated_tokens": 1, "generated_chars": 0},
      holds_on={"generated_tokens": 24, "generated_chars": 103})  # 2026-12-01
def generated_offline(v: Values) -> tuple[bool, str]:
    n, c = v["generated_tokens"], v["generated_chars"]
    return n > 0 and c > 0, f"{n} tokens, {c} characters of text"
