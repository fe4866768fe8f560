"""Chapter 04's own checks (hardware): is the lab's code right on this machine? Each is evaluated on the
figures ``notebooks/04_gpu_hardware.ipynb`` records, and each names the unit test
(``tests/test_lab_checks_hardware.py``) that runs a broken implementation through it and sees it fail.

What the tutorial claims (prefill compute-bound, decode bandwidth-bound, the decode ceiling, the
datasheet figures, what fits a 12 GB card or a MacBook Air) is judged by the ledger,
``data/claims/04_hardware.toml``; the roofline formulas and the catalog are unit tests
(``tests/test_roofline.py``, ``tests/test_catalog.py``).
"""

from __future__ import annotations

import math

from . import Values, check

BROKEN = "tests/test_lab_checks_hardware.py::"


@check("hardware", "the compute dtype the lab chose agrees with this machine's measured 16-bit matmul speed",
       needs=("compute_dtype", "half_over_fp32_matmul"),
       broken=BROKEN + "test_a_chooser_that_trusts_any_measurement_fails",
       # bf16 chosen on an AVX2-only CPU whose bf16 matmul runs 45x slower than fp32 (chapter 00 measured it)
       fails_on={"compute_dtype": "bfloat16", "half_over_fp32_matmul": 0.022},
       holds_on={"compute_dtype": "bfloat16", "half_over_fp32_matmul": 3.77})  # AMX: bf16 3.8x fp32
def dtype_choice(v: Values) -> tuple[bool, str]:
    dt, x = v["compute_dtype"], v["half_over_fp32_matmul"]
    # a tenth either side of 1 is timing noise between two roofs measured a few seconds apart
    held = x <= 1.1 if dt == "float32" else x >= 0.9
    return held, f"chose {dt}; the 16-bit matmul ran at {x:.3f}x fp32's FLOP/s"


def _close(a: float, b: float) -> bool:
    return math.isclose(a, b, rel_tol=1e-6)


@check("hardware", "the chapter's roofline arithmetic (ridge point, attainable FLOP/s, a matmul's intensity) "
       "gives labkit.hardware.roofline's figures", needs=("page_roofline_same",),
       broken=BROKEN + "test_an_intensity_that_forgets_the_output_fails",
       fails_on={"page_roofline_same": False}, holds_on={"page_roofline_same": True})
def page_roofline(v: Values) -> tuple[bool, str]:
    ok = bool(v["page_roofline_same"])
    return ok, "the same figures" if ok else "the chapter's arithmetic gives other figures"


@check("hardware", "the ridge and the decode ceiling are computed from the roofs the chapter reports "
       "(ridge = matmul roof / bandwidth roof; ceiling = bandwidth roof / bytes per token)",
       needs=("ridge_flops_per_byte", "matmul_roof_tflops", "bandwidth_gbps", "decode_ceiling_tps",
              "decode_bytes_per_token"), broken=BROKEN + "test_a_stale_bandwidth_roof_fails",
       # the ridge and ceiling left from the first copy (8 GB/s) after the roof moved to 10 GB/s
       fails_on={"ridge_flops_per_byte": 50.0, "matmul_roof_tflops": 0.4, "bandwidth_gbps": 10.0,
                 "decode_ceiling_tps": 30.0, "decode_bytes_per_token": 2.7e8},
       holds_on={"ridge_flops_per_byte": 40.0, "matmul_roof_tflops": 0.4, "bandwidth_gbps": 10.0,
                 "decode_ceiling_tps": 10e9 / 2.7e8, "decode_bytes_per_token": 2.7e8})
def roofs_consistent(v: Values) -> tuple[bool, str]:
    bw = v["bandwidth_gbps"] * 1e9
    ridge = v["matmul_roof_tflops"] * 1e12 / bw
    ceiling = bw / v["decode_bytes_per_token"]
    held = _close(v["ridge_flops_per_byte"], ridge) and _close(v["decode_ceiling_tps"], ceiling)
    return held, (f"ridge {v['ridge_flops_per_byte']:.2f} (roofs give {ridge:.2f}) FLOPs/byte; ceiling "
                  f"{v['decode_ceiling_tps']:.1f} (roofs give {ceiling:.1f}) tokens/s")


@check("hardware", "the decode ceiling reads the model's real bytes: every parameter once, at the decode "
       "dtype's element size, plus the KV cache", needs=("decode_bytes_per_token", "decode_params",
                                                          "decode_element_bytes", "decode_kv_bytes"),
       broken=BROKEN + "test_bytes_that_count_the_tied_head_twice_fail",
       # SmolLM2-135M in bf16 with its tied embedding (49,152 x 576) counted a second time
       fails_on={"decode_bytes_per_token": 325_653_120, "decode_params": 134_515_008,
                 "decode_element_bytes": 2, "decode_kv_bytes": 0},
       holds_on={"decode_bytes_per_token": 269_030_016, "decode_params": 134_515_008,
                 "decode_element_bytes": 2, "decode_kv_bytes": 0})
def decode_bytes_real(v: Values) -> tuple[bool, str]:
    expected = v["decode_params"] * v["decode_element_bytes"] + v["decode_kv_bytes"]
    got, kv = v["decode_bytes_per_token"], v["decode_kv_bytes"]
    return _close(got, expected), (f"{got / 1e6:,.1f} MB per token; {v['decode_params']:,} parameters x "
                                   f"{v['decode_element_bytes']} bytes + KV {kv / 1e6:,.2f} MB = "
                                   f"{expected / 1e6:,.1f} MB")
