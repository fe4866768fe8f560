"""Chapter 04's own checks (labkit/checks/hardware.py) against broken implementations: each test runs a
small mutated version of the chapter's code path, computes the figures the notebook records from it,
and sees the check fail; the real code path, run the same way, holds."""

import math

import torch

from labkit.checks import outcome
from labkit.hardware import capability as cap
from labkit.hardware import microbench, roofline
from labkit.llm.decode import step_figures
from labkit.llm.kvcache import kv_cache_bytes_for_config
from labkit.llm.memory import tensor_bytes

# What the hardware reports, as chapter 00 measured it: an AVX2-only CPU (no native bf16; a bf16
# matmul at 0.022x fp32's speed) and an AMX CPU (native bf16; its bf16 matmul roof 3.77x fp32's).
AVX2 = {"native": False, "ratio": 0.022}
AMX = {"native": True, "ratio": 3.77}


def _choice(choose, hw) -> dict:
    """The notebook's two figures: the dtype the chooser picks for ``hw`` and its measured ratio
    (on a CPU without the native flag the lab measures the speedup and passes it to the rule)."""
    dtype, _ = choose("cpu", hw["native"], False, None if hw["native"] else hw["ratio"])
    return {"compute_dtype": dtype, "half_over_fp32_matmul": hw["ratio"]}


def test_a_chooser_that_trusts_any_measurement_fails():
    def trusts_any_measurement(device, bf16_native, fp16_native=False, bf16_speedup=None):
        # the slip: a measured speedup, however slow, counted as native bf16
        return cap.choose_dtype(device, bf16_native or bf16_speedup is not None, fp16_native, bf16_speedup)

    def ignores_the_flag(device, bf16_native, fp16_native=False, bf16_speedup=None):
        return cap.choose_dtype(device, False, fp16_native, bf16_speedup)  # the native flag never read

    assert outcome("hardware", "dtype_choice", _choice(trusts_any_measurement, AVX2)).held is False
    assert outcome("hardware", "dtype_choice", _choice(ignores_the_flag, AMX)).held is False
    for hw in (AVX2, AMX):
        assert outcome("hardware", "dtype_choice", _choice(cap.choose_dtype, hw)).held is True


def _roof_figures(peak: float, samples: list[float], bytes_per_token: float, stale: bool) -> dict:
    """The notebook's flow: ridge and ceiling from the first copy, then the roof moves to the best copy
    seen (more copies run between the decodes) and both are computed again, unless ``stale``."""
    bandwidth = samples[0]
    ridge = roofline.ridge_point(peak, bandwidth)
    ceiling = roofline.decode_ceiling_tokens_per_s(bandwidth, bytes_per_token)
    bandwidth = max(samples)
    if not stale:
        ridge = roofline.ridge_point(peak, bandwidth)
        ceiling = roofline.decode_ceiling_tokens_per_s(bandwidth, bytes_per_token)
    return {"ridge_flops_per_byte": ridge, "matmul_roof_tflops": peak / 1e12,
            "bandwidth_gbps": bandwidth / 1e9, "decode_ceiling_tps": ceiling,
            "decode_bytes_per_token": bytes_per_token}


def test_a_stale_bandwidth_roof_fails():
    peak = microbench.matmul_tflops("cpu", "float32", n=128, repeats=3)["tflops_best"] * 1e12
    copies = [microbench.memory_bandwidth("cpu", nbytes=4 * 2**20, repeats=3)["gbps_best"] * 1e9
              for _ in range(3)]
    samples = sorted(copies)  # a run in which the copies between the decodes were faster than the first
    assert samples[0] < samples[-1], "three timed copies came out identical to the nanosecond"
    stale, right = (_roof_figures(peak, samples, 2.7e8, stale=s) for s in (True, False))
    assert outcome("hardware", "roofs_consistent", stale).held is False
    assert outcome("hardware", "roofs_consistent", right).held is True


def _byte_figures(model, weights: float) -> dict:
    """The notebook's figures for one dtype: parameters, element size, KV bytes and bytes per token
    as step_figures computes them from ``weights``."""
    params = sum(p.numel() for p in model.parameters())
    kv = kv_cache_bytes_for_config(model.config.to_dict(), 40, dtype_bytes=2)
    figures = step_figures(params, weights, kv, 128, 0.1, 10.0, 1e10)
    return {"decode_bytes_per_token": figures["bytes_per_token"], "decode_params": params,
            "decode_element_bytes": next(model.parameters()).element_size(), "decode_kv_bytes": kv}


def test_bytes_that_count_the_tied_head_twice_fail(tiny_llama):
    model = tiny_llama().to(torch.bfloat16)  # tied embedding and head, as in the bundled SmolLM2
    twice = sum(t.numel() * t.element_size() for t in model.state_dict().values())  # lm_head counted again
    assert outcome("hardware", "decode_bytes_real", _byte_figures(model, twice)).held is False
    right = tensor_bytes(model, buffers=False)
    assert outcome("hardware", "decode_bytes_real", _byte_figures(model, right)).held is True


def _page_same(gemm_intensity) -> bool:
    """The notebook's figure: the chapter's roofline arithmetic against labkit.hardware.roofline."""
    def ridge_point(peak_flops, bandwidth):
        return peak_flops / bandwidth

    def attainable(intensity, peak_flops, bandwidth):
        return min(peak_flops, intensity * bandwidth)

    cases = [(1.0, 989e12, 3.35e12), (500.0, 989e12, 3.35e12), (20.0, 1.2e12, 13e9)]
    return (all(math.isclose(attainable(*c), roofline.attainable_flops(*c)) for c in cases)
            and all(math.isclose(gemm_intensity(m, 4096, 4096, 2), roofline.gemm_intensity(m, 4096, 4096, 2))
                    for m in (1, 4, 16, 64, 256, 1024))
            and math.isclose(ridge_point(989e12, 3.35e12), roofline.ridge_point(989e12, 3.35e12)))


def test_an_intensity_that_forgets_the_output_fails():
    def right(m, n, k, dtype_bytes=2):  # the chapter's gemm_intensity
        return 2 * m * n * k / ((m * k + k * n + m * n) * dtype_bytes)

    def broken(m, n, k, dtype_bytes=2):  # the bytes written out left out: the intensity comes out too high
        return 2 * m * n * k / ((m * k + k * n) * dtype_bytes)

    assert outcome("hardware", "page_roofline", {"page_roofline_same": _page_same(broken)}).held is False
    assert outcome("hardware", "page_roofline", {"page_roofline_same": _page_same(right)}).held is True
