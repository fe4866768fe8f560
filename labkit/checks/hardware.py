"""Chapter 04's final checks (hardware): rules over the figures ``notebooks/04_gpu_hardware.ipynb``
records.

Every rule compares *measured* times (llama.cpp's rule applies where ``make llamacpp`` built it).
What follows from sizes and datasheets alone (the catalog's ops:byte ratios, what fits a 12 GB card,
the roofline formulas) holds by construction: it is a unit test (``tests/test_roofline.py``,
``tests/test_catalog.py``) or a ``computed`` ledger row.
"""

from __future__ import annotations

from . import Values, rule

NOT_CPU = "the bundled 135M model is launch-bound on a GPU: prefill time there does not track tokens"


def _cpu_only(v: Values) -> str | None:
    return None if v.get("device", "cpu") == "cpu" else NOT_CPU


@rule("hardware", "decode is bound by its per-step weight read, not arithmetic: 8 sequences in a step cost "
      "far less than 8 steps",
      needs=("decode_b8_over_b1_step",),
      # a compute-bound decode: bf16 emulated on an AVX2-only CPU (chapter 00 measured its bf16 matmul
      # 45x slower than fp32), where 8 sequences cost about 8x one; illustrative, not a recorded run
      fails_on={"decode_b8_over_b1_step": 7.1},
      holds_on={"decode_b8_over_b1_step": 1.24})  # Intel AMX, bf16, 2 cores, 2026-12-01
def decode_memory_bound(v: Values) -> tuple[bool, str]:
    x = v["decode_b8_over_b1_step"]
    return x < 4, f"decode step at batch 8 took {x:.2f}x the batch-1 step (8x: nothing shared)"


@rule("hardware", "prefill is compute-bound here: 512 prompt tokens take over twice as long as 128",
      needs=("prefill_512_over_128",), when=_cpu_only,
      # a launch-bound prefill: the 135M model on a CUDA GPU, where 128 or 512 tokens cost the same
      # kernel launches (illustrative)
      fails_on={"prefill_512_over_128": 1.05, "device": "cpu"},
      holds_on={"prefill_512_over_128": 3.14, "device": "cpu"})  # Intel AMX, bf16, 2026-12-01
def prefill_compute_bound(v: Values) -> tuple[bool, str]:
    x = v["prefill_512_over_128"]
    return x > 2, f"prefill of 512 tokens took {x:.2f}x the 128-token prefill (4x: time tracks FLOPs)"


@rule("hardware", "prefill reaches many more FLOP/s than decode (measured, same model and dtype)",
      needs=("prefill_over_decode_flops",),
      # decode batched so wide that it matches prefill's FLOP/s: illustrative
      fails_on={"prefill_over_decode_flops": 1.8},
      holds_on={"prefill_over_decode_flops": 58.5})  # Intel AMX, bf16, 2026-12-01 (fp32: 22.9)
def prefill_more_flops(v: Values) -> tuple[bool, str]:
    x = v["prefill_over_decode_flops"]
    return x > 3, f"prefill achieved {x:.1f}x decode's FLOP/s"


@rule("hardware", "decode stays under its bandwidth ceiling (tokens/s x bytes/token <= 1.5 x the copy rate)",
      needs=("decode_achieved",),
      # a copy benchmark measured in a slow spell of a shared host, or weights served from a large L3:
      # illustrative
      fails_on={"decode_achieved": 1.7},
      holds_on={"decode_achieved": 0.37})  # Intel AMX, bf16, 2026-12-01 (fp32: 0.69)
def decode_under_ceiling(v: Values) -> tuple[bool, str]:
    x = v["decode_achieved"]
    return x <= 1.5, f"decode moved {x:.0%} of the measured copy bandwidth"


@rule("hardware", "the compute dtype the lab chose matches this machine's measured 16-bit matmul speed",
      needs=("compute_dtype", "half_over_fp32_matmul"),
      # the choice gone wrong: bf16 picked on an AVX2-only CPU whose bf16 matmul is 45x slower (chapter 00)
      fails_on={"compute_dtype": "bfloat16", "half_over_fp32_matmul": 0.022},
      holds_on={"compute_dtype": "bfloat16", "half_over_fp32_matmul": 3.73})  # Intel AMX, 2026-12-01
def dtype_choice(v: Values) -> tuple[bool, str]:
    dt, x = v["compute_dtype"], v["half_over_fp32_matmul"]
    held = x < 0.5 if dt == "float32" else x > 0.9
    return held, f"chose {dt}; the 16-bit matmul ran at {x:.3f}x fp32's FLOP/s"


@rule("hardware", "the same weight does more FLOP/s when more rows share it (matmul m=1024 vs m=1)",
      needs=("matmul_m1024_over_m1",),
      # a weight small enough to stay in cache at m=1 would show little gain: illustrative
      fails_on={"matmul_m1024_over_m1": 2.5},
      holds_on={"matmul_m1024_over_m1": 191.0})  # Intel AMX, bf16, 2026-12-01
def rows_share_weight(v: Values) -> tuple[bool, str]:
    x = v["matmul_m1024_over_m1"]
    return x > 4, f"m=1024 reached {x:.1f}x the FLOP/s of m=1"


def _llamacpp(v: Values) -> str | None:
    return None if v.get("llamacpp_measured") else "llama.cpp is not built here (make llamacpp)"


@rule("hardware", "llama.cpp's batch-1 decode moves a quarter to 1.5x of its bandwidth ceiling",
      needs=("llamacpp_decode_achieved",), when=_llamacpp,
      # recorded while building this check: llama-bench with 2 threads on this 2-vCPU machine while another
      # process ran, one repetition stalled (34.5 +- 46.5 tok/s): 34.5 x 96.9 MB / 20.1 GB/s
      fails_on={"llamacpp_decode_achieved": 0.17, "llamacpp_measured": True},
      holds_on={"llamacpp_decode_achieved": 0.42, "llamacpp_measured": True})  # Intel AMX, 1 thread, 12-01
def llamacpp_decode_share(v: Values) -> tuple[bool, str]:
    x = v["llamacpp_decode_achieved"]
    why = " (over 1.5x: a cache served the weights)" if x > 1.5 else ""
    return 0.25 <= x <= 1.5, f"llama.cpp's decode moved {x:.0%} of the measured copy bandwidth{why}"


def _clock_known(v: Values) -> str | None:
    known = v.get("matmul_fp32_lanes_per_cycle") is not None
    return None if known else "this CPU reports no clock to divide by"


@rule("hardware", "the fp32 matmul ran SIMD lanes wide: more multiply-adds per cycle than a scalar core can",
      needs=("matmul_fp32_lanes_per_cycle",), when=_clock_known,
      # torch without a vectorized BLAS (a naive triple loop, about 2 GFLOP/s at 2.1 GHz): illustrative
      fails_on={"matmul_fp32_lanes_per_cycle": 0.5},
      holds_on={"matmul_fp32_lanes_per_cycle": 28.6})  # Intel AMX (AVX-512), 1 thread, fp32, 2026-12-01
def simd_lanes_used(v: Values) -> tuple[bool, str]:
    x = v["matmul_fp32_lanes_per_cycle"]
    return x > 2, f"one thread did {x:.1f} fp32 multiply-adds per cycle (scalar, two FMA units: at most 2)"


@rule("hardware", "an H100's edge over this CPU is larger in FLOP/s than in bandwidth: prefill would gain "
      "more than decode", needs=("h100_prefill_gain_over_decode_gain",),
      # a copy measured in a stall of the shared host (1.5 GB/s) beside a normal fp32 matmul: illustrative
      fails_on={"h100_prefill_gain_over_decode_gain": 0.6},
      holds_on={"h100_prefill_gain_over_decode_gain": 3.1})  # Intel AMX, bf16, 2026-12-01
def gpu_gains_more_on_prefill(v: Values) -> tuple[bool, str]:
    x = v["h100_prefill_gain_over_decode_gain"]
    return x > 1, f"the FLOP/s ratio is {x:.1f}x the bandwidth ratio"
