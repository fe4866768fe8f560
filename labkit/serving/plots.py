"""Plots for load-test results (chapter 02): TTFT CDF, ITL histogram, and the latency-throughput
knee. Each takes summaries from :func:`labkit.serving.loadgen.run` (which carry their ``requests``) and
returns the matplotlib ``Axes`` it drew on.

Example::

    from labkit.serving import loadgen, plots
    runs = loadgen.sweep(url, concurrencies=(1, 2, 4, 8), model="smollm2")
    plots.plot_knee(runs)
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from .metrics import request_metrics


def _ok(s: dict[str, Any]) -> list[dict[str, Any]]:
    return [request_metrics(r) for r in s.get("requests", []) if r.get("status") == "ok"]


def _axes(ax: Any) -> Any:
    if ax is not None:
        return ax
    import matplotlib.pyplot as plt

    return plt.subplots(figsize=(6, 3.5))[1]


def plot_ttft_cdf(summaries: Sequence[dict[str, Any]], ax: Any = None) -> Any:
    """Empirical CDF of TTFT (ms), one line per run, with each run's P50 and P99 marked."""
    import numpy as np

    ax = _axes(ax)
    for s in summaries:
        x = np.sort([m["ttft_s"] * 1000 for m in _ok(s)])
        if x.size:
            y = np.arange(1, x.size + 1) / x.size
            line, = ax.step(x, y, where="post", label=f"{s['label']} (n={x.size})")
            ax.plot([s["p50_ttft_ms"], s["p99_ttft_ms"]], [0.5, 0.99], "o", color=line.get_color(), ms=4)
    ax.set(xlabel="TTFT (ms)", ylabel="fraction of requests", title="TTFT CDF (dots: P50, P99)",
           ylim=(0, 1.02))
    ax.legend(fontsize=8)
    return ax


def plot_itl_hist(summaries: Sequence[dict[str, Any]], ax: Any = None, bins: int = 40) -> Any:
    """Histogram (fractions) of per-token ITL (ms) pooled over each run's requests, up to twice the largest
    P99 (the legend counts the gaps beyond, so stalls are not hidden)."""
    import numpy as np

    ax = _axes(ax)
    all_itl = [[g * 1000 for m in _ok(s) for g in m["itl_s"]] for s in summaries]
    p99 = [s["p99_itl_ms"] for s in summaries if s.get("n_itl")]
    if p99:
        top = 2 * max(p99)
        edges = np.linspace(0, top, bins + 1)
        for s, xs in zip(summaries, all_itl, strict=True):
            beyond = sum(x > top for x in xs)
            note = f", {beyond} > {top:.0f} ms" if beyond else ""
            ax.hist(xs, bins=edges, histtype="step", weights=np.full(len(xs), 1 / max(1, len(xs))),
                    label=f"{s['label']} ({len(xs)} gaps{note})")
    ax.set(xlabel="inter-token latency (ms)", ylabel="fraction of gaps", title="ITL histogram")
    ax.legend(fontsize=8)
    return ax


def plot_knee(summaries: Sequence[dict[str, Any]], ax: Any = None) -> Any:
    """Aggregate output tokens/s (left axis) and P99 TTFT and E2E latency (right axis, ms) against
    concurrency: throughput flattens while tail latency keeps climbing past the knee."""
    ax = _axes(ax)
    c = [s["concurrency"] for s in summaries]
    ax.plot(c, [s["output_throughput"] for s in summaries], "o-", color="C0", label="output tok/s")
    ax.set(xlabel="concurrency (requests in flight)", ylabel="aggregate output tokens/s",
           title="Throughput vs tail latency", xscale="log", xticks=c)
    ax.set_xticklabels([str(x) for x in c])
    ax2 = ax.twinx()
    ax2.plot(c, [s["p99_ttft_ms"] for s in summaries], "s--", color="C3", label="P99 TTFT ms")
    ax2.plot(c, [s["p99_e2el_ms"] for s in summaries], "^--", color="C1", label="P99 E2E ms")
    ax2.set_ylabel("P99 latency (ms)")
    lines = ax.get_legend_handles_labels()[0] + ax2.get_legend_handles_labels()[0]
    ax.legend(lines, [x.get_label() for x in lines], fontsize=8, loc="upper left")
    return ax
