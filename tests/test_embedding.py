"""The bundled sentence embedder and its pooling (labkit.llm.embedding; chapter 07)."""

import pytest
import torch

from labkit.llm import embedding
from labkit.llm.embedding import MINILM, load_embedder


@pytest.fixture(scope="module")
def encoder():
    return load_embedder()


def test_loads_the_checked_weights_as_a_6_layer_encoder(encoder):
    model, tok = encoder
    assert model.config.model_type == "bert" and model.config.num_hidden_layers == 6
    assert sum(p.numel() for p in model.parameters()) == 22_713_216
    assert MINILM["sha256"].startswith("53aa5117") and tok("hello")["input_ids"][0] == tok.cls_token_id


def test_unit_vectors_that_put_a_paraphrase_nearer_than_an_unrelated_text(encoder):
    model, tok = encoder
    v = embedding.embed(model, tok, ["How can I make my model answer faster?",
                                     "Ways to cut a language model's response time",
                                     "The recipe needs two eggs and a cup of flour."])
    assert v.shape == (3, 384)
    assert torch.allclose(v.norm(dim=-1), torch.ones(3), atol=1e-5)
    assert v[0] @ v[1] > v[0] @ v[2] + 0.2


def test_mean_pool_ignores_masked_positions():
    hidden = torch.tensor([[[1.0, 2.0], [3.0, 4.0], [100.0, 100.0]]])
    assert torch.equal(embedding.mean_pool(hidden, torch.tensor([[1, 1, 0]])), torch.tensor([[2.0, 3.0]]))


def test_long_texts_are_truncated_to_the_models_limit(encoder):
    model, tok = encoder
    long = "tokens " * 600
    assert len(tok(long)["input_ids"]) > embedding.MAX_TOKENS
    assert torch.allclose(embedding.embed(model, tok, [long]), embedding.embed(model, tok, [long + "more"]))


def test_batches_by_length_and_the_positions_they_compute(encoder):
    _, tok = encoder
    texts = ["a b c d e f g h", "a", "a b c d", "a b"]
    groups = embedding.by_length(texts, tok, 2)
    assert groups == [[1, 3], [2, 0]]
    lengths = [len(tok(t)["input_ids"]) for t in texts]
    one = embedding.padded_tokens(texts, tok, [[0, 1, 2, 3]])
    assert one == {"real": sum(lengths), "computed": 4 * max(lengths)}
    assert embedding.padded_tokens(texts, tok, groups)["computed"] < one["computed"]


def test_bad_input_says_what_to_pass(encoder):
    model, tok = encoder
    with pytest.raises(ValueError, match="non-empty"):
        embedding.embed(model, tok, [])
    with pytest.raises(ValueError, match="non-empty"):
        embedding.embed(model, tok, ["ok", ""])
    with pytest.raises(ValueError, match="at least one"):
        embedding.by_length(["a"], encoder[1], 0)
