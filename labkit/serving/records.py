"""The request record every streaming client returns, and how tokens are counted per chunk
(chapter 02).

A record is a plain dict (fields documented in :mod:`labkit.serving.metrics`). Tokens come from the
server's own usage figures where it sends them (cumulative counts per chunk, or one total shared
among chunks), else from a tokenizer on the cumulative text; chunks are never counted as tokens."""

from __future__ import annotations

import json
import re
import time
from collections.abc import Sequence
from typing import Any


def new_record(backend: str) -> dict[str, Any]:
    """An empty request record stamped with the send time (``time.perf_counter()``, seconds);
    ``note`` says what was odd about a request that still counts as ok."""
    return {"backend": backend, "status": "error", "error": None, "http_status": None,
            "t_sent": time.perf_counter(), "t_end": None, "chunks": [], "output_tokens": None,
            "prompt_tokens": None, "token_source": None, "text": "", "note": None}


def finish_record(rec: dict[str, Any], parts: list[tuple[float, str, int | None]],
                  total: int | None = None, tokenizer: Any = None) -> dict[str, Any]:
    """Fill ``chunks``/``output_tokens``/``text`` from ``parts``, the ``(perf_counter time, text,
    cumulative tokens or None)`` of each chunk that carried output: text, a rise in the cumulative
    count, or a finish without text (where an end-of-sequence token arrives). Stamps ``t_end``.
    A text-less part that ends up with no (known) token is dropped: ``chunks`` holds token-bearing
    chunks (and, rarely, text that the counts gave no token)."""
    rec["t_end"] = time.perf_counter()
    texts = [p[1] for p in parts]
    cumulative = [p[2] for p in parts]
    counts, n, source = count_chunk_tokens(texts, cumulative, total, tokenizer)
    rec["chunks"] = [[t - rec["t_sent"], k] for (t, text, _), k in zip(parts, counts, strict=True)
                     if text or k]
    rec["output_tokens"], rec["token_source"] = n, source
    rec["text"] = "".join(texts)
    return rec


def fail(rec: dict[str, Any], status: str, error: str) -> dict[str, Any]:
    """Mark ``rec`` failed with ``status`` and ``error`` (what happened and what to do)."""
    rec["status"], rec["error"] = status, error
    rec["t_end"] = rec["t_end"] or time.perf_counter()
    return rec


_TAG = re.compile(r"<[^>]+>")
_TITLE = re.compile(r"<title[^>]*>(.*?)</title>", re.I | re.S)


def error_text(body: bytes | str) -> str:
    """The message inside an error body (OpenAI ``{"error": {"message"}}``, Ollama ``{"error"}``,
    FastAPI ``{"detail"}``, ``{"message"}``), an HTML page's title (or its text), else the body's
    start; at most 300 characters, on one line."""
    raw = body.encode() if isinstance(body, str) else body
    try:
        obj = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError):
        text = raw[:4000].decode("utf-8", "replace")
        if "<" in text and ">" in text:  # an HTML error page (a proxy, a gateway)
            m = _TITLE.search(text)
            text = m.group(1) if m else _TAG.sub(" ", text)
        return " ".join(text.split())[:300]
    if isinstance(obj, dict):
        err = next((obj[k] for k in ("error", "detail", "message") if obj.get(k)), obj)
        if isinstance(err, dict):
            err = err.get("message") or err
        return " ".join(str(err).split())[:300]
    return " ".join(str(obj).split())[:300]


# Never count chunks as tokens: servers may batch several tokens into one chunk.


def tokens_from_cumulative(cumulative: Sequence[int]) -> list[int]:
    """Tokens per chunk from cumulative counts (``usage.completion_tokens`` sent with every chunk,
    vLLM's ``stream_options.continuous_usage_stats``)."""
    out, prev = [], 0
    for c in cumulative:
        out.append(max(0, c - prev))
        prev = max(prev, c)
    return out


def tokens_by_tokenizer(texts: Sequence[str], tokenizer: Any) -> list[int]:
    """Tokens per chunk by re-tokenizing the *cumulative* text without special tokens. Tokenizing
    each chunk alone would add a BOS per chunk and split words the model did not split."""
    out, prev, text = [], 0, ""
    for t in texts:
        text += t
        n = len(tokenizer(text, add_special_tokens=False)["input_ids"])
        out.append(max(0, n - prev))
        prev = max(prev, n)
    return out


def tokens_by_total(texts: Sequence[str], total: int) -> list[int]:
    """Share a known total (the server's final usage count) among chunks, used only when the server
    reports no per-chunk counts and no tokenizer is given (an approximation):

    * every chunk with text gets one token; a text-less chunk (a finish chunk, where an
      end-of-sequence token arrives) gets one of what is left, the latest first; the rest goes to
      the text chunks by characters (largest remainder);
    * fewer tokens than text chunks: they are spread evenly over the text chunks, the first and
      the last included, so TTFT and E2E still fall where text first and last arrived.
    """
    n = len(texts)
    counts = [0] * n
    textful = [i for i, t in enumerate(texts) if t]
    if not textful:  # only text-less chunks: the tokens arrived with the last
        if n:
            counts[-1] = total
        return counts
    m = len(textful)
    if total <= m:
        for j in range(total):
            counts[textful[int(j * (m - 1) / max(1, total - 1) + 0.5)]] += 1
        return counts
    left = total - m
    for i in textful:
        counts[i] = 1
    for i in reversed([i for i, t in enumerate(texts) if not t]):
        if left:
            counts[i], left = 1, left - 1
    shares = [left * len(texts[i]) / sum(len(texts[j]) for j in textful) for i in textful]
    base = [int(x) for x in shares]
    rest = left - sum(base)
    for j in sorted(range(m), key=lambda j: shares[j] - base[j], reverse=True)[:rest]:
        base[j] += 1
    for j, i in enumerate(textful):
        counts[i] += base[j]
    return counts


def count_chunk_tokens(texts: Sequence[str], cumulative: Sequence[int | None] | None = None,
                       total: int | None = None, tokenizer: Any = None) -> tuple[list[Any], int | None, str]:
    """Tokens in each chunk, the output token count, and where they came from, best source first:

    1. ``"usage-continuous"``: cumulative server counts on every chunk (exact);
    2. ``"tokenizer"`` / ``"usage+tokenizer"``: re-tokenized cumulative text (the server's final
       usage total, when sent, stays the output count);
    3. ``"usage"``: the final total, one token per chunk (exact when the server sends one token per
       chunk); ``"usage+chars"`` / ``"usage+spread"``: more / fewer tokens than text chunks, shared
       by :func:`tokens_by_total` (an approximation);
    4. ``"unknown"``: no usage, no tokenizer: counts are None and TPOT/ITL cannot be computed.
    """
    if texts and cumulative is not None and all(c is not None for c in cumulative):
        counts = tokens_from_cumulative(cumulative)  # type: ignore[arg-type]
        n = sum(counts)
        if total is not None and total > n:  # tokens sent after the last counted chunk
            counts[-1] += total - n
            n = total
        return counts, n, "usage-continuous"
    if total is None and cumulative is not None and any(c is not None for c in cumulative):
        total = max(c for c in cumulative if c is not None)  # usage on some chunks only: a total
    if tokenizer is not None:
        counts = tokens_by_tokenizer(texts, tokenizer)
        empty = [i for i, t in enumerate(texts) if not t]
        if total is not None and total > sum(counts) and empty:  # the end-of-sequence token
            counts[empty[-1]] += total - sum(counts)
        return counts, (sum(counts) if total is None else total), (
            "tokenizer" if total is None else "usage+tokenizer")
    if total is not None:
        counts = tokens_by_total(texts, total)
        with_text = sum(1 for t in texts if t)
        exact = total >= with_text and max(counts, default=0) <= 1
        return counts, total, "usage" if exact else ("usage+chars" if total > with_text else "usage+spread")
    return [None] * len(texts), None, "unknown"
