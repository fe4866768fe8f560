"""Chapter 02b's own checks (labkit/checks/selection.py) against broken implementations: each test runs
a small mutated version of the chapter's code path on a tiny random model (or the shipped eval set),
computes the figure the notebook records from it, and sees the check fail; the real code path, run
the same way, holds."""

import copy

import torch
from test_finetune import ITEMS, CharTok, tiny_llama

from labkit.checks import outcome
from labkit.llm import distill as di
from labkit.llm import domain_eval as de
from labkit.llm import finetune as ft


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
    peft_model, _ = ft.lora_finetune(tiny_llama(), batches, rank=8, lr=3e-2, top_layers=2, desc=None)
    twin = copy.deepcopy(peft_model)
    real, broken = _merge_diff(peft_model, ft.merge), _merge_diff(twin, _unscaled_merge)
    assert outcome("selection", "lora_merge_matches_adapter", {"merge_max_logit_diff": broken}).held is False
    assert outcome("selection", "lora_merge_matches_adapter", {"merge_max_logit_diff": real}).held is True


def _disjoint() -> bool:
    """The notebook's figure: no invoice text in both the training and the held-out split."""
    train, held = de.load_items("invoices", "train"), de.load_items("invoices", "heldout")
    return not ({de.text_of(i) for i in train} & {de.text_of(i) for i in held})


def test_loader_that_ignores_the_split_fails(monkeypatch):
    real = _disjoint()
    load = de.load_items
    monkeypatch.setattr(de, "load_items", lambda name, split=None, limit=None: load(name, None, limit))
    assert outcome("selection", "eval_splits_disjoint", {"eval_splits_disjoint": _disjoint()}).held is False
    assert outcome("selection", "eval_splits_disjoint", {"eval_splits_disjoint": real}).held is True


def _frozen_diff(teacher, layers, top_layers, train_top=True) -> float:
    """The notebook's path and figure: the student cut to ``layers``, distilled with its top
    ``top_layers`` trained (every layer when ``train_top`` is False, a leak), then the largest
    difference of the tensors it should share with its teacher (all but the top ``top_layers``)."""
    student = di.make_student(teacher, layers)
    batches = ft.sft_batches(CharTok(), ITEMS[:4], batch_size=4, steps=3, seed=0)
    di.distill(student, teacher, batches, lr=1e-2, top_layers=top_layers if train_top else None, desc=None)
    trained = tuple(f"model.layers.{i}." for i in range(len(layers) - top_layers, len(layers)))
    teacher_sd = teacher.state_dict()
    return max((w - teacher_sd[k]).abs().max().item() for k, w in student.state_dict().items()
               if not k.startswith(trained))


def test_student_cut_from_the_wrong_end_fails():
    teacher = tiny_llama(4)
    check = "student_keeps_teacher"
    real = _frozen_diff(teacher, [0, 1, 2], 1)
    assert outcome("selection", check, {"student_frozen_max_diff": real}).held is True
    last = _frozen_diff(teacher, [1, 2, 3], 1)  # the teacher's last three layers, not its first
    assert outcome("selection", check, {"student_frozen_max_diff": last}).held is False
    leak = _frozen_diff(teacher, [0, 1, 2], 1, train_top=False)  # every layer trained
    assert outcome("selection", check, {"student_frozen_max_diff": leak}).held is False
