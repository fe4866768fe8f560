"""vLLM's own KV-cache meter beside the paged arithmetic (chapter 06b, "Going further: paged KV blocks
against a contiguous reservation").

:func:`meter` sends prompts (token ids, so their lengths are exact) all at once to a vLLM server, each
asking for ``tokens`` new tokens with ``ignore_eos`` (every answer exactly that long), and reads
``/metrics`` every ``interval_s`` while they run: ``vllm:num_requests_running`` and the share of KV
blocks in use (``vllm:kv_cache_usage_perc``; ``vllm:gpu_cache_usage_perc`` in older releases). The
block size and the number of blocks come from the server's ``vllm:cache_config_info`` labels, not
assumed: vLLM's GPU backends page in blocks of 16 tokens, its CPU build in 128.
:class:`KVMeter` holds the readings and the paged arithmetic they are compared with.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass

import httpx

from ..engines import prometheus
from ..llm.paged_kv import blocks
from ..serving.streaming import base_url_of, run_sync

LABELS = ("block_size", "num_gpu_blocks", "kv_cache_max_concurrency")


@dataclass(frozen=True)
class KVMeter:
    """One :func:`meter` run. ``prompt_tokens``: each prompt's length as the server counted it;
    ``tokens``: new tokens per answer; ``block_size`` (tokens) and ``total_blocks``: the server's KV
    cache; ``max_concurrency``: vLLM's own count of requests of ``--max-model-len`` tokens the cache
    holds (None where not exported); ``readings``: ``(requests running, share of blocks in use)`` per
    scrape."""

    prompt_tokens: tuple[int, ...]
    tokens: int
    block_size: int
    total_blocks: int
    max_concurrency: float | None
    readings: tuple[tuple[int, float], ...]

    @property
    def used_blocks(self) -> int | None:
        """The most blocks in use in a reading taken while every request ran (None: no such reading)."""
        full = [u for r, u in self.readings if r == len(self.prompt_tokens)]
        return round(max(full) * self.total_blocks) if full else None

    @property
    def expected(self) -> tuple[int, int]:
        """Blocks the paged arithmetic (:func:`labkit.llm.paged_kv.blocks`) gives every sequence at the
        engine's block size: after its first new token, and before its last one is written."""
        return (blocks([p + 1 for p in self.prompt_tokens], self.block_size),
                blocks([p + self.tokens for p in self.prompt_tokens], self.block_size))


async def _run(url: str, model: str, prompts: Sequence[Sequence[int]], tokens: int, interval_s: float
               ) -> tuple[list[int], list[tuple[int, float]], str]:
    readings: list[tuple[int, float]] = []
    async with httpx.AsyncClient(timeout=httpx.Timeout(300.0, connect=10.0)) as client:
        async def one(ids: Sequence[int]) -> int:
            body = {"model": model, "prompt": list(ids), "max_tokens": tokens, "ignore_eos": True,
                    "temperature": 0.0}
            r = (await client.post(f"{url}/v1/completions", json=body)).raise_for_status()
            return int(r.json()["usage"]["prompt_tokens"])

        sent = [asyncio.create_task(one(p)) for p in prompts]
        usage = None  # the gauge's name in this release, found in the first scrape
        while not all(t.done() for t in sent):
            m = prometheus.samples((await client.get(f"{url}/metrics")).text, "vllm:")
            usage = usage or prometheus.metric_name(m, "kv_usage")
            if usage is None:
                raise RuntimeError("the server exports no KV-cache usage gauge (vllm:kv_cache_usage_perc)")
            readings.append((round(m.get("vllm:num_requests_running", 0.0)), m[usage]))
            await asyncio.sleep(interval_s)
        counts = await asyncio.gather(*sent)
        config = (await client.get(f"{url}/metrics")).text
    return list(counts), readings, config


def meter(url: str, model: str, prompts: Sequence[Sequence[int]], tokens: int = 32,
          interval_s: float = 0.05) -> KVMeter:
    """Send ``prompts`` (token ids) at once to the vLLM server at ``url`` serving ``model``, ``tokens``
    new tokens each, and read its KV meter while they run (see the module docstring). ``ValueError``
    for no prompts or ``tokens`` below 2; ``RuntimeError`` when the server does not say its block size
    and block count; ``httpx.HTTPError`` when a request fails."""
    if not prompts or tokens < 2:
        raise ValueError(f"need at least one prompt and tokens >= 2, got {len(prompts)} prompts, {tokens}")
    url = base_url_of(url)
    counts, readings, text = run_sync(_run(url, model, prompts, tokens, interval_s))
    return KVMeter(tuple(counts), tokens, *cache_config(text), tuple(readings))


def cache_config(metrics_text: str) -> tuple[int, int, float | None]:
    """``(block size in tokens, number of blocks, max concurrency or None)`` from the labels of
    ``vllm:cache_config_info`` in a ``/metrics`` text. ``RuntimeError`` when the block size or the
    block count is missing."""
    info = prometheus.samples(metrics_text, "vllm:cache_config_info", keep=LABELS)
    value = {k: set(prometheus.by_label(info, "vllm:cache_config_info", k)) - {"", "None"} for k in LABELS}
    try:  # one engine's config (several data-parallel engines export the same labels once)
        (block_label,), (total_label,) = value["block_size"], value["num_gpu_blocks"]
        block, total = int(block_label), int(total_label)
    except ValueError as e:  # no such sample, a label missing or not a number
        raise RuntimeError("the server's vllm:cache_config_info gives no block_size and num_gpu_blocks "
                           "labels: is it vLLM?") from e
    conc = [float(c) for c in value["kv_cache_max_concurrency"]]
    return block, total, conc[0] if conc else None
