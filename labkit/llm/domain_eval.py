"""Exact-match evaluation on the lab's own sets (chapter 02b, "Choosing a model": run domain-specific
evals, not just public benchmarks).

``data/evals/invoices.jsonl`` is the domain task (fields pulled out of short invoice texts, a
``train`` and a ``heldout`` split with no text in both), ``data/evals/generic.jsonl`` a public-style
general set; both are written by the seeded ``data/evals/make_evals.py``. A model answers each prompt
by greedy decoding (:func:`generate_answers`: batched, left-padded, at most ``max_new_tokens`` new
tokens, cut at the first newline); :func:`exact_match` scores an answer 1 when it equals the expected
string after stripping spaces, else 0. :func:`ranking` orders variants by score (ties kept together) and
:func:`discordant_pairs` says where two evals order them oppositely.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import torch
from tqdm.auto import tqdm

from ..paths import data

SETS = ("invoices", "generic")
SPLITS = ("train", "heldout")


def load_items(name: str, split: str | None = None, limit: int | None = None) -> list[dict[str, Any]]:
    """Items of ``data/evals/<name>.jsonl`` (``invoices`` or ``generic``), in file order, optionally
    only ``split`` (``train`` or ``heldout``) and only the first ``limit``. ``ValueError`` on a bad name."""
    if name not in SETS:
        raise ValueError(f"eval set must be one of {SETS}, got {name!r} (regenerate with "
                         "`python data/evals/make_evals.py` if a file is missing)")
    if split is not None and split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS} or None, got {split!r}")
    with open(data("evals", f"{name}.jsonl")) as f:
        rows = [json.loads(line) for line in f if line.strip()]
    rows = [r for r in rows if split is None or r["split"] == split]
    return rows[:limit] if limit is not None else rows


def text_of(item: dict[str, Any]) -> str:
    """The invoice (or question) text an item's prompt is built on: the prompt before its ``Q:`` line;
    items sharing it share one invoice."""
    return item["prompt"].rsplit("\nQ:", 1)[0]


def first_line(text: str) -> str:
    """A generated continuation cut at its first newline, spaces stripped: the model's answer."""
    return text.split("\n", 1)[0].strip()


def exact_match(answer: str, expected: str) -> int:
    """1 when ``answer`` equals ``expected`` once both are stripped of surrounding spaces, else 0
    (case and inner characters count: ``2021-05-22`` is not ``22.05.2021``)."""
    return int(answer.strip() == expected.strip())


def _pad_id(tok) -> int:
    return tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id


@torch.inference_mode()
def generate_answers(model, tok, prompts: Sequence[str], max_new_tokens: int = 12, batch_size: int = 16,
                     desc: str | None = None) -> list[str]:
    """Greedy answers of ``model`` to ``prompts``: batches of ``batch_size`` left-padded prompts, at most
    ``max_new_tokens`` new tokens each (a batch stops early once every row has a newline or the end
    token), each cut by :func:`first_line`. ``desc`` labels a tqdm progress bar."""
    dev = next(model.parameters()).device
    nl = set(tok.convert_tokens_to_ids([t for t in tok.get_vocab() if "\n" in t.replace("Ċ", "\n")]))
    stop = torch.tensor(sorted(nl | {tok.eos_token_id}), device=dev)
    side, tok.padding_side = tok.padding_side, "left"
    out: list[str] = []
    try:
        for i in tqdm(range(0, len(prompts), batch_size), desc=desc, disable=desc is None, leave=False):
            enc = tok(list(prompts[i:i + batch_size]), return_tensors="pt", padding=True).to(dev)
            gen = model.generate(**enc, max_new_tokens=max_new_tokens, do_sample=False,
                                 pad_token_id=_pad_id(tok), eos_token_id=stop.tolist())
            new = gen[:, enc["input_ids"].shape[1]:]
            out += [first_line(tok.decode(row, skip_special_tokens=True)) for row in new]
    finally:
        tok.padding_side = side
    return out


def score(model, tok, items: Sequence[dict[str, Any]], max_new_tokens: int = 12, batch_size: int = 16,
          desc: str | None = None) -> dict[str, Any]:
    """Exact-match accuracy of ``model`` on ``items``: ``{"score"`` (fraction 0-1), ``"correct"``,
    ``"n"``, ``"by_kind"`` (kind -> fraction), ``"answers"`` (what it said, in order)``}``."""
    if not items:
        raise ValueError("no items to score: check the set name and split")
    answers = generate_answers(model, tok, [it["prompt"] for it in items], max_new_tokens, batch_size, desc)
    hits = [exact_match(a, it["answer"]) for a, it in zip(answers, items, strict=True)]
    kinds: dict[str, list[int]] = {}
    for h, it in zip(hits, items, strict=True):
        kinds.setdefault(it["kind"], []).append(h)
    return {"score": sum(hits) / len(hits), "correct": sum(hits), "n": len(hits),
            "by_kind": {k: sum(v) / len(v) for k, v in kinds.items()}, "answers": answers}


def ranking(scores: dict[str, float]) -> list[list[str]]:
    """Variant names from best to worst score, grouped: variants with equal scores share a group
    (``{"a": 0.5, "b": 0.9, "c": 0.5}`` -> ``[["b"], ["a", "c"]]``)."""
    groups: list[list[str]] = []
    for k in sorted(scores, key=lambda k: -scores[k]):
        if groups and scores[groups[-1][0]] == scores[k]:
            groups[-1].append(k)
        else:
            groups.append([k])
    return groups


def ranking_text(scores: dict[str, float]) -> str:
    """:func:`ranking` as text: ``b > a = c``."""
    return " > ".join(" = ".join(g) for g in ranking(scores))


def discordant_pairs(a: dict[str, float], b: dict[str, float]) -> list[tuple[str, str]]:
    """Pairs of variants that the two score sets order strictly opposite ways (``x`` above ``y`` on
    ``a``, below it on ``b``); a tie on either side is not a disagreement. Empty: the rankings agree."""
    keys = [k for k in a if k in b]
    return [(x, y) for i, x in enumerate(keys) for y in keys[i + 1:]
            if (a[x] - a[y]) * (b[x] - b[y]) < 0]
