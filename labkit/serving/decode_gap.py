"""Where generation speed goes between the model and the reader, on a local llama.cpp (chapter 02).

Four clocks time the same decode, each enclosing more than the one before:

* **the model alone**: llama-bench's generation rate (``labkit.engines.llamacpp.bench``): batch 1, no
  sampling, no detokenization, no HTTP;
* **the server's own, not streamed**: llama-server's ``timings`` of a request sent without
  streaming (:func:`unstreamed_timing`): the model plus sampling, detokenization and the server's
  loop, from the first token to the last;
* **the server's own, streamed**: the same ``timings`` of the streamed requests
  (``RequestRecord.server``, read by :func:`labkit.serving.openai_api.llamacpp_server_timing`): now
  the server also writes one SSE chunk per token while the model runs;
* **the client's**: labkit's 1/TPOT from the stream (:func:`labkit.serving.records.request_metrics`),
  the same span after delivery over HTTP and parsing; and output tokens / E2E, which also counts
  the wait for the first token.

:func:`decode_layers` turns a run's records, the unstreamed timings and llama-bench's rate into those
rates (medians over requests with :func:`labkit.stats.median_interval`), their ratios and the
milliseconds per token each layer adds; :func:`gap_sentences` says it in words, from the numbers.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import httpx

from ..stats import median_interval
from .openai_api import llamacpp_server_timing
from .records import RequestRecord, ServerTiming, request_metrics
from .streaming import base_url_of

__all__ = ["decode_layers", "figures", "gap_sentences", "per_request", "unstreamed_timing"]


def unstreamed_timing(base_url: str, model: str, prompt: str, max_tokens: int = 32,
                      timeout_s: float = 120.0) -> ServerTiming:
    """llama-server's own timing of one chat request sent *without* streaming (greedy, exactly
    ``max_tokens`` tokens, as the load generator's requests): the server samples and detokenizes
    as usual but sends one answer at the end, so no per-token HTTP work runs beside the model.
    ``RuntimeError`` when the answer carries no ``timings`` (not a llama.cpp server)."""
    body = {"model": model, "messages": [{"role": "user", "content": prompt}], "max_tokens": max_tokens,
            "temperature": 0.0, "ignore_eos": True, "stream": False}
    r = httpx.post(f"{base_url_of(base_url)}/v1/chat/completions", json=body, timeout=timeout_s)
    r.raise_for_status()
    timings = r.json().get("timings")
    if not isinstance(timings, dict):
        raise RuntimeError(f"{base_url} answered without llama.cpp's `timings`: is it llama-server?")
    return llamacpp_server_timing(timings)


def per_request(records: Sequence[RequestRecord],
                unstreamed: Mapping[Any, ServerTiming] | None = None) -> list[dict[str, Any]]:
    """One row per ``ok`` request that carries the server's own timing: ``prompt_id``,
    ``prompt_tokens``, ``ttft_ms`` (client), ``prefill_ms`` (server: prompt processing to the first
    token), ``client_tps`` (1/TPOT), ``server_tps`` (the server's own rate over the same tokens),
    ``e2e_tps`` (output tokens / E2E, client) and, when ``unstreamed`` (prompt id -> the server's
    timing of the same prompt sent without streaming) has the request's prompt, ``unstreamed_tps``.
    Rates in tokens/s."""
    rows = []
    for r in records:
        sv = r.server
        if r.status != "ok" or sv is None or not sv.get("eval_tokens_per_s"):
            continue
        m = request_metrics(r)
        prefill = sv.get("prompt_eval_s")
        plain = (unstreamed or {}).get(r.prompt_id)
        rows.append({"prompt_id": r.prompt_id, "prompt_tokens": r.prompt_tokens, "ttft_ms": m["ttft_s"] * 1e3,
                     "prefill_ms": prefill * 1e3 if prefill is not None else None,
                     "client_tps": m["tps"], "server_tps": sv["eval_tokens_per_s"],
                     "e2e_tps": m["output_tokens_per_s"],
                     "unstreamed_tps": plain.get("eval_tokens_per_s") if plain else None})
    return rows


#: The layers between llama-bench's model step and the client's time per token, in order: each is the
#: time per token of one clock less the one inside it (see :func:`decode_layers`). Without the
#: unstreamed clock, ``server`` stands for ``sampling`` and ``streaming`` together.
LAYERS = {"sampling": "sampling, detokenization and the server's loop (its own clock, not streaming)",
          "streaming": "streaming each token as it comes: a JSON chunk and an HTTP write per token in the "
                       "server, read by the client, on the CPU the model uses",
          "server": "everything the server adds around the model step while streaming (sampling, "
                    "detokenization, its loop, a chunk per token)",
          "delivery": "delivery to the client over loopback and its SSE parsing"}


def decode_layers(records: Sequence[RequestRecord], bench_tps: float,
                  unstreamed: Mapping[Any, ServerTiming] | None = None,
                  bench_sd: float = 0.0) -> dict[str, Any]:
    """The clocks of the module doc for one run (``records``, streamed one at a time), llama-bench's
    generation rate ``bench_tps`` (tokens/s, same model and threads) and, optionally, ``unstreamed``
    (prompt id -> the server's own timing of the same prompt sent without streaming,
    :func:`unstreamed_timing`) and llama-bench's standard deviation ``bench_sd`` (tokens/s): the
    intervals of every figure that involves llama-bench then span its rate +- ``bench_sd`` too
    (llama-bench runs at another moment than the requests, and a machine's speed drifts).

    Returns ``n`` (requests counted: those with the server's timing, and with an unstreamed one
    when ``unstreamed`` is given), ``bench_tps``, ``bench_sd``, ``model_ms_per_token`` (``1000 / bench_tps``),
    ``layers`` (the :data:`LAYERS` keys measured, in order) and, each a
    :func:`~labkit.stats.median_interval` dict (``median``, ``lo``, ``hi``, ``n``) over those
    requests: the rates ``server_tps`` (streamed, the server's clock), ``client_tps`` (1/TPOT),
    ``e2e_tps`` (tokens/s) and with ``unstreamed`` ``unstreamed_tps``; the ratios
    ``client_over_server``, ``client_over_bench`` (and ``unstreamed_over_bench``); the milliseconds
    per token each layer adds, ``<layer>_ms``: ``sampling`` (unstreamed server less the model step)
    and ``streaming`` (streamed less unstreamed, on the server's clock), or without ``unstreamed``
    ``server`` (streamed server less the model step); ``delivery`` (the client's TPOT less the
    streamed server's); ``ttft_ms`` (the client's TTFT) and ``ttft_minus_prefill_ms`` (its part
    beyond the server's prefill: request parsing, chat template, tokenization, HTTP). ``ValueError``
    when no request qualifies (not a llama.cpp server, or prompts without ids) or ``bench_tps`` is
    not positive."""
    rows = [r for r in per_request(records, unstreamed) if unstreamed is None or r["unstreamed_tps"]]
    if not rows:
        raise ValueError("no ok request carries the server's own timing"
                         + (" and an unstreamed one of its prompt id" if unstreamed is not None else "")
                         + ": decode_layers needs records from llama.cpp's server (its stream sends "
                         "`timings`)")
    if not bench_tps > 0:
        raise ValueError(f"bench_tps must be a positive rate (tokens/s), got {bench_tps}")
    if not bench_sd >= 0:
        raise ValueError(f"bench_sd must be a standard deviation (>= 0 tokens/s), got {bench_sd}")
    # a busy machine can stall one llama-bench repetition so that its sd reaches its mean: the rate's low end
    # is then near 0 and every interval through it is all but unbounded (clamped at a thousandth of the rate)
    bench_lo = max(bench_tps - bench_sd, bench_tps / 1000)
    model_ms = 1e3 / bench_tps
    col = lambda f: median_interval([f(r) for r in rows])  # noqa: E731
    ms = lambda k: 1e3 / k  # noqa: E731 - tokens/s -> ms per token

    def with_bench(f: Callable[[dict[str, Any], float], float]) -> dict[str, float]:
        """f(row, llama-bench's rate): the median at its mean, the interval over its mean +- sd."""
        at = [col(lambda r, b=b: f(r, b)) for b in (bench_tps, bench_lo, bench_tps + bench_sd)]
        return at[0] | {"lo": min(a["lo"] for a in at), "hi": max(a["hi"] for a in at)}
    g: dict[str, Any] = {
        "n": len(rows), "bench_tps": bench_tps, "bench_sd": bench_sd, "model_ms_per_token": model_ms,
        "server_tps": col(lambda r: r["server_tps"]), "client_tps": col(lambda r: r["client_tps"]),
        "e2e_tps": col(lambda r: r["e2e_tps"]),
        "client_over_server": col(lambda r: r["client_tps"] / r["server_tps"]),
        "client_over_bench": with_bench(lambda r, b: r["client_tps"] / b),
        "ttft_ms": col(lambda r: r["ttft_ms"]),
        "ttft_minus_prefill_ms": median_interval([r["ttft_ms"] - r["prefill_ms"] for r in rows
                                                  if r["prefill_ms"] is not None]),
    }
    if unstreamed is not None:
        g |= {"unstreamed_tps": col(lambda r: r["unstreamed_tps"]),
              "unstreamed_over_bench": with_bench(lambda r, b: r["unstreamed_tps"] / b),
              "sampling_ms": with_bench(lambda r, b: ms(r["unstreamed_tps"]) - ms(b)),
              "streaming_ms": col(lambda r: ms(r["server_tps"]) - ms(r["unstreamed_tps"])),
              "layers": ["sampling", "streaming", "delivery"]}
    else:
        g |= {"server_ms": with_bench(lambda r, b: ms(r["server_tps"]) - ms(b)),
              "layers": ["server", "delivery"]}
    g["delivery_ms"] = col(lambda r: ms(r["client_tps"]) - ms(r["server_tps"]))
    return g


def _nz(x: float, digits: int) -> float:
    """``x`` rounded to ``digits`` decimals, without a negative zero: a layer of -0.004 ms prints
    as +0.00, not -0.00."""
    return round(x, digits) + 0.0


def gap_sentences(g: Mapping[str, Any], threads: int | None = None, cpus: int | None = None) -> str:
    """:func:`decode_layers`'s result in words: each rate, the ratios, and the milliseconds per token
    each layer added between the model step and the client's TPOT (a layer whose requests fell on
    both sides of zero is said to be within this run's noise), every figure printed from ``g``.
    With llama.cpp's ``threads``: a line saying when they take all ``cpus`` logical CPUs (default
    ``os.cpu_count()``), so the server's HTTP work and the client share the model's cores."""
    rate = lambda k: g[k]["median"]  # noqa: E731
    sd = f" ± {g['bench_sd']:.1f}" if g.get("bench_sd") else ""
    lines = [f"model alone (llama-bench):       {g['bench_tps']:5.1f}{sd} tok/s  = "
             f"{g['model_ms_per_token']:.2f} ms per token"]
    if "unstreamed_tps" in g:
        lines.append(f"server's clock, not streamed:    {rate('unstreamed_tps'):5.1f} tok/s  "
                     f"({g['unstreamed_over_bench']['median']:.2f}x llama-bench)")
    lines += [
        f"server's clock, streamed:        {rate('server_tps'):5.1f} tok/s",
        f"client's clock, 1/TPOT:          {rate('client_tps'):5.1f} tok/s  "
        f"({g['client_over_server']['median']:.3f}x the server's, "
        f"{g['client_over_bench']['median']:.2f}x llama-bench)",
        f"client's clock, tokens / E2E:    {rate('e2e_tps'):5.1f} tok/s  "
        "(the wait for the first token counted in)",
        f"per token, median of {g['n']} requests (their range in brackets), beyond the model step:",
    ]
    for k in g["layers"]:
        d = g[f"{k}_ms"]
        noise = ("  (within this run's noise)" if d["lo"] < 0 < d["hi"]
                 else "  (below zero on every request)" if d["hi"] <= -0.005 else "")
        lines.append(f"  {_nz(d['median'], 2):+6.2f} ms [{_nz(d['lo'], 2):+.2f}, {_nz(d['hi'], 2):+.2f}] "
                     f"{LAYERS[k]}{noise}")
    added = [k for k in g["layers"] if g[f"{k}_ms"]["median"] > 0]
    big = max(added, key=lambda k: g[f"{k}_ms"]["median"]) if added else None
    total = _nz(sum(g[f"{k}_ms"]["median"] for k in g["layers"]), 2)
    lines.append(f"together {total:+.2f} ms per token on a model step of {g['model_ms_per_token']:.2f} ms; "
                 + (f"the largest layer: {big}" if big else "no layer added time in this run"))
    cpus = cpus or os.cpu_count()
    if threads and cpus and threads >= cpus:
        lines.append(f"llama.cpp's {threads} threads take all {cpus} logical CPUs here: the server's HTTP "
                     "work and the client run on the cores the model decodes on")
    t = g["ttft_minus_prefill_ms"]
    lines.append(f"before the first token the client waited {_nz(t['median'], 1):.1f} ms "
                 f"[{_nz(t['lo'], 1):.1f}, {_nz(t['hi'], 1):.1f}] beyond the server's prefill "
                 "(request parsing, chat template, tokenization, HTTP)")
    return "\n".join(lines)


#: What chapter 02 records of :func:`decode_layers` (as ``llamacpp_<key>``): key -> (unit, what it is).
FIGURES = {
    "unstreamed_tps": ("tok/s", "llama-server's own decode rate, not streamed"),
    "server_tps": ("tok/s", "llama-server's own decode rate, streamed requests"),
    "client_tps": ("tok/s", "labkit's 1/TPOT of the streamed requests"),
    "e2e_tps": ("tok/s", "labkit's output tokens / E2E"),
    "client_over_server": ("x", "labkit's 1/TPOT / the server's own rate"),
    "client_over_bench": ("x", "labkit's 1/TPOT / llama-bench's rate"),
    "unstreamed_over_bench": ("x", "the server's own rate, not streamed / llama-bench's"),
    "sampling_ms": ("ms/token", "server not streaming, beyond llama-bench's step"),
    "streaming_ms": ("ms/token", "server streaming, beyond not streaming"),
    "server_ms": ("ms/token", "server streaming, beyond llama-bench's step"),
    "delivery_ms": ("ms/token", "labkit's TPOT beyond the server's own"),
    "ttft_ms": ("ms", "labkit's TTFT"),
    "ttft_minus_prefill_ms": ("ms", "labkit's TTFT beyond the server's prefill"),
}


def figures(g: Mapping[str, Any], bench: Mapping[str, Any], reps: int
            ) -> dict[str, tuple[Any, str, str, tuple[float, float, int] | None]]:
    """What chapter 02 records (as ``llamacpp_<key>``, with :func:`labkit.results.record`), key ->
    ``(value, unit, note, spread)``: ``threads``, ``bench_gen_tps`` (llama-bench's mean, spread: one
    sd over its ``reps`` runs) from ``bench`` (:func:`labkit.engines.llamacpp.bench`'s dict), and each
    :data:`FIGURES` key that :func:`decode_layers` returned in ``g``: its median over requests
    (spread: ``lo``, ``hi``)."""
    m, sd, t = float(bench["gen_tps"]), float(bench["gen_tps_sd"]), int(bench["threads"])
    out: dict[str, tuple[Any, str, str, tuple[float, float, int] | None]] = {
        "threads": (t, "threads", "llama-server and llama-bench alike", None),
        "bench_gen_tps": (m, "tok/s", f"llama-bench batch-1 generation, {t} threads, mean of {reps} runs "
                          "(spread: one sd)", (m - sd, m + sd, reps))}
    for k, (unit, what) in FIGURES.items():
        if k in g:
            d = g[k]
            note = f"median of {d['n']} requests: {what}"
            out[k] = (d["median"], unit, note, (d["lo"], d["hi"], int(d["n"])))
    return out
