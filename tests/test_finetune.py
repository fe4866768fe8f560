import copy

import pytest
import torch

from labkit.llm import domain_eval as de
from labkit.llm import finetune as ft


class CharTok:
    """A character tokenizer with the calls the lab makes (enough for sft_batches)."""

    pad_token_id, eos_token_id = 0, 1

    def __call__(self, text, add_special_tokens=False):
        return {"input_ids": [2 + ord(c) % 60 for c in text]}


def tiny_llama(layers=3):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=layers,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
                      tie_word_embeddings=True, initializer_range=0.2)
    return LlamaForCausalLM(cfg).eval()


ITEMS = [{"prompt": f"Invoice INV-{n}\nQ: invoice number?\nA:", "answer": f"INV-{n}"} for n in range(10, 30)]


def test_batches_are_left_padded_and_label_only_the_answer():
    batches = ft.sft_batches(CharTok(), ITEMS, batch_size=4, steps=3, seed=0)
    assert len(batches) == 3
    b = batches[0]
    assert b["input_ids"].shape == b["labels"].shape == b["attention_mask"].shape
    assert (b["attention_mask"][:, -1] == 1).all()  # every row ends at the last position
    answer_len = len(CharTok()(" INV-10\n")["input_ids"])
    assert ((b["labels"] != ft.IGNORE).sum(1) == answer_len).all()
    assert int(b["keep"]) == answer_len + 1
    assert (b["position_ids"][b["attention_mask"] == 1].min()) == 0
    again = ft.sft_batches(CharTok(), ITEMS, batch_size=4, steps=3, seed=0)
    assert torch.equal(again[2]["input_ids"], batches[2]["input_ids"])  # a fixed data order


def test_lora_lowers_the_loss_and_merges_into_the_same_architecture():
    model = tiny_llama()
    before = ft.param_count(model)
    same = [{"prompt": i["prompt"], "answer": "paid"} for i in ITEMS[:4]]  # one answer to learn
    batches = ft.sft_batches(CharTok(), same, batch_size=4, steps=20, seed=0)
    peft_model, run = ft.lora_finetune(copy.deepcopy(model), batches, rank=8, lr=3e-2, top_layers=2)
    assert run.steps == 20 and run.examples == 80 and 0 < run.trainable < before * 0.5
    assert sum(run.losses[-3:]) < 0.5 * sum(run.losses[:3])
    merged = ft.merge(peft_model)
    assert type(merged) is type(model) and ft.param_count(merged) == before
    assert not any("lora" in n for n, _ in merged.named_parameters())
    with torch.no_grad():  # the merged weights give what the adapters gave
        x = batches[0]
        assert torch.allclose(ft.tail_logits(merged, x), ft.tail_logits(peft_model, x), atol=1e-5)
        assert not torch.allclose(ft.tail_logits(merged, x), ft.tail_logits(model, x), atol=1e-3)


def test_only_top_layers_get_adapters():
    peft_model, _ = ft.lora_finetune(tiny_llama(4), ft.sft_batches(CharTok(), ITEMS, 2, 1), top_layers=1)
    adapted = {n.split("layers.")[1].split(".")[0] for n, _ in peft_model.named_parameters() if "lora_A" in n}
    assert adapted == {"3"}


def _adapters(peft_model):
    return {k: p.detach().clone() for k, p in peft_model.named_parameters() if "lora" in k}


def test_checkpoints_keep_the_best_steps_adapters():
    batches = ft.sft_batches(CharTok(), ITEMS, batch_size=4, steps=6, seed=0)
    dev_scores = iter([0.2, 0.7, 0.7])  # what the judge says at steps 2, 4 and 6: 4 is the earliest best
    peft_model, run = ft.lora_finetune(tiny_llama(), batches, lr=3e-2, top_layers=2, checkpoints=(2, 4, 6),
                                       judge=lambda m: next(dev_scores))
    assert run.checkpoints == {2: 0.2, 4: 0.7, 6: 0.7} and run.chosen == 4 and run.steps == 6
    four, _ = ft.lora_finetune(tiny_llama(), batches[:4], lr=3e-2, top_layers=2)  # a 4-step run, same seed
    kept, fresh = _adapters(peft_model), _adapters(four)
    assert kept.keys() == fresh.keys() and all(torch.allclose(kept[k], fresh[k], atol=1e-6) for k in kept)
    _, stop_early = ft.lora_finetune(tiny_llama(), batches, top_layers=2, checkpoints=(3,), judge=lambda m: 0)
    assert stop_early.steps == 3 and stop_early.chosen == 3  # training stops at the last checkpoint


def test_no_deprecation_warning_from_peft(recwarn):
    ft.lora_finetune(tiny_llama(), ft.sft_batches(CharTok(), ITEMS, 2, 1), top_layers=1)
    assert not [w for w in recwarn if "is_gradient_checkpointing" in str(w.message)]


def test_bad_arguments():
    with pytest.raises(ValueError, match="need items"):
        ft.sft_batches(CharTok(), [], 4, 1)
    assert de.exact_match("INV-10", "INV-10") == 1
