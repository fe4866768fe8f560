"""A server's Prometheus ``/metrics``, read the one way every chapter reads it (chapters 02, 06 and
08): scrape and parse with ``prometheus_client``'s own text parser, look metrics up under the names
vLLM has used across releases, and take counter and histogram deltas between two scrapes (what
the requests sent in between did). Values keep the metric's units: seconds for ``*_seconds``,
counts for ``*_total`` and ``*_count``, a 0..1 fraction for ``*_perc``.

A scrape is a flat dict ``{key: value}``: the key is the sample name (``vllm:num_requests_running``,
``vllm:e2e_request_latency_seconds_sum``), plus the labels asked to be kept in Prometheus' own
spelling (``vllm:time_to_first_token_seconds_bucket{le="0.1"}``); samples that differ only in other
labels (``engine``, ``model_name``) are summed. Usage::

    from labkit.engines import prometheus
    before = prometheus.scrape(url, prefix="vllm:")
    ...                                    # send requests
    after = prometheus.scrape(url, prefix="vllm:")
    ttft = prometheus.histogram_delta(before, after, "vllm:time_to_first_token_seconds")
    ttft["count"], ttft["mean"], prometheus.histogram_quantile(ttft["buckets"], 0.99)
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Sequence
from typing import Any

import httpx
import numpy as np
from prometheus_client.parser import text_string_to_metric_families

from ..serving.streaming import base_url_of

NAN = float("nan")
_LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')
#: The names one figure has had in vLLM, newest first (renamed in the V1 engine). Prefix-cache
#: counters changed more often: :func:`labkit.experiments.vllm_prefix.prefix_metric_names` finds them.
RENAMED: dict[str, tuple[str, ...]] = {
    "kv_usage": ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"),
    "itl": ("vllm:inter_token_latency_seconds", "vllm:time_per_output_token_seconds"),
    "ttft": ("vllm:time_to_first_token_seconds",),
    "e2e": ("vllm:e2e_request_latency_seconds",),
}


def _key(name: str, labels: dict[str, str], keep: Iterable[str]) -> str:
    kept = [f'{k}="{labels[k]}"' for k in keep if k in labels]
    return f"{name}{{{','.join(kept)}}}" if kept else name


def samples(text: str, prefix: str = "", keep: Sequence[str] = ("le",),
            average: Iterable[str] = ()) -> dict[str, float]:
    """Prometheus exposition ``text`` as ``{key: value}`` (see the module docstring) for sample names
    starting with ``prefix``: summed over the label sets that differ only in labels not in ``keep``;
    names in ``average`` (gauges such as KV-cache usage of several engines) averaged instead.
    ``ValueError`` when ``text`` is not Prometheus text."""
    sums: dict[str, float] = {}
    counts: dict[str, int] = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            if s.name.startswith(prefix):
                k = _key(s.name, s.labels, keep)
                sums[k] = sums.get(k, 0.0) + float(s.value)
                counts[k] = counts.get(k, 0) + 1
    mean = set(average)
    return {k: v / counts[k] if k.split("{")[0] in mean else v for k, v in sums.items()}


def fetch(base_url: str, timeout_s: float = 10.0, client: Any = None) -> str:
    """The text of ``base_url``/metrics (``/v1`` and a trailing ``/`` are dropped from ``base_url``).
    ``httpx.HTTPError`` when the server does not answer 2xx; ``ValueError`` for a URL without a
    scheme. Scraping often, pass an ``httpx.Client``: ``httpx.get`` builds one per call (~50 ms)."""
    url = f"{base_url_of(base_url)}/metrics"
    return (client or httpx).get(url, timeout=timeout_s).raise_for_status().text


def scrape(base_url: str, prefix: str = "", keep: Sequence[str] = ("le",), timeout_s: float = 10.0,
           client: Any = None) -> dict[str, float]:
    """:func:`fetch` then :func:`samples`: one scrape of a running server as a flat dict."""
    return samples(fetch(base_url, timeout_s, client), prefix, keep)


def by_label(scrape: dict[str, float], name: str, label: str, missing: str = "") -> dict[str, float]:
    """``{label value: value}`` of the samples of ``name`` in a scrape that kept ``label``; a sample
    without the label is under ``missing``."""
    out: dict[str, float] = {}
    for key, v in scrape.items():
        base, _, rest = key.partition("{")
        if base == name:
            value = dict(_LABEL.findall(rest)).get(label, missing)
            out[value] = out.get(value, 0.0) + v
    return out


def metric_name(scrape: dict[str, float], figure: str) -> str | None:
    """The name under which this server exports ``figure`` (a key of :data:`RENAMED`, e.g. ``"itl"``),
    or ``None``: the first of its names with a sample in ``scrape`` (for a histogram, its ``_count``)."""
    present = {k.split("{")[0] for k in scrape}
    return next((n for n in RENAMED[figure] if n in present or f"{n}_count" in present), None)


def counter_delta(before: dict[Any, float], after: dict[Any, float], key: Any) -> float:
    """``after[key] - before[key]`` (a key missing before counts as 0; missing after, NaN).
    ``ValueError`` when it went down: the server restarted between the scrapes."""
    d = after.get(key, NAN) - before.get(key, 0.0)
    if d < 0:
        raise ValueError(f"{key} went down between two scrapes (server restarted?): scrape both from one run")
    return d


def histogram(scrape: dict[str, float], name: str) -> dict[str, Any]:
    """The histogram ``name`` in a scrape (kept ``le``): ``buckets`` ``{upper bound: cumulative
    count}`` sorted (``math.inf`` last), ``sum`` (the metric's unit) and ``count``; 0 when absent."""
    buckets = {float(le): v for le, v in by_label(scrape, f"{name}_bucket", "le").items() if le}
    return {"buckets": dict(sorted(buckets.items())), "sum": scrape.get(f"{name}_sum", 0.0),
            "count": scrape.get(f"{name}_count", 0.0)}


def bucket_delta(before: dict[float, float], after: dict[float, float]) -> dict[float, float]:
    """The cumulative histogram of what was observed between two scrapes (``after - before`` per
    bucket). ``ValueError`` when a bucket shrank: the server restarted between them."""
    return {le: counter_delta(before, after, le) for le in sorted(after)}


def histogram_delta(before: dict[str, float], after: dict[str, float], name: str) -> dict[str, Any]:
    """What the requests between two scrapes did to histogram ``name``: ``buckets`` (cumulative
    counts, :func:`bucket_delta`), ``sum``, ``count`` and ``mean`` (``sum / count``, NaN for none)."""
    b, a = histogram(before, name), histogram(after, name)
    n, total = counter_delta(b, a, "count"), counter_delta(b, a, "sum")
    return {"buckets": bucket_delta(b["buckets"], a["buckets"]), "sum": total, "count": n,
            "mean": total / n if n else NAN}


def histogram_quantile(buckets: dict[float, float], q: float) -> float:
    """The ``q`` quantile (0..1) of a cumulative histogram ``{upper bound: count}`` as PromQL's
    ``histogram_quantile``: linear inside the bucket holding rank ``q * total`` (the first starts
    at 0); in the ``+Inf`` bucket, the highest finite bound. NaN when empty."""
    if not 0.0 <= q <= 1.0:
        raise ValueError(f"q must be in [0, 1] (0.99 for P99), got {q!r}")
    les, counts = np.array(sorted(buckets.items()), dtype=float).reshape(-1, 2).T
    if les.size and les[-1] != math.inf:
        raise ValueError("buckets need the +Inf bucket (its count is the total): pass all of them")
    if les.size < 2 or counts[-1] <= 0:
        return NAN
    rank = q * counts[-1]
    i = int(np.searchsorted(counts, rank, side="left"))  # the first bucket with count >= rank
    if i == les.size - 1 or (i == 0 and les[0] <= 0):
        return float(les[-2] if i else les[0])
    lo, below = (0.0, 0.0) if i == 0 else (les[i - 1], counts[i - 1])
    return float(lo + (les[i] - lo) * (rank - below) / (counts[i] - below))
