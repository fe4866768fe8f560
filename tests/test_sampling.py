"""Temperature / top-k / top-p against transformers' logits processors (labkit.llm.sampling, chapter 03)."""

import pytest
import torch
from transformers import TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper

from labkit.llm.sampling import (
    apply_temperature,
    entropy_bits,
    probabilities,
    sample,
    top_k_filter,
    top_p_filter,
)


@pytest.fixture
def logits():
    return torch.randn(3, 500, generator=torch.Generator().manual_seed(0)) * 3


@pytest.mark.parametrize("t", [0.3, 1.0, 1.7])
def test_temperature_matches_transformers(logits, t):
    assert torch.allclose(apply_temperature(logits, t), TemperatureLogitsWarper(t)(None, logits))


@pytest.mark.parametrize("k", [1, 5, 50, 500])
def test_top_k_matches_transformers(logits, k):
    assert torch.equal(top_k_filter(logits, k), TopKLogitsWarper(k)(None, logits.clone()))


@pytest.mark.parametrize("p", [0.05, 0.5, 0.9, 0.99])
def test_top_p_matches_transformers(logits, p):
    assert torch.equal(top_p_filter(logits, p).isinf(), TopPLogitsWarper(p)(None, logits.clone()).isinf())


def test_top_p_keeps_the_smallest_set_reaching_p(logits):
    probs = logits.softmax(-1)
    kept = ~top_p_filter(logits, 0.8).isinf()
    mass = (probs * kept).sum(-1)
    assert (mass >= 0.8).all()
    smallest_kept = torch.where(kept, probs, torch.inf).min(-1).values
    assert (mass - smallest_kept < 0.8).all()  # dropping the least likely kept token falls short


def test_temperature_sharpens_and_flattens(logits):
    h = [entropy_bits(probabilities(logits, t)).mean() for t in (0.2, 1.0, 5.0)]
    assert h[0] < h[1] < h[2] <= torch.log2(torch.tensor(500.0))


def test_greedy_is_deterministic_and_seeded_sampling_reproducible(logits):
    assert torch.equal(sample(logits, 0), logits.argmax(-1))
    draw = lambda seed: [sample(logits, 1.0, top_k=50, generator=torch.Generator().manual_seed(seed))
                         for _ in range(20)]
    assert all(torch.equal(a, b) for a, b in zip(draw(7), draw(7), strict=True))
    assert not all(torch.equal(a, b) for a, b in zip(draw(7), draw(8), strict=True))


def test_samples_stay_inside_the_filters(logits):
    allowed = ~top_k_filter(logits, 3).isinf()
    for s in range(20):
        tok = sample(logits, 1.0, top_k=3, generator=torch.Generator().manual_seed(s))
        assert allowed.gather(-1, tok[:, None]).all()


def test_bad_arguments():
    with pytest.raises(ValueError):
        apply_temperature(torch.zeros(3), 0)
    with pytest.raises(ValueError):
        top_p_filter(torch.zeros(3), 1.5)
    with pytest.raises(ValueError):
        top_k_filter(torch.zeros(3), 0)
