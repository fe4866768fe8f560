"""Chapter 00's own checks (setup): is the lab's code right on this machine? Each is evaluated on the
figures ``notebooks/00_setup.ipynb`` records, and each names the unit test
(``tests/test_lab_checks_setup.py``) that runs a broken implementation through it and sees it fail.

The chapter's claims (decode waits on memory, the setup guide's CUDA one-liner, what a 6-8 GB card
runs, the snippet's ``total_mem``) are judged by the ledger, ``data/claims/00_setup.toml``; the fit
table's arithmetic is a unit test (``tests/test_memory.py``).
"""

from __future__ import annotations

from ..models import LOCAL_LLMS
from . import Values, check

BROKEN = "tests/test_lab_checks_setup.py::"


@check("setup", "the dtype the lab computes in here (labkit.hardware.capability) is the fastest matmul "
       "measured, within 20%", needs=("compute_dtype_over_fastest",),
       broken=BROKEN + "test_dtype_chosen_for_its_bytes_alone_fails",
       # bf16 chosen for its half bytes on a CPU capped at AVX2, where torch emulates it: about 1/75 of
       # fp32's rate (what test_dtype_chosen_for_its_bytes_alone_fails measures under that cap)
       fails_on={"compute_dtype_over_fastest": 0.013},
       holds_on={"compute_dtype_over_fastest": 1.0})  # the chosen dtype is the fastest one
def compute_dtype_fastest(v: Values) -> tuple[bool, str]:
    x = v["compute_dtype_over_fastest"]
    # 20%: the two dtypes' best matmuls are a few runs each; a wrong choice costs 2x-75x, not 20%
    return x >= 0.8, f"the chosen dtype's best matmul is {x:.2f}x the fastest dtype's"


@check("setup", "the bundled model generated text offline", needs=("generated_tokens", "generated_chars"),
       broken=BROKEN + "test_new_tokens_sliced_past_the_end_fail",
       # the new tokens sliced from the output's end instead of the prompt's: none, and no text
       fails_on={"generated_tokens": 0, "generated_chars": 0},
       holds_on={"generated_tokens": 24, "generated_chars": 138})  # 24 greedy tokens asked for
def generated_offline(v: Values) -> tuple[bool, str]:
    n, c = v["generated_tokens"], v["generated_chars"]
    return n > 0 and c > 0, f"{n} tokens, {c} characters of text"


def _bundled_loaded(v: Values) -> str | None:
    llm = v.get("loaded_llm")
    return None if llm in LOCAL_LLMS else (
        f"the profile loads {llm}, not the bundled model the fit table counts")


@check("setup", "the parameter count the fit table uses (read from the bundled weights file's header) "
       "equals the parameters of the model loaded from it", needs=("bundled_params_file", "loaded_params"),
       broken=BROKEN + "test_header_count_that_skips_vectors_fails",
       # a header count that keeps 2-D matrices only (norm weights left out): 61 vectors of 576 short
       fails_on={"loaded_llm": "smollm2-135m", "bundled_params_file": 134_479_872,
                 "loaded_params": 134_515_008},
       holds_on={"loaded_llm": "smollm2-135m", "bundled_params_file": 134_515_008,
                 "loaded_params": 134_515_008},
       when=_bundled_loaded)
def params_file_matches_model(v: Values) -> tuple[bool, str]:
    f, m = v["bundled_params_file"], v["loaded_params"]
    return f == m, f"{f:,} in the file's header, {m:,} in the loaded model ({f - m:+,})"
