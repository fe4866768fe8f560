import pytest
import torch
from test_finetune import ITEMS, CharTok, tiny_llama

from labkit.llm import distill as di
from labkit.llm import finetune as ft


def test_kd_loss_is_zero_for_identical_logits_and_positive_otherwise():
    torch.manual_seed(0)
    t = torch.randn(2, 5, 64)
    assert di.kd_loss(t, t.clone()).item() == pytest.approx(0.0, abs=1e-6)
    s = t + 0.5 * torch.randn_like(t)
    assert di.kd_loss(s, t).item() > 0.01
    mask = torch.tensor([[1, 1, 0, 0, 0], [1, 0, 0, 0, 0]])
    s2 = s.clone()
    s2[:, 2:] = t[:, 2:] + 10  # masked-out positions do not count
    s2[0, 1] = s[0, 1]
    assert di.kd_loss(s2, t, mask).item() == pytest.approx(di.kd_loss(s, t, mask).item(), rel=1e-5)
    # a shift of all logits by a constant is the same distribution
    assert di.kd_loss(t + 3.0, t).item() == pytest.approx(0.0, abs=1e-5)


def test_student_keeps_the_chosen_layers_and_the_teacher_is_untouched():
    teacher = tiny_llama(4)
    n_teacher = ft.param_count(teacher)
    ids = torch.randint(2, 64, (1, 9))
    full = di.make_student(teacher, [0, 1, 2, 3])
    with torch.no_grad():
        assert torch.equal(full(ids).logits, teacher(ids).logits)
    student = di.make_student(teacher, [0, 3])
    assert student.config.num_hidden_layers == 2 and len(student.model.layers) == 2
    assert [layer.self_attn.layer_idx for layer in student.model.layers] == [0, 1]
    assert ft.param_count(student) < n_teacher and ft.param_count(teacher) == n_teacher
    assert torch.equal(student.model.layers[1].mlp.up_proj.weight, teacher.model.layers[3].mlp.up_proj.weight)
    with torch.no_grad():  # the cache works with the new indices
        out = student.generate(ids, max_new_tokens=3, do_sample=False, pad_token_id=0)
    assert out.shape[1] == 12
    with pytest.raises(ValueError, match="indices"):
        di.make_student(teacher, [0, 7])


def test_distillation_moves_the_student_toward_the_teacher():
    teacher = tiny_llama(4)
    student = di.make_student(teacher, [0, 1])
    batches = ft.sft_batches(CharTok(), ITEMS[:4], batch_size=4, steps=10, seed=0)
    run = di.distill(student, teacher, batches, lr=1e-2, top_layers=1)
    assert run.steps == 10 and run.trainable == sum(p.numel() for p in student.model.layers[1].parameters())
    assert run.losses[-1] < run.losses[0]
    assert not any(p.requires_grad for p in student.parameters())


def test_cross_entropy_only_never_runs_the_teacher():
    class NoTeacher(torch.nn.Module):
        def forward(self, *a, **k):
            raise AssertionError("the teacher ran")

    student = di.make_student(tiny_llama(3), [0, 2])
    batches = ft.sft_batches(CharTok(), ITEMS[:4], batch_size=4, steps=2, seed=0)
    run = di.distill(student, NoTeacher(), batches, lr=1e-2, hard_weight=1.0, soft_weight=0.0)
    assert run.steps == 2
    with pytest.raises(ValueError, match="train on something"):
        di.distill(student, NoTeacher(), batches, hard_weight=0.0, soft_weight=0.0)


def test_layer_importance_finds_a_layer_that_does_nothing():
    model = tiny_llama(5)
    with torch.no_grad():  # layer 2 returns its input: zero attention and MLP outputs
        model.model.layers[2].self_attn.o_proj.weight.zero_()
        model.model.layers[2].mlp.down_proj.weight.zero_()
    imp = di.layer_importance(model, ft.sft_batches(CharTok(), ITEMS, 4, 1)[0])
    assert len(imp) == 5 and imp[2] == pytest.approx(0.0, abs=1e-6) and min(imp[:2] + imp[3:]) > 1e-3


def test_layers_to_keep_drops_the_least_important_never_the_ends():
    imp = [0.01, 0.5, 0.02, 0.3, 0.04, 0.001]
    assert di.layers_to_keep(imp, 2) == [0, 1, 3, 5]  # 0 and 5 are the least important, and stay
    assert di.layers_to_keep(imp, 0) == list(range(6))
    with pytest.raises(ValueError, match="can drop"):
        di.layers_to_keep(imp, 5)


def test_shared_max_diff_maps_student_layers_to_the_teachers():
    teacher = tiny_llama(4)
    student = di.make_student(teacher, [0, 2, 3])
    assert di.shared_max_diff(student, teacher, [0, 2, 3], trained=0) == 0.0
    assert di.shared_max_diff(student, teacher, [0, 1, 3], trained=0) > 0  # layer 1 is not the student's
    with torch.no_grad():
        student.model.layers[2].mlp.up_proj.weight.add_(1.0)
    # the trained top layer is left out
    assert di.shared_max_diff(student, teacher, [0, 2, 3], trained=1) == 0.0
    assert di.shared_max_diff(student, teacher, [0, 2, 3], trained=0) == pytest.approx(1.0)
