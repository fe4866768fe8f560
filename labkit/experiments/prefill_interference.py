"""A long prompt arrives while answers stream: what its prefill does to them, with and without chunked
prefill (chapter 05, "Going further: a long prompt arrives"; ``benchmarks/chunked_prefill.py``). Times
in seconds.

An engine builds each step's batch from one token of every running answer plus as many waiting prompt
tokens as fit under its per-step budget: llama-server's ``-b`` (batch size), vLLM's
``--max-num-batched-tokens`` (its V1 scheduler always chunks a prompt longer than that). With a budget
larger than the prompt, the whole prefill runs in one step and every running answer waits for it; with
a small budget the prompt goes in chunks, one per step, between the answers' tokens. :func:`measure`
starts one server of the chosen engine per budget (or uses one the caller keeps running), then, round
after round with the servers in alternating order, opens ``streams`` answers, sends the long prompt once
they are decoding, and reads every token's arrival: the longest gap a running answer saw while the
prompt prefilled (the *stall*), the answers' usual inter-token gap outside that window, and the long
prompt's own TTFT. No round reuses a cached prompt: llama-server is asked not to (``cache_prompt``),
and vLLM gets a ``cache_salt`` of the round's own, so its prefix cache (on, as in the chapter's other
servers) finds nothing to reuse.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

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
    and its ``long_tokens``; ``flag``, the engine's option that set the budget (``vLLM
    --max-num-batched-tokens 64``)."""

    batch: int
    stall_s: list[float] = field(default_factory=list)
    itl_s: list[float] = field(default_factory=list)
    long_ttft_s: list[float] = field(default_factory=list)
    long_tokens: int | None = None
    flag: str = ""

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


def flag(engine: str, budget: int) -> str:
    """The option that caps the prompt tokens a step of ``engine`` takes, as a reader would type it."""
    if engine not in BUDGET_FLAG:
        raise ValueError(f"engine={engine!r}: choose llamacpp or vllm")
    return f"{BUDGET_FLAG[engine]} {budget}"


BUDGET_FLAG = {"llamacpp": "llama-server -b", "vllm": "vLLM --max-num-batched-tokens"}


def start(engine: str, budget: int, streams: int, threads: int | None = None) -> process.Server:
    """One server of ``engine`` (``llamacpp`` or ``vllm``) whose steps take at most ``budget`` prompt
    tokens (:func:`flag`), with room for ``streams`` answers and the long prompt; otherwise the lab's
    usual settings (vLLM's as in chapter 05's engine comparison, prefix cache on)."""
    if engine == "llamacpp":
        return llamacpp.start_llamacpp(threads=threads, parallel=streams + 1, ctx_per_slot=2048,
                                       extra=["-b", str(budget), "-ub", str(budget)])
    if engine == "vllm":
        return vllm.start_vllm(threads=threads, extra=["--max-num-batched-tokens", str(budget)])
    raise ValueError(f"engine={engine!r}: choose llamacpp or vllm")


def no_cache(engine: str, round_: int) -> dict[str, object]:
    """What each request of round ``round_`` adds to its body so that no server reuses a cached prompt:
    llama-server's ``cache_prompt: false``; for vLLM a ``cache_salt`` of the round's own, which enters
    the hash of the prompt's first block, so no block of an earlier round matches."""
    return {"cache_prompt": False} if engine == "llamacpp" else {"cache_salt": f"interference-round-{round_}"}


def measure(long: str, batches: Sequence[int] = (2048, 64), rounds: int = 2, streams: int = 4,
            tokens: int = 64, after_s: float = 1.0, short: str = "Tell me a long story.",
            threads: int | None = None, engine: str = "llamacpp", running: Mapping[int, Any] | None = None
            ) -> dict[int, Interference]:
    """For each per-step prompt budget in ``batches`` (llama-server's ``-b`` and ``-ub``, or vLLM's
    ``--max-num-batched-tokens`` with ``engine="vllm"``), ``rounds`` rounds of: ``streams`` answers of
    ``tokens`` tokens each to ``short`` (``ignore_eos``), and ``after_s`` later one request with the
    prompt ``long`` (one token asked); no request reuses a cached prompt (:func:`no_cache`). Servers
    alternate round by round. ``running``: budget -> a server of ``engine`` already up with that budget
    (anything with ``url`` and ``model``, e.g. a :class:`labkit.engines.server.Target`), used and left
    running; the other budgets get a server of their own (:func:`start`), stopped on return.
    ``RuntimeError`` saying what to do where the engine cannot run here; ``ValueError`` from
    :func:`gaps_around` when a round could not see the stall."""
    if engine not in BUDGET_FLAG:
        raise ValueError(f"engine={engine!r}: choose llamacpp or vllm")
    if rounds < 1 or streams < 1 or not batches:
        raise ValueError(f"need rounds >= 1, streams >= 1 and a batch size; got {rounds}, {streams}, "
                         f"{batches}")
    running = dict(running or {})
    if set(running) - set(batches):
        raise ValueError(f"running servers for budgets {sorted(set(running) - set(batches))} that batches "
                         f"{list(batches)} does not hold")
    if set(batches) - set(running) and not ENGINES[engine].available():
        raise RuntimeError(f"{ENGINES[engine].name} cannot run here: {ENGINES[engine].why_not()}")
    out = {b: Interference(b, flag=flag(engine, b)) for b in batches}
    with contextlib.ExitStack() as stack:
        servers = dict(running)
        for b in batches:
            if b not in servers:
                srv = start(engine, b, streams, threads)
                stack.callback(process.stop, srv)
                servers[b] = srv
        for r in range(rounds):
            for b in (batches if r % 2 == 0 else list(reversed(batches))):
                answers, arrival = run_sync(_round(servers[b].url, servers[b].model, short, long,
                                                   streams, tokens, after_s, no_cache(engine, r)))
                failed = [str(x.error) for x in [arrival, *answers] if x.status != "ok"]
                if failed:
                    raise RuntimeError(f"a request failed on the {engine} server with budget {b}: "
                                       + "; ".join(failed))
                ttft = arrival.chunks[0][0]
                stall, itl = gaps_around(answers, arrival.t_sent, arrival.t_sent + ttft)
                out[b].stall_s.append(stall)
                out[b].itl_s.append(itl)
                out[b].long_ttft_s.append(ttft)
                out[b].long_tokens = arrival.prompt_tokens
    return out
