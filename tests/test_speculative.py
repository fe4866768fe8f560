"""Speculative decoding (labkit.llm.speculative, chapter 06): greedy output identical to plain greedy
decoding (transformers' generate) for both drafters, the early-exit drafter against transformers'
own hidden states, the sampling rule's output distribution on a toy vocabulary, and the paper's
expected-tokens formula against a direct simulation."""

import numpy as np
import pytest
import torch

from labkit.llm.speculative import (
    TASKS,
    EarlyExitDrafter,
    PromptLookupDrafter,
    accept_greedy,
    accept_sampled,
    expected_speedup,
    expected_tokens_per_pass,
    prefill,
    roofline_verify_ratio,
    speculative_generate,
)
from labkit.models import chat_ids

NEW = 20


@pytest.fixture(scope="module")
def llm():
    from labkit.models import load_llm
    from labkit.settings import set_threads

    set_threads(1)
    torch.manual_seed(0)
    return load_llm(dtype="float32", device="cpu")


@pytest.fixture(scope="module")
def greedy_ref(llm):
    model, tok = llm
    ids = chat_ids(tok, TASKS["copy"])
    out = model.generate(torch.tensor([ids]), attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                         max_new_tokens=NEW, do_sample=False)
    return ids, out[0, len(ids):].tolist()


def _consistent(st, n):
    assert st.new_tokens == n
    assert st.new_tokens == st.accepted + st.target_passes  # each pass emits its accepted drafts + 1


@pytest.mark.slow  # loads the bundled model
def test_plain_path_matches_generate(llm, greedy_ref):
    ids, ref = greedy_ref
    n = NEW // 2
    out, st = speculative_generate(llm[0], ids, None, max_new_tokens=n)
    assert out == ref[:n]
    assert st.target_passes == n and st.drafted == 0 and st.tokens_per_pass == 1.0


@pytest.mark.slow  # loads the bundled model
@pytest.mark.parametrize("k", [2, 4, 7])
def test_prompt_lookup_greedy_is_identical(llm, greedy_ref, k):
    ids, ref = greedy_ref
    out, st = speculative_generate(llm[0], ids, PromptLookupDrafter(), k=k, max_new_tokens=NEW)
    assert out == ref
    _consistent(st, NEW)
    assert st.tokens_per_pass > 1.3  # the copy task: most drafts are looked up correctly
    assert st.target_passes < NEW


@pytest.mark.slow  # loads the bundled model
def test_shared_prefill_gives_the_same_runs_and_is_left_as_found(llm, greedy_ref):
    ids, ref = greedy_ref
    cache = prefill(llm[0], ids)
    assert cache.get_seq_length() == len(ids) - 1
    for k in (2, 4):  # two runs on one prefill give what fresh prefills give; the cache is cut back each time
        out, _ = speculative_generate(llm[0], ids, PromptLookupDrafter(), k=k, max_new_tokens=NEW,
                                      cache=cache)
        assert out == ref
        assert cache.get_seq_length() == len(ids) - 1
    with pytest.raises(ValueError, match="prefill"):  # another prompt's prefill is refused
        speculative_generate(llm[0], ids + [ids[-1]], None, max_new_tokens=2, cache=cache)


@pytest.mark.slow  # loads the bundled model
@pytest.mark.parametrize("k", [2, 4])
def test_early_exit_greedy_is_identical(llm, greedy_ref, k):
    model = llm[0]
    ids, ref = greedy_ref
    layers = 12  # of 30: cheap drafts; on the copy prompt a few are accepted, most rejected
    n = NEW // 2  # drafting costs a dozen layers per token here: keep it short (greedy prefixes agree)
    out, st = speculative_generate(model, ids, EarlyExitDrafter(model, layers), k=k, max_new_tokens=n)
    assert out == ref[:n]
    _consistent(st, n)
    assert st.accepted > 0 and st.rejections > 0  # both the accept and the roll-back paths ran


@pytest.mark.slow  # loads the bundled model
def test_early_exit_logits_match_transformers_hidden_states(llm):
    model, tok = llm
    layers = 5
    ids = chat_ids(tok, TASKS["open"])
    d = EarlyExitDrafter(model, layers)
    drafts, _ = d.propose(ids, k=3)
    assert len(drafts) == 3 and d.cache.get_seq_length() == len(ids) + 2
    # a different continuation: the drafter must roll its cache back to the common prefix
    other = ids + [drafts[0] + 1, 17]
    d.propose(other, k=1)
    assert d.seen == other and d.cache.get_seq_length() == len(other)
    with torch.inference_mode():
        logits = d.forward([5])
        hs = model(torch.tensor([other + [5]]), output_hidden_states=True).hidden_states[layers]
        ref = model.lm_head(model.model.norm(hs[:, -1]))[0]
    assert torch.allclose(logits, ref, atol=1e-3)


@pytest.mark.slow  # loads the bundled model
def test_early_exit_rejects_bad_layer_counts(llm):
    with pytest.raises(ValueError):
        EarlyExitDrafter(llm[0], llm[0].config.num_hidden_layers)


@pytest.mark.slow  # loads the bundled model
def test_sampling_mode_runs_and_is_reproducible(llm):
    ids = chat_ids(llm[1], "Say hello hello hello hello.")
    runs = [speculative_generate(llm[0], ids, PromptLookupDrafter(), k=4, max_new_tokens=4, temperature=1.0,
                                 generator=torch.Generator().manual_seed(3)) for _ in range(2)]
    assert runs[0][0] == runs[1][0] and len(runs[0][0]) == 4
    _consistent(runs[0][1], 4)


def test_prompt_lookup_finds_the_latest_longest_match():
    d = PromptLookupDrafter(max_ngram=3)
    assert d.propose([1, 2, 3, 4, 9, 8, 1, 2, 3, 5, 6, 1, 2, 3], k=2)[0] == [5, 6]  # latest 3-gram match
    assert d.propose([7, 1, 2, 9, 1], k=3)[0] == [2, 9, 1]  # only the 1-gram matches
    assert d.propose([1, 2, 3], k=4)[0] == []  # nothing repeats
    assert PromptLookupDrafter(min_ngram=2).propose([7, 1, 2, 9, 1], k=3)[0] == []


P = torch.tensor([0.40, 0.25, 0.15, 0.10, 0.06, 0.04])
Q = torch.tensor([0.05, 0.10, 0.40, 0.05, 0.30, 0.10])


def _emitted(q, trials=8_000, seed=0):
    """First emitted token of a one-draft step, over many trials, with drafts drawn from q (or fixed)."""
    g = torch.Generator().manual_seed(seed)
    p2 = torch.stack([P, P])
    counts, accepted = np.zeros(len(P)), 0
    for _ in range(trials):
        if q is None:
            x, qq = 2, None  # a prompt-lookup draft: one fixed token, q one-hot
        else:
            x, qq = int(torch.multinomial(q, 1, generator=g)), q[None]
        m, tok = accept_sampled([x], p2, qq, g)
        counts[x if m == 1 else tok] += 1
        accepted += m
    return counts / trials, accepted / trials


@pytest.mark.parametrize("q", [Q, None], ids=["model-draft", "one-hot-draft"])
def test_sampling_rule_reproduces_the_target_distribution(q):
    freq, acc = _emitted(q)
    tv = 0.5 * np.abs(freq - P.numpy()).sum()
    assert tv < 0.025, (freq, tv)  # 8k trials: sampling noise in TV is ~0.009; a wrong residual gives ~0.14
    expect_acc = float(torch.minimum(P, Q).sum()) if q is not None else float(P[2])  # 1 − TV(p, q)
    assert abs(acc - expect_acc) < 0.02
    if q is not None:  # and drafting from q alone would have been far from p
        assert 0.5 * float((P - Q).abs().sum()) > 0.3


def test_bonus_token_follows_p_after_all_accepted():
    g = torch.Generator().manual_seed(1)
    onehot = torch.zeros(2, len(P))
    onehot[0, 3] = onehot[1, 0] = 1.0
    p = torch.stack([onehot[0], onehot[1], P])  # the target agrees with both drafts for sure
    counts = np.zeros(len(P))
    for _ in range(5000):
        m, tok = accept_sampled([3, 0], p, onehot, g)
        assert m == 2
        counts[tok] += 1
    assert 0.5 * np.abs(counts / 5000 - P.numpy()).sum() < 0.03


@pytest.mark.parametrize("alpha", [0.0, 0.3, 0.6, 0.9])
@pytest.mark.parametrize("k", [1, 4, 8])
def test_expected_tokens_formula_matches_simulation(alpha, k):
    rng = np.random.default_rng(0)
    ok = rng.random((100_000, k)) < alpha  # each draft accepted independently with probability alpha
    accepted = np.where(ok.all(1), k, np.argmin(ok, axis=1))  # accepted prefix length
    sim = (accepted + 1).mean()  # plus the target's own token
    assert sim == pytest.approx(expected_tokens_per_pass(alpha, k), rel=0.01)


def test_expected_speedup_limits():
    assert expected_tokens_per_pass(1.0, 4) == 5.0
    assert expected_speedup(0.0, 4, c=0.1) == pytest.approx(1 / 1.4)  # every draft rejected: pure cost
    assert expected_speedup(1.0, 4, c=0.0) == 5.0
    e = expected_tokens_per_pass(0.8, 4)
    assert expected_speedup(0.8, 4, c=0.0, verify_cost=2.0) == pytest.approx(e / 2)


def test_roofline_verify_is_free_only_below_the_ridge():
    from labkit.hardware.catalog import ACCELERATORS

    h100 = ACCELERATORS["H100 SXM"]
    peak, bw = h100.tflops["bf16"] * 1e12, h100.bandwidth_bytes_per_s
    params = 8e9
    ridge = h100.ops_per_byte("bf16")  # bf16 weights: a pass over n tokens has intensity ≈ n FLOPs/byte
    k = 4
    small = int(ridge // (k + 1)) - 1
    assert roofline_verify_ratio(params, 2 * params, small, k, peak, bw) == pytest.approx(1.0)
    big = roofline_verify_ratio(params, 2 * params, 4096, k, peak, bw)
    assert big == pytest.approx(k + 1, rel=1e-6)  # both passes compute-bound: k+1 times the work
    mid = roofline_verify_ratio(params, 2 * params, 2 * small, k, peak, bw)
    assert 1.0 < mid < k + 1


def test_roofline_speedup_is_the_model_with_the_roofline_verify_cost():
    from labkit.hardware.catalog import ACCELERATORS
    from labkit.llm.speculative import roofline_speedup

    h100 = ACCELERATORS["H100 SXM"]
    peak, bw, params, k, alpha = h100.tflops["bf16"] * 1e12, h100.bandwidth_bytes_per_s, 135e6, 4, 0.8
    # batch 1 is memory-bound: verification is free, the paper's speedup with a free drafter
    assert roofline_speedup(alpha, k, 1, params, 2 * params, peak, bw) == pytest.approx(
        expected_speedup(alpha, k, 0.0))
    # far past the ridge both passes are compute-bound: the verify pass costs k + 1 plain ones
    big = roofline_speedup(alpha, k, 8192, params, 2 * params, peak, bw)
    assert big == pytest.approx(expected_tokens_per_pass(alpha, k) / (k + 1)) and big < 1
    drafting = roofline_speedup(alpha, k, 1, params, 2 * params, peak, bw, c=0.1)
    assert drafting == pytest.approx(expected_speedup(alpha, k, 0.1))


def test_greedy_acceptance_keeps_drafts_up_to_the_first_disagreement():
    # the tutorial's example: three drafts match the target's picks, the fourth does not
    drafts, picks = ["The", "quick", "brown", "fox"], ["The", "quick", "brown", "dog", "over"]
    assert accept_greedy(drafts, picks) == (3, "dog")
    assert accept_greedy([5, 6], [5, 6, 7]) == (2, 7)  # all kept: the bonus token follows
    assert accept_greedy([5, 6], [4, 6, 7]) == (0, 4)  # the first refused: the target's own token only
    assert accept_greedy([], [9]) == (0, 9)  # no drafts: plain decoding
