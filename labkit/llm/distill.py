"""Knowledge distillation into a shallower student (chapter 02b, "Choosing a model": a compact
student trained to reproduce a teacher's output distributions).

:func:`make_student` copies the teacher keeping only the decoder layers given (chapter 02b keeps the
first ones: same embeddings, final norm and head, so its vocabulary and hidden size are the teacher's);
:func:`kd_loss` is the KL divergence from the teacher's softened distribution to the student's,
scaled by ``T**2`` and averaged over real (unpadded) positions; :func:`distill` trains the student's
layers on it, the teacher's logits computed on the fly. Times are seconds.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from typing import Any

import torch
import torch.nn.functional as F

from .finetune import TrainRun, answer_loss, tail_logits, train_steps


def make_student(teacher, layers: Sequence[int]) -> Any:
    """A deep copy of ``teacher`` (a transformers decoder such as Llama or Qwen3) keeping only the
    decoder ``layers`` given, in that order; the config says the new depth and each kept attention
    layer gets its new index (the KV cache is indexed by it). The teacher is left untouched."""
    student = copy.deepcopy(teacher)
    body = student.get_decoder() if hasattr(student, "get_decoder") else student.model
    old = body.layers
    if not layers or any(not 0 <= i < len(old) for i in layers):
        raise ValueError(f"layers must be indices below {len(old)}, got {list(layers)}")
    body.layers = torch.nn.ModuleList([old[i] for i in layers])
    for new_idx, layer in enumerate(body.layers):
        attn = getattr(layer, "self_attn", None)
        if attn is not None and hasattr(attn, "layer_idx"):
            attn.layer_idx = new_idx
    cfg = student.config
    if getattr(cfg, "layer_types", None):
        cfg.layer_types = [cfg.layer_types[i] for i in layers]
    cfg.num_hidden_layers = len(layers)
    return student.eval()


def kd_loss(student_logits: torch.Tensor, teacher_logits: torch.Tensor, mask: torch.Tensor | None = None,
            temperature: float = 2.0) -> torch.Tensor:
    """``T**2 * KL(softmax(teacher / T) || softmax(student / T))`` per position, averaged over the
    positions where ``mask`` is 1 (all when ``None``). Logits ``(batch, seq, vocab)``; 0 exactly when
    the two distributions agree."""
    t = temperature
    log_p = F.log_softmax(teacher_logits.float() / t, dim=-1)
    log_q = F.log_softmax(student_logits.float() / t, dim=-1)
    kl = (log_p.exp() * (log_p - log_q)).sum(-1)
    if mask is None:
        return kl.mean() * t * t
    m = mask.to(kl.dtype)
    return (kl * m).sum() / m.sum().clamp_min(1) * t * t


def distill(student, teacher, batches: Sequence[dict[str, torch.Tensor]], lr: float = 5e-4,
            temperature: float = 2.0, top_layers: int | None = None, hard_weight: float = 0.0,
            seed: int = 0, desc: str | None = "distill") -> TrainRun:
    """Train ``student`` (in place) to match ``teacher``'s softened next-token distributions on the last
    ``keep`` positions of each :func:`labkit.llm.finetune.sft_batches` batch (the end of the question and
    the answer): one AdamW step per batch on :func:`kd_loss`, plus ``hard_weight`` times the answer's
    cross-entropy (:func:`labkit.llm.finetune.answer_loss`, the batch's labels). Only decoder layers train
    (the last ``top_layers`` of them, or all when ``None``: the backward pass stops at the lowest);
    embeddings, head and final norm stay frozen. Both models are left in eval mode, the student's
    parameters frozen."""
    torch.manual_seed(seed)
    body = student.get_decoder() if hasattr(student, "get_decoder") else student.model
    layers = list(body.layers)[-top_layers:] if top_layers else list(body.layers)
    for p in student.parameters():
        p.requires_grad_(False)
    params = [p for layer in layers for p in layer.parameters()]
    for p in params:
        p.requires_grad_(True)
    opt = torch.optim.AdamW(params, lr=lr, weight_decay=0.0)
    run = TrainRun(trainable=sum(p.numel() for p in params))
    dev = next(student.parameters()).device
    teacher.eval()
    student.train()

    def loss_of(batch: dict[str, torch.Tensor]) -> torch.Tensor:
        with torch.no_grad():
            target = tail_logits(teacher, batch, dev)
        logits = tail_logits(student, batch, dev)
        loss = kd_loss(logits, target, None, temperature)
        return loss + hard_weight * answer_loss(logits, batch) if hard_weight else loss

    train_steps(batches, loss_of, opt, run, dev, desc)
    student.eval()
    for p in student.parameters():
        p.requires_grad_(False)
    return run
