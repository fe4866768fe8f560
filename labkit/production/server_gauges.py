"""A server's ``/metrics`` as the monitor's figures (chapter 08): vLLM's (``vllm:``) and llama-server's
(``llamacpp:``, started with ``--metrics``) mapped to the same names where they mean the same thing,
read with the lab's one Prometheus parser (:mod:`labkit.engines.prometheus`). Counts are requests and
tokens, times seconds, KV usage %. :func:`server_sample` scrapes once; :mod:`labkit.production.monitor`
samples it on a thread."""

from __future__ import annotations

import time
from typing import Any

import httpx

from ..engines import prometheus
from ..serving.streaming import base_url_of

NAN = float("nan")
TTFT = prometheus.RENAMED["ttft"][0]
KV_NAMES = prometheus.RENAMED["kv_usage"]  # current vLLM, then before v1

#: llama-server's names (this lab's build: the llama.cpp of llama-cpp-python 0.3.36) for the figures of
#: :func:`server_sample` where they mean what vLLM's do. Its token counters grow when a request ends
#: (vLLM's: every step), and its ``prompt_tokens_total`` leaves out prompt tokens reused from its cache
#: (:data:`LLAMACPP_CACHED`), which vLLM counts: the two are added. The KV gauge is in older builds only.
LLAMACPP = {"running": "llamacpp:requests_processing", "waiting": "llamacpp:requests_deferred",
            "prompt_tokens_total": "llamacpp:prompt_tokens_total",
            "generation_tokens_total": "llamacpp:tokens_predicted_total",
            "kv_usage_pct": "llamacpp:kv_cache_usage_ratio"}
LLAMACPP_CACHED = "llamacpp:prompt_tokens_cached_total"
#: What llama-server exports beyond vLLM's figures: busy slots per decode call, averaged since it started (a
#: mean batch size), decode calls, seconds spent on prompts and on generation, prompt tokens from its cache.
LLAMACPP_EXTRA = {"busy_slots_per_decode": "llamacpp:n_busy_slots_per_decode",
                  "decode_calls_total": "llamacpp:n_decode_total",
                  "prompt_seconds_total": "llamacpp:prompt_seconds_total",
                  "generation_seconds_total": "llamacpp:tokens_predicted_seconds_total",
                  "prompt_tokens_cached_total": LLAMACPP_CACHED}
#: Figures vLLM exports and llama-server does not (NaN, empty or absent): no TTFT histogram, no count of
#: finished requests (by reason or in all), and in current builds no KV-cache gauge.
LLAMACPP_LACKS = ("ttft_buckets", "ttft_sum", "ttft_count", "finished_<reason>", "finished_total",
                  "kv_usage_pct")
#: Three of vLLM's figures a dashboard reads, in words, by the sample key that holds each
#: (:func:`missing_figures`).
FIGURE_WORDS = {"ttft_count": "a TTFT histogram", "finished_total": "a count of finished requests",
                "kv_usage_pct": "a KV-cache gauge"}


def missing_figures(samples: list[dict[str, Any]]) -> list[str]:
    """Which of :data:`FIGURE_WORDS` the last readable sample (no ``error``) lacks (absent, NaN or
    empty), in words, for chapter 08's monitoring section; all of them when no sample was read."""
    last: dict[str, Any] = next((s for s in reversed(samples) if "error" not in s), {})
    lacks = lambda v: v is None or v != v or v == {}  # noqa: E731
    return [words for key, words in FIGURE_WORDS.items() if lacks(last.get(key))]


def parse_llamacpp(text: str) -> dict[str, Any]:
    """llama-server's Prometheus text as :func:`server_sample`'s figures (:data:`LLAMACPP`), plus
    :data:`LLAMACPP_EXTRA`; ``engine`` ``"llamacpp"``. What it lacks (:data:`LLAMACPP_LACKS`) is NaN,
    ``kv_metric`` None and ``ttft_buckets`` empty, as for a vLLM without those metrics."""
    s = prometheus.samples(text, "llamacpp:")
    get = lambda name: float(s.get(name, NAN))
    kv = LLAMACPP["kv_usage_pct"] if LLAMACPP["kv_usage_pct"] in s else None
    out: dict[str, Any] = {"engine": "llamacpp", "kv_usage_pct": 100.0 * s[kv] if kv else NAN,
                           "kv_metric": kv, "ttft_count": NAN, "ttft_sum": NAN, "ttft_buckets": {}}
    out |= {k: get(LLAMACPP[k]) for k in ("running", "waiting", "generation_tokens_total")}
    out["prompt_tokens_total"] = get(LLAMACPP["prompt_tokens_total"]) + s.get(LLAMACPP_CACHED, 0.0)
    return out | {k: get(name) for k, name in LLAMACPP_EXTRA.items()}


def parse_metrics(text: str) -> dict[str, Any]:
    """A server's Prometheus text as :func:`server_sample`'s figures: llama-server's when it has
    ``llamacpp:`` samples and no ``vllm:`` ones (:func:`parse_llamacpp`), else vLLM's (``engine``
    ``"vllm"``), label sets summed (KV usage: averaged); a server with neither gives NaNs."""
    if "llamacpp:" in text and "vllm:" not in text:
        return parse_llamacpp(text)
    s = prometheus.samples(text, "vllm:", keep=("le", "finished_reason"), average=KV_NAMES)
    reasons = {f"finished_{k}": v for k, v in
               prometheus.by_label(s, "vllm:request_success_total", "finished_reason", "all").items()}
    kv_name, ttft = prometheus.metric_name(s, "kv_usage"), prometheus.histogram(s, TTFT)
    get = lambda name: float(s.get(name, NAN))
    total = {"finished_total": sum(reasons.values())} if reasons else {}
    return {"engine": "vllm" if s else None,
            "running": get("vllm:num_requests_running"), "waiting": get("vllm:num_requests_waiting"),
            "kv_usage_pct": 100.0 * s[kv_name] if kv_name else NAN, "kv_metric": kv_name,
            "prompt_tokens_total": get("vllm:prompt_tokens_total"), "ttft_count": get(f"{TTFT}_count"),
            "generation_tokens_total": get("vllm:generation_tokens_total"), "ttft_sum": get(f"{TTFT}_sum"),
            "ttft_buckets": ttft["buckets"]} | reasons | total


def server_sample(base_url: str, timeout_s: float = 2.0,
                  client: httpx.Client | None = None) -> dict[str, Any]:
    """Scrape ``base_url``/metrics once (vLLM or llama-server, :func:`parse_metrics`): ``engine``,
    ``running``, ``waiting`` (requests), ``kv_usage_pct`` (of ``vllm:kv_cache_usage_perc``, or
    ``vllm:gpu_cache_usage_perc`` before vLLM v1: ``kv_metric``), ``ttft_buckets`` (``{upper bound s:
    cumulative count}``), ``ttft_sum`` (s), ``ttft_count``, ``finished_<reason>``/``_total``,
    ``prompt_``/``generation_tokens_total`` (llama-server lacks some: :data:`LLAMACPP_LACKS`); else
    ``error``. Scraping often, pass a ``client``: ``httpx.get`` builds one per call (~50 ms of CPU)."""
    url = f"{base_url_of(base_url)}/metrics"
    out: dict[str, Any] = {"time": time.time(), "t_perf": time.perf_counter()}
    try:
        return out | parse_metrics(prometheus.fetch(base_url, timeout_s, client))
    except (httpx.HTTPError, ValueError) as e:  # no answer, or not Prometheus text (another server)
        return out | {"error": f"{url}: {type(e).__name__}: {e}"}
