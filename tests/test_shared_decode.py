"""labkit.llm.shared_decode (chapter 02b): prompts split into segments tokenize as the whole prompt,
the shared-prefix greedy decoder answers as transformers' ``generate`` does on whole prompts, and its
cache layer holds what transformers' own holds."""

import pytest
import torch
from transformers.cache_utils import DynamicLayer

from labkit.llm import domain_eval as de
from labkit.llm import shared_decode as sd


@pytest.fixture(scope="module")
def tok():
    from transformers import AutoTokenizer

    from labkit.models import llm_dir

    return AutoTokenizer.from_pretrained(llm_dir("float32"))


@pytest.fixture(scope="module")
def model(tiny_llama, tok):
    """A random two-layer Llama with the real tokenizer's vocabulary: answers are arbitrary tokens,
    which is what a test of the decoding path wants (any slip changes them)."""
    return tiny_llama(num_hidden_layers=2, vocab_size=len(tok), initializer_range=0.5)


def test_segments_tokenize_as_the_whole_prompt(tok):
    held, train = de.load_items("invoices", "heldout"), de.load_items("invoices", "train")
    shots = de.few_shot(train, 3)
    for item in held:
        for segs in (de.segments(item), de.chat_segments(tok, item, shots)):
            parts = sd.split_ids(tok, segs)
            assert sum(parts, []) == tok("".join(segs))["input_ids"] and all(parts)
    with pytest.raises(ValueError, match="inside a token"):
        sd.split_ids(tok, ("Grand to", "tal 12.00"))  # "total" is one token, "to" + "tal" two


def test_greedy_answers_match_generate_on_whole_prompts(model, tok):
    held, train = de.load_items("invoices", "heldout"), de.load_items("invoices", "train")
    generic = de.load_items("generic")
    items = held[:9]
    chats = [de.chat_segments(tok, i, de.few_shot(train, 3)) for i in held[:3]]
    for prompts in ([de.segments(i) for i in items], chats, [de.segments(i) for i in generic[:6]]):
        # batches of 4: an invoice's questions are split across batches too
        shared = sd.greedy_answers(model, tok, prompts, max_new_tokens=8, batch_size=4)
        plain = de.generate_answers(model, tok, ["".join(p) for p in prompts], max_new_tokens=8,
                                    batch_size=len(prompts))
        assert shared == plain
        assert len(set(shared)) > 1  # the prompts got different answers: the test can see a mix-up


def test_prompts_must_have_one_shape(model, tok):
    with pytest.raises(ValueError, match="same number of segments"):
        sd.greedy_answers(model, tok, [("a", "b"), ("c",)])
    with pytest.raises(ValueError, match="not empty"):
        sd.greedy_answers(model, tok, [("a", "")])


def test_slab_layer_holds_what_transformers_layer_holds():
    torch.manual_seed(0)
    slab, plain = sd.SlabLayer(), DynamicLayer()
    for width in (5, 1, 1, 20, 1):
        k, v = torch.randn(3, 2, width, 4), torch.randn(3, 2, width, 4)
        a, b = slab.update(k, v), plain.update(k, v)
        assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
    idx = torch.tensor([2, 0, 0])
    slab.batch_select_indices(idx)
    plain.batch_select_indices(idx)
    k, v = torch.randn(3, 2, 1, 4), torch.randn(3, 2, 1, 4)
    a, b = slab.update(k, v), plain.update(k, v)
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1]) and slab.get_seq_length() == 29


def test_stop_ids_hold_newlines_and_the_end_token(tok):
    stops = sd.stop_ids(tok)
    assert tok.eos_token_id in stops and tok.convert_tokens_to_ids("Ċ") in stops
    assert tok("7")["input_ids"][0] not in stops
    assert sd.first_line(" 2021-05-22\nQ: x") == "2021-05-22"
