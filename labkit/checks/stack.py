"""Chapter 05's final checks (stack): rules over the figures ``notebooks/05_software_stack.ipynb``
records.

Timed comparisons use the low (or high) end of their spread over interleaved rounds, so one lucky
round cannot decide them. What holds by construction is a unit test: the crafted pickle is refused
and never runs (``tests/test_weight_formats.py``), the GGUF tensor dequantizes to the safetensors copy
made from it (``tests/test_models.py``), what a ``vllm serve`` command needs (``tests/test_vram.py``).
The engine rules compare vLLM's CPU build and llama-server run here with the same thread count; they
skip where either engine did not run.
"""

from __future__ import annotations

from . import Values, rule


def _served(v: Values) -> str | None:
    kind = v.get("engine_target")
    return None if kind in ("vllm", "external") else f"no engine to measure here ({kind or 'none'})"


@rule("stack", "fused x*6 is faster than x*2 then *3 in every round but the extremes",
      needs=("fusion_speedup", "fusion_speedup_lo"),
      # a tensor small enough to stay in cache, where both versions cost the launch alone; illustrative
      fails_on={"fusion_speedup": 1.02, "fusion_speedup_lo": 0.97},
      holds_on={"fusion_speedup": 2.0, "fusion_speedup_lo": 1.9})  # Intel AMX, 128 MiB fp32, 2026-12-01
def fusion_faster(v: Values) -> tuple[bool, str]:
    m, lo = v["fusion_speedup"], v["fusion_speedup_lo"]
    return lo > 1, f"fused {m:.2f}x faster (low end {lo:.2f}x)"


@rule("stack", "torch.compile's fused chain is faster than eager and computes the same",
      needs=("compile_speedup", "compile_speedup_lo", "compile_max_abs_diff"),
      # commit dd9d605: AVX-512 code reused from Inductor's cache under an AVX2 cap gave this chapter
      # a wrong fused chain, max difference 2.6
      fails_on={"compile_speedup": 2.3, "compile_speedup_lo": 2.1, "compile_max_abs_diff": 2.6},
      holds_on={"compile_speedup": 2.37, "compile_speedup_lo": 2.2, "compile_max_abs_diff": 4.8e-7})
def compile_faster_same(v: Values) -> tuple[bool, str]:
    m, lo, diff = v["compile_speedup"], v["compile_speedup_lo"], v["compile_max_abs_diff"]
    return lo > 1 and diff < 1e-4, f"{m:.2f}x (low end {lo:.2f}x), outputs differ by at most {diff:.1e}"


@rule("stack", "memory-mapped safetensors opens faster than torch.load of the same weights",
      needs=("safetensors_open_over_torch_load", "safetensors_open_over_torch_load_hi"),
      # safetensors read through a slow network filesystem where mmap pages fault one by one; illustrative
      fails_on={"safetensors_open_over_torch_load": 0.9, "safetensors_open_over_torch_load_hi": 1.3},
      holds_on={"safetensors_open_over_torch_load": 0.032, "safetensors_open_over_torch_load_hi": 0.04})
def safetensors_opens_faster(v: Values) -> tuple[bool, str]:
    m, hi = v["safetensors_open_over_torch_load"], v["safetensors_open_over_torch_load_hi"]
    return hi < 1, f"opening took {m:.3f}x torch.load's time (high end {hi:.3f}x)"


@rule("stack", "an engine with 8 requests in flight out-serves transformers generate one by one",
      needs=("vllm_c8_over_transformers", "vllm_c8_completed_share"), when=_served,
      # a server that dropped most requests at concurrency 8 (timeouts): illustrative
      fails_on={"vllm_c8_over_transformers": 1.9, "vllm_c8_completed_share": 0.25, "engine_target": "vllm"},
      holds_on={"vllm_c8_over_transformers": 8.4, "vllm_c8_completed_share": 1.0, "engine_target": "vllm"})
def engine_beats_generate(v: Values) -> tuple[bool, str]:
    x, done = v["vllm_c8_over_transformers"], v["vllm_c8_completed_share"]
    return x > 1 and done == 1, f"{x:.1f}x transformers' tokens/s, {done:.0%} of the requests answered"


@rule("stack", "the engine's throughput grows from 1 to 8 requests in flight (continuous batching)",
      needs=("vllm_c8_over_c1",), when=_served,
      # a server started with --max-num-seqs 1, which queues the other seven: illustrative
      fails_on={"vllm_c8_over_c1": 1.0, "engine_target": "vllm"},
      holds_on={"vllm_c8_over_c1": 7.4, "engine_target": "vllm"})  # Intel AMX, vLLM CPU build, 2026-12-01
def engine_batches(v: Values) -> tuple[bool, str]:
    x = v["vllm_c8_over_c1"]
    return x > 1.5, f"{x:.1f}x the output tokens/s at 8 in flight vs 1"


def _both_engines(v: Values) -> str | None:
    if v.get("llamacpp_target") != "llamacpp":
        return f"llama.cpp not measured here ({v.get('llamacpp_target') or 'none'})"
    if v.get("engine_target") != "vllm":
        return f"vLLM's CPU build not measured on this machine ({v.get('engine_target') or 'none'})"
    return None


@rule("stack", "llama.cpp's Q4_1 decodes one stream faster than vLLM's CPU build (fewer bytes per token)",
      needs=("llamacpp_c1_tpot_hi_ms", "vllm_c1_tpot_lo_ms"), when=_both_engines,
      # llama.cpp built with every SIMD flag off (a fully portable build): Q4_1 dot products run as
      # scalar code and one token costs several times the weight reads; illustrative
      fails_on={"llamacpp_c1_tpot_hi_ms": 140.0, "vllm_c1_tpot_lo_ms": 51.0,
                "llamacpp_target": "llamacpp", "engine_target": "vllm"},
      holds_on={"llamacpp_c1_tpot_hi_ms": 26.5, "vllm_c1_tpot_lo_ms": 65.6,
                "llamacpp_target": "llamacpp", "engine_target": "vllm"})  # Intel AMX, 1 thread, 2026-12-01
def llamacpp_faster_batch1(v: Values) -> tuple[bool, str]:
    lc, vl = v["llamacpp_c1_tpot_hi_ms"], v["vllm_c1_tpot_lo_ms"]
    return lc < vl, f"slowest llama.cpp request {lc:.1f} ms per token, fastest vLLM request {vl:.1f} ms"


@rule("stack", "vLLM gains more than llama.cpp from 8 requests in flight (its steps are mostly shared cost)",
      needs=("vllm_c8_over_c1", "llamacpp_c8_over_c1"), when=_both_engines,
      # vLLM started with --max-num-seqs 1, which queues the other seven, beside llama-server's 8 slots
      fails_on={"vllm_c8_over_c1": 1.0, "llamacpp_c8_over_c1": 1.8, "llamacpp_target": "llamacpp",
                "engine_target": "vllm"},
      holds_on={"vllm_c8_over_c1": 5.3, "llamacpp_c8_over_c1": 1.16, "llamacpp_target": "llamacpp",
                "engine_target": "vllm"})  # Intel AMX, 1 thread each, 2026-12-01
def vllm_batches_more(v: Values) -> tuple[bool, str]:
    vl, lc = v["vllm_c8_over_c1"], v["llamacpp_c8_over_c1"]
    return vl > lc, f"output tokens/s at 8 vs 1 in flight: vLLM {vl:.2f}x, llama.cpp {lc:.2f}x"


@rule("stack", "llama-server holds less resident memory than vLLM's server for the same model",
      needs=("llamacpp_rss_mb", "vllm_rss_mb"), when=_both_engines,
      # llama-server given 8 slots of 32,768 tokens (-c 262144): its f16 KV cache alone is 6 GB and it
      # is cleared, so resident, at start; illustrative
      fails_on={"llamacpp_rss_mb": 6500.0, "vllm_rss_mb": 2600.0, "llamacpp_target": "llamacpp",
                "engine_target": "vllm"},
      holds_on={"llamacpp_rss_mb": 523.0, "vllm_rss_mb": 3040.0, "llamacpp_target": "llamacpp",
                "engine_target": "vllm"})  # Intel AMX, 2026-12-01
def llamacpp_less_memory(v: Values) -> tuple[bool, str]:
    lc, vl = v["llamacpp_rss_mb"], v["vllm_rss_mb"]
    return lc < vl, f"llama-server {lc:.0f} MB resident, vLLM {vl:.0f} MB"
