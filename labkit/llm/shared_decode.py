"""Greedy answers to many prompts that share text, each shared segment prefilled once (chapter 02b,
"Choosing a model": scoring every held-out item of every variant on a CPU).

A prompt is a tuple of text segments, e.g. (few-shot prefix, invoice text, question). Prompts whose
first segments are equal share the keys and values of those segments: the three questions about one
invoice prefill its text once, and a few-shot prefix every item shares is prefilled once per batch.
:func:`greedy_answers` runs level by level: the distinct prefixes of each level are prefilled,
left-padded within their segment, on top of their parent's cache rows (selected with
``batch_select_indices``), with an attention mask that hides the padding inside the sequence and
position ids that count only real tokens. Then it decodes greedily; rows that wrote a newline or the
end token leave the batch once a quarter of the batch has finished. The cache (:class:`SlabLayer`)
writes each step's keys and values into room kept at the end of a buffer instead of concatenating
a new tensor every step, which copied the whole cache, long shared prefix included, for every row.
The answer is the text before the first newline, as with transformers' ``generate`` on the whole
prompt (:func:`labkit.llm.domain_eval.generate_answers`; the chapter checks that both give the same
answers).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator, Sequence
from typing import Any

import torch
from transformers.cache_utils import DynamicCache, DynamicLayer

from .decode import cache_argument

GROW = 16  # positions of room a layer's buffer gains when it is full (one copy per 16 decode steps)


class SlabLayer(DynamicLayer):
    """One layer's KV cache in a buffer with room at the end: appending writes in place, and the
    keys and values handed to attention are views of the filled part (same numbers as transformers'
    ``DynamicLayer``, which concatenates, and so copies the whole cache, at every step)."""

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        super().lazy_initialization(key_states, value_states)
        self.filled = 0
        self.k_buf, self.v_buf = key_states[:, :, :0], value_states[:, :, :0]

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any, **kwargs: Any
               ) -> tuple[torch.Tensor, torch.Tensor]:
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        n, add = self.filled, key_states.shape[2]
        if n + add > self.k_buf.shape[2]:  # full: a new buffer with room to spare
            k_buf = key_states.new_empty((*key_states.shape[:2], n + add + GROW, key_states.shape[3]))
            v_buf = value_states.new_empty((*value_states.shape[:2], n + add + GROW, value_states.shape[3]))
            k_buf[:, :, :n], v_buf[:, :, :n] = self.k_buf[:, :, :n], self.v_buf[:, :, :n]
            self.k_buf, self.v_buf = k_buf, v_buf
        self.k_buf[:, :, n:n + add], self.v_buf[:, :, n:n + add] = key_states, value_states
        self.filled = n + add
        self.keys, self.values = self.k_buf[:, :, :self.filled], self.v_buf[:, :, :self.filled]
        return self.keys, self.values

    def get_seq_length(self) -> int:
        return self.filled if self.is_initialized else 0

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        if self.get_seq_length() > 0:
            self.k_buf, self.v_buf = self.k_buf[indices], self.v_buf[indices]
            self.keys, self.values = self.k_buf[:, :, :self.filled], self.v_buf[:, :, :self.filled]


def first_line(text: str) -> str:
    """A generated continuation cut at its first newline, spaces stripped: the model's answer."""
    return text.split("\n", 1)[0].strip()


def stop_ids(tok: Any) -> list[int]:
    """Token ids that end an answer: every token holding a newline, and the end token."""
    nl = tok.convert_tokens_to_ids([t for t in tok.get_vocab() if "\n" in t.replace("Ċ", "\n")])
    return sorted(set(nl) | {tok.eos_token_id})


def split_ids(tok: Any, prompt: Sequence[str]) -> list[list[int]]:
    """Token ids of each segment of ``prompt``, cut so that together they are exactly the ids of the
    whole prompt (special tokens as the tokenizer adds them). ``ValueError`` when a segment boundary
    falls inside a token (the tokenizer merges across it): move the boundary."""
    out: list[list[int]] = []
    done: list[int] = []
    text = ""
    for seg in prompt:
        text += seg
        ids = tok(text)["input_ids"]
        if ids[:len(done)] != done:
            raise ValueError(f"segment boundary inside a token before {seg[:30]!r}: split elsewhere")
        out.append(ids[len(done):])
        done = ids
    return out


def _left_pad(seqs: Sequence[Sequence[int]], pad: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``(ids, mask)``, rows left-padded to the longest (width 0 when every row is empty)."""
    width = max(len(s) for s in seqs)
    ids = torch.full((len(seqs), width), pad, dtype=torch.long)
    mask = torch.zeros((len(seqs), width), dtype=torch.long)
    for r, s in enumerate(seqs):
        if s:
            ids[r, width - len(s):], mask[r, width - len(s):] = torch.tensor(s), 1
    return ids, mask


def _forward(model: Any, ids: torch.Tensor, mask: torch.Tensor, cache: Any, name: str) -> torch.Tensor:
    """Run ``ids`` (the newest ``ids.shape[1]`` positions of ``mask``) on top of ``cache`` (updated in
    place); the last position's logits. Positions count the real tokens before each one."""
    pos = (mask.cumsum(-1) - 1).clamp_min(0)[:, -ids.shape[1]:]
    dev = next(model.parameters()).device
    out = model(input_ids=ids.to(dev), attention_mask=mask.to(dev), position_ids=pos.to(dev),
                use_cache=True, logits_to_keep=1, **{name: cache})
    return out.logits[:, -1].float().cpu()


@torch.inference_mode()
def _batch(model: Any, tok: Any, prompts: Sequence[list[list[int]]], max_new_tokens: int, stop: torch.Tensor,
           name: str) -> list[list[int]]:
    """Greedy continuations (token ids, the stop token included) of one batch of split prompts."""
    pad = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
    cache, mask = DynamicCache(), torch.zeros((1, 0), dtype=torch.long)
    cache.layer_class_to_replicate = SlabLayer  # created lazily, one per layer, at the first forward
    keys: list[tuple] = [()]
    logits = torch.empty(0)
    for level in range(len(prompts[0])):
        level_keys = list(dict.fromkeys(tuple(map(tuple, p[:level + 1])) for p in prompts))
        parent = torch.tensor([keys.index(k[:-1]) if level else 0 for k in level_keys])
        cache.batch_select_indices(parent)  # a row per distinct prefix, copied from its parent's row
        ids, m = _left_pad([k[-1] for k in level_keys], pad)
        mask = torch.cat([mask[parent], m], 1)
        if ids.shape[1]:
            logits = _forward(model, ids, mask, cache, name)
        keys = level_keys
    row_of = {k: r for r, k in enumerate(keys)}
    active = torch.arange(len(keys))  # the batch's rows: which prompt each one is
    going = torch.ones(len(keys), dtype=torch.bool)  # rows still writing
    out: list[list[int]] = [[] for _ in keys]
    for step in range(max_new_tokens):
        nxt = torch.where(going, logits.argmax(-1), pad)
        for r, t in zip(active[going].tolist(), nxt[going].tolist(), strict=True):
            out[r].append(t)
        going &= ~torch.isin(nxt, stop)
        if step == max_new_tokens - 1 or not going.any():
            break
        if (~going).sum() * 4 >= len(going):  # a quarter has finished: those rows leave the batch
            keep = going.nonzero().squeeze(1)
            cache.batch_select_indices(keep)
            mask, active, nxt, going = mask[keep], active[keep], nxt[keep], going[keep]
        # a finished row still in the batch writes padding, masked out: it changes no other row
        mask = torch.cat([mask, going[:, None].long()], 1)
        logits = _forward(model, nxt[:, None], mask, cache, name)
    return [out[row_of[tuple(map(tuple, p))]] for p in prompts]


@contextlib.contextmanager
def _gqa_in_sdpa() -> Iterator[None]:
    """transformers repeats each key/value head for its query heads (a copy) before PyTorch's attention
    unless this variable is set; PyTorch's own grouped-query path gives the same answers without the
    copy, which every row pays for a long shared prefix. Restored on exit."""
    key, before = "TRANSFORMERS_SDPA_FORCE_GQA", os.environ.get("TRANSFORMERS_SDPA_FORCE_GQA")
    os.environ[key] = "1"
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = before


def greedy_answers(model: Any, tok: Any, prompts: Sequence[Sequence[str]], max_new_tokens: int = 12,
                   batch_size: int = 90) -> list[str]:
    """Greedy answers of ``model`` to ``prompts`` (tuples of text segments, all of one length, the last
    never empty), in order: at most ``max_new_tokens`` new tokens, cut at the first newline and
    stripped. Prompts are sorted so that shared segments and similar lengths share a batch of
    ``batch_size``; a segment shared within a batch is prefilled once."""
    if len({len(p) for p in prompts}) > 1 or any(not p[-1] for p in prompts):
        raise ValueError("every prompt needs the same number of segments, the last one not empty")
    split = [split_ids(tok, p) for p in prompts]
    order = sorted(range(len(split)), key=lambda i: [(len(s), s) for s in split[i]])
    base = model.get_base_model() if hasattr(model, "get_base_model") else model  # peft: the wrapped model
    name, stop = cache_argument(base), torch.tensor(stop_ids(tok))
    answers: list[str] = [""] * len(split)
    with _gqa_in_sdpa():
        for b in range(0, len(order), batch_size):
            idx = order[b:b + batch_size]
            for i, ids in zip(idx, _batch(model, tok, [split[i] for i in idx], max_new_tokens, stop, name),
                              strict=True):
                answers[i] = first_line(tok.decode(ids, skip_special_tokens=True))
    return answers
