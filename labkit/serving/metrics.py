"""Inference metrics: TTFT, TPOT, ITL, E2E latency, throughput, goodput, percentiles (chapter 02).

Definitions follow vLLM's ``vllm bench serve`` (``vllm/benchmarks/serve.py``), the tool the field
treats as the reference; where other tools differ it is said next to the definition.

A *request record* is the plain dict every backend in :mod:`labkit.serving.streaming` returns::

    {"status": "ok",                # or http_error, timeout, broken_stream, connect_error, error
     "error": None,                 # what went wrong, in words
     "t_sent": 12.5,                # time.perf_counter() when the request left (seconds)
     "t_end": 14.1,                 # ... when the stream closed
     "chunks": [[0.21, 1], [0.26, 2], ...],  # [seconds after t_sent, tokens in this chunk]
     "output_tokens": 32, "prompt_tokens": 18, "token_source": "usage-continuous", ...}

Only chunks that carry generated text (or tokens) are kept: role-only chunks, keep-alives and the
final usage chunk never are. :func:`request_metrics` turns one record into numbers, :func:`summarize`
many records into a vLLM-style summary dict (``median_ttft_ms``, ``p99_itl_ms``, ...).

Example::

    from labkit.serving import metrics
    rec = {"status": "ok", "t_sent": 0.0, "t_end": 0.5, "chunks": [[0.2, 1], [0.3, 1], [0.5, 2]],
           "output_tokens": 4}
    metrics.request_metrics(rec)   # ttft_s 0.2, e2e_s 0.5, tpot_s 0.1, itl_s [0.1, 0.1, 0.1]
    print(metrics.format_report(metrics.summarize([rec])))
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable, Sequence
from typing import Any

STATUSES = ("ok", "http_error", "timeout", "broken_stream", "connect_error", "error")
PERCENTILES = (50, 90, 99)
NAN = float("nan")


def request_metrics(rec: dict[str, Any]) -> dict[str, Any]:
    """Per-request figures (seconds, tokens, tokens/s) of one request record.

    * ``ttft_s``: first token-bearing chunk minus ``t_sent``.
    * ``e2e_s``: last token-bearing chunk minus ``t_sent`` (vLLM's ``latency``; the stream's
      close, a few hundred microseconds later, is ``t_end``). No chunk: ``t_end - t_sent``.
    * ``tpot_s``: ``(e2e - ttft) / (output_tokens - 1)``, vLLM's definition, which leaves the first
      token (prefill) out. GuideLLM's TPOT divides the whole E2E by all tokens; llmperf's
      "inter-token latency" divides E2E including TTFT by the token count. NaN for 0-1 tokens.
    * ``itl_s``: one value per token after the first: a chunk carrying ``k`` tokens that arrives
      ``g`` seconds after the previous token-bearing chunk contributes ``k`` gaps of ``g / k``.
      Tokens that arrive in the first chunk together with the first token have no gap. vLLM pools
      one gap per *chunk* (``chunk_gaps_s`` here), which equals ours only when every chunk holds
      one token; with several tokens per chunk, per-chunk gaps overstate ITL by that factor.
    * ``tps``: decode speed as the tutorial means TPS, tokens/s after the first token = 1 / TPOT.
    * ``output_tokens_per_s``: output tokens / E2E, what one user receives on average.
    """
    chunks = rec.get("chunks") or []
    t_sent = rec.get("t_sent", 0.0)
    counts = [c[1] for c in chunks]
    known = bool(chunks) and all(isinstance(k, int) for k in counts)
    n_out = rec.get("output_tokens")
    if n_out is None and known:
        n_out = sum(counts)
    if chunks:
        ttft, e2e = chunks[0][0], chunks[-1][0]
    else:
        ttft, e2e = NAN, rec.get("t_end", t_sent) - t_sent
    gaps = [b[0] - a[0] for a, b in zip(chunks, chunks[1:], strict=False)]
    itl: list[float] = []
    if known:  # gaps run from the previous chunk that carried tokens: empty chunks lose no time
        prev_t = None
        for t, k in chunks:
            if k > 0:
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


def stats(values: Iterable[float], percentiles: Sequence[float] = PERCENTILES) -> dict[str, float]:
    """``n``, ``mean``, ``std``, ``median`` and ``p<q>`` of ``values`` (NaNs dropped) with numpy's
    default (linear) percentile, as vLLM does. Empty input gives ``n`` 0 and NaN figures, never 0."""
    import numpy as np

    a = np.asarray([v for v in values if v is not None and not math.isnan(v)], dtype=float)
    out: dict[str, float] = {"n": int(a.size)}
    if a.size == 0:
        return out | {"mean": NAN, "std": NAN, "median": NAN} | {f"p{_pword(p)}": NAN for p in percentiles}
    out |= {"mean": float(a.mean()), "std": float(a.std()), "median": float(np.median(a))}
    for p in percentiles:
        out[f"p{_pword(p)}"] = float(np.percentile(a, p))
    return out


def _pword(p: float) -> str:
    return str(int(p)) if int(p) == p else str(p)


def meets_slo(m: dict[str, Any], slo: dict[str, float]) -> bool:
    """Whether one request's figures (from :func:`request_metrics`) meet every limit in ``slo``:
    keys ``ttft_ms``, ``tpot_ms``, ``e2el_ms`` (milliseconds, as ``vllm bench serve --goodput``).
    A one-token output has no TPOT and passes that limit (vLLM counts its TPOT as 0)."""
    unknown = set(slo) - {"ttft_ms", "tpot_ms", "e2el_ms"}
    if unknown:
        raise ValueError(f"unknown SLO keys {sorted(unknown)}; use ttft_ms, tpot_ms, e2el_ms")
    values = {"ttft_ms": m["ttft_s"], "tpot_ms": m["tpot_s"], "e2el_ms": m["e2e_s"]}
    for key, limit in slo.items():
        v = values[key]
        if key == "tpot_ms" and math.isnan(v):
            continue
        if math.isnan(v) or v * 1000.0 > limit:
            return False
    return True


def summarize(
    records: Sequence[dict[str, Any]],
    duration_s: float | None = None,
    slo: dict[str, float] | None = None,
    percentiles: Sequence[float] = PERCENTILES,
) -> dict[str, Any]:
    """A vLLM-style summary of ``records`` (a run's requests).

    Keys: ``n_requests``, ``completed`` (status ok), ``failed``, ``status_counts``, ``duration``
    (seconds; default first send to last close), ``total_input_tokens``, ``total_output_tokens``,
    ``request_throughput`` (req/s), ``output_throughput`` (aggregate tokens/s),
    ``total_token_throughput``, ``request_goodput`` (req/s meeting every ``slo`` limit, None without
    SLOs), ``mean_/median_/std_/p50_/p90_/p99_`` + ``ttft|tpot|itl|e2el`` + ``_ms``, and
    ``n_ttft``/``n_tpot``/``n_itl``/``n_e2el``: how many values each figure is over (TPOT leaves
    out one-token outputs; ITL counts gaps, not requests). Also the per-stream decode speed
    ``median_tps`` (1 / median TPOT, tokens/s; robust) and ``mean_tps`` (mean of per-request
    1/TPOT: one stalled request whose tokens arrive in a burst inflates it), and the per-chunk ITL
    vLLM reports (``*_chunk_itl_ms``) to show the multi-token-chunk trap. Throughput counts only
    completed requests, as vLLM does; failures are counted, never dropped.
    """
    records = list(records)
    counts = Counter(r.get("status", "error") for r in records)
    ok = [r for r in records if r.get("status") == "ok"]
    per = [request_metrics(r) for r in ok]
    if duration_s is None:
        starts = [r["t_sent"] for r in records if "t_sent" in r]
        ends = [r.get("t_end", r["t_sent"]) for r in records if "t_sent" in r]
        duration_s = (max(ends) - min(starts)) if starts else 0.0
    out_tokens = sum(m["output_tokens"] or 0 for m in per)
    in_tokens = sum(r.get("prompt_tokens") or 0 for r in ok)
    rate = (lambda x: x / duration_s if duration_s > 0 else NAN)
    s: dict[str, Any] = {
        "n_requests": len(records),
        "completed": len(ok),
        "failed": len(records) - len(ok),
        "status_counts": {k: counts.get(k, 0) for k in STATUSES} | dict(counts),
        "duration": duration_s,
        "total_input_tokens": in_tokens,
        "total_output_tokens": out_tokens,
        "output_tokens_unknown": sum(1 for m in per if m["output_tokens"] is None),
        "request_throughput": rate(len(ok)),
        "output_throughput": rate(out_tokens),
        "total_token_throughput": rate(out_tokens + in_tokens),
        "request_goodput": rate(sum(meets_slo(m, slo) for m in per)) if slo else None,
        "slo": dict(slo) if slo else None,
    }
    series = {
        "ttft": [m["ttft_s"] for m in per],
        "tpot": [m["tpot_s"] for m in per],
        "itl": [g for m in per for g in m["itl_s"]],
        "e2el": [m["e2e_s"] for m in per],
        "chunk_itl": [g for m in per for g in m["chunk_gaps_s"]],
    }
    for name, values in series.items():
        st = stats(values, percentiles)
        s[f"n_{name}"] = st.pop("n")
        for key, v in st.items():
            s[f"{key}_{name}_ms"] = v * 1000.0
    s["mean_tps"] = stats(m["tps"] for m in per)["mean"]
    s["median_tps"] = 1000.0 / s["median_tpot_ms"] if s["median_tpot_ms"] > 0 else NAN
    return s


def format_report(s: dict[str, Any], title: str = "") -> str:
    """Text table of a :func:`summarize` dict: each figure's mean/P50/P90/P99 in ms and how many
    values it is over, then throughput and the status of every request."""
    lines = [title] if title else []
    counts = ", ".join(f"{k} {v}" for k, v in s["status_counts"].items() if v)
    lines.append(f"requests     {s['n_requests']} ({counts or 'none'}) in {s['duration']:.2f} s")
    lines.append(f"{'figure':<12} {'mean':>9} {'p50':>9} {'p90':>9} {'p99':>9}   over")
    for name, label in (("ttft", "TTFT ms"), ("tpot", "TPOT ms"), ("itl", "ITL ms"),
                        ("chunk_itl", "chunk ITL ms"), ("e2el", "E2E ms")):
        row = [s.get(f"{k}_{name}_ms", NAN) for k in ("mean", "p50", "p90", "p99")]
        unit = "gaps" if "itl" in name else "requests"
        lines.append(f"{label:<12} " + " ".join(f"{v:9.1f}" for v in row) + f"   {s[f'n_{name}']} {unit}")
    lines.append(
        f"throughput   {s['output_throughput']:.1f} output tok/s aggregate, "
        f"{s['request_throughput']:.2f} req/s, {s['median_tps']:.1f} tok/s per stream (1/median TPOT)"
    )
    if s.get("request_goodput") is not None:
        lines.append(f"goodput      {s['request_goodput']:.2f} req/s meeting {s['slo']}")
    if s.get("output_tokens_unknown"):
        lines.append(f"warning      {s['output_tokens_unknown']} requests with unknown token counts "
                     "(no usage from the server and no tokenizer): TPOT/ITL leave them out")
    return "\n".join(lines)


def format_rows(rows: Sequence[dict[str, Any]]) -> str:
    """Plain-text table of result rows (dicts with the same keys; the keys are the header): floats
    to one decimal, text left-aligned, numbers right-aligned. Chapters 02 and 05."""
    if not rows:
        return "(no rows)"
    keys = list(rows[0])
    fmt = lambda v: f"{v:.1f}" if isinstance(v, float) else str(v)
    cells = [[fmt(r[k]) for k in keys] for r in rows]
    widths = [max(len(k), *(len(c[i]) for c in cells)) for i, k in enumerate(keys)]
    left = [isinstance(rows[0][k], str) for k in keys]
    line = lambda vals: "  ".join(v.ljust(w) if lj else v.rjust(w)
                                  for v, w, lj in zip(vals, widths, left, strict=True))
    return "\n".join([line(keys)] + [line(c) for c in cells])


# --- Counting tokens per chunk -------------------------------------------------------------
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
    """Share a known total (the server's final usage count) among chunks. When the total equals
    the number of chunks each holds exactly one token (every chunk carries at least one); otherwise
    each chunk gets one and the rest goes by characters (largest remainder). An approximation,
    used only when the server reports no per-chunk counts and no tokenizer is given."""
    n = len(texts)
    if n == 0:
        return []
    if total <= n:
        return [1] * total + [0] * (n - total)
    extra = total - n
    chars = [max(1, len(t)) for t in texts]
    shares = [extra * c / sum(chars) for c in chars]
    base = [int(x) for x in shares]
    left = extra - sum(base)
    for i in sorted(range(n), key=lambda i: shares[i] - base[i], reverse=True)[:left]:
        base[i] += 1
    return [1 + b for b in base]


def count_chunk_tokens(texts: Sequence[str], cumulative: Sequence[int | None] | None = None,
                       total: int | None = None, tokenizer: Any = None) -> tuple[list[Any], int | None, str]:
    """Tokens in each chunk, the output token count, and where they came from, best source first:

    1. ``"usage-continuous"``: cumulative server counts on every chunk (exact);
    2. ``"tokenizer"`` / ``"usage+tokenizer"``: re-tokenized cumulative text (the server's final
       usage total, when sent, stays the output count);
    3. ``"usage"`` / ``"usage+chars"``: the final total shared among chunks (:func:`tokens_by_total`);
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
        return counts, (sum(counts) if total is None else total), (
            "tokenizer" if total is None else "usage+tokenizer")
    if total is not None:
        return tokens_by_total(texts, total), total, "usage" if total == len(texts) else "usage+chars"
    return [None] * len(texts), None, "unknown"
