"""Paged KV cache against a contiguous reservation (chapter 06b, "Going further: paged KV"): the
memory each wastes on real request lengths, and how many sequences a KV budget holds under each.

A server that does not know how long an answer will be can reserve, for every sequence, room for
the longest it may grow (``reserve`` tokens, e.g. ``--max-model-len``) in one contiguous block:
most of it stays empty. PagedAttention (Kwon et al., 2023; vLLM) hands out fixed-size blocks of
``block`` tokens as a sequence grows, so a sequence wastes at most the unused part of its last
block. Lengths are in tokens; shares are fractions of the reserved tokens holding live keys and
values.
"""

from __future__ import annotations

import math
from collections.abc import Sequence


def blocks(lengths: Sequence[int], block: int) -> int:
    """KV blocks of ``block`` tokens that sequences of ``lengths`` tokens hold: each a whole number of
    blocks, its last one partly empty."""
    return sum(math.ceil(n / block) for n in lengths)


def reservation(lengths: Sequence[int], reserve: int, block: int = 16, budget_tokens: int | None = None
                ) -> dict[str, float]:
    """For sequences of ``lengths`` tokens (prompt plus answer, at their end): ``live`` tokens, the
    tokens reserved ``contiguous`` (``reserve`` each) and ``paged`` (whole blocks of ``block``), the
    share of each reservation holding live tokens, and with ``budget_tokens`` (a KV budget in tokens)
    how many sequences of this mix fit under each scheme, ``fit_contiguous`` and ``fit_paged`` (the
    latter at the mix's mean blocks per sequence). ``ValueError`` for no lengths, a length below 1 or
    above ``reserve``, or a ``block`` below 1."""
    if not lengths or min(lengths) < 1:
        raise ValueError(f"need at least one sequence, each at least 1 token long, got {list(lengths)[:5]}")
    if block < 1 or reserve < max(lengths):
        raise ValueError(f"reserve ({reserve}) must hold the longest sequence ({max(lengths)}) and block "
                         f"({block}) be at least 1 token")
    live = sum(lengths)
    paged = blocks(lengths, block) * block
    contiguous = reserve * len(lengths)
    out = {"sequences": len(lengths), "live": live, "contiguous": contiguous, "paged": paged,
           "contiguous_live_share": live / contiguous, "paged_live_share": live / paged}
    if budget_tokens is not None:
        out["fit_contiguous"] = budget_tokens // reserve
        out["fit_paged"] = math.floor(budget_tokens / (paged / len(lengths)))
    return out
