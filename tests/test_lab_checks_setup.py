"""Chapter 00's own checks (labkit/checks/setup.py) against broken implementations: each test runs a
small mutated version of the chapter's code path, computes the figure the notebook records from it,
and sees the check fail; the real code path, run the same way, holds."""

import json
import math
import os
import platform
import subprocess
import sys

import pytest
import torch

from labkit.checks import outcome
from labkit.llm.memory import safetensors_params

# The notebook's figure under a CPU capped at AVX2 (how the lab emulates an AVX2-only CPU): the chosen
# dtype's best matmul over the fastest dtype's, with the real chooser or one that picks bf16 for its
# half bytes whatever the hardware does.
DTYPE_RUN = """
import json
from labkit.hardware import capability as cap, microbench
mm = {d: microbench.matmul_tflops("cpu", d, n=256, repeats=3)["tflops_best"]
      for d in microbench.matmul_dtypes("cpu")}
real = cap.capability("cpu").dtype
cap.choose_dtype = lambda device, *a, **k: ("bfloat16", "half the bytes of fp32")
cap.capability.cache_clear()
broken = cap.capability("cpu").dtype
print(json.dumps({kind: {"chosen": d, "compute_dtype_over_fastest": mm[d] / max(mm.values())}
                  for kind, d in (("real", real), ("broken", broken))}))
"""


def _dtype_figures() -> dict:
    """The figure for the real chooser and the broken one, from one process (one torch import)."""
    env = os.environ | {"ONEDNN_MAX_CPU_ISA": "AVX2", "OMP_NUM_THREADS": "1"}
    out = subprocess.run([sys.executable, "-c", DTYPE_RUN], env=env, capture_output=True, text=True,
                         timeout=120, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.skipif(platform.machine().lower() not in ("x86_64", "amd64"),
                    reason="the AVX2 cap (ONEDNN_MAX_CPU_ISA) emulates an AVX2-only CPU on x86 only")
def test_dtype_chosen_for_its_bytes_alone_fails():
    figures = _dtype_figures()
    broken, real = figures["broken"], figures["real"]
    assert broken["chosen"] == "bfloat16" and real["chosen"] == "float32"
    assert outcome("setup", "compute_dtype_fastest", broken).held is False
    assert outcome("setup", "compute_dtype_fastest", real).held is True


def _generated(model, slice_from_end: bool) -> dict:
    """The notebook's two figures: tokens generated greedily after the prompt, and their text."""
    ids = torch.tensor([[5, 17, 42, 9, 77, 3]])
    with torch.inference_mode():
        out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=8, do_sample=False,
                             pad_token_id=0, eos_token_id=None)
    new = out[0, out.shape[1]:] if slice_from_end else out[0, ids.shape[1]:]
    text = "".join(chr(97 + int(t) % 26) for t in new).strip()  # a character "tokenizer"
    return {"generated_tokens": len(new), "generated_chars": len(text)}


def test_new_tokens_sliced_past_the_end_fail(tiny_llama):
    model = tiny_llama()
    assert outcome("setup", "generated_offline", _generated(model, slice_from_end=True)).held is False
    assert outcome("setup", "generated_offline", _generated(model, slice_from_end=False)).held is True


def _matrices_only(path) -> int:
    """A header count that keeps the 2-D weight matrices and forgets the norms' vectors."""
    from safetensors import safe_open

    with safe_open(str(path), framework="pt") as f:
        shapes = [f.get_slice(k).get_shape() for k in f.keys()]
    return sum(math.prod(s) for s in shapes if len(s) == 2)


def test_header_count_that_skips_vectors_fails(tiny_llama, tmp_path):
    model = tiny_llama()
    model.save_pretrained(tmp_path)  # safetensors, the tied head stored once
    file = tmp_path / "model.safetensors"
    loaded = {"loaded_llm": "smollm2-135m", "loaded_params": sum(p.numel() for p in model.parameters())}
    broken = loaded | {"bundled_params_file": _matrices_only(file)}
    assert outcome("setup", "params_file_matches_model", broken).held is False
    real = loaded | {"bundled_params_file": safetensors_params(file)}
    assert outcome("setup", "params_file_matches_model", real).held is True
    hub = broken | {"loaded_llm": "Qwen/Qwen3-4B"}  # a hub model: the bundled file's count is not its
    assert outcome("setup", "params_file_matches_model", hub).held is None
