"""Plots for load-test results (chapter 02): TTFT CDF, ITL histogram, and the latency-throughput
knee. Long-tailed distributions are drawn on a log axis, so one outlier does not flatten the rest.
Each takes summaries from :func:`labkit.serving.loadgen.run` (which carry their ``requests``) and
returns the matplotlib ``Axes`` it drew on.

Example::

    from labkit.serving import loadgen, loadspec, plots
    runs = loadgen.sweep(url, (1, 2, 4, 8), client=loadspec.ClientSpec(model="smollm2"))
    plots.plot_knee(runs)
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from .metrics import RunSummary
from .records import RequestFigures, request_metrics


def _ok(s: RunSummary) -> list[RequestFigures]:
    return [request_metrics(r) for r in s.requests if r.status == "ok"]


def _axes(ax: Any) -> Any:
    if ax is not None:
        return ax
    import matplotlib.pyplot as plt

    return plt.subplots(figsize=(6, 3.5))[1]


#: A distribution whose largest value is more than this many times its smallest gets a log axis.
LOG_SPAN = 10.0


def _long_tail(values: Sequence[float]) -> bool:
    pos = [v for v in values if v > 0]
    return len(pos) > 1 and max(pos) > LOG_SPAN * min(pos)


def plot_ttft_cdf(summaries: Sequence[RunSummary], ax: Any = None) -> Any:
    """Empirical CDF of TTFT (ms), one line per run, with each run's P50 and P99 marked. The x axis
    is logarithmic when the TTFTs span more than a factor :data:`LOG_SPAN` (queueing at high
    concurrency), so the fast runs are not squeezed against the axis."""
    ax = _axes(ax)
    everything: list[float] = []
    for s in summaries:
        x = np.sort([m["ttft_s"] * 1000 for m in _ok(s)])
        everything += x.tolist()
        if x.size:
            y = np.arange(1, x.size + 1) / x.size
            line, = ax.step(x, y, where="post", label=f"{s.label} (n={x.size})")
            ax.plot([s.ttft.p50, s.ttft.p99], [0.5, 0.99], "o", color=line.get_color(), ms=4)
    log = _long_tail(everything)
    ax.set(xlabel="TTFT (ms" + (", log scale)" if log else ")"), ylabel="fraction of requests",
           title="TTFT CDF (dots: P50, P99)", ylim=(0, 1.02))
    if log:
        ax.set_xscale("log")
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1))  # beside the axes: covers no line
    return ax


def plot_itl_hist(summaries: Sequence[RunSummary], ax: Any = None, bins: int = 40) -> Any:
    """Histogram (fractions) of per-token ITL (ms) pooled over each run's requests, on log-spaced
    bins and a log x axis: the steady decode gaps and the rare stalls (a prefill joining the batch,
    a preemption) are orders of magnitude apart, and on a linear axis one outlier bin dominates.
    Fractions are of all gaps; gaps of 0 ms (tokens sharing one chunk) cannot sit on a log axis, so
    the legend counts them instead."""
    ax = _axes(ax)
    all_itl = [[g * 1000 for m in _ok(s) for g in m["itl_s"]] for s in summaries]
    pos = [x for xs in all_itl for x in xs if x > 0]
    if pos:
        lo, hi = min(pos), max(pos)
        if hi <= lo * 1.01:  # one value: a narrow band around it
            lo, hi = lo / 1.5, hi * 1.5
        edges = np.geomspace(lo, hi, bins + 1)
        for s, xs in zip(summaries, all_itl, strict=True):
            zero = sum(x <= 0 for x in xs)
            note = f", {zero} at 0 ms" if zero else ""
            note += f", P99 {s.itl.p99:.0f} ms" if s.itl.n else ""
            ax.hist([x for x in xs if x > 0], bins=edges, histtype="step",
                    weights=np.full(len(xs) - zero, 1 / max(1, len(xs))),
                    label=f"{s.label} ({len(xs)} gaps{note})")
        ax.set_xscale("log")
    ax.set(xlabel="inter-token latency (ms, log scale)", ylabel="fraction of gaps",
           title="ITL histogram (log-spaced bins)")
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1))  # beside the axes: covers no line
    return ax


def plot_knee(summaries: Sequence[RunSummary], ax: Any = None) -> Any:
    """Aggregate output tokens/s (left axis) and P99 TTFT and E2E latency (right axis, ms) against
    concurrency: throughput flattens while tail latency keeps climbing past the knee."""
    ax = _axes(ax)
    c = [s.concurrency or 0 for s in summaries]
    ax.plot(c, [s.output_throughput for s in summaries], "o-", color="C0", label="output tok/s")
    ax.set(xlabel="concurrency (requests in flight)", ylabel="aggregate output tokens/s",
           title="Throughput vs tail latency", xscale="log", xticks=c)
    ax.set_xticklabels([str(x) for x in c])
    ax2 = ax.twinx()
    ax2.plot(c, [s.ttft.p99 for s in summaries], "s--", color="C3", label="P99 TTFT ms")
    ax2.plot(c, [s.e2el.p99 for s in summaries], "^--", color="C1", label="P99 E2E ms")
    ax2.set_ylabel("P99 latency (ms)")
    lines = ax.get_legend_handles_labels()[0] + ax2.get_legend_handles_labels()[0]
    ax.legend(lines, [x.get_label() for x in lines], fontsize=8, loc="upper left")
    return ax
