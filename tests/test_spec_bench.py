"""Chapter 06's speculative-decoding measurements (labkit.llm.spec_bench) on a tiny random Llama: paired
rounds time plain and speculative runs of one length in alternating order and still write plain
greedy's text, the greedy judge forgives only near-ties, and the
early-exit acceptance read from one pass equals what the early-exit drafter itself predicts."""

import math

import pytest
import torch

from labkit.llm import spec_bench as SB
from labkit.llm import speculative
from labkit.llm.speculative import EarlyExitDrafter, PromptLookupDrafter, SpecStats, speculative_generate

PROMPT = list(range(10, 30)) * 2 + list(range(10, 14))  # repeats itself: prompt lookup finds drafts


@pytest.fixture(scope="module")
def model(tiny_llama):
    return tiny_llama(vocab_size=128, num_hidden_layers=4, max_position_embeddings=256,
                      tie_word_embeddings=False)


@pytest.fixture(scope="module")
def greedy(model):
    return speculative_generate(model, PROMPT, None, max_new_tokens=12)[0]


def test_paired_rounds_time_runs_of_one_length_and_write_plain_greedys_text(model, greedy, monkeypatch):
    calls = []
    real = speculative.speculative_generate

    def spy(m, ids, drafter, k=4, max_new_tokens=32, **kw):
        out, st = real(m, ids, drafter, k=k, max_new_tokens=max_new_tokens, **kw)
        calls.append((drafter is None, max_new_tokens, out))
        return out, st

    monkeypatch.setattr(SB, "speculative_generate", spy)
    ratios, st = SB.paired_rounds(model, PROMPT, PromptLookupDrafter(), 4, 12, rounds=3)
    assert len(ratios) == 3 and all(0 < r < math.inf for r in ratios)
    assert [plain for plain, _, _ in calls] == [True, False, False, True, True, False]  # order alternates
    assert {n for _, n, _ in calls} == {12} and all(out == greedy for _, _, out in calls)
    assert st.new_tokens == 12 and st.drafted > 0 and st.tokens_per_pass > 1


def test_same_as_greedy_is_exact_in_float32_and_forgives_only_near_ties(model, greedy):
    assert SB.same_as_greedy(model, PROMPT, greedy[:6], greedy) == (True, "")
    wrong = greedy[:3] + [(greedy[3] + 1) % 128] + greedy[4:6]
    assert SB.same_as_greedy(model, PROMPT, wrong, greedy) == (False, "")
    with torch.no_grad():
        top2 = model(torch.tensor([PROMPT + greedy[:3]])).logits[0, -1].topk(2).values
    gap = float(top2[0] - top2[1])
    ok, note = SB.same_as_greedy(model, PROMPT, wrong, greedy, exact=False, near_tie=gap + 1e-3)
    assert ok and note == f"differs from greedy at token 3; top-2 logit gap there {gap:.3f}"
    assert SB.same_as_greedy(model, PROMPT, wrong, greedy, exact=False, near_tie=gap - 1e-3)[0] is False
    assert SB.same_as_greedy(model, PROMPT, greedy[:4], greedy, exact=False) == (True, "")


def test_runs_table_rows():
    st = SpecStats(new_tokens=12, target_passes=6, drafted=16, accepted=6, rejections=5)
    runs = [dict(task="copy", k=4, temp=0.0, st=st, same=True),
            dict(task="open", k=4, temp=1.2, st=st, same=None)]
    lines = SB.runs_table(runs).splitlines()
    assert lines[0].split()[:3] == ["task", "k", "temp"] and lines[0].endswith("identical to greedy")
    assert lines[1].split() == ["copy", "4", "0.0", "12", "6", "0.38", "0.55", "2.00", "True"]
    assert lines[2].split() == ["open", "4", "1.2", "12", "6", "0.38", "0.55", "2.00"]


def test_early_exit_agreement_is_what_the_drafter_predicts(model, greedy):
    depths = [1, 2, 3]
    alpha = SB.early_exit_agreement(model, PROMPT, greedy, depths)
    for L in depths:
        d = EarlyExitDrafter(model, L)
        with torch.no_grad():
            preds = [int(d.forward(PROMPT).argmax())] + [int(d.forward([t]).argmax()) for t in greedy[:-1]]
        hits = sum(p == t for p, t in zip(preds, greedy, strict=True))
        assert alpha[L] == pytest.approx(hits / len(greedy))


def test_early_exit_step_times(model):
    full, draft = SB.early_exit_step_times(model, PROMPT, [1, 3], pass_tokens=(1, 3), repeats=1)
    assert set(full) == {1, 3} and set(draft) == {1, 3}
    assert all(0 < t < 10 for t in [*full.values(), *draft.values()])
