"""The request record every streaming client returns, and how tokens are counted per chunk
(chapter 02).

:class:`RequestRecord` is one request as measured: times in seconds (``time.perf_counter()`` while
in memory; seconds after the run's start in the load generator's JSONL), token counts in tokens.
Tokens come from the server's own usage figures where it sends them (cumulative counts per chunk,
or one total shared among chunks), else from a tokenizer on the cumulative text; chunks are never
counted as tokens. :func:`request_metrics` turns one record into its TTFT, TPOT, ITL and E2E
(:class:`RequestFigures`); :mod:`labkit.serving.metrics` summarizes many."""

from __future__ import annotations

import dataclasses
import json
import re
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, TypedDict

#: How a request ended. ``ok``: the answer arrived whole; ``http_error``: the server refused it
#: (``http_status`` says how); ``timeout``: no data for the read timeout, or past the total one;
#: ``broken_stream``: the stream ended or broke before the end; ``connect_error``: no server;
#: ``error``: anything else (an error the server reported mid-stream, a non-streaming answer);
#: ``not_sent``: the load generator's ``max_duration_s`` came first.
Status = Literal["ok", "http_error", "timeout", "broken_stream", "connect_error", "error", "not_sent"]
#: One chunk that carried output: (seconds after ``t_sent``, tokens in it; None when unknown).
Chunk = tuple[float, int | None]
#: One received chunk before counting: (``perf_counter`` time, its text, cumulative tokens or None).
Part = tuple[float, str, int | None]
#: Figures the JSONL line adds after the record's own fields (see :meth:`RequestRecord.to_json`).
NAN = float("nan")
JSON_FIGURES = ("ttft_s", "tpot_s", "e2e_s", "itl_s")


class ServerTiming(TypedDict):
    """A server's own account of one request (Ollama's last streamed object, llama.cpp's ``timings``):
    token counts and seconds, plus its decode rate ``eval_tokens_per_s`` (tokens/s) as the server
    states it: ``eval_count / eval_s`` for Ollama, the tokens after the first over ``eval_s`` for
    llama.cpp (:func:`labkit.serving.openai_api.llamacpp_server_timing`)."""

    eval_count: int | None
    prompt_eval_count: int | None
    eval_s: float | None
    prompt_eval_s: float | None
    load_s: float | None
    total_s: float | None
    eval_tokens_per_s: float | None


@dataclass
class RequestRecord:
    """One streamed request as the client measured it. The fields, in the order the JSONL has them:

    * ``backend``: the client that sent it (``"openai-chat"``, ``"openai-completions"``,
      ``"ollama-generate"``, ``"ollama-chat"``, ``"transformers"``, or a load generator's backend name).
    * ``status`` (:data:`Status`; "error" until a client says otherwise, so an unfinished record never
      counts as ok), ``error`` (what went wrong and what to do, in words), ``http_status`` (the
      server's HTTP code, None without an answer).
    * ``t_sent``: when the request left (seconds, ``time.perf_counter()``; in JSONL, seconds after
      the run's start); ``t_end``: when the stream closed (same clock; None while open).
    * ``chunks``: the chunks that carried output, each (seconds after ``t_sent``, tokens in it: None
      when unknown); role-only, empty and usage-only chunks and keep-alives are never kept.
    * ``output_tokens`` / ``prompt_tokens``: tokens generated / in the prompt (None: unknown);
      ``token_source``: where the counts came from (:func:`count_chunk_tokens`; ``"streamer"`` for
      an in-process model, one token per chunk).
    * ``text``: the generated text (cut to 300 characters in JSONL); ``note``: what was odd about a
      request still counted ok; ``server``: the server's own timings (Ollama, llama.cpp), else None.
    * Set by the load generator (None otherwise): ``id`` (its request number, ``"warmup-N"`` for a
      warm-up), ``prompt_id`` (the prompt's ``id`` in its set), ``phase`` (``"run"`` or
      ``"warmup"``), ``max_tokens`` (asked for), ``queue_s`` (seconds from the request's arrival to
      its send: waiting for a concurrency cap, never part of TTFT), ``t_run_start`` (the run's
      ``perf_counter`` start; in memory only, never in JSONL).
    """

    backend: str = ""
    status: Status = "error"
    error: str | None = None
    http_status: int | None = None
    t_sent: float = 0.0
    t_end: float | None = None
    chunks: list[Chunk] = field(default_factory=list)
    output_tokens: int | None = None
    prompt_tokens: int | None = None
    token_source: str | None = None
    text: str = ""
    note: str | None = None
    server: ServerTiming | None = None
    id: int | str | None = None
    prompt_id: int | str | None = None
    phase: Literal["run", "warmup"] | None = None
    max_tokens: int | None = None
    queue_s: float | None = None
    t_run_start: float | None = None

    def to_json(self, t0: float = 0.0, text_chars: int | None = 300) -> str:
        """One JSONL line (no newline), as the load generator writes it: times less ``t0`` (the
        run's start), ``text`` cut to ``text_chars`` characters, ``server`` only when present, no
        ``t_run_start``; then the request's ``ttft_s``, ``tpot_s``, ``e2e_s`` (seconds) and
        ``itl_s`` (list of seconds) as :func:`request_metrics` defines them,
        None unless ok. :meth:`from_json` reads it back."""
        line: dict[str, Any] = {}
        for f in dataclasses.fields(self):
            v = getattr(self, f.name)
            if f.name == "t_run_start" or (f.name == "server" and v is None):
                continue
            if f.name in ("t_sent", "t_end") and v is not None:
                v -= t0
            line[f.name] = v[:text_chars] if f.name == "text" and text_chars is not None else v
        figures: Mapping[str, object] = {}
        if self.status == "ok":
            figures = request_metrics(self)
        line |= {k: figures.get(k) for k in JSON_FIGURES}
        return json.dumps(line)

    @classmethod
    def from_json(cls, line: str) -> RequestRecord:
        """The record of one JSONL line written by :meth:`to_json` (times stay relative to the
        run's start; the derived figures are dropped: :func:`request_metrics`
        recomputes them). ``ValueError`` naming any field a record does not have."""
        obj = json.loads(line)
        if not isinstance(obj, dict):
            raise ValueError(f"a request record line must be a JSON object, got {line[:80]!r}")
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = set(obj) - names - set(JSON_FIGURES)
        if unknown:
            raise ValueError(f"fields {sorted(unknown)} are not request-record fields; "
                             f"a record has {sorted(names)}")
        obj["chunks"] = [(t, k) for t, k in obj.get("chunks") or []]
        return cls(**{k: v for k, v in obj.items() if k in names})


def new_record(backend: str) -> RequestRecord:
    """An empty request record stamped with the send time (``time.perf_counter()``, seconds)."""
    return RequestRecord(backend=backend, t_sent=time.perf_counter())


def finish_record(rec: RequestRecord, parts: Sequence[Part], total: int | None = None,
                  tokenizer: Any = None) -> RequestRecord:
    """Fill ``chunks``/``output_tokens``/``text`` from ``parts``, the ``(perf_counter time, text,
    cumulative tokens or None)`` of each chunk that carried output: text, a rise in the cumulative
    count, or a finish without text (where an end-of-sequence token arrives). Stamps ``t_end``.
    A text-less part that ends up with no (known) token is dropped: ``chunks`` holds token-bearing
    chunks (and, rarely, text that the counts gave no token). ``tokenizer``: a transformers
    tokenizer (callable on text) or None."""
    rec.t_end = time.perf_counter()
    texts = [p[1] for p in parts]
    cumulative = [p[2] for p in parts]
    counts, n, source = count_chunk_tokens(texts, cumulative, total, tokenizer)
    rec.chunks = [(t - rec.t_sent, k) for (t, text, _), k in zip(parts, counts, strict=True) if text or k]
    rec.output_tokens, rec.token_source = n, source
    rec.text = "".join(texts)
    return rec


def fail(rec: RequestRecord, status: Status, error: str) -> RequestRecord:
    """Mark ``rec`` failed with ``status`` and ``error`` (what happened and what to do)."""
    rec.status, rec.error = status, error
    rec.t_end = rec.t_end or time.perf_counter()
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
                       total: int | None = None, tokenizer: Any = None
                       ) -> tuple[Sequence[int | None], int | None, str]:
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


class RequestFigures(TypedDict):
    """One request's figures (:func:`request_metrics`): seconds, tokens, tokens/s; NaN when unknown."""

    ttft_s: float
    e2e_s: float
    tpot_s: float
    itl_s: list[float]
    chunk_gaps_s: list[float]
    output_tokens: int | None
    tps: float
    output_tokens_per_s: float


def request_metrics(rec: RequestRecord) -> RequestFigures:
    """Per-request figures (seconds, tokens, tokens/s) of one request record, NaN when unknown.

    * ``ttft_s``: first chunk that carries a token minus ``t_sent`` (a chunk whose count is 0, such
      as text the server counted no token for, is not the first token; unknown counts are taken
      as tokens).
    * ``e2e_s``: last token-bearing chunk minus ``t_sent`` (vLLM's ``latency``; the stream's
      close, a few hundred microseconds later, is ``t_end``). No chunk: ``t_end - t_sent``.
    * ``tpot_s``: ``(e2e - ttft) / (output_tokens - 1)``, vLLM's definition, which leaves the first
      token (prefill) out. GuideLLM's TPOT divides request start -> last token (TTFT included, the
      close after the last token not) by all output tokens; llmperf's "inter-token latency" divides
      E2E including TTFT by the token count. NaN for 0-1 tokens.
    * ``itl_s``: one value per token after the first: a chunk carrying ``k`` tokens that arrives
      ``g`` seconds after the previous token-bearing chunk contributes ``k`` gaps of ``g / k``.
      Tokens that arrive in the first chunk together with the first token have no gap.
    * ``chunk_gaps_s``: one gap per token-bearing chunk after the first. This is *not* vLLM's ITL
      either: vLLM pools one gap per received chunk, empty ones included (a text-less chunk splits
      a gap in two). Both equal ``itl_s`` only when every chunk holds exactly one token; with
      several tokens per chunk, per-chunk gaps overstate ITL by that factor.
    * ``tps``: decode speed as the tutorial means TPS, tokens/s after the first token = 1 / TPOT.
    * ``output_tokens_per_s``: output tokens / E2E, what one user receives on average.
    """
    chunks, t_sent, t_end = rec.chunks, rec.t_sent, rec.t_end
    counts = [c[1] for c in chunks]
    known = bool(chunks) and all(isinstance(k, int) for k in counts)
    n_out = rec.output_tokens
    if n_out is None and known:
        n_out = sum(k or 0 for k in counts)
    bearing = [c for c in chunks if c[1] is None or c[1] > 0] or list(chunks)
    if bearing:
        ttft, e2e = bearing[0][0], bearing[-1][0]
    else:
        ttft, e2e = NAN, (t_sent if t_end is None else t_end) - t_sent
    gaps = [b[0] - a[0] for a, b in zip(bearing, bearing[1:], strict=False)]
    itl: list[float] = []
    if known:  # gaps run from the previous chunk that carried tokens: empty chunks lose no time
        prev_t = None
        for t, k in chunks:
            if k:
                if prev_t is not None:
                    itl += [(t - prev_t) / k] * k
                prev_t = t
    tpot = (e2e - ttft) / (n_out - 1) if n_out and n_out > 1 and chunks else NAN
    return {
        "ttft_s": ttft,
        "e2e_s": e2e,
        "tpot_s": tpot,
        "itl_s": itl,
        "chunk_gaps_s": gaps,
        "output_tokens": n_out,
        "tps": 1.0 / tpot if tpot and tpot > 0 else NAN,
        "output_tokens_per_s": n_out / e2e if n_out and e2e > 0 else NAN,
    }
