"""How much a change to a model changed its output (chapter 06, "Quantization"): perplexity on a
text, the divergence of its next-token distributions from a reference model's, and whether it
continues prompts with the same greedy tokens.

Perplexity is exp(mean negative log-likelihood per predicted token), scored in non-overlapping
windows of ``window`` tokens (each window starts without context, so it is a little higher than a
sliding-window score). Texts ship in ``data/texts`` (see its README).
"""

from __future__ import annotations

import math

import torch

from ..models import chat_ids
from ..paths import data


def load_text(name: str = "heldout") -> str:
    """``data/texts/<name>.txt`` (``heldout`` or ``calibration``)."""
    return data("texts", f"{name}.txt").read_text()


def token_windows(tok, text: str, window: int = 256, n_windows: int | None = None) -> torch.Tensor:
    """Token ids of ``text`` cut into ``(n, window)`` non-overlapping windows (the remainder is
    dropped; ``n_windows`` caps n)."""
    ids = tok(text, return_tensors="pt").input_ids[0]
    n = ids.numel() // window if n_windows is None else min(n_windows, ids.numel() // window)
    if n < 1:
        raise ValueError(f"text has {ids.numel()} tokens, fewer than one window of {window}")
    return ids[: n * window].view(n, window)


@torch.inference_mode()
def window_logits(model, ids: torch.Tensor, batch_tokens: int | None = None) -> torch.Tensor:
    """Logits ``(n, window, vocab)`` in float32 for each window of ``ids``: one window per forward
    pass, or as many as fit ``batch_tokens`` tokens per pass (fewer passes: the fixed cost of each,
    such as a dequantizing layer rebuilding its weight, is paid less often; 16-bit kernels then round
    a little differently than one window at a time)."""
    dev = next(model.parameters()).device
    step = max(1, (batch_tokens or 0) // ids.shape[1])
    return torch.cat([model(ids[i:i + step].to(dev)).logits.float().cpu() for i in range(0, len(ids), step)])


def perplexity_from_logits(logits: torch.Tensor, ids: torch.Tensor) -> dict:
    """``{"ppl", "nll" (nats per token), "tokens"}`` of next-token predictions ``logits[:, :-1]``
    scored against ``ids[:, 1:]``."""
    nll = torch.nn.functional.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]),
                                            ids[:, 1:].reshape(-1).to(logits.device))
    return {"ppl": math.exp(float(nll)), "nll": float(nll), "tokens": int(ids[:, 1:].numel())}


def window_perplexities(logits: torch.Tensor, ids: torch.Tensor) -> list[float]:
    """Perplexity of each window on its own (same scoring as :func:`perplexity_from_logits`), for a
    spread over windows (:func:`labkit.stats.median_interval`) or a paired comparison of two models
    window by window (:func:`labkit.stats.ratio_interval`)."""
    nll = torch.nn.functional.cross_entropy(logits[:, :-1].transpose(1, 2), ids[:, 1:].to(logits.device),
                                            reduction="none").mean(1)
    return [math.exp(float(v)) for v in nll]


def perplexity(model, ids: torch.Tensor) -> dict:
    """Perplexity of ``model`` on windows ``ids`` ``(n, window)`` (see :func:`token_windows`)."""
    return perplexity_from_logits(window_logits(model, ids), ids)


def divergence(ref_logits: torch.Tensor, logits: torch.Tensor) -> dict:
    """How far ``logits`` are from ``ref_logits`` (same shape): ``{"kl"`` mean KL(ref || other) in
    nats per position, ``"top1"`` fraction of positions with the same argmax, ``"kl_per_pos"``
    KL averaged over windows, by position}``."""
    p = torch.log_softmax(ref_logits.float(), -1)
    q = torch.log_softmax(logits.float(), -1)
    kl = (p.exp() * (p - q)).sum(-1)
    return {"kl": float(kl.mean()), "top1": float((p.argmax(-1) == q.argmax(-1)).float().mean()),
            "kl_per_pos": kl.mean(0)}


@torch.inference_mode()
def greedy_continuations(model, tok, prompts: list[str], max_new_tokens: int = 16) -> list[torch.Tensor]:
    """Each prompt (chat-formatted when the tokenizer has a template) followed by ``max_new_tokens``
    greedy tokens (exactly that many: end-of-sequence is ignored), as 1-D id tensors."""
    dev = next(model.parameters()).device
    out = []
    for prompt in prompts:
        ids = torch.tensor([chat_ids(tok, prompt)], device=dev)
        gen = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_new_tokens,
                             min_new_tokens=max_new_tokens, do_sample=False,
                             pad_token_id=tok.eos_token_id if tok.pad_token_id is None else tok.pad_token_id)
        out.append(torch.cat([ids[0].cpu(), gen[0, ids.shape[1]:].cpu()]))
    return out


@torch.inference_mode()
def greedy_agreement(model, sequences: list[torch.Tensor], n_new: int) -> dict:
    """How closely ``model`` follows reference greedy continuations ``sequences`` (from
    :func:`greedy_continuations`, last ``n_new`` tokens generated): ``{"top1"`` fraction of those
    tokens that ``model``'s own argmax predicts given the reference prefix (one forward pass per
    sequence), ``"prefix"`` mean fraction generated before the first disagreement, i.e. how much of
    its own greedy output would be identical}``."""
    dev = next(model.parameters()).device
    hits, prefix = 0, 0.0
    for seq in sequences:
        pred = model(seq[None].to(dev)).logits[0, -n_new - 1:-1].argmax(-1).cpu()
        same = pred == seq[-n_new:]
        hits += int(same.sum())
        prefix += (int(same.int().cumprod(0).sum())) / n_new
    return {"top1": hits / (n_new * len(sequences)), "prefix": prefix / len(sequences)}
