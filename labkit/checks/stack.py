"""Chapter 05's own checks (stack): is the lab's code right on this machine? Each is evaluated on the
figures ``notebooks/05_software_stack.ipynb`` records, and each names the unit test
(``tests/test_lab_checks_stack.py``) that runs a broken implementation through it and sees it fail.

The chapter's claims (fusion halving the memory trips, torch.compile's speed-up, memory-mapped
safetensors opening faster, engines against generate, batching, llama.cpp on a CPU) are judged by the
ledger, ``data/claims/05_stack.toml``. What holds by construction is a unit test: the crafted pickle
is refused and never runs (``tests/test_weight_formats.py``), what a ``vllm serve`` command needs
(``tests/test_vram.py``).
"""

from __future__ import annotations

from . import Values, check

BROKEN = "tests/test_lab_checks_stack.py::"


@check("stack", "torch.compile's fused chain computes what eager PyTorch computes",
       needs=("compile_max_abs_diff",), broken=BROKEN + "test_a_compiler_that_swaps_an_op_fails",
       # seen once: AVX-512 code reused from Inductor's cache under an AVX2 cap gave a wrong chain
       fails_on={"compile_max_abs_diff": 2.6},
       holds_on={"compile_max_abs_diff": 1.2e-7})  # fp32 rounding of eleven elementwise steps
def compile_same(v: Values) -> tuple[bool, str]:
    d = v["compile_max_abs_diff"]
    return d < 1e-4, f"outputs differ by at most {d:.1e} (fp32 rounding of the chain is about 1e-7)"


@check("stack", "the pickle copy timed against safetensors holds the same tensors, bit for bit",
       needs=("pickle_copy_same_tensors",), broken=BROKEN + "test_a_stale_pickle_copy_fails",
       # a cached copy written from the float32 folder under the bfloat16 copy's name
       fails_on={"pickle_copy_same_tensors": False}, holds_on={"pickle_copy_same_tensors": True})
def pickle_copy_same(v: Values) -> tuple[bool, str]:
    ok = bool(v["pickle_copy_same_tensors"])
    return ok, "same names, dtypes and values" if ok else "the two files hold different tensors"


@check("stack", "the float32 safetensors copy transformers and vLLM load holds the GGUF's weights",
       needs=("gguf_copy_max_diff",), broken=BROKEN + "test_a_copy_rounded_through_bfloat16_fails",
       fails_on={"gguf_copy_max_diff": 1.9e-3},  # a copy converted through bfloat16
       holds_on={"gguf_copy_max_diff": 0.0})
def gguf_copy_exact(v: Values) -> tuple[bool, str]:
    d = v["gguf_copy_max_diff"]
    return d < 1e-6, f"blk.0.ffn_down dequantized vs the copy: max |difference| {d:.1e}"


def _no_server(v: Values) -> str | None:
    return "no engine served requests here" if v.get("engine_requests_planned") == 0 else None


@check("stack", "every request sent to the engines was answered, each with exactly the tokens asked for",
       needs=("engine_requests_planned", "engine_requests_full"), when=_no_server,
       broken=BROKEN + "test_a_server_that_drops_or_cuts_requests_fails",
       # a server that failed every third request (fail_every=3) at 8 in flight
       fails_on={"engine_requests_planned": 30, "engine_requests_full": 27},
       holds_on={"engine_requests_planned": 30, "engine_requests_full": 30})
def engines_answered_all(v: Values) -> tuple[bool, str]:
    n, full = v["engine_requests_planned"], v["engine_requests_full"]
    return full == n, f"{full} of {n} requests answered in full"
