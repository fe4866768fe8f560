"""Exact-match evaluation on the lab's own sets (chapter 02b, "Choosing a model": run domain-specific
evals, not just public benchmarks).

``data/evals/invoices.jsonl`` is the domain task (fields pulled out of short invoice texts; a
``train``, a ``dev`` and a ``heldout`` split, no text in two), ``data/evals/generic.jsonl`` a
public-style general set; both are written by the seeded ``data/evals/make_evals.py``.

A prompt is a tuple of text segments (:func:`segments`: the invoice text, then the question; or
:func:`chat_segments`: a few-shot chat prefix, the invoice text, the question in the model's chat
template). :func:`labkit.llm.shared_decode.greedy_answers` answers them greedily, computing the keys
and values of a segment shared by several prompts once. :func:`score` then counts an answer right
by :func:`exact_match` (the expected string, exactly) and by :func:`normalized_match` (the same
content in another format: ``22.05.2021`` for ``2021-05-22``), overall and per field.
:func:`compare` pairs two scorings of the same items (exact McNemar test and an interval that
resamples invoices); :func:`ranking` and :func:`separated` order variants.
"""

from __future__ import annotations

import json
import random
import re
from collections.abc import Sequence
from datetime import datetime
from typing import Any

from ..paths import data
from ..stats import mcnemar, paired_bootstrap
from .shared_decode import first_line, greedy_answers, stop_ids

SETS = ("invoices", "generic")
SPLITS = ("train", "dev", "heldout")
DATE_FORMATS = ("%Y-%m-%d", "%d %B %Y", "%B %d, %Y", "%d.%m.%Y", "%d %b %Y", "%Y/%m/%d", "%m/%d/%Y",
                "%d/%m/%Y", "%B %d %Y", "%b %d, %Y")


def load_items(name: str, split: str | None = None, limit: int | None = None) -> list[dict[str, Any]]:
    """Items of ``data/evals/<name>.jsonl`` (``invoices`` or ``generic``), in file order, optionally
    only ``split`` (``train``, ``dev`` or ``heldout``) and only the first ``limit``. ``ValueError`` on a
    bad name."""
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
    """The invoice (or worked examples) text an item's prompt is built on: the prompt before its last
    ``Q:`` line; items sharing it share one invoice (every generic item shares the two shots)."""
    return item["prompt"].rsplit("\nQ:", 1)[0]


def segments(item: dict[str, Any]) -> tuple[str, str]:
    """The item's prompt as it is written, in two segments: (:func:`text_of`, the question)."""
    text = text_of(item)
    return text, item["prompt"][len(text):]


def few_shot(items: Sequence[dict[str, Any]], k: int, seed: int = 0) -> list[dict[str, Any]]:
    """``k`` worked examples from ``items`` (the training split), each from another invoice, the fields
    taken in turn (``k`` = 3: one number, one date, one total), chosen with ``seed``."""
    rng = random.Random(seed)
    kinds = sorted({i["kind"] for i in items})
    pool = list(items)
    rng.shuffle(pool)
    out: list[dict[str, Any]] = []
    texts: set[str] = set()
    for kind in (kinds * k)[:k]:
        pick = next(i for i in pool if i["kind"] == kind and text_of(i) not in texts)
        out.append(pick)
        texts.add(text_of(pick))
    return out


def _turn(item: dict[str, Any]) -> str:
    """The user's turn for an item: its prompt without the trailing ``A:`` (the template adds the
    assistant's turn instead)."""
    return item["prompt"].removesuffix("\nA:")


def chat_segments(tok: Any, item: dict[str, Any], shots: Sequence[dict[str, Any]]) -> tuple[str, str, str]:
    """The item as the last user turn of a chat in the tokenizer's own template, after ``shots``
    (worked examples: a user turn and the expected answer as the assistant's turn each), with the
    generation prompt: (everything before the invoice text, the invoice text, the rest)."""
    chat = [m for s in shots for m in ({"role": "user", "content": _turn(s)},
                                       {"role": "assistant", "content": s["answer"]})]
    chat.append({"role": "user", "content": _turn(item)})
    # enable_thinking=False: a reasoning model's template (Qwen3, the full profile) answers directly
    full = tok.apply_chat_template(chat, tokenize=False, add_generation_prompt=True, enable_thinking=False)
    text = text_of(item)
    at = full.rindex(text)
    return full[:at], text, full[at + len(text):]


def exact_match(answer: str, expected: str) -> int:
    """1 when ``answer`` equals ``expected`` once both are stripped of surrounding spaces, else 0
    (case and inner characters count: ``2021-05-22`` is not ``22.05.2021``)."""
    return int(answer.strip() == expected.strip())


def _pad_id(tok: Any) -> int:
    return tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id


def generate_answers(model: Any, tok: Any, prompts: Sequence[str], max_new_tokens: int = 12,
                     batch_size: int = 16) -> list[str]:
    """Greedy answers of ``model`` to whole ``prompts`` through transformers' own ``generate``: batches
    of ``batch_size`` left-padded prompts, at most ``max_new_tokens`` new tokens each, cut by
    :func:`first_line`. The plain path, each prompt prefilled in full: chapter 02b checks the shared
    cache of :func:`labkit.llm.shared_decode.greedy_answers` against it."""
    import torch

    dev = next(model.parameters()).device
    side, tok.padding_side = tok.padding_side, "left"
    out: list[str] = []
    try:
        with torch.inference_mode():
            for i in range(0, len(prompts), batch_size):
                enc = tok(list(prompts[i:i + batch_size]), return_tensors="pt", padding=True).to(dev)
                gen = model.generate(**enc, max_new_tokens=max_new_tokens, do_sample=False,
                                     pad_token_id=_pad_id(tok), eos_token_id=stop_ids(tok))
                new = gen[:, enc["input_ids"].shape[1]:]
                out += [first_line(tok.decode(row, skip_special_tokens=True)) for row in new]
    finally:
        tok.padding_side = side
    return out


def normalized(answer: str, kind: str) -> str:
    """The content of an answer with its format taken away: a date as ``YYYY-MM-DD`` from any of
    :data:`DATE_FORMATS`; a total as its digits only (``$14,100.80`` and ``14.100.80`` are ``1410080``);
    anything else upper-cased without spaces, ``#`` and a final ``.``. An unreadable date stays as it is."""
    a = answer.strip().rstrip(".").strip()
    if kind == "date":
        for fmt in DATE_FORMATS:
            try:
                return datetime.strptime(a, fmt).strftime("%Y-%m-%d")
            except ValueError:
                pass
        return a
    if kind == "total":
        return re.sub(r"\D", "", a)
    return re.sub(r"[\s#]", "", a).upper()


def normalized_match(answer: str, expected: str, kind: str) -> int:
    """1 when ``answer`` holds the expected content in any format :func:`normalized` reads, else 0
    (every exact match is a normalized match; an empty answer never is)."""
    got = normalized(answer, kind)
    return int(bool(got) and got == normalized(expected, kind))


def score(model: Any, tok: Any, items: Sequence[dict[str, Any]],
          prompts: Sequence[tuple[str, ...]] | None = None, max_new_tokens: int = 12,
          batch_size: int = 90) -> dict[str, Any]:
    """Accuracy of ``model`` on ``items``, answering ``prompts`` (default :func:`segments` of each item)
    greedily (:func:`labkit.llm.shared_decode.greedy_answers`). Returns ``score`` and ``normalized``
    (fractions 0-1), ``correct``, ``n``, ``hits`` and ``norm_hits`` (0/1 per item, in order),
    ``by_kind`` (kind -> ``(exact, normalized)`` fractions) and ``answers`` (what it said)."""
    if not items:
        raise ValueError("no items to score: check the set name and split")
    prompts = [segments(i) for i in items] if prompts is None else prompts
    answers = greedy_answers(model, tok, prompts, max_new_tokens, batch_size)
    hits = [exact_match(a, it["answer"]) for a, it in zip(answers, items, strict=True)]
    norm = [normalized_match(a, it["answer"], it["kind"]) for a, it in zip(answers, items, strict=True)]
    kinds: dict[str, list[tuple[int, int]]] = {}
    for h, g, it in zip(hits, norm, items, strict=True):
        kinds.setdefault(it["kind"], []).append((h, g))
    return {"score": sum(hits) / len(hits), "normalized": sum(norm) / len(norm), "correct": sum(hits),
            "n": len(hits), "hits": hits, "norm_hits": norm, "answers": answers,
            "by_kind": {k: (sum(h for h, _ in v) / len(v), sum(g for _, g in v) / len(v))
                        for k, v in kinds.items()}}


def compare(a: Sequence[int], b: Sequence[int], items: Sequence[dict[str, Any]], seed: int = 0
            ) -> dict[str, float]:
    """``b`` against ``a``, 0/1 hits on the same ``items``: ``diff`` (b's score minus a's, a fraction)
    with ``lo``/``hi``, a 95% bootstrap interval that resamples whole invoices (an invoice's items are
    not independent), ``groups`` (invoices), and the exact McNemar test on the items: ``a_only``,
    ``b_only`` (items only one got right) and ``p`` (two-sided)."""
    boot = paired_bootstrap(a, b, groups=[text_of(i) for i in items], seed=seed)
    test = mcnemar([bool(x) for x in a], [bool(x) for x in b])
    return {"diff": boot["value"], "lo": boot["lo"], "hi": boot["hi"], "groups": boot["n"], **test}


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


def separated(hits: dict[str, Sequence[int]], alpha: float = 0.05) -> dict[tuple[str, str], int]:
    """Every pair ``(x, y)`` of variants scored on the same items (name -> 0/1 hits): +1 when ``x`` is
    better by the exact McNemar test at level ``alpha``, -1 when ``y`` is, 0 when the items cannot tell
    them apart."""
    names = list(hits)
    out = {}
    for i, x in enumerate(names):
        for y in names[i + 1:]:
            t = mcnemar([bool(v) for v in hits[x]], [bool(v) for v in hits[y]])
            out[(x, y)] = 0 if t["p"] >= alpha else 1 if t["a_only"] > t["b_only"] else -1
    return out
