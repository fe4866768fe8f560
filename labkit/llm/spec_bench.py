"""Measuring speculative decoding against plain decoding (chapter 06b, "Speculative decoding").

:func:`paired_rounds` measures speculation's speed-up: rounds of a plain and a speculative run of
:func:`labkit.llm.speculative.speculative_generate` of the same length, timed back to back in
alternating order, so a busy neighbour slows both alike and neither run is timed over fewer tokens
(a short run's per-token time is at the mercy of one slow moment); :func:`same_as_greedy` judges
whether a run's output is plain greedy's; :func:`runs_table` prints the prompt-lookup grid. For
the early-exit drafter, :func:`early_exit_agreement` reads the greedy acceptance of every exit
depth from one forward pass, and :func:`early_exit_step_times` times one draft step of each depth
against target passes over a few tokens (what verifying k guesses costs).
Units: seconds, tokens, fractions.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch
from transformers import DynamicCache

from ..hardware.microbench import interleaved_times
from .speculative import EarlyExitDrafter, SpecStats, speculative_generate


def paired_rounds(model: Any, prompt_ids: Sequence[int], drafter: Any, k: int, max_new_tokens: int,
                  rounds: int = 5, cache: DynamicCache | None = None) -> tuple[list[float], SpecStats]:
    """Speculation's speed-up at batch 1 from ``rounds`` paired rounds: each round times a plain greedy
    run and a speculative one (``drafter``, ``k`` guesses per pass) of the same ``max_new_tokens``
    tokens back to back, the plain one first in even rounds and second in odd ones (so neither always
    runs right after the other). Returns the per-round speed-ups (plain ÷ speculative decode seconds
    per token, prefill excluded; :func:`labkit.stats.median_interval` gives their median and
    interval) and the last speculative run's :class:`~labkit.llm.speculative.SpecStats` (greedy: every
    round emits the same tokens in the same passes)."""
    ratios, st = [], SpecStats()
    for r in range(rounds):
        runs = {}
        for name in (("plain", "spec") if r % 2 == 0 else ("spec", "plain")):
            d, kk = (None, 0) if name == "plain" else (drafter, k)
            runs[name] = speculative_generate(model, prompt_ids, d, k=kk, max_new_tokens=max_new_tokens,
                                              cache=cache)[1]
        st = runs["spec"]
        ratios.append(runs["plain"].decode_s_per_token / st.decode_s_per_token)
    return ratios, st


def same_as_greedy(model: Any, prompt_ids: Sequence[int], out: Sequence[int], greedy: Sequence[int],
                   exact: bool = True, near_tie: float = 0.5) -> tuple[bool, str]:
    """Is ``out`` plain greedy's text ``greedy`` (cut to ``len(out)``)? ``(verdict, note)``. With
    ``exact`` (float32), token for token. Otherwise (16-bit: a pass over k+1 tokens may round
    differently from a pass over 1 on a GPU) a difference is forgiven only where the target's top two
    logits were within ``near_tie``; the note then says where and by how much (else it is empty)."""
    ref = list(greedy[:len(out)])
    if list(out) == ref or exact:
        return list(out) == ref, ""
    j = next(i for i, (x, y) in enumerate(zip(out, ref, strict=True)) if x != y)
    with torch.inference_mode():
        logits = model(torch.tensor([list(prompt_ids) + ref[:j]], device=model.device)).logits[0, -1].float()
    top2 = logits.topk(2).values
    gap = float(top2[0] - top2[1])
    return gap < near_tie, f"differs from greedy at token {j}; top-2 logit gap there {gap:.3f}"


def runs_table(runs: list[dict[str, Any]]) -> str:
    """The prompt-lookup grid as text: one row per run (``task``, ``k``, ``temp``, ``st``
    (:class:`~labkit.llm.speculative.SpecStats`), ``same``: None when sampling). Counts only: speed
    comes from :func:`paired_rounds`."""
    lines = [f"{'task':5s} {'k':>2s} {'temp':>4s} {'tokens':>6s} {'passes':>6s} {'accept':>6s} {'alpha':>5s} "
             f"{'tok/pass':>8s}  identical to greedy"]
    for r in runs:
        st = r["st"]
        lines.append(f"{r['task']:5s} {r['k']:2d} {r['temp']:4.1f} {st.new_tokens:6d} {st.target_passes:6d} "
                     f"{st.acceptance_rate:6.2f} {st.alpha:5.2f} {st.tokens_per_pass:8.2f}  "
                     f"{'' if r['same'] is None else r['same']}")
    return "\n".join(lines)


@torch.inference_mode()
def early_exit_agreement(model: Any, prompt_ids: Sequence[int], answer: Sequence[int],
                         depths: Sequence[int]) -> dict[int, float]:
    """Exit depth L -> share of ``answer``'s tokens (the model's greedy answer to ``prompt_ids``)
    that the first L layers, read out through the final norm and LM head, predict as their argmax:
    the greedy acceptance α of an early-exit drafter of depth L. One forward pass for all depths."""
    full = list(prompt_ids) + list(answer)
    hs = model(torch.tensor([full], device=model.device), output_hidden_states=True).hidden_states
    span = slice(len(prompt_ids) - 1, len(full) - 1)  # positions that predict the answer's tokens
    target = torch.tensor(list(answer), device=model.device)
    return {L: (model.lm_head(model.model.norm(hs[L][0, span])).argmax(-1) == target).float().mean().item()
            for L in depths}


@torch.inference_mode()
def early_exit_step_times(model: Any, prompt_ids: Sequence[int], depths: Sequence[int],
                          pass_tokens: Sequence[int] = (1, 3, 5, 9), repeats: int = 3
                          ) -> tuple[dict[int, float], dict[int, float]]:
    """``(full, draft)``: median seconds of a target pass over m tokens (m in ``pass_tokens``) and
    of one draft step of an :class:`~labkit.llm.speculative.EarlyExitDrafter` of each depth, all at
    the context of ``prompt_ids``, interleaved (each pass's tokens are cropped off again)."""
    dev = model.device
    cache = DynamicCache(config=model.config)
    model(input_ids=torch.tensor([list(prompt_ids)], device=dev), cache=cache, use_cache=True)
    drafters = {L: EarlyExitDrafter(model, L) for L in depths}
    for d in drafters.values():
        d.forward(prompt_ids)

    def full_step(m: int) -> Callable[[], None]:
        def run() -> None:
            model(input_ids=torch.full((1, m), 42, device=dev), cache=cache, use_cache=True)
            cache.crop(-m)
        return run

    def draft_step(d: EarlyExitDrafter) -> Callable[[], None]:
        def run() -> None:
            d.forward([42])
            d.cache.crop(-1)
            d.seen.pop()
        return run

    fns = {f"full {m}": full_step(m) for m in pass_tokens}
    fns.update({f"draft L={L}": draft_step(d) for L, d in drafters.items()})
    t = {name: float(np.median(v)) for name, v in interleaved_times(fns, str(dev), repeats=repeats).items()}
    return {m: t[f"full {m}"] for m in pass_tokens}, {L: t[f"draft L={L}"] for L in depths}
