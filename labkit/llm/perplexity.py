"""How much a change to a model changed its output (chapter 06, "Quantization"): perplexity on a
text, the divergence of its next-token distributions from a reference model's, and whether it
continues prompts with the same greedy tokens.

Perplexity is exp(mean negative log-likelihood per predicted token). The chapter scores the whole
held-out text with a strided sliding window (:func:`sliding_windows`, :func:`sliding_logits`): windows
of ``window`` tokens start every ``stride`` tokens, and each token is scored once, in the window that
gives it the most context, so every prediction past the first window sees at least
``window - stride`` tokens before it. Its interval is a cluster bootstrap over the text's paragraphs
(:func:`paragraph_groups`, :func:`ppl_interval`, :func:`ppl_ratio_interval`: two models compared on
the same tokens, paired). :func:`token_windows` cuts non-overlapping windows (each starts without
context, so it scores a little higher), used by the risk ladder and the benchmarks. Texts ship in
``data/texts`` (see its README).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch

from ..models import chat_ids
from ..paths import data
from ..stats import paired_bootstrap


def load_text(name: str = "heldout") -> str:
    """``data/texts/<name>.txt``: ``heldout``, ``calibration`` or ``calibration_more`` (see its README)."""
    return data("texts", f"{name}.txt").read_text()


def token_windows(tok: Any, text: str, window: int = 256, n_windows: int | None = None) -> torch.Tensor:
    """Token ids of ``text`` cut into ``(n, window)`` non-overlapping windows (the remainder is
    dropped; ``n_windows`` caps n)."""
    ids = tok(text, return_tensors="pt").input_ids[0]
    n = ids.numel() // window if n_windows is None else min(n_windows, ids.numel() // window)
    if n < 1:
        raise ValueError(f"text has {ids.numel()} tokens, fewer than one window of {window}")
    return ids[: n * window].view(n, window)


@torch.inference_mode()
def window_logits(model: Any, ids: torch.Tensor, batch_tokens: int | None = None) -> torch.Tensor:
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


@dataclass(frozen=True)
class Sliding:
    """A text cut for strided sliding-window scoring (:func:`sliding_windows`): ``ids`` all its token ids
    ``(N,)``; ``windows`` ``(n, window)``; ``starts[i]`` where window i begins in ``ids``; ``first[i]``
    the first position of window i whose prediction is scored (predictions are scored once each, in
    text order, so positions ``first[i]..window-2`` of window i predict ``ids[starts[i]+first[i]+1 ...]``)."""

    ids: torch.Tensor
    windows: torch.Tensor
    starts: tuple[int, ...]
    first: tuple[int, ...]

    @property
    def shape(self) -> tuple[int, int]:
        """``(windows, window length)``, as for a tensor of windows."""
        return (self.windows.shape[0], self.windows.shape[1])

    def numel(self) -> int:
        """Tokens scored: every token of the text but the first."""
        return int(self.ids.numel()) - 1


def sliding_windows(ids: torch.Tensor, window: int = 1024, stride: int = 512) -> Sliding:
    """Windows of ``window`` tokens of ``ids`` (1-D) starting every ``stride`` tokens, the last one moved
    back to end with the text (so all have one length and batch together); each predicted token is
    scored in the first window that reaches it after the previous window's scored part, so a
    prediction beyond the first window has at least ``window - stride`` tokens of context. A text no
    longer than ``window`` is one window. ``ValueError`` unless ``0 < stride <= window``."""
    ids = ids.flatten()
    n = int(ids.numel())
    if not 0 < stride <= window:
        raise ValueError(f"need 0 < stride <= window, got stride {stride}, window {window}")
    if n < 2:
        raise ValueError(f"text has {n} tokens: nothing to predict")
    w = min(window, n)
    starts, first, done = [0], [0], w  # done: ids[1:done] are predicted by the windows so far
    while done < n:
        s = min(starts[-1] + stride, n - w)
        starts.append(s)
        first.append(done - 1 - s)  # position predicting ids[done]
        done = s + w
    return Sliding(ids, torch.stack([ids[s:s + w] for s in starts]), tuple(starts), tuple(first))


@torch.inference_mode()
def sliding_logits(model: Any, sw: Sliding, batch_tokens: int | None = None) -> torch.Tensor:
    """Float32 logits ``(N - 1, vocab)`` predicting ``sw.ids[1:]``, each from the window of ``sw`` that
    scores it (:func:`window_logits` on the windows, ``batch_tokens`` per pass)."""
    logits = window_logits(model, sw.windows, batch_tokens)
    return torch.cat([logits[i, f:-1] for i, f in enumerate(sw.first)])


def token_nll(logits: torch.Tensor, ids: torch.Tensor, log_probs: bool = False) -> torch.Tensor:
    """Negative log-likelihood (nats) of each predicted token, as a float64 1-D tensor: of ``ids[1:]``
    under ``logits`` ``(N - 1, vocab)`` (:func:`sliding_logits`, ``ids`` 1-D), or of every window's
    ``ids[:, 1:]`` under ``logits[:, :-1]`` (windows ``(n, window)``, :func:`window_logits`).
    ``log_probs``: ``logits`` are log-probabilities already (``log_softmax`` applied)."""
    if ids.dim() == 2:
        logits, ids = logits[:, :-1].reshape(-1, logits.shape[-1]), ids[:, 1:].reshape(-1)
    else:
        ids = ids[1:]
    ids = ids.to(logits.device)
    if log_probs:
        return -logits.gather(1, ids[:, None])[:, 0].double()
    return torch.nn.functional.cross_entropy(logits, ids, reduction="none").double()


def paragraph_groups(tok: Any, text: str) -> list[int]:
    """For each token of ``text`` (as ``tok`` encodes it), the index of the paragraph (blocks separated
    by a blank line) it starts in: the clusters :func:`ppl_interval` resamples. Needs a fast tokenizer
    (character offsets)."""
    offsets = tok(text, return_offsets_mapping=True)["offset_mapping"]
    breaks, at = [], text.find("\n\n")
    while at >= 0:
        breaks.append(at)
        at = text.find("\n\n", at + 2)
    return [sum(b < start for b in breaks) for start, _ in offsets]


def ppl_interval(nll: torch.Tensor, groups: list[int], confidence: float = 0.95) -> dict[str, float]:
    """Pooled perplexity ``exp(mean nll)`` of per-token ``nll`` with a percentile bootstrap interval that
    resamples whole ``groups`` (the paragraph of each scored token: tokens of one passage are not
    independent; :func:`paragraph_groups` of the whole text may be passed: the first token, never
    predicted, is then dropped). Returns ``ppl``, ``lo``, ``hi``, ``n`` (groups)."""
    x = nll.double().cpu().numpy()
    b = paired_bootstrap([0.0] * len(x), x, _scored(groups, len(x)), "diff", confidence)
    return {"ppl": math.exp(b["value"]), "lo": math.exp(b["lo"]), "hi": math.exp(b["hi"]), "n": b["n"]}


def ppl_ratio_interval(nll_ref: torch.Tensor, nll: torch.Tensor, groups: list[int],
                       confidence: float = 0.95) -> dict[str, float]:
    """Perplexity of ``nll`` over that of ``nll_ref`` (per-token NLL of two models on the same tokens):
    ``exp(mean nll - mean nll_ref)``, with a paired bootstrap interval that resamples whole ``groups``
    (:func:`labkit.stats.paired_bootstrap`, differences of mean NLL, exponentiated). Returns ``ratio``,
    ``lo``, ``hi``, ``n`` (groups)."""
    a, b_ = nll_ref.double().cpu().numpy(), nll.double().cpu().numpy()
    b = paired_bootstrap(a, b_, _scored(groups, len(a)), "diff", confidence)
    return {"ratio": math.exp(b["value"]), "lo": math.exp(b["lo"]), "hi": math.exp(b["hi"]), "n": b["n"]}


def _scored(groups: list[int], n: int) -> list[int]:
    return list(groups[1:]) if len(groups) == n + 1 else list(groups)


def perplexity(model: Any, ids: torch.Tensor) -> dict:
    """Perplexity of ``model`` on windows ``ids`` ``(n, window)`` (see :func:`token_windows`)."""
    return perplexity_from_logits(window_logits(model, ids), ids)


def divergence(ref_logits: torch.Tensor, logits: torch.Tensor, ref_logp: torch.Tensor | None = None) -> dict:
    """How far ``logits`` are from ``ref_logits`` (same shape): ``{"kl"`` mean KL(ref || other) in
    nats per position, ``"top1"`` fraction of positions with the same argmax, ``"kl_per_pos"``
    KL averaged over windows, by position, ``"kl_tokens"`` each position's KL (windows x
    positions)}``. ``ref_logp``: ``log_softmax(ref_logits)`` if already
    computed (a baseline compared with several models)."""
    return divergence_logp(torch.log_softmax(ref_logits.float(), -1) if ref_logp is None else ref_logp,
                           torch.log_softmax(logits.float(), -1))


def divergence_logp(p: torch.Tensor, q: torch.Tensor, ref: dict[str, torch.Tensor] | None = None) -> dict:
    """:func:`divergence` from log-probabilities ``p`` (reference) and ``q``. ``ref``: ``{"p": p.exp(),
    "p_logp": Σ p·log p, "top": p.argmax(-1)}`` when already computed (KL = Σ p log p − Σ p log q)."""
    if ref is None:
        probs = p.exp()
        ref = {"p": probs, "p_logp": torch.linalg.vecdot(probs, p), "top": p.argmax(-1)}
    kl = ref["p_logp"] - torch.linalg.vecdot(ref["p"], q)
    return {"kl": float(kl.mean()), "top1": float((ref["top"] == q.argmax(-1)).float().mean()),
            "kl_per_pos": kl.mean(0), "kl_tokens": kl}


@torch.inference_mode()
def greedy_continuations(model: Any, tok: Any, prompts: list[str],
                         max_new_tokens: int = 16) -> list[torch.Tensor]:
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
def greedy_agreement(model: Any, sequences: list[torch.Tensor], n_new: int) -> dict:
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
