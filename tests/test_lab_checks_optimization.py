"""Chapter 06's own checks (labkit/checks/optimization.py) against broken implementations: each test runs
a small mutated version of the chapter's code path (one line of labkit's own source changed, or one
call made wrongly), computes the figure the notebook records from it the way the notebook does, and
sees the check fail; the real code path, run the same way, holds."""


import pytest
import torch
from mutation import mutated

from labkit.checks import outcome
from labkit.llm import gptq as G

CH = "optimization"



# ---- GPTQ ---------------------------------------------------------------------------------------

def _calib_ratio_max(model, quantize_weight, monkeypatch) -> float:
    """The notebook's figure: GPTQ the whole model (labkit.llm.gptq.gptq_quantize_model, as the notebook calls
    it) and take the largest per-layer GPTQ / RTN output error on the layer's own calibration inputs."""
    monkeypatch.setattr(G, "gptq_quantize_weight", quantize_weight)
    calib = torch.randint(0, 256, (4, 32), generator=torch.Generator().manual_seed(0))
    report: dict = {}
    G.gptq_quantize_model(model, calib, bits=4, group_size=32, act_order=True, cache=False, progress=False,
                          report=report)
    return max(r["calib_err_gptq"] / r["calib_err_rtn"] for n, r in report.items() if n != "tokens")


def test_gptq_without_error_feedback_fails(tiny_llama, monkeypatch):
    # the broken GPTQ: each column's rounding error is no longer pushed onto the columns not yet quantized
    real = G.gptq_quantize_weight
    no_feedback = mutated(G.gptq_quantize_weight,
                          ("w1[i + 1:].addr_(h_rows[i][i + 1:], e_rows[i], alpha=-inv_d[i])", "pass"),
                          ("wt[i2:].addmm_(hinv[i1:i2, i2:].t(), err1, alpha=-1)", "pass"))
    broken = _calib_ratio_max(tiny_llama(), no_feedback, monkeypatch)
    right = _calib_ratio_max(tiny_llama(), real, monkeypatch)
    assert broken == pytest.approx(1.0, abs=1e-5)  # round-to-nearest on the same grid
    assert outcome(CH, "gptq_layer_error", {"gptq_calib_err_ratio_max": broken}).held is False
    assert outcome(CH, "gptq_layer_error", {"gptq_calib_err_ratio_max": right}).held is True


# ---- INT8 against torchao -------------------------------------------------------------------------

def test_int8_rounding_that_truncates_fails(tiny_llama, monkeypatch):
    from labkit.llm import lowbit_kernels as LK
    from labkit.llm import quantize as Q

    model = tiny_llama()
    right = LK.int8_step_distance(model)
    # the broken rounding: codes truncated toward zero instead of rounded to the nearest
    monkeypatch.setattr(Q, "round_to_grid", mutated(Q.round_to_grid, ("torch.round(", "torch.trunc(")))
    broken = LK.int8_step_distance(model)
    assert outcome(CH, "int8_matches_torchao", {"int8_torchao_max_steps": broken}).held is False
    assert outcome(CH, "int8_matches_torchao", {"int8_torchao_max_steps": right}).held is True


# ---- llama.cpp's levels --------------------------------------------------------------------------

@pytest.mark.slow  # starts llama.cpp on the bundled GGUF
def test_an_8bit_level_made_from_the_wrong_file_fails(tools, tmp_path):
    from labkit.engines import llamacpp
    from labkit.experiments import gguf_levels as GL
    from labkit.paths import data

    files = GL.level_files(("Q8_0", "Q4_0"), folder=tmp_path)  # Q4_1 (shipped), then the levels made from it
    wrong = llamacpp.quantize(files["Q4_0"], tmp_path / "from-Q4_0-Q8_0.gguf", "Q8_0")  # rounded twice
    ppl = {k: llamacpp.perplexity(p, data("texts", "heldout.txt"), ctx=128, chunks=4)["ppl"]
           for k, p in (("base", files[GL.BASE]), ("right", files["Q8_0"]), ("wrong", wrong))}
    for k in ("right", "wrong"):  # the notebook's figure: the level's perplexity over the base's
        held = outcome(CH, "gguf_q8_quality", {"gguf_q8_0_ppl_over_base": ppl[k] / ppl["base"]}).held
        assert held is (k == "right"), (k, ppl)
