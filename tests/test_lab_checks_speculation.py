"""Chapter 06b's own checks (labkit/checks/speculation.py) against broken implementations: each test runs
a small mutated version of the chapter's code path (one line of labkit's own source changed, or one
call made wrongly), computes the figure the notebook records from it the way the notebook does, and
sees the check fail; the real code path, run the same way, holds."""

import torch
from mutation import mutated

from labkit.checks import outcome
from labkit.llm import prefix_cache as pc
from labkit.llm import speculative as spec
from labkit.llm.speculative import EarlyExitDrafter, PromptLookupDrafter, speculative_generate

CH = "speculation"


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
    monkeypatch.setattr(spec, "_decode", mutated(spec._decode, keep_refused))
    broken = _identical(model)
    for name in ("spec_lossless", "spec_early_exit_lossless"):
        assert outcome(CH, name, broken).held is False, name
        assert outcome(CH, name, right).held is True, name


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


def _page_speculate(model, prompt_ids, drafter, k, n_new, slip=0):
    """The chapter's speculate_greedy (notebooks/06b_speculation_caching.ipynb); ``slip=1`` keeps the first
    refused draft too, the off-by-one of a verify loop."""
    ids, cache, passes = list(prompt_ids), spec.prefill(model, prompt_ids), 0
    while len(ids) - len(prompt_ids) < n_new:
        drafts = drafter.propose(ids, min(k, n_new - (len(ids) - len(prompt_ids)) - 1))[0]
        x = torch.tensor([[ids[-1], *drafts]], device=model.device)
        with torch.inference_mode():
            picks = model(input_ids=x, cache=cache, use_cache=True).logits[0].argmax(-1).tolist()
        m = 0
        while m < len(drafts) and drafts[m] == picks[m]:
            m += 1
        m = min(m + slip, len(drafts)) if m < len(drafts) else m
        cache.crop(m - len(drafts))
        ids += drafts[:m] + [picks[m]]
        passes += 1
    return ids[len(prompt_ids):], passes


def test_a_page_loop_that_keeps_one_draft_too_many_fails(tiny_llama):
    model = tiny_llama(vocab_size=128, num_hidden_layers=4, max_position_embeddings=256,
                       tie_word_embeddings=False)
    ref_out, ref_st = speculative_generate(model, PROMPT, PromptLookupDrafter(), k=4, max_new_tokens=16)
    assert ref_st.rejections, "no draft was rejected: the test cannot tell a broken verify loop"
    figure = {}
    for slip in (0, 1):
        out, passes = _page_speculate(model, PROMPT, PromptLookupDrafter(), 4, 16, slip=slip)
        figure[slip] = {"page_spec_same": out == ref_out and passes == ref_st.target_passes}
    assert outcome(CH, "page_spec_matches", figure[1]).held is False
    assert outcome(CH, "page_spec_matches", figure[0]).held is True


# ---- paged KV: vLLM's own meter ------------------------------------------------------------------

def test_paged_arithmetic_that_rounds_blocks_down_fails(monkeypatch):
    from labkit.experiments import vllm_kv_blocks as vk
    from labkit.llm import paged_kv

    # vLLM's CPU build on three of the chapter's prompt lengths: 32 new tokens each, 128-token blocks
    meter = vk.KVMeter((35, 200, 130), 32, 128, 364, 22.75, ((3, 5 / 364),))

    def figures() -> dict:
        lo, hi = meter.expected
        return {"vllm_kv_blocks_used": meter.used_blocks, "vllm_kv_blocks_lo": lo, "vllm_kv_blocks_hi": hi,
                "study": True, "vllm_kv_metered": True}

    right = figures()
    # the slip: a sequence's blocks rounded down, as if a partly filled last block took no memory
    monkeypatch.setattr(vk, "blocks", mutated(paged_kv.blocks, ("math.ceil(n / block)", "n // block")))
    assert outcome(CH, "vllm_kv_meter", figures()).held is False
    assert outcome(CH, "vllm_kv_meter", right).held is True
