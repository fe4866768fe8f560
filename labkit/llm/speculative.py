"""Speculative decoding from scratch on a transformers causal LM (chapter 06b, "Speculative decoding").

A cheap *drafter* proposes ``k`` tokens; the *target* model scores the last accepted token plus all
``k`` drafts in ONE forward pass through its KV cache (a ``DynamicCache``), and keeps the longest
prefix the standard rule accepts, plus one token of its own:

* greedy (``temperature == 0``): accept while the draft equals the target's argmax, then emit the
  target's argmax at the first mismatch (or a bonus token after ``k`` matches): the output is
  token-identical to plain greedy decoding.
* sampling: accept draft ``x`` with probability ``min(1, p(x) / q(x))`` (``p`` target, ``q`` drafter);
  on rejection draw from ``normalize(max(0, p - q))``; after ``k`` acceptances draw a bonus token
  from ``p``. Every emitted token then follows ``p`` exactly (Leviathan et al., 2023).

Rejected drafts are dropped from the cache with ``cache.crop(-n)`` (transformers 5 crops by a
negative count of tokens to remove). Drafters: :class:`PromptLookupDrafter` (copy what followed
the last n-gram earlier in the text; ``q`` is one-hot) and :class:`EarlyExitDrafter` (the model's
first ``L`` layers, its final norm and LM head: LayerSkip-style self-speculation, no second model).
:func:`expected_tokens_per_pass` and :func:`expected_speedup` are the paper's model;
:func:`roofline_verify_ratio` says, from chapter 04's roofline, what a verify pass costs at batch b,
and :func:`roofline_speedup` what speedup that leaves.
Units: seconds, tokens, FLOP/s, bytes, bytes/s.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, cast

import torch
from transformers import DynamicCache
from transformers.masking_utils import create_causal_mask

from ..hardware.machine import synchronize
from ..hardware.roofline import forward_flops
from .sampling import probabilities

TASKS = {
    "copy": "Repeat the following paragraph word for word, but write 'guardian' instead of 'keeper':\n\n"
            "The old lighthouse stood at the edge of the cliff for more than a century. Every night its "
            "keeper climbed the narrow stairs, trimmed the wick and watched the beam sweep across the dark "
            "water, warning ships away from the rocks below.",
    "open": "What are three good habits for staying healthy?",
    "code": "Rename the variable total to subtotal in this Python function and show the whole function:\n\n"
            "def price(items):\n    total = 0\n    for item in items:\n        total += item.cost\n"
            "    return total\n",
    "facts": "Name the planets of the solar system in order from the Sun.",
}
"""Chapter 06's prompts: two that an answer mostly copies (a paragraph rewrite, a code edit: drafts
can be looked up in the prompt) and two open ones (a question, a list of facts: nothing to copy)."""


@dataclass
class SpecStats:
    """Counters of one generation: tokens emitted, target forward passes (prefill excluded), draft
    tokens proposed / accepted, passes that ended in a rejection, and seconds (wall, drafting, verifying)."""

    new_tokens: int = 0
    target_passes: int = 0
    drafted: int = 0
    accepted: int = 0
    rejections: int = 0
    wall_s: float = 0.0
    draft_s: float = 0.0
    verify_s: float = 0.0

    @property
    def acceptance_rate(self) -> float:
        """Accepted ÷ proposed draft tokens (drafts after a rejection count as not accepted)."""
        return self.accepted / self.drafted if self.drafted else float("nan")

    @property
    def alpha(self) -> float:
        """Per-token acceptance α of the paper's i.i.d. model, estimated as accepted ÷ judged tokens
        (judged = accepted + rejections; drafts after a rejection were never judged)."""
        judged = self.accepted + self.rejections
        return self.accepted / judged if judged else float("nan")

    @property
    def decode_s_per_token(self) -> float:
        """Seconds of drafting + verifying per emitted token (the prompt's prefill excluded)."""
        return (self.draft_s + self.verify_s) / self.new_tokens if self.new_tokens else float("nan")

    @property
    def tokens_per_pass(self) -> float:
        """Emitted tokens per target forward pass (plain decoding: 1.0)."""
        return self.new_tokens / self.target_passes if self.target_passes else float("nan")


class PromptLookupDrafter:
    """Prompt lookup (n-gram) drafting: find the sequence's last ``n``-gram earlier in the sequence
    (``n`` from ``max_ngram`` down to ``min_ngram``, most recent match first) and propose the tokens
    that followed it. No model, no cost worth measuring; ``q`` is one-hot on the proposal."""

    def __init__(self, max_ngram: int = 3, min_ngram: int = 1):
        self.max_ngram, self.min_ngram = max_ngram, min_ngram

    def propose(self, ids: Sequence[int], k: int, temperature: float = 0.0,
                generator: torch.Generator | None = None) -> tuple[list[int], torch.Tensor | None]:
        """Up to ``k`` proposed token ids (maybe none) and ``None`` for q (one-hot)."""
        ids = list(ids)
        for n in range(min(self.max_ngram, len(ids) - 1), self.min_ngram - 1, -1):
            tail = ids[-n:]
            for start in range(len(ids) - n - 1, -1, -1):
                if ids[start:start + n] == tail:
                    return ids[start + n:start + n + k], None
        return [], None


class EarlyExitDrafter:
    """Self-speculative drafter: the target's own embedding, first ``layers`` decoder layers, final
    norm and LM head (LayerSkip-style early exit), with its own small KV cache that follows the
    accepted text. Costs about ``layers / num_hidden_layers`` of a pass plus the LM head."""

    def __init__(self, model: Any, layers: int):
        n = model.config.num_hidden_layers
        if not 1 <= layers < n:
            raise ValueError(f"layers must be in [1, {n - 1}] for a {n}-layer model, got {layers}")
        kinds = set((getattr(model.config, "layer_types", None) or ["full_attention"])[:layers])
        if kinds != {"full_attention"}:
            raise NotImplementedError(f"early exit here builds full causal masks only; layers are {kinds}")
        self.model, self.layers = model, layers
        self.cache, self.seen = DynamicCache(), cast(list[int], [])

    def forward(self, ids: Sequence[int]) -> torch.Tensor:
        """Logits (vocab,) after feeding ``ids`` on top of the drafter's cache."""
        m = self.model.model
        x = m.embed_tokens(torch.tensor([list(ids)], device=self.model.device))
        past = self.cache.get_seq_length()
        pos = torch.arange(past, past + x.shape[1], device=x.device).unsqueeze(0)
        mask = create_causal_mask(config=m.config, inputs_embeds=x, attention_mask=None, cache=self.cache,
                                  position_ids=pos)
        pe = m.rotary_emb(x, position_ids=pos)
        for layer in m.layers[: self.layers]:
            x = layer(x, attention_mask=mask, position_embeddings=pe, position_ids=pos, cache=self.cache,
                      use_cache=True)
        self.seen += list(ids)
        return self.model.lm_head(m.norm(x[:, -1]))[0].float()

    @torch.inference_mode()
    def propose(self, ids: Sequence[int], k: int, temperature: float = 0.0,
                generator: torch.Generator | None = None) -> tuple[list[int], torch.Tensor | None]:
        """``k`` drafted ids and their draft distributions q (k, vocab), or ``None`` when greedy."""
        ids = list(ids)
        keep = 0
        while keep < min(len(self.seen), len(ids) - 1) and self.seen[keep] == ids[keep]:
            keep += 1
        if len(self.seen) > keep:  # roll back drafts the target rejected
            self.cache.crop(keep - len(self.seen))
            self.seen = self.seen[:keep]
        logits = self.forward(ids[keep:])
        drafts, qs = [], []
        for i in range(k):
            if temperature == 0:
                tok = int(logits.argmax())
            else:
                q = probabilities(logits, temperature)
                tok = int(torch.multinomial(q, 1, generator=generator))
                qs.append(q)
            drafts.append(tok)
            if i < k - 1:
                logits = self.forward([tok])
        return drafts, (torch.stack(qs) if qs else None)


def accept_greedy(drafts: Sequence, target: Sequence) -> tuple[int, Any]:
    """The greedy acceptance rule: ``target[i]`` is the target's argmax after the first ``i`` drafts
    (``len(drafts) + 1`` entries). Returns ``(m, token)``: the first ``m`` drafts equal the target's
    picks and are kept, and ``token = target[m]`` follows them (the target's own token where it
    disagreed, or a bonus token after ``k`` matches). Works on any comparable tokens (ids or words)."""
    m = 0
    while m < len(drafts) and drafts[m] == target[m]:
        m += 1
    return m, target[m]


def accept_sampled(drafts: Sequence[int], p: torch.Tensor, q: torch.Tensor | None,
                   generator: torch.Generator | None = None) -> tuple[int, int]:
    """The sampling acceptance rule. ``p``: target distributions (len(drafts) + 1, vocab); ``q``:
    draft distributions (len(drafts), vocab) or ``None`` for one-hot drafts. Returns ``(m, token)``:
    the first ``m`` drafts are accepted and ``token`` follows them (residual draw or bonus)."""
    for i, x in enumerate(drafts):
        qx = 1.0 if q is None else float(q[i, x])
        if float(torch.rand((), generator=generator)) * qx < float(p[i, x]):  # u < p/q, without dividing
            continue
        if q is None:
            residual = p[i].clone()
            residual[x] = 0.0
        else:
            residual = (p[i] - q[i]).clamp_min(0.0)
        if float(residual.sum()) <= 0:
            residual = p[i]
        return i, int(torch.multinomial(residual / residual.sum(), 1, generator=generator))
    n = len(drafts)
    return n, int(torch.multinomial(p[n], 1, generator=generator))


@torch.inference_mode()
def prefill(model: Any, prompt_ids: Sequence[int]) -> DynamicCache:
    """The KV cache :func:`speculative_generate` starts from: every token of ``prompt_ids`` but the
    last (which is fed with the first drafts). Pass it as ``cache`` to share one prefill among runs
    on the same prompt (the prefill is outside the timed decode anyway)."""
    cache = DynamicCache(config=model.config)
    if len(prompt_ids) > 1:
        ids = torch.tensor([list(prompt_ids)[:-1]], device=model.device)
        model(input_ids=ids, cache=cache, use_cache=True, logits_to_keep=1)
    return cache


@torch.inference_mode()
def speculative_generate(model: Any, prompt_ids: Sequence[int], drafter: Any = None, k: int = 4,
                         max_new_tokens: int = 32,
                         temperature: float = 0.0, generator: torch.Generator | None = None,
                         eos_token_id: int | None = None, cache: DynamicCache | None = None
                         ) -> tuple[list[int], SpecStats]:
    """Generate up to ``max_new_tokens`` after ``prompt_ids`` (batch 1) with ``drafter`` proposing
    ``k`` tokens per target pass; ``drafter=None`` is plain decoding (one token per pass) through the
    same code. ``cache``: :func:`prefill` of ``prompt_ids``, cut back to it on return so that the next
    run can start from it too (default: a prefill of its own). Returns ``(new token ids, SpecStats)``."""
    dev = model.device
    ids, out, st = list(prompt_ids), cast(list[int], []), SpecStats()
    synchronize(str(dev))
    t_start = time.perf_counter()
    kept = max(len(ids) - 1, 0)
    if cache is None:
        cache = prefill(model, ids)
    elif cache.get_seq_length() != kept:
        raise ValueError(f"the cache holds {cache.get_seq_length()} tokens, a prefill of this prompt {kept}: "
                         "pass prefill(model, prompt_ids)")
    try:
        _decode(model, ids, out, st, cache, drafter, k, max_new_tokens, temperature, generator, eos_token_id)
    finally:
        if cache.get_seq_length() > kept:
            cache.crop(kept - cache.get_seq_length())  # back to the prompt, for the next run
    out = out[:max_new_tokens]
    st.new_tokens = len(out)
    synchronize(str(dev))
    st.wall_s = time.perf_counter() - t_start
    return out, st


def _decode(model: Any, ids: list[int], out: list[int], st: SpecStats, cache: DynamicCache, drafter: Any,
            k: int,
            max_new_tokens: int, temperature: float, generator: torch.Generator | None,
            eos_token_id: int | None) -> None:
    """:func:`speculative_generate`'s loop: extends ``ids`` and ``out``, counts into ``st``."""
    dev = model.device
    while len(out) < max_new_tokens:
        kk = min(k, max_new_tokens - len(out) - 1) if drafter is not None else 0
        t0 = time.perf_counter()
        drafts, q = drafter.propose(ids, kk, temperature, generator) if kk > 0 else ([], None)
        drafts = drafts[:kk]
        synchronize(str(dev))
        t1 = time.perf_counter()
        logits = model(input_ids=torch.tensor([[ids[-1], *drafts]], device=dev), cache=cache,
                       use_cache=True).logits[0].float()
        if temperature == 0:
            m, token = accept_greedy(drafts, logits.argmax(-1).tolist())
        else:
            m, token = accept_sampled(drafts, probabilities(logits, temperature), q, generator)
        synchronize(str(dev))
        st.draft_s += t1 - t0
        st.verify_s += time.perf_counter() - t1
        cache.crop(m - len(drafts))  # drop the rejected drafts' keys and values (no-op when all kept)
        st.target_passes += 1
        st.drafted += len(drafts)
        st.accepted += m
        st.rejections += m < len(drafts)
        new = drafts[:m] + [token]
        if eos_token_id is not None and eos_token_id in new:
            new = new[: new.index(eos_token_id) + 1]
        ids += new
        out += new
        if eos_token_id is not None and out[-1] == eos_token_id:
            break


def expected_tokens_per_pass(alpha: float, k: int) -> float:
    """Expected tokens emitted per target pass when each draft token is accepted independently with
    probability ``alpha``: (1 − α^(k+1)) / (1 − α); k + 1 at α = 1 (Leviathan et al., eq. 1)."""
    if alpha >= 1.0:
        return float(k + 1)
    return (1.0 - alpha ** (k + 1)) / (1.0 - alpha)


def expected_speedup(alpha: float, k: int, c: float, verify_cost: float = 1.0) -> float:
    """Expected wall-time speedup over plain decoding: tokens per pass ÷ (k·c + verify_cost), with
    ``c`` = one draft step's time ÷ one target decode step's, and ``verify_cost`` = a (k+1)-token
    verify pass's time ÷ a 1-token pass's (1 in the paper: verification assumed free)."""
    return expected_tokens_per_pass(alpha, k) / (k * c + verify_cost)


def roofline_pass_seconds(params: float, weight_bytes: float, tokens: int, peak_flops: float,
                          bandwidth_bytes_per_s: float, kv_bytes: float = 0.0) -> float:
    """Roofline time (seconds) of one forward pass over ``tokens`` tokens (all sequences of the
    batch together): max(2·params·tokens ÷ peak FLOP/s, (weights + KV bytes) ÷ bandwidth)."""
    return max(forward_flops(params, tokens) / peak_flops, (weight_bytes + kv_bytes) / bandwidth_bytes_per_s)


def roofline_verify_ratio(params: float, weight_bytes: float, batch: int, k: int, peak_flops: float,
                          bandwidth_bytes_per_s: float, kv_bytes_per_seq: float = 0.0) -> float:
    """Time of a verify pass over batch·(k+1) tokens ÷ a plain decode pass over batch tokens, from the
    roofline: 1.0 while batch·(k+1) stays left of the ridge point (memory-bound: the extra tokens are
    free), up to k+1 once both passes are compute-bound."""
    kv = batch * kv_bytes_per_seq
    bw = bandwidth_bytes_per_s
    verify = roofline_pass_seconds(params, weight_bytes, batch * (k + 1), peak_flops, bw, kv)
    plain = roofline_pass_seconds(params, weight_bytes, batch, peak_flops, bw, kv)
    return verify / plain


def roofline_speedup(alpha: float, k: int, batch: int, params: float, weight_bytes: float, peak_flops: float,
                     bandwidth_bytes_per_s: float, c: float = 0.0) -> float:
    """:func:`expected_speedup` at batch ``batch`` with the verify cost from the roofline
    (:func:`roofline_verify_ratio`, weights only): what speculation leaves on a given device."""
    verify = roofline_verify_ratio(params, weight_bytes, batch, k, peak_flops, bandwidth_bytes_per_s)
    return expected_speedup(alpha, k, c, verify)
