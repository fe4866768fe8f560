"""LoRA fine-tuning on a domain's training split, sized for a CPU (chapter 02b, "Choosing a model":
fine-tuning adjusts a pre-trained model's weights on your data, same architecture).

:func:`sft_batches` turns ``{"prompt", "answer"}`` items into padded token batches whose labels
cover the answer (and the newline that ends it) only; :func:`lora_finetune` wraps a causal LM with
``peft`` low-rank adapters (rank ``rank`` on every attention and MLP projection) and trains them with
AdamW (constant learning rate) in a fixed data order, optionally scoring ``checkpoints`` on a dev split
and keeping the best (the checkpoint after ``s`` steps is exactly what a run of ``s`` steps makes, so this
is a choice of the number of steps); :func:`merge` folds the adapters back into the weights
(``merge_and_unload``), leaving a model of the original architecture and parameter count. Times are
seconds.
"""

from __future__ import annotations

import functools
import random
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from ..hardware import microbench

TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
IGNORE = -100  # label of a position the loss skips (prompt and padding)


@dataclass
class TrainRun:
    """What one training run did: ``losses`` (per step), ``seconds`` (wall time of the training steps,
    checkpoint scoring left out), ``steps``, ``examples`` (items seen, repeats included), ``trainable``
    (parameters updated), ``checkpoints`` (step -> its dev score, when scored) and ``chosen`` (the step
    whose weights the model kept)."""

    losses: list[float] = field(default_factory=list)
    seconds: float = 0.0
    steps: int = 0
    examples: int = 0
    trainable: int = 0
    checkpoints: dict[int, float] = field(default_factory=dict)
    chosen: int = 0


def sft_batches(tok: Any, items: Sequence[dict[str, Any]], batch_size: int, steps: int, seed: int = 0
                ) -> list[dict[str, torch.Tensor]]:
    """``steps`` batches of ``batch_size`` items (shuffled with ``seed``, cycling through ``items``),
    **left**-padded so every answer ends at the last position: ``input_ids``, ``attention_mask``,
    ``position_ids`` (counting from each row's first real token), ``labels`` (the ids on the answer's
    tokens, ``" " + answer + "\\n"``, :data:`IGNORE` elsewhere) and ``keep`` (how many final positions
    need logits: the longest answer plus one)."""
    if not items or batch_size < 1 or steps < 1:
        raise ValueError("need items, batch_size >= 1 and steps >= 1")
    order: list[int] = []
    rng = random.Random(seed)
    while len(order) < batch_size * steps:
        block = list(range(len(items)))
        rng.shuffle(block)
        order += block
    pad = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
    out = []
    for s in range(steps):
        seqs = []
        for i in order[s * batch_size:(s + 1) * batch_size]:
            p = tok(items[i]["prompt"], add_special_tokens=False)["input_ids"]
            a = tok(" " + items[i]["answer"] + "\n", add_special_tokens=False)["input_ids"]
            seqs.append((p + a, [IGNORE] * len(p) + a, len(a)))
        width = max(len(ids) for ids, _, _ in seqs)
        ids = torch.full((len(seqs), width), pad)
        labels = torch.full((len(seqs), width), IGNORE)
        mask = torch.zeros((len(seqs), width), dtype=torch.long)
        for r, (x, y, _) in enumerate(seqs):
            ids[r, width - len(x):], labels[r, width - len(y):] = torch.tensor(x), torch.tensor(y)
            mask[r, width - len(x):] = 1
        out.append({"input_ids": ids, "attention_mask": mask, "labels": labels,
                    "position_ids": (mask.cumsum(-1) - 1).clamp_min(0),
                    "keep": torch.tensor(max(n for _, _, n in seqs) + 1)})
    return out


def tail_logits(model: Any, batch: dict[str, torch.Tensor], device: Any = "cpu") -> torch.Tensor:
    """Logits ``(batch, keep, vocab)`` of the last ``batch["keep"]`` positions of a :func:`sft_batches`
    batch (the only ones the answer loss needs: the head's matmul over the prompt is skipped)."""
    return model(input_ids=batch["input_ids"].to(device), attention_mask=batch["attention_mask"].to(device),
                 position_ids=batch["position_ids"].to(device), logits_to_keep=int(batch["keep"])).logits


def answer_loss(logits: torch.Tensor, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """Mean cross-entropy of the answer tokens given :func:`tail_logits` (position t predicts t + 1)."""
    keep = int(batch["keep"])
    target = batch["labels"][:, -keep + 1:].to(logits.device)
    return torch.nn.functional.cross_entropy(logits[:, :-1].flatten(0, 1).float(), target.flatten(),
                                             ignore_index=IGNORE)


def param_count(model: Any) -> int:
    """Parameters of ``model``, each tensor counted once (a tied head is the embedding)."""
    seen, n = set(), 0
    for p in model.parameters():
        if p.data_ptr() not in seen:
            seen.add(p.data_ptr())
            n += p.numel()
    return n


Batch = dict[str, torch.Tensor]


def train_steps(batches: Sequence[Batch], loss_of: Callable[[Batch], torch.Tensor],
                opt: torch.optim.Optimizer, run: TrainRun, device: Any,
                on_step: Callable[[int], None] | None = None) -> TrainRun:
    """One optimizer step per batch on ``loss_of(batch)``, the loop LoRA fine-tuning and distillation
    (chapter 02b) share: each loss, step and example goes into ``run``, and ``run.seconds`` adds up the
    steps' times (:func:`labkit.hardware.microbench.timed`, seconds). ``on_step(steps done)`` runs after
    each step, untimed."""
    def step(batch: Batch) -> float:
        loss = loss_of(batch)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return float(loss.detach())

    for batch in batches:
        loss, seconds = microbench.timed(functools.partial(step, batch), str(device).split(":")[0])
        run.losses.append(loss)
        run.seconds += seconds
        run.steps += 1
        run.examples += int(batch["input_ids"].shape[0])
        if on_step is not None:
            on_step(run.steps)
    return run


def lora_finetune(model: Any, batches: Sequence[dict[str, torch.Tensor]], rank: int = 8, alpha: int = 16,
                  lr: float = 2e-3, top_layers: int | None = None, targets: Sequence[str] = TARGETS,
                  seed: int = 0, checkpoints: Sequence[int] = (),
                  judge: Callable[[Any], float] | None = None) -> tuple[Any, TrainRun]:
    """Train LoRA adapters on ``model`` (changed in place: peft injects the adapters) over ``batches``
    of :func:`sft_batches` (one optimizer step each, :func:`answer_loss`), AdamW at learning rate ``lr``.
    ``top_layers``: adapt only the last that many decoder layers (the backward pass then stops there:
    cheaper on a CPU); ``None`` adapts all. With ``checkpoints`` (step counts) and ``judge`` (model ->
    a score on a dev split, higher better), training stops at the last checkpoint, each checkpoint is
    scored, and the adapters of the best one (the earliest of equals) are kept. Returns ``(peft model,
    TrainRun)``, the model in eval mode."""
    from peft import LoraConfig, get_peft_model

    torch.manual_seed(seed)
    n = model.config.num_hidden_layers
    layers = None if top_layers is None else list(range(max(n - top_layers, 0), n))
    config = LoraConfig(r=rank, lora_alpha=alpha, lora_dropout=0.0, target_modules=list(targets),
                        layers_to_transform=layers, task_type="CAUSAL_LM")
    with warnings.catch_warnings():
        # peft 0.21 reads transformers' deprecated ``is_gradient_checkpointing`` alias while wrapping the
        # model; nothing here checkpoints activations, and the FutureWarning is about peft's code, not ours
        warnings.filterwarnings("ignore", message=".*is_gradient_checkpointing.*", category=FutureWarning)
        peft_model = get_peft_model(model, config)
    params = {k: p for k, p in peft_model.named_parameters() if p.requires_grad}
    opt = torch.optim.AdamW(params.values(), lr=lr, weight_decay=0.0)
    run = TrainRun(trainable=sum(p.numel() for p in params.values()))
    dev = next(peft_model.parameters()).device
    saved: dict[int, dict[str, torch.Tensor]] = {}

    def checkpoint(step: int) -> None:
        if judge is not None and step in checkpoints:
            peft_model.eval()
            run.checkpoints[step] = judge(peft_model)
            saved[step] = {k: p.detach().clone() for k, p in params.items()}
            peft_model.train()

    stop = max(checkpoints) if checkpoints and judge is not None else len(batches)
    peft_model.train()
    train_steps(batches[:stop], lambda b: answer_loss(tail_logits(peft_model, b, dev), b), opt, run, dev,
                checkpoint)
    run.chosen = run.steps
    if run.checkpoints:
        run.chosen = max(run.checkpoints, key=lambda s: (run.checkpoints[s], -s))
        with torch.no_grad():
            for k, p in params.items():
                p.copy_(saved[run.chosen][k])
    peft_model.eval()
    return peft_model, run


def merge(peft_model: Any) -> Any:
    """The base model with the adapters folded into its weights (``W + B A * alpha / r``), adapters
    removed: the original architecture and parameter count, in eval mode."""
    return peft_model.merge_and_unload().eval()
