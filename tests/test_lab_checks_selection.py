"""Chapter 02b's own checks (labkit/checks/selection.py) against broken implementations: each test runs
a small mutated version of the chapter's code path on a tiny random model (or the shipped eval set),
computes the figure the notebook records from it, and sees the check fail; the real code path, run
the same way, holds."""

import copy

import pytest
import torch
from test_finetune import ITEMS, CharTok, tiny_llama

from labkit.checks import outcome
from labkit.llm import distill as di
from labkit.llm import domain_eval as de
from labkit.llm import finetune as ft
from labkit.llm import shared_decode as sd


@pytest.fixture(scope="module")
def tok():
    from transformers import AutoTokenizer

    from labkit.models import llm_dir

    return AutoTokenizer.from_pretrained(llm_dir("float32"))


def _mismatches(model, tok) -> int:
    """The notebook's figure: the shared-prefix decoder's answers against generate's on whole prompts
    (bare held-out items and chat items with worked examples)."""
    held, train = de.load_items("invoices", "heldout"), de.load_items("invoices", "train")
    shots = de.few_shot(train, 3)
    out = 0
    for prompts in ([de.segments(i) for i in held[:6]], [de.chat_segments(tok, i, shots) for i in held[:2]]):
        shared = sd.greedy_answers(model, tok, prompts, max_new_tokens=6)
        plain = de.generate_answers(model, tok, ["".join(p) for p in prompts], max_new_tokens=6, batch_size=6)
        out += sum(a != b for a, b in zip(shared, plain, strict=True))
    return out


def test_shared_decoder_with_positions_restarting_per_segment_fails(monkeypatch, tok):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(vocab_size=len(tok), hidden_size=32, intermediate_size=64,
                                         num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                                         initializer_range=0.5)).eval()
    real = _mismatches(model, tok)
    forward = sd._forward

    def restarting(model, ids, mask, cache, name):  # positions count from 0 in every segment and step
        pos = torch.arange(ids.shape[1]).expand(ids.shape[0], -1)
        out = model(input_ids=ids, attention_mask=mask, position_ids=pos, use_cache=True, logits_to_keep=1,
                    **{name: cache})
        return out.logits[:, -1].float()

    monkeypatch.setattr(sd, "_forward", restarting)
    broken = _mismatches(model, tok)
    monkeypatch.setattr(sd, "_forward", forward)
    check = "shared_decode_matches_generate"
    assert outcome("selection", check, {"shared_decode_mismatches": broken}).held is False
    assert outcome("selection", check, {"shared_decode_mismatches": real}).held is True


def _merge_diff(peft_model, merge) -> float:
    """The notebook's figure: the adapter model's logits on held-out prompts, then the merged model's."""
    probe = ft.sft_batches(CharTok(), ITEMS[10:16], 6, 1)[0]
    with torch.no_grad():
        adapter_logits, merged = ft.tail_logits(peft_model, probe), merge(peft_model)  # logits first
        return (ft.tail_logits(merged, probe) - adapter_logits).abs().max().item()


def _unscaled_merge(peft_model):
    """A merge that folds B·A in without its alpha / r scale."""
    for m in peft_model.modules():
        if isinstance(getattr(m, "scaling", None), dict):
            m.scaling = {k: 1.0 for k in m.scaling}
    return ft.merge(peft_model)


def test_merge_without_the_lora_scale_fails():
    same = [{"prompt": i["prompt"], "answer": "paid"} for i in ITEMS[:4]]
    batches = ft.sft_batches(CharTok(), same, batch_size=4, steps=20, seed=0)
    peft_model, _ = ft.lora_finetune(tiny_llama(), batches, rank=8, lr=3e-2, top_layers=2)
    twin = copy.deepcopy(peft_model)
    real, broken = _merge_diff(peft_model, ft.merge), _merge_diff(twin, _unscaled_merge)
    assert outcome("selection", "lora_merge_matches_adapter", {"merge_max_logit_diff": broken}).held is False
    assert outcome("selection", "lora_merge_matches_adapter", {"merge_max_logit_diff": real}).held is True


def _disjoint() -> bool:
    """The notebook's figure: no invoice text in two of the train, dev and held-out splits."""
    texts = [{de.text_of(i) for i in de.load_items("invoices", s)} for s in ("train", "dev", "heldout")]
    return not (texts[0] & texts[1] or texts[0] & texts[2] or texts[1] & texts[2])


def test_loader_that_ignores_the_split_fails(monkeypatch):
    real = _disjoint()
    load = de.load_items
    monkeypatch.setattr(de, "load_items", lambda name, split=None, limit=None: load(name, None, limit))
    assert outcome("selection", "eval_splits_disjoint", {"eval_splits_disjoint": _disjoint()}).held is False
    assert outcome("selection", "eval_splits_disjoint", {"eval_splits_disjoint": real}).held is True


def _frozen_diff(teacher, layers, top_layers, made_from=None, train_top=True) -> float:
    """The notebook's path and figure: the student cut to ``made_from`` (default ``layers``), distilled
    with its top ``top_layers`` trained (every layer when ``train_top`` is False, a leak), then the
    largest difference of the tensors it should share with the teacher's ``layers``."""
    student = di.make_student(teacher, made_from or layers)
    batches = ft.sft_batches(CharTok(), ITEMS[:4], batch_size=4, steps=3, seed=0)
    di.distill(student, teacher, batches, lr=1e-2, top_layers=top_layers if train_top else None)
    return di.shared_max_diff(student, teacher, layers, top_layers)


def test_student_cut_from_the_wrong_end_fails():
    teacher = tiny_llama(4)
    check = "student_keeps_teacher"
    real = _frozen_diff(teacher, [0, 2, 3], 1)  # a measured cut: layer 1 dropped
    assert outcome("selection", check, {"student_frozen_max_diff": real}).held is True
    wrong = _frozen_diff(teacher, [0, 2, 3], 1, made_from=[1, 2, 3])  # built from other layers than it claims
    assert outcome("selection", check, {"student_frozen_max_diff": wrong}).held is False
    leak = _frozen_diff(teacher, [0, 2, 3], 1, train_top=False)  # every layer trained
    assert outcome("selection", check, {"student_frozen_max_diff": leak}).held is False
