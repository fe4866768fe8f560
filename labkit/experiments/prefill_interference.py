"""A long prompt arrives while answers stream: what its prefill does to them, with and without chunked
prefill (chapter 05, "Going further: a long prompt arrives"). Times in seconds.

llama-server builds each step's batch from one token of every running answer plus as many waiting
prompt tokens as fit under ``-b`` (its batch size): with a batch larger than the prompt, the whole
prefill runs in one step and every running answer waits for it; with a small batch the prompt goes in
chunks, one per step, between the answers' tokens (vLLM's ``--max-num-batched-tokens`` sets the same
budget). :func:`measure` starts one server per batch size, then, round after round with the servers in
alternating order, opens ``streams`` answers, sends the long prompt once they are decoding, and reads
every token's arrival: the longest gap a running answer saw while the prompt prefilled (the *stall*),
the answers' usual inter-token gap outside that window, and the long prompt's own TTFT.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from ..engines import llamacpp, process
from ..serving.openai_api import openai_backend
from ..serving.records import RequestRecord
from ..serving.streaming import run_sync


@dataclass
class Interference:
    """One batch size's rounds: ``stall_s`` (per round, the longest gap between two tokens of a running
    answer that overlapped the long prompt's prefill), ``itl_s`` (per round, the median gap outside it),
    ``long_ttft_s`` (per round, the long prompt's time to first token) and its ``long_tokens``."""

    batch: int
    stall_s: list[float] = field(default_factory=list)
    itl_s: list[float] = field(default_factory=list)
    long_ttft_s: list[float] = field(default_factory=list)
    long_tokens: int | None = None

    def median(self, name: str) -> float:
        """The median over rounds of ``stall_s``, ``itl_s`` or ``long_ttft_s``."""
        return float(np.median(getattr(self, name)))


def gaps_around(streams: Sequence[RequestRecord], start: float, end: float) -> tuple[float, float]:
    """``(stall, itl)``: the longest gap between consecutive tokens of ``streams`` that overlaps
    ``[start, end]`` (``perf_counter`` seconds), and the median gap that does not. ``ValueError`` when
    no answer was still streaming after ``end`` (its stall would not show)."""
    inside: list[float] = []
    outside: list[float] = []
    for rec in streams:
        times = [rec.t_sent + t for t, _ in rec.chunks]
        if len(times) < 2 or times[-1] <= end:
            raise ValueError("an answer ended before the long prompt's first token: ask for more tokens per "
                             "answer, or send the long prompt sooner")
        for a, b in zip(times, times[1:], strict=False):
            (inside if a < end and b > start else outside).append(b - a)
    if not inside:
        raise ValueError("no answer's tokens straddled the long prompt's prefill: send it while they stream")
    return max(inside), float(np.median(outside))


async def _round(url: str, model: str, short: str, long: str, streams: int, tokens: int,
                 after_s: float) -> tuple[list[RequestRecord], RequestRecord]:
    # cache_prompt off: a round must prefill the long prompt again, not reuse the last round's KV cache
    backend = openai_backend(url, model, ignore_eos=True, extra_body={"cache_prompt": False})
    async with backend.session() as s:
        running = [asyncio.create_task(backend.send(s, short, tokens)) for _ in range(streams)]
        await asyncio.sleep(after_s)
        arrival = await backend.send(s, long, 1)
        return list(await asyncio.gather(*running)), arrival


def measure(long: str, batches: Sequence[int] = (2048, 64), rounds: int = 2, streams: int = 4,
            tokens: int = 64, after_s: float = 1.0, short: str = "Tell me a long story.",
            threads: int | None = None) -> dict[int, Interference]:
    """For each batch size in ``batches`` (llama-server's ``-b`` and ``-ub``), ``rounds`` rounds of:
    ``streams`` answers of ``tokens`` tokens each to ``short`` (``ignore_eos``), and ``after_s`` later
    one request with the prompt ``long`` (one token asked); no request reuses a cached prompt
    (llama-server's ``cache_prompt`` off). Servers alternate round by round.
    ``RuntimeError`` where llama.cpp is not built; ``ValueError`` from :func:`gaps_around` when a round
    could not see the stall."""
    if not llamacpp.llamacpp_available():
        raise RuntimeError(llamacpp.unavailable_reason())
    if rounds < 1 or streams < 1 or not batches:
        raise ValueError(f"need rounds >= 1, streams >= 1 and a batch size; got {rounds}, {streams}, "
                         f"{batches}")
    out = {b: Interference(b) for b in batches}
    with contextlib.ExitStack() as stack:
        servers = {}
        for b in batches:
            srv = llamacpp.start_llamacpp(threads=threads, parallel=streams + 1, ctx_per_slot=2048,
                                          extra=["-b", str(b), "-ub", str(b)])
            stack.callback(process.stop, srv)
            servers[b] = srv
        for r in range(rounds):
            for b in (batches if r % 2 == 0 else list(reversed(batches))):
                running, arrival = run_sync(_round(servers[b].url, servers[b].model, short, long,
                                                   streams, tokens, after_s))
                failed = [str(x.error) for x in [arrival, *running] if x.status != "ok"]
                if failed:
                    raise RuntimeError(f"a request failed on the -b {b} server: " + "; ".join(failed))
                ttft = arrival.chunks[0][0]
                stall, itl = gaps_around(running, arrival.t_sent, arrival.t_sent + ttft)
                out[b].stall_s.append(stall)
                out[b].itl_s.append(itl)
                out[b].long_ttft_s.append(ttft)
                out[b].long_tokens = arrival.prompt_tokens
    return out
