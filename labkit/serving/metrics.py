"""Inference metrics: TTFT, TPOT, ITL, E2E latency, throughput, goodput, percentiles (chapter 02).

Definitions follow vLLM's ``vllm bench serve`` (``vllm/benchmarks/serve.py``), the tool the field
treats as the reference; where other tools differ it is said next to the definition.

A *request record* is the :class:`labkit.serving.records.RequestRecord` every backend in
:mod:`labkit.serving.streaming` returns (its fields and their units are documented there): the
send and close times (seconds) and the chunks that carried generated output, each as (seconds
after sending, tokens in it). :func:`labkit.serving.records.request_metrics` turns one record into
numbers, :func:`summarize` many records into a :class:`RunSummary` (vLLM's
summary: counts, throughput, and a :class:`Spread` in ms per figure, ``s.ttft.p99``); the load
generator returns one with its run's settings and records filled in.

Example::

    from labkit.serving import metrics
    from labkit.serving.records import RequestRecord, request_metrics
    rec = RequestRecord(status="ok", t_sent=0.0, t_end=0.5, chunks=[(0.2, 1), (0.3, 1), (0.5, 2)],
                        output_tokens=4)
    request_metrics(rec)           # ttft_s 0.2, e2e_s 0.5, tpot_s 0.1, itl_s [0.1, 0.1, 0.1]
    print(metrics.format_report(metrics.summarize([rec])))
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, fields
from typing import Any

from ..stats import summary
from .records import RequestFigures, RequestRecord, request_metrics

STATUSES = ("ok", "http_error", "timeout", "broken_stream", "connect_error", "error")
PERCENTILES = (50, 90, 99)
NAN = float("nan")
FIGURES = ("ttft", "tpot", "itl", "e2el", "chunk_gap")


@dataclass(frozen=True)
class Spread:
    """One figure's spread over a run, in milliseconds: how many values it is over (requests, or gaps
    for ITL), mean, standard deviation, median and the 50th/90th/99th percentiles; NaN when ``n`` is 0."""

    n: int
    mean: float
    std: float
    median: float
    p50: float
    p90: float
    p99: float

    @classmethod
    def of_seconds(cls, values: Iterable[float]) -> Spread:
        """The spread of ``values`` given in seconds (NaN left out), in ms."""
        st = summary(values, PERCENTILES)
        return cls(n=int(st["n"]), **{f.name: st[f.name] * 1000.0 for f in fields(cls) if f.name != "n"})


@dataclass(frozen=True)
class RunSummary:
    """A run's requests summarized as ``vllm bench serve`` does (chapter 02; :func:`summarize` builds it).

    Counts: ``n_requests``, ``completed`` (status ok), ``failed``, ``status_counts`` (every status in
    :data:`STATUSES`, and ``not_sent`` from the load generator). ``duration_s``: first send to last
    close unless given. Tokens: ``total_input_tokens``, ``total_output_tokens``,
    ``output_tokens_unknown`` (completed requests without a count). Throughput over completed requests
    only: ``request_throughput`` (req/s), ``output_throughput`` (aggregate output tokens/s),
    ``total_token_throughput``. Goodput: ``request_goodput`` (req/s meeting every ``slo`` limit, None
    without SLOs), ``slo_unknown`` (completed requests whose figures could not be judged, never goodput).
    Spreads (ms): ``ttft``, ``tpot`` (leaves out one-token outputs), ``itl`` (over gaps, not requests),
    ``e2el``, ``chunk_gap`` (between token-bearing chunks; see :func:`request_metrics`). Per-stream decode
    speed (tokens/s): ``median_tps`` (1 / median TPOT; robust), ``mean_tps`` (mean of per-request
    1/TPOT: one stalled request whose tokens arrive in a burst inflates it).

    The load generator's run (:func:`labkit.serving.loadgen.run`) also fills ``label``, ``backend``,
    ``mode`` (closed/open), ``concurrency``, ``rate``, ``burstiness``, ``max_tokens``, ``warmup``,
    ``n_planned``, ``accounted`` (every planned request has a status), the ``jsonl``/``summary_json``
    paths it wrote, and ``requests`` (every record, not-sent ones included); None or empty otherwise.
    """

    n_requests: int
    completed: int
    failed: int
    status_counts: dict[str, int]
    duration_s: float
    total_input_tokens: int
    total_output_tokens: int
    output_tokens_unknown: int
    request_throughput: float
    output_throughput: float
    total_token_throughput: float
    request_goodput: float | None
    slo: dict[str, float] | None
    slo_unknown: int
    ttft: Spread
    tpot: Spread
    itl: Spread
    e2el: Spread
    chunk_gap: Spread
    mean_tps: float
    median_tps: float
    label: str | None = None
    backend: str | None = None
    mode: str | None = None
    concurrency: int | None = None
    rate: float | None = None
    burstiness: float | None = None
    max_tokens: int | None = None
    warmup: int | None = None
    n_planned: int | None = None
    accounted: bool | None = None
    jsonl: str | None = None
    summary_json: str | None = None
    requests: tuple[RequestRecord, ...] = field(default=(), repr=False)

    def spread(self, figure: str) -> Spread:
        """The :class:`Spread` of ``figure``, one of :data:`FIGURES` (for tables that loop over them)."""
        if figure not in FIGURES:
            raise ValueError(f"unknown figure {figure!r}; use one of {', '.join(FIGURES)}")
        value: Spread = getattr(self, figure)
        return value

    def vllm_names(self) -> dict[str, float]:
        """The figures under the names ``vllm bench serve`` saves them by (``median_ttft_ms``,
        ``p99_itl_ms``, ``output_throughput``, ...), to set beside its result file."""
        out = {f"{stat}_{name}_ms": getattr(self.spread(name), stat)
               for name in FIGURES for stat in ("mean", "median", "std", "p50", "p90", "p99")}
        same = ("completed", "total_input_tokens", "total_output_tokens", "request_throughput",
                "output_throughput", "total_token_throughput")
        return out | {k: getattr(self, k) for k in same} | {"duration": self.duration_s}

    def to_json(self) -> dict[str, Any]:
        """JSON-ready data for the summary file: every field but the records (they go to JSONL), the
        spreads flat under vLLM's names (:meth:`vllm_names`) with ``n_<figure>`` counts."""
        plain = {f.name: getattr(self, f.name) for f in fields(self) if f.name not in (*FIGURES, "requests")}
        return plain | self.vllm_names() | {f"n_{name}": self.spread(name).n for name in FIGURES}


def meets_slo(m: RequestFigures, slo: Mapping[str, float]) -> bool | None:
    """Whether one request's figures (from :func:`request_metrics`) meet every limit in ``slo``:
    keys ``ttft_ms``, ``tpot_ms``, ``e2el_ms`` (milliseconds, as ``vllm bench serve --goodput``).
    An output of at most one token has TPOT 0 for this purpose, as in vLLM. ``None`` when a figure
    a limit needs is unknown (e.g. TPOT without token counts): not known to meet it, so
    :func:`summarize` counts it apart and never as goodput."""
    unknown = set(slo) - {"ttft_ms", "tpot_ms", "e2el_ms"}
    if unknown:
        raise ValueError(f"unknown SLO keys {sorted(unknown)}; use ttft_ms, tpot_ms, e2el_ms")
    values = {"ttft_ms": m["ttft_s"], "tpot_ms": m["tpot_s"], "e2el_ms": m["e2e_s"]}
    n_out = m.get("output_tokens")
    if math.isnan(values["tpot_ms"]) and n_out is not None and n_out <= 1:
        values["tpot_ms"] = 0.0
    if any(math.isnan(values[k]) for k in slo):
        return None
    return all(values[k] * 1000.0 <= limit for k, limit in slo.items())


def summarize(records: Sequence[RequestRecord], duration_s: float | None = None,
              slo: Mapping[str, float] | None = None) -> RunSummary:
    """The :class:`RunSummary` of ``records`` (a run's requests): ``duration_s`` defaults to the first
    send to the last close; ``slo`` limits in ms (:func:`meets_slo`) give goodput. Throughput counts
    only completed requests, as vLLM does; failures are counted, never dropped."""
    records = list(records)
    counts: Counter[str] = Counter(r.status for r in records)
    ok = [r for r in records if r.status == "ok"]
    per = [request_metrics(r) for r in ok]
    if duration_s is None:
        starts = [r.t_sent for r in records]
        ends = [r.t_sent if r.t_end is None else r.t_end for r in records]
        duration_s = (max(ends) - min(starts)) if starts else 0.0
    span = duration_s
    out_tokens = sum(m["output_tokens"] or 0 for m in per)
    in_tokens = sum(r.prompt_tokens or 0 for r in ok)

    def rate(x: float) -> float:
        return x / span if span > 0 else NAN

    judged = [meets_slo(m, slo) for m in per] if slo else []
    tpot = Spread.of_seconds(m["tpot_s"] for m in per)
    return RunSummary(
        n_requests=len(records), completed=len(ok), failed=len(records) - len(ok),
        status_counts={k: counts.get(k, 0) for k in STATUSES} | dict(counts), duration_s=span,
        total_input_tokens=in_tokens, total_output_tokens=out_tokens,
        output_tokens_unknown=sum(1 for m in per if m["output_tokens"] is None),
        request_throughput=rate(len(ok)), output_throughput=rate(out_tokens),
        total_token_throughput=rate(out_tokens + in_tokens),
        request_goodput=rate(sum(v is True for v in judged)) if slo else None,
        slo=dict(slo) if slo else None, slo_unknown=sum(v is None for v in judged),
        ttft=Spread.of_seconds(m["ttft_s"] for m in per), tpot=tpot,
        itl=Spread.of_seconds(g for m in per for g in m["itl_s"]),
        e2el=Spread.of_seconds(m["e2e_s"] for m in per),
        chunk_gap=Spread.of_seconds(g for m in per for g in m["chunk_gaps_s"]),
        mean_tps=summary(m["tps"] for m in per)["mean"],
        median_tps=1000.0 / tpot.median if tpot.median > 0 else NAN)


def format_report(s: RunSummary, title: str = "") -> str:
    """Text table of a :class:`RunSummary`: each figure's mean/P50/P90/P99 in ms and how many
    values it is over, then throughput and the status of every request."""
    lines = [title] if title else []
    counts = ", ".join(f"{k} {v}" for k, v in s.status_counts.items() if v)
    lines.append(f"requests     {s.n_requests} ({counts or 'none'}) in {s.duration_s:.2f} s")
    lines.append(f"{'figure':<12} {'mean':>9} {'p50':>9} {'p90':>9} {'p99':>9}   over")
    for name, label in (("ttft", "TTFT ms"), ("tpot", "TPOT ms"), ("itl", "ITL ms"),
                        ("chunk_gap", "chunk gap ms"), ("e2el", "E2E ms")):
        sp = s.spread(name)
        unit = "gaps" if name in ("itl", "chunk_gap") else "requests"
        lines.append(f"{label:<12} " + " ".join(f"{v:9.1f}" for v in (sp.mean, sp.p50, sp.p90, sp.p99))
                     + f"   {sp.n} {unit}")
    lines.append(
        f"throughput   {s.output_throughput:.1f} output tok/s aggregate, "
        f"{s.request_throughput:.2f} req/s, {s.median_tps:.1f} tok/s per stream (1/median TPOT)"
    )
    lines.append("             ITL: per token (a k-token chunk gives k gaps); chunk gap: per token-bearing "
                 "chunk (vLLM's ITL is per chunk, empty ones included)")
    if s.request_goodput is not None:
        lines.append(f"goodput      {s.request_goodput:.2f} req/s meeting {s.slo}"
                     + (f"; {s.slo_unknown} requests with an unknown figure not counted"
                        if s.slo_unknown else ""))
    if s.output_tokens_unknown:
        lines.append(f"warning      {s.output_tokens_unknown} requests with unknown token counts "
                     "(no usage from the server and no tokenizer): TPOT/ITL leave them out")
    return "\n".join(lines)


def by_prompt_kind(records: Sequence[RequestRecord], kinds: Sequence[str]) -> dict[str, dict[str, float]]:
    """Median TTFT and TPOT in ms of ``records`` grouped by the kind of prompt each sent (``kinds``,
    one per record, e.g. "short"/"long"): ``{kind: {"ttft_ms", "tpot_ms", "n"}}`` (chapter 02)."""
    if len(records) != len(kinds):
        raise ValueError(f"{len(records)} records but {len(kinds)} kinds")
    out: dict[str, dict[str, float]] = {}
    for kind in dict.fromkeys(kinds):
        figs = [request_metrics(r) for r, k in zip(records, kinds, strict=True) if k == kind]
        out[kind] = {"ttft_ms": float(summary([f["ttft_s"] for f in figs])["median"]) * 1e3,
                     "tpot_ms": float(summary([f["tpot_s"] for f in figs])["median"]) * 1e3, "n": len(figs)}
    return out


def prompt_length_sentence(fig: Mapping[str, Mapping[str, float]], short: str = "short", long: str = "long",
                           flat: float = 0.10) -> str:
    """One sentence on how TTFT and TPOT moved from ``short`` to ``long`` prompts (medians from
    :func:`by_prompt_kind`); a TPOT change within ``flat`` (10%) is called flat."""
    a, b = fig[short], fig[long]
    t_x, p_ch = b["ttft_ms"] / a["ttft_ms"], b["tpot_ms"] / a["tpot_ms"] - 1
    head = (f"From {short} to {long} prompts the median TTFT went {a['ttft_ms']:.0f} -> "
            f"{b['ttft_ms']:.0f} ms "
            f"({t_x:.1f}x) and the median TPOT {a['tpot_ms']:.1f} -> {b['tpot_ms']:.1f} ms ({p_ch:+.0%}): ")
    if abs(p_ch) <= flat:
        return head + "TPOT stayed within 10%, since each decode step still handles one token."
    if p_ch < 0 and t_x > 1:
        return head + ("TPOT fell while TTFT rose: the prompt's length showed in the first token only, since "
                       "each decode step still handles one token.")
    if p_ch < 0:
        return head + "both fell."
    if t_x - 1 > 2 * p_ch:
        return head + ("TPOT grew too, but by much less than TTFT: a decode step handles one token, yet "
                       "attends over a longer context.")
    return head + "TPOT grew about as much as TTFT here, so prompt length did not separate the two phases."


def knee_sentence(summaries: Sequence[RunSummary], flat: float = 0.10) -> str:
    """Chapter 02's knee, from a concurrency sweep's summaries in order: the output tokens/s each
    request added in flight bought, then the first level whose throughput rose by less than ``flat``
    (10%) over the level before (the knee: throughput stops rising while latency grows), or, when
    every level still rose, that the knee lies beyond the sweep's highest level."""
    c = [s.concurrency or 0 for s in summaries]
    t = [s.output_throughput for s in summaries]
    ttft = [s.ttft.p99 for s in summaries]
    bought = [(t[i] - t[i - 1]) / (c[i] - c[i - 1]) for i in range(1, len(c))]
    text = "Output tokens/s bought by each request added in flight: " + ", ".join(
        f"{a}->{b}: {x:+.1f}" for a, b, x in zip(c, c[1:], bought, strict=False)) + ". "
    i = next((i for i in range(1, len(c)) if t[i] < t[i - 1] * (1 + flat)), len(c) - 1)
    moved = (f"{t[i - 1]:.1f} -> {t[i]:.1f} tok/s from {c[i - 1]} to {c[i]} in flight "
             f"({t[i] / t[i - 1] - 1:+.0%}) while P99 TTFT went {ttft[i - 1]:.0f} -> {ttft[i]:.0f} ms")
    if t[i] < t[i - 1] * (1 + flat):
        return text + f"Throughput went {moved}: the knee lies between {c[i - 1]} and {c[i]}."
    bent = f", though each added request bought {bought[-1] / bought[0]:.0%} of what the first did" \
        if bought[-1] < bought[0] else ""
    return text + (f"Throughput still rose, {moved}: this server's knee lies beyond {c[-1]}, "
                   f"the sweep's last level{bent}.")
