"""Knowledge distillation into a shallower student (chapter 02b, "Choosing a model": a compact
student trained to reproduce a teacher's output distributions).

:func:`layer_importance` measures how much each decoder layer changes its input (one minus the cosine
similarity of the hidden state before and after it, "block influence", Men et al. 2024, ShortGPT), and
:func:`layers_to_keep` drops the least important ones, never the first or the last (the layers that
change the hidden state most; cutting the last ones is the worst choice in the layer-pruning
literature). :func:`make_student` copies the teacher keeping only the decoder layers given (same
embeddings, final norm and head, so its vocabulary and hidden size are the teacher's);
:func:`kd_loss` is the KL divergence from the teacher's softened distribution to the student's,
scaled by ``T**2`` and averaged over real (unpadded) positions; :func:`distill` trains the student's
layers on it and/or on the answer's cross-entropy, the teacher's logits computed on the fly;
:func:`shared_max_diff` says whether the student still holds the teacher's tensors it did not train.
Times are seconds.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Sequence
from typing import Any

import torch
import torch.nn.functional as F

from .finetune import TrainRun, answer_loss, tail_logits, train_steps


@torch.no_grad()
def layer_importance(model: Any, batch: dict[str, torch.Tensor]) -> list[float]:
    """Block influence of each decoder layer on a :func:`labkit.llm.finetune.sft_batches` batch: one minus
    the mean cosine similarity between the hidden state a layer receives and the one it returns, over
    the batch's real (unpadded) tokens. Near 0: the layer hardly changes its input."""
    body = model.get_decoder() if hasattr(model, "get_decoder") else model.model
    seen: list[tuple[torch.Tensor, torch.Tensor]] = []

    def grab(module: Any, args: Any, kwargs: Any, out: Any) -> None:  # each layer's input and output states
        x = args[0] if args else kwargs["hidden_states"]
        seen.append((x, out[0] if isinstance(out, tuple) else out))

    hooks = [layer.register_forward_hook(grab, with_kwargs=True) for layer in body.layers]
    dev = next(model.parameters()).device
    try:
        model(input_ids=batch["input_ids"].to(dev), attention_mask=batch["attention_mask"].to(dev),
              position_ids=batch["position_ids"].to(dev), logits_to_keep=1)
    finally:
        for h in hooks:
            h.remove()
    real = batch["attention_mask"].to(dev).bool()
    return [1 - F.cosine_similarity(x[real], y[real], dim=-1).mean().item() for x, y in seen]


def layers_to_keep(importance: Sequence[float], drop: int) -> list[int]:
    """Indices of the layers kept when the ``drop`` least important ones go (:func:`layer_importance`),
    never the first or the last; in order. ``ValueError`` when that leaves fewer than two layers."""
    n = len(importance)
    if not 0 <= drop <= n - 2:
        raise ValueError(f"can drop 0..{n - 2} of {n} layers (the first and last stay), got {drop}")
    gone = set(sorted(range(1, n - 1), key=lambda i: importance[i])[:drop])
    return [i for i in range(n) if i not in gone]


def make_student(teacher: Any, layers: Sequence[int]) -> Any:
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


def distill(student: Any, teacher: Any, batches: Sequence[dict[str, torch.Tensor]], lr: float = 5e-4,
            temperature: float = 2.0, top_layers: int | None = None, hard_weight: float = 0.0,
            soft_weight: float = 1.0, seed: int = 0) -> TrainRun:
    """Train ``student`` (in place) to match ``teacher``'s softened next-token distributions on the last
    ``keep`` positions of each :func:`labkit.llm.finetune.sft_batches` batch (the end of the question and
    the answer): one AdamW step per batch on ``soft_weight`` times :func:`kd_loss` plus ``hard_weight``
    times the answer's cross-entropy (:func:`labkit.llm.finetune.answer_loss`, the batch's labels; with
    ``soft_weight`` 0 the teacher is not run: plain fine-tuning of the cut model). Only decoder layers
    train (the last ``top_layers`` of them, or all when ``None``: the backward pass stops at the lowest);
    embeddings, head and final norm stay frozen. Both models are left in eval mode, the student's
    parameters frozen."""
    if soft_weight <= 0 and hard_weight <= 0:
        raise ValueError("train on something: soft_weight (KL) or hard_weight (cross-entropy) above 0")
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
        logits = tail_logits(student, batch, dev)
        loss = hard_weight * answer_loss(logits, batch) if hard_weight else logits.new_zeros(())
        if soft_weight:
            with torch.no_grad():
                target = tail_logits(teacher, batch, dev)
            loss = loss + soft_weight * kd_loss(logits, target, None, temperature)
        return loss

    train_steps(batches, loss_of, opt, run, dev)
    student.eval()
    for p in student.parameters():
        p.requires_grad_(False)
    return run


def shared_max_diff(student: Any, teacher: Any, layers: Sequence[int], trained: int) -> float:
    """Largest absolute difference between the student's tensors and the teacher's they were copied from
    (student layer ``j`` is teacher layer ``layers[j]``), leaving out the student's last ``trained``
    layers (those distillation updated): 0 exactly when the cut and the freezing are right."""
    teacher_sd = teacher.state_dict()
    moved = {f"layers.{j}." for j in range(len(layers) - trained, len(layers))}
    worst = 0.0
    for k, w in student.state_dict().items():
        m = re.search(r"layers\.(\d+)\.", k)
        if m and m.group(0) in moved:
            continue
        src = k if m is None else k.replace(m.group(0), f"layers.{layers[int(m.group(1))]}.", 1)
        worst = max(worst, (w - teacher_sd[src]).abs().max().item())
    return worst
