"""Chapter 06's own checks (labkit/checks/optimization.py) against broken implementations: each test runs
a small mutated version of the chapter's code path (one line of labkit's own source changed, or one
call made wrongly), computes the figure the notebook records from it the way the notebook does, and
sees the check fail; the real code path, run the same way, holds."""

import inspect
import textwrap

import pytest
import torch

from labkit.checks import outcome
from labkit.llm import gptq as G
from labkit.llm import prefix_cache as pc
from labkit.llm import speculative as spec
from labkit.llm.speculative import EarlyExitDrafter, PromptLookupDrafter, speculative_generate

CH = "optimization"


def mutated(module, name: str, *edits: tuple[str, str]):
    """``module.name`` compiled again from its own source with each ``old`` of ``edits`` (a statement, no
    indentation) replaced by ``new`` (each must occur once: an edit that no longer applies fails loudly)."""
    src = textwrap.dedent(inspect.getsource(getattr(module, name)))
    for old, new in edits:
        assert src.count(old) == 1, f"{name} no longer contains {old.strip()!r}: update the mutation"
        src = src.replace(old, new)
    namespace = dict(vars(module))
    exec(compile(src, f"<mutated {module.__name__}.{name}>", "exec"), namespace)
    return namespace[name]


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
    no_feedback = mutated(G, "gptq_quantize_weight",
                          ("w1[i + 1:].addr_(h_rows[i][i + 1:], e_rows[i], alpha=-inv_d[i])", "pass"),
                          ("wt[i2:].addmm_(hinv[i1:i2, i2:].t(), err1, alpha=-1)", "pass"))
    broken = _calib_ratio_max(tiny_llama(), no_feedback, monkeypatch)
    right = _calib_ratio_max(tiny_llama(), real, monkeypatch)
    assert broken == pytest.approx(1.0, abs=1e-5)  # round-to-nearest on the same grid
    assert outcome(CH, "gptq_layer_error", {"gptq_calib_err_ratio_max": broken}).held is False
    assert outcome(CH, "gptq_layer_error", {"gptq_calib_err_ratio_max": right}).held is True


# ---- speculative decoding -------------------------------------------------------------------------

PROMPT = list(range(10, 30)) * 2 + list(range(10, 14))  # repeats itself: prompt lookup finds drafts


def _identical(model) -> dict:
    """The notebook's figures: the share of prompt-lookup greedy runs (k = 2, 4, 8) identical to plain
    greedy decoding, and whether an early-exit run is."""
    plain = speculative_generate(model, PROMPT, None, max_new_tokens=16)[0]
    runs = [speculative_generate(model, PROMPT, PromptLookupDrafter(), k=k, max_new_tokens=16)
            for k in (2, 4, 8)]
    early = speculative_generate(model, PROMPT, EarlyExitDrafter(model, 2), k=2, max_new_tokens=16)
    rejected = sum(st.rejections for _, st in runs) + early[1].rejections
    assert rejected, "no draft was rejected: the test cannot tell a broken verify loop"
    return {"spec_greedy_identical_share": sum(out == plain for out, _ in runs) / len(runs),
            "spec_early_exit_identical": early[0] == plain}


def test_a_verify_loop_that_keeps_a_rejected_draft_fails(tiny_llama, monkeypatch):
    model = tiny_llama(vocab_size=128, num_hidden_layers=4, max_position_embeddings=256,
                       tie_word_embeddings=False)
    right = _identical(model)
    # the off-by-one: after a refusal the loop emits the refused draft instead of the target's own token
    keep_refused = ("new = drafts[:m] + [token]",
                    "new = drafts[:m + 1] if m < len(drafts) else drafts + [token]")
    monkeypatch.setattr(spec, "_decode", mutated(spec, "_decode", keep_refused))
    broken = _identical(model)
    assert outcome(CH, "spec_lossless", broken).held is False
    assert outcome(CH, "spec_lossless", right).held is True


# ---- prefix caching ------------------------------------------------------------------------------

def _max_diff_fp32(m32, shared_ids, suffix_ids, sizes) -> float:
    """The notebook's figure: the largest next-token logit difference between a prefix-cache hit and a
    full prefill, over the shared lengths ``sizes`` (float32)."""
    stored = pc.prefill_prefix(m32, shared_ids[:, :512])
    return max(float((pc.prefill(m32, torch.cat([shared_ids[:, :n], suffix_ids], dim=1))[0]
                      - pc.reuse(m32, pc.cropped(stored, n), suffix_ids)[0]).abs().max())
               for n in sizes if n <= 512)


def test_a_cache_cropped_one_token_short_fails(tiny_llama, monkeypatch):
    m32 = tiny_llama(seed=3)
    g = torch.Generator().manual_seed(0)
    shared, suffix = torch.randint(0, 256, (1, 40), generator=g), torch.randint(0, 256, (1, 6), generator=g)
    right = _max_diff_fp32(m32, shared, suffix, (8, 24, 40))
    real = pc.cropped
    monkeypatch.setattr(pc, "cropped", lambda cache, n: real(cache, n - 1))  # one token short
    broken = _max_diff_fp32(m32, shared, suffix, (8, 24, 40))
    assert outcome(CH, "prefix_logits", {"prefix_max_logit_diff_fp32": broken}).held is False
    assert outcome(CH, "prefix_logits", {"prefix_max_logit_diff_fp32": right}).held is True


# ---- llama.cpp's levels --------------------------------------------------------------------------

def test_an_8bit_level_made_from_the_wrong_file_fails(tools, tmp_path):
    from labkit.engines import gguf_levels as GL
    from labkit.engines import llamacpp
    from labkit.paths import data

    files = GL.level_files(("Q8_0", "Q4_0"), folder=tmp_path)  # Q4_1 (shipped), then the levels made from it
    wrong = llamacpp.quantize(files["Q4_0"], tmp_path / "from-Q4_0-Q8_0.gguf", "Q8_0")  # rounded twice
    ppl = {k: llamacpp.perplexity(p, data("texts", "heldout.txt"), ctx=128, chunks=4)["ppl"]
           for k, p in (("base", files[GL.BASE]), ("right", files["Q8_0"]), ("wrong", wrong))}
    for k in ("right", "wrong"):  # the notebook's figure: the level's perplexity over the base's
        held = outcome(CH, "gguf_q8_quality", {"gguf_q8_0_ppl_over_base": ppl[k] / ppl["base"]}).held
        assert held is (k == "right"), (k, ppl)
