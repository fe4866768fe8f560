"""A long prompt arrives while answers stream: what its prefill does to them, with and without chunked
prefill (chapter 05, "Going further: a long prompt arrives"; ``benchmarks/chunked_prefill.py``). Times
in seconds.

An engine builds each step's batch from one token of every running answer plus as many waiting prompt
tokens as fit under its per-step budget: llama-server's ``-b`` (batch size), vLLM's
``--max-num-batched-tokens`` (its V1 scheduler always chunks a prompt longer than that). With a budget
larger than the prompt, the whole prefill runs in one step and every running answer waits for it; with
a small budget the prompt goes in chunks, one per step, between the answers' tokens. :func:`measure`
starts one server of the chosen engine per budget, then, round after round with the servers in
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

from ..engines import llamacpp, process, vllm
from ..engines.server import ENGINES
from ..serving.openai_api import openai_backend
from ..serving.records import RequestRecord
from ..serving.streaming import run_sync


@dataclass
class Interference:
    """One per-step prompt budget's rounds (``batch``, in tokens): ``stall_s`` (per round, the longest gap
    between two tokens of a running answer that overlapped the long prompt's prefill), ``itl_s`` (per
    round, the median gap outside it), ``long_ttft_s`` (per round, the long prompt's time to first token)
    and its ``long_tokens``."""

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


async def _round(url: str, model: str, short: str, long: str, streams: int, tokens: int, after_s: float,
                 extra_body: dict[str, object] | None) -> tuple[list[RequestRecord], RequestRecord]:
    backend = openai_backend(url, model, ignore_eos=True, extra_body=extra_body)
    async with backend.session() as s:
        running = [asyncio.create_task(backend.send(s, short, tokens)) for _ in range(streams)]
        await asyncio.sleep(after_s)
        arrival = await backend.send(s, long, 1)
        return list(await asyncio.gather(*running)), arrival


def start(engine: str, budget: int, streams: int, threads: int | None = None) -> process.Server:
    """One server of ``engine`` (``llamacpp`` or ``vllm``) whose steps take at most ``budget`` prompt
    tokens, room for ``streams`` answers and the long prompt, and no prompt cache to reuse (vLLM:
    ``--no-enable-prefix-caching``; llama-server: each request says ``cache_prompt: false``, see
    :data:`NO_CACHE`), so that every round prefills the long prompt anew."""
    if engine == "llamacpp":
        return llamacpp.start_llamacpp(threads=threads, parallel=streams + 1, ctx_per_slot=2048,
                                       extra=["-b", str(budget), "-ub", str(budget)])
    if engine == "vllm":
        return vllm.start_vllm(threads=threads, extra=["--max-num-batched-tokens", str(budget),
                                                       "--no-enable-prefix-caching"])
    raise ValueError(f"engine={engine!r}: choose llamacpp or vllm")


NO_CACHE: dict[str, dict[str, object] | None] = {"llamacpp": {"cache_prompt": False}, "vllm": None}


def measure(long: str, batches: Sequence[int] = (2048, 64), rounds: int = 2, streams: int = 4,
            tokens: int = 64, after_s: float = 1.0, short: str = "Tell me a long story.",
            threads: int | None = None, engine: str = "llamacpp") -> dict[int, Interference]:
    """For each per-step prompt budget in ``batches`` (llama-server's ``-b`` and ``-ub``, or vLLM's
    ``--max-num-batched-tokens`` with ``engine="vllm"``), ``rounds`` rounds of: ``streams`` answers of
    ``tokens`` tokens each to ``short`` (``ignore_eos``), and ``after_s`` later one request with the
    prompt ``long`` (one token asked); no request reuses a cached prompt (:func:`start`). Servers
    alternate round by round. ``RuntimeError`` saying what to do where the engine cannot run here;
    ``ValueError`` from :func:`gaps_around` when a round could not see the stall."""
    if engine not in NO_CACHE:
        raise ValueError(f"engine={engine!r}: choose llamacpp or vllm")
    if not ENGINES[engine].available():
        raise RuntimeError(f"{ENGINES[engine].name} cannot run here: {ENGINES[engine].why_not()}")
    if rounds < 1 or streams < 1 or not batches:
        raise ValueError(f"need rounds >= 1, streams >= 1 and a batch size; got {rounds}, {streams}, "
                         f"{batches}")
    out = {b: Interference(b) for b in batches}
    with contextlib.ExitStack() as stack:
        servers = {}
        for b in batches:
            srv = start(engine, b, streams, threads)
            stack.callback(process.stop, srv)
            servers[b] = srv
        for r in range(rounds):
            for b in (batches if r % 2 == 0 else list(reversed(batches))):
                running, arrival = run_sync(_round(servers[b].url, servers[b].model, short, long,
                                                   streams, tokens, after_s, NO_CACHE[engine]))
                failed = [str(x.error) for x in [arrival, *running] if x.status != "ok"]
                if failed:
                    raise RuntimeError(f"a request failed on the {engine} server with budget {b}: "
                                       + "; ".join(failed))
                ttft = arrival.chunks[0][0]
                stall, itl = gaps_around(running, arrival.t_sent, arrival.t_sent + ttft)
                out[b].stall_s.append(stall)
                out[b].itl_s.append(itl)
                out[b].long_ttft_s.append(ttft)
                out[b].long_tokens = arrival.prompt_tokens
    return out
