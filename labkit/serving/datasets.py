"""Prompt files the reference load generators read (chapter 02), so that ``labkit bench --dataset FILE``
sends the same prompts as vLLM's ``bench serve`` or GuideLLM given the same file:

* **ShareGPT-style JSON** (vLLM's ``--dataset-name sharegpt``): a list of records whose
  ``conversations`` (or ``conversation``) list turns as ``{"from": "human", "value": ...}``; the
  prompt is the first turn, and a record with fewer than two turns is skipped, as vLLM skips it.
  The reply's length in tokens needs the model's tokenizer, so ``max_tokens`` comes from the run
  (``--max-tokens``) unless the record says ``max_tokens`` or ``output_tokens``.
* **JSONL**, one object a line (vLLM's ``--dataset-name custom``, GuideLLM's file data): the text
  under ``prompt`` (or ``text``), and the tokens to ask for under ``output_tokens``,
  ``output_tokens_count`` (GuideLLM's name), ``output_len`` or ``max_tokens`` when present.

The prompts keep the file's order; :func:`labkit.serving.loadgen.run` draws them in a seeded order,
so a run of as many requests as the file has prompts sends each exactly once.
"""

from __future__ import annotations

import json
from pathlib import Path

from .loadspec import Prompt, _whole

OUTPUT_KEYS = ("max_tokens", "output_tokens", "output_tokens_count", "output_len")
TEXT_KEYS = ("prompt", "text")


def _max_tokens(obj: dict, where: str) -> int | None:
    for key in OUTPUT_KEYS:
        if obj.get(key) is not None:
            _whole(f"{where}: {key}", obj[key], 1)  # the check LoadSpec makes of its own counts
            return obj[key]
    return None


def _sharegpt(records: list, path: Path) -> list[Prompt]:
    out = []
    for i, rec in enumerate(records):
        turns = rec.get("conversations", rec.get("conversation")) if isinstance(rec, dict) else None
        if not isinstance(turns, list):
            raise ValueError(f"{path}: record {i} has no 'conversations' list: not ShareGPT-style JSON "
                             "(a list of {\"conversations\": [{\"from\": ..., \"value\": ...}, ...]})")
        if len(turns) < 2 or not isinstance(turns[0], dict) or not isinstance(turns[0].get("value"), str):
            continue
        p = Prompt(prompt=turns[0]["value"], id=rec.get("id", i))
        if (n := _max_tokens(rec, f"{path}, record {i}")) is not None:
            p["max_tokens"] = n
        out.append(p)
    return out


def _jsonl(lines: list[str], path: Path) -> list[Prompt]:
    out = []
    for i, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as e:
            raise ValueError(f"{path}, line {i}: not JSON ({e.msg}); a JSONL file has one object a line") \
                from None
        obj = obj if isinstance(obj, dict) else {}
        text = next((obj[k] for k in TEXT_KEYS if isinstance(obj.get(k), str)), None)
        if text is None:
            raise ValueError(f"{path}, line {i}: no prompt: each line needs a string under "
                             f"{' or '.join(repr(k) for k in TEXT_KEYS)}")
        p = Prompt(prompt=text, id=obj.get("id", i))
        if (n := _max_tokens(obj, f"{path}, line {i}")) is not None:
            p["max_tokens"] = n
        out.append(p)
    return out


def load_dataset(path: str | Path) -> list[Prompt]:
    """The prompts of a ShareGPT-style JSON file or a JSONL file (see the module docstring), in the
    file's order. ``ValueError`` saying what is missing: the file, or what it lacks."""
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"{path}: no such file; pass a ShareGPT-style .json or a .jsonl of prompts")
    text = path.read_text(encoding="utf-8")
    stripped = text.lstrip()
    if stripped.startswith("["):
        try:
            records = json.loads(text)
        except json.JSONDecodeError as e:
            raise ValueError(f"{path}: not JSON ({e.msg} at line {e.lineno})") from None
        prompts = _sharegpt(records, path)
    else:
        prompts = _jsonl(text.splitlines(), path)
    if not prompts:
        raise ValueError(f"{path}: no usable prompt in it (ShareGPT records need two turns or more)")
    return prompts
