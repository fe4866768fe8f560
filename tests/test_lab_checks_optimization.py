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
        held = outcome(CH, "gguf_q8_quality", {"gguf_q8_0_ppl_over_base": ppl[k] / ppl["base"],
                                                "study": True}).held
        assert held is (k == "right"), (k, ppl)


# ---- the chapter's own rtn and gptq ------------------------------------------------------------------

def _page_rtn(w, bits=8):
    """The chapter's rtn (notebooks/06_optimization.ipynb, "RTN and a GPTQ step, written out")."""
    qmax = 2 ** (bits - 1) - 1
    scale = (w.float().abs().amax(dim=1, keepdim=True) / qmax).clamp_min(2**-24).half()
    return (w.float() / scale.float()).round().clamp(-qmax, qmax).to(torch.int8), scale


def _page_gptq(w, h, bits=4, damp=0.01, update=True):
    """The chapter's gptq; ``update=False`` leaves out the step that pushes a column's error onward."""
    w, qmax = w.float().clone(), 2 ** (bits - 1) - 1
    scale = (w.abs().amax(dim=1) / qmax).clamp_min(2**-24).half().float()
    h = h + damp * h.diag().mean() * torch.eye(h.shape[0])
    u = torch.linalg.cholesky(torch.cholesky_inverse(torch.linalg.cholesky(h)), upper=True)
    for j in range(w.shape[1]):
        q = (w[:, j] / scale).round().clamp(-qmax, qmax) * scale
        err = (w[:, j] - q) / u[j, j]
        if update:
            w[:, j + 1:] -= err[:, None] * u[j, j + 1:][None, :]
        w[:, j] = q
    return w


def test_a_page_gptq_without_its_update_fails():
    from labkit.llm import quantize as Q

    gen = torch.Generator().manual_seed(0)
    x = torch.randn(256, 64, generator=gen) @ torch.randn(64, 64, generator=gen)  # correlated, as in a model
    w = torch.randn(48, 64, generator=gen)
    h = G.hessian_of(x)
    codes, scales = _page_rtn(w, 8)
    ref_codes, ref_scales = Q.quantize_weight(w, bits=8)
    same = torch.equal(codes, ref_codes) and torch.equal(scales, ref_scales)
    lab = G.layer_error(w, G.gptq_quantize_weight(w, h, bits=4, group_size=None, damp=0.01)[2], x)
    figures = {upd: {"page_rtn_same": same,
                     "page_gptq_over_labkit": G.layer_error(w, _page_gptq(w, h, update=upd), x) / lab}
               for upd in (True, False)}
    assert outcome(CH, "page_quant_matches", figures[False]).held is False
    assert outcome(CH, "page_quant_matches", figures[True]).held is True
