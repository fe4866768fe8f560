"""Prefix caching on a real server: vLLM's hit vs miss TTFT, and its hit rate from ``/metrics``
(chapter 06b); which prefixes its cache keeps over a stream of requests (chapter 08).

vLLM caches prefixes by default (``--enable-prefix-caching``): the KV blocks of a prompt are kept
under a hash of every token up to them, so a later prompt that starts with the same tokens reuses
those blocks and prefills only the rest. It matches whole blocks (16 tokens on GPUs, 128 in the
CPU build), so a shared part shorter than a block is never a hit.

:func:`prompts` builds requests that share one long prefix (hits once it is cached) and requests of
the same length whose prefixes all differ from the first token (misses). :func:`hit_vs_miss`
sends them one at a time, alternating, through :func:`labkit.serving.loadgen.run` against the
completions endpoint (no chat template: the prompt's tokens are exactly the ones cached), and
reads the hit rate of each kind from the prefix-cache counters, whose names
:func:`prefix_metric_names` finds in what the server exports rather than assuming them
(:mod:`labkit.engines.prometheus` scrapes and parses ``/metrics``).

:func:`replay` sends a stream of requests, each one of several groups' prefixes plus its own tokens
(:func:`group_prompts`), one at a time, and reads per request how much of its prefix vLLM found still
cached: chapter 08 sets it beside the routing simulation's cache (:mod:`labkit.production.balancer`),
which keeps whole prefixes, least recently used first, where vLLM evicts block by block.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import httpx
import numpy as np

from ..engines import prometheus
from ..serving import loadgen, loadspec

# A system prompt long enough to fill several cache blocks; numbered rules keep it plain text.
_RULE = ("Rule {k}: answer in plain words, quote the manual section {k} you relied on, say when the manual "
         "is silent, and never guess a figure.")


def prefix_metric_names(metrics: dict[str, float] | str) -> dict[str, str]:
    """The prefix-cache counters in a ``/metrics`` scrape (a dict of sample names, as
    :func:`labkit.engines.prometheus.scrape` returns, or the raw exposition text):
    ``{"hits": name, "queries": name}`` (tokens found in the cache / tokens looked up), e.g.
    ``vllm:prefix_cache_hits_total`` in vLLM 0.32, ``vllm:gpu_prefix_cache_hits_total`` in early V1
    releases; or ``{"rate": name}`` where only a hit-rate gauge exists (vLLM V0). Counters for
    external (connector) and multimodal caches are skipped. ``KeyError`` listing what is there."""
    names = list(prometheus.samples(metrics) if isinstance(metrics, str) else metrics)
    local = [n for n in names if "prefix_cache" in n and "external" not in n and not n.endswith("_created")]

    def pick(word: str) -> str | None:
        found = [n for n in local if n.rsplit(":", 1)[-1].split("prefix_cache_", 1)[-1].startswith(word)]
        return min(found, key=lambda n: (not n.endswith("_total"), len(n))) if found else None

    hits, queries = pick("hits"), pick("queries")
    if hits and queries:
        return {"hits": hits, "queries": queries}
    rate = pick("hit_rate")
    if rate:
        return {"rate": rate}
    raise KeyError(f"no prefix-cache counters among the exported metrics; names with 'prefix': "
                   f"{sorted(n for n in names if 'prefix' in n)}")


def hit_rate(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    """Prefix-cache hits, queries (tokens) and their ratio between two scrapes."""
    names = prefix_metric_names(after)
    if "rate" in names:
        return {"hits": float("nan"), "queries": float("nan"), "rate": after[names["rate"]]}
    hits = prometheus.counter_delta(before, after, names["hits"])
    queries = prometheus.counter_delta(before, after, names["queries"])
    return {"hits": hits, "queries": queries, "rate": hits / queries if queries else float("nan")}


def shared_text(tokenizer: Any, n_tokens: int) -> str:
    """A support-desk system prompt cut to ``n_tokens`` tokens of ``tokenizer`` (at most ~40,000)."""
    for n_rules in (100, 400, 1500):
        ids = tokenizer(" ".join(_RULE.format(k=k) for k in range(1, n_rules + 1)),
                        add_special_tokens=False)["input_ids"]
        if len(ids) >= n_tokens:
            return tokenizer.decode(ids[:n_tokens])
    raise ValueError(f"n_tokens={n_tokens} is more than the shared text holds ({len(ids)} tokens)")


def prompts(tokenizer: Any, shared_tokens: int = 512, n: int = 3) -> dict[str, Any]:
    """``{"shared": text, "warmup": prompt, "hit": [n prompts], "miss": [n prompts]}``: hit prompts
    are the shared text (cut at ``shared_tokens`` tokens by ``tokenizer``) plus a short question;
    miss prompts put a distinct number first (their first token differs), so no block matches
    anything cached, and are as long."""
    shared = shared_text(tokenizer, shared_tokens)
    question = "\n\nCustomer {i}: my order number {i}{i} has not arrived; what should I do next?\nAnswer:"
    return {"shared": shared, "warmup": shared + question.format(i=99),
            "hit": [shared + question.format(i=i) for i in range(n)],
            "miss": [f"{i}{i}{i}: " + shared + question.format(i=i) for i in range(n)]}


def hit_vs_miss(url: str, model: str, tokenizer: Any, shared_tokens: int = 512, n: int = 3,
                max_tokens: int = 2) -> dict[str, Any]:
    """TTFT of prefix-cache hits vs misses on an OpenAI-compatible server exporting vLLM's
    metrics. One warm-up request caches the shared prefix; then ``n`` misses and ``n`` hits go one
    at a time, alternating, each through :func:`labkit.serving.loadgen.run` (completions endpoint,
    ``ignore_eos``), with ``/metrics`` read around every request. Returns ``hit_ttft_s`` and
    ``miss_ttft_s`` (medians, seconds), ``ratio`` (hit / miss), ``hit_rate`` and ``miss_rate``
    (cached / looked-up tokens for each kind), ``metric_names``, and the per-request ``ttft_s`` lists."""
    scrape_metrics = lambda: prometheus.scrape(url, "vllm:")
    p = prompts(tokenizer, shared_tokens, n)
    client = loadspec.ClientSpec(model=model, endpoint="completions", ignore_eos=True)
    alone = lambda prompt: loadspec.LoadSpec(1, max_tokens=max_tokens, prompts=[prompt], warmup=0)
    loadgen.run(url, alone(p["warmup"]), client, progress=False)
    ttft: dict[str, list[float]] = {"hit": [], "miss": []}
    counts = {kind: {"hits": 0.0, "queries": 0.0} for kind in ttft}
    for i in range(n):
        for kind in ("miss", "hit"):
            before = scrape_metrics()
            s = loadgen.run(url, alone(p[kind][i]), client, progress=False, check=False)
            if s.completed != 1:
                raise RuntimeError(f"a {kind} request failed: {s.status_counts}")
            try:
                d = hit_rate(before, scrape_metrics())
            except KeyError:  # prefix caching off: this vLLM exports no prefix-cache counters
                d = {"hits": 0.0, "queries": 0.0}
            counts[kind]["hits"] += d["hits"]
            counts[kind]["queries"] += d["queries"]
            ttft[kind].append(s.ttft.median / 1e3)
    rates = {k: c["hits"] / c["queries"] if c["queries"] else float("nan") for k, c in counts.items()}
    hit_s, miss_s = float(np.median(ttft["hit"])), float(np.median(ttft["miss"]))
    return {"hit_ttft_s": hit_s, "miss_ttft_s": miss_s, "ratio": hit_s / miss_s, "hit_rate": rates["hit"],
            "miss_rate": rates["miss"], "counts": counts, "ttft_s": ttft, "shared_tokens": shared_tokens,
            "metric_names": _names_or_none(scrape_metrics())}


def _names_or_none(metrics: dict[str, float]) -> dict[str, str] | None:
    try:
        return prefix_metric_names(metrics)
    except KeyError:
        return None


def group_prompts(tokenizer: Any, groups: Sequence[int], prefix_tokens: int = 512,
                  own_tokens: int = 24) -> list[list[int]]:
    """Token ids of one request per entry of ``groups``: that group's prefix (``prefix_tokens`` long,
    the group's number among its first tokens, so no two groups share a block: a block's hash covers
    every token up to it), then ``own_tokens`` tokens that only this request has. Chapter 08's replay."""
    shared = tokenizer(shared_text(tokenizer, prefix_tokens), add_special_tokens=False)["input_ids"]
    out = []
    for i, g in enumerate(groups):
        head = tokenizer(f"Manual {g}:", add_special_tokens=False)["input_ids"]
        own = tokenizer(f"\nTicket {i}: " + " ".join(["order", str(i)] * own_tokens),
                        add_special_tokens=False)["input_ids"]
        out.append((head + shared)[:prefix_tokens] + own[:own_tokens])
    return out


@dataclass(frozen=True)
class Replay:
    """One :func:`replay`: per request, the tokens vLLM found cached (``hits``); ``prefix_tokens`` of each
    request are its group's, cached in ``block_size`` blocks."""

    hits: tuple[float, ...]
    prefix_tokens: int
    block_size: int

    @property
    def whole(self) -> float:
        """Share of requests that found their group's whole prefix cached (every full block of it)."""
        full = self.prefix_tokens // self.block_size * self.block_size
        return sum(h >= full for h in self.hits) / len(self.hits)

    @property
    def some(self) -> float:
        """Share of requests that found some of their prefix cached: at least its first block."""
        return sum(h > 0 for h in self.hits) / len(self.hits)


def replay(url: str, model: str, prompts: Sequence[Sequence[int]], prefix_tokens: int, block_size: int,
           max_tokens: int = 2) -> Replay:
    """Send ``prompts`` (token ids, :func:`group_prompts`) one at a time to the vLLM server at ``url``
    and read its prefix-cache counters before the first and after each request (see :class:`Replay`).
    ``KeyError`` where the server exports no prefix-cache counters (prefix caching off)."""
    hits = []
    with httpx.Client(timeout=httpx.Timeout(300.0, connect=10.0)) as client:
        before = prometheus.scrape(url, "vllm:")
        for ids in prompts:
            body = {"model": model, "prompt": list(ids), "max_tokens": max_tokens, "temperature": 0.0}
            client.post(f"{url}/v1/completions", json=body).raise_for_status()
            after = prometheus.scrape(url, "vllm:")
            hits.append(hit_rate(before, after)["hits"])
            before = after
    return Replay(tuple(hits), prefix_tokens, block_size)
