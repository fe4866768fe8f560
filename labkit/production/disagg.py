"""Prefill and decode on the same engines or in separate pools, simulated with simpy from measured step
costs (chapter 05, "Going further: a long prompt arrives"). Times in seconds, sizes in tokens.

Chapter 05 measures what a long prompt's prefill does to the answers streaming on the same engine. With
those costs (:class:`labkit.production.batchsim.StepCost`: seconds per prompt token, seconds per decode
step) this module asks the fleet's question: for the same number of engines, is it better to give each
one everything, or to split the work, as NVIDIA Dynamo and llm-d do? :class:`Layout` says which:

* *colocated* engines take both: each step carries one token of every answer it is decoding plus up to
  ``budget`` prompt tokens of the prompts it has admitted (chunked prefill when ``budget`` is smaller
  than a prompt; a prompt that completes in a step gets its first token at that step's end);
* *disaggregated* pools: a prefill engine turns one prompt at a time into its KV cache and first token,
  the cache crosses a link (``transfer_s_per_token`` seconds per prompt token), and a decode engine,
  which never prefills, admits the answer at its next step when it has a free slot.

A step lasts its prompt tokens x ``prefill_s_per_token`` plus, when any answer is decoding,
``decode_step_s(answers)``. A request goes to the engine (of the right pool) with the fewest requests in
its hands. :func:`simulate` returns every request's token times; :func:`summarize` the TTFT and
inter-token gap percentiles, tokens/s and each pool's busy share.
"""

from __future__ import annotations

from collections.abc import Generator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import simpy

from ..serving import arrivals
from ..stats import percentile
from .batchsim import StepCost


@dataclass(frozen=True)
class Layout:
    """How a fleet's engines share the work: ``colocated`` engines that do both, or ``prefill`` and
    ``decode`` pools; ``slots``: answers an engine decodes at once; ``budget``: prompt tokens a
    colocated step may take; ``transfer_s_per_token``: seconds to move one prompt token's KV cache from
    a prefill to a decode engine."""

    name: str
    colocated: int = 0
    prefill: int = 0
    decode: int = 0
    slots: int = 4
    budget: int = 2048
    transfer_s_per_token: float = 0.0

    def __post_init__(self) -> None:
        split = self.prefill > 0 or self.decode > 0
        if self.colocated < 0 or self.prefill < 0 or self.decode < 0:
            raise ValueError(f"{self.name}: engine counts must be >= 0")
        if (self.colocated > 0) == split or (split and not (self.prefill > 0 and self.decode > 0)):
            raise ValueError(f"{self.name}: give colocated engines, or both a prefill and a decode pool")
        if self.slots < 1 or self.budget < 1 or self.transfer_s_per_token < 0:
            raise ValueError(f"{self.name}: slots and budget must be >= 1, the transfer time >= 0")


class _Engine:
    def __init__(self, env: simpy.Environment) -> None:
        self.inbox: simpy.Store = simpy.Store(env)
        self.held = 0  # requests in its hands: queued, prefilling or decoding
        self.busy_s = 0.0


def _least_loaded(engines: Sequence[_Engine]) -> _Engine:
    return min(engines, key=lambda e: e.held)


def _tokens_out(e: _Engine, running: dict[int, int], now: float, times: list[list[float]]) -> None:
    """A decode step ended at ``now``: every answer in ``running`` gets a token; finished ones leave."""
    for r in list(running):
        times[r].append(now)
        running[r] -= 1
        if running[r] == 0:
            del running[r]
            e.held -= 1


def _colocated(env: simpy.Environment, e: _Engine, cost: StepCost, lay: Layout,
               times: list[list[float]]) -> Generator[Any, Any, None]:
    prefilling: list[list[int]] = []  # [request, prompt tokens left, output tokens]
    running: dict[int, int] = {}  # request -> output tokens still to come
    while True:
        if not running and not prefilling:
            prefilling.append(list((yield e.inbox.get())))
        while e.inbox.items and len(running) + len(prefilling) < lay.slots:
            prefilling.append(list(e.inbox.items.pop(0)))
        room, chunk, done = lay.budget, 0, []
        for p in prefilling:
            take = min(p[1], room)
            p[1], room, chunk = p[1] - take, room - take, chunk + take
            if p[1] == 0:
                done.append(p)
            if room == 0:
                break
        step = chunk * cost.prefill_s_per_token + (cost.decode_step_s(len(running)) if running else 0.0)
        yield env.timeout(step)
        e.busy_s += step
        _tokens_out(e, running, env.now, times)
        for p in done:
            prefilling.remove(p)
            times[p[0]].append(env.now)  # the first token comes with the step that ends the prompt
            if p[2] > 1:
                running[p[0]] = p[2] - 1
            else:
                e.held -= 1


def _prefill(env: simpy.Environment, e: _Engine, decoders: Sequence[_Engine], cost: StepCost, lay: Layout,
             times: list[list[float]]) -> Generator[Any, Any, None]:
    while True:
        r, tokens, out = yield e.inbox.get()
        yield env.timeout(tokens * cost.prefill_s_per_token)
        e.busy_s += tokens * cost.prefill_s_per_token
        e.held -= 1
        times[r].append(env.now)
        if out > 1:
            env.process(_transfer(env, (r, out - 1), tokens * lay.transfer_s_per_token, decoders))


def _transfer(env: simpy.Environment, item: tuple[int, int], seconds: float,
              decoders: Sequence[_Engine]) -> Generator[Any, Any, None]:
    yield env.timeout(seconds)
    target = _least_loaded(decoders)
    target.held += 1
    yield target.inbox.put(item)


def _decode(env: simpy.Environment, e: _Engine, cost: StepCost, lay: Layout,
            times: list[list[float]]) -> Generator[Any, Any, None]:
    running: dict[int, int] = {}
    while True:
        if not running:
            r, left = yield e.inbox.get()
            running[r] = left
        while e.inbox.items and len(running) < lay.slots:
            r, left = e.inbox.items.pop(0)
            running[r] = left
        step = cost.decode_step_s(len(running))
        yield env.timeout(step)
        e.busy_s += step
        _tokens_out(e, running, env.now, times)


def simulate(requests: Sequence[dict[str, Any]], cost: StepCost, layout: Layout
             ) -> tuple[list[list[float]], dict[str, float]]:
    """Serve ``requests`` (``{arrival_s, input_tokens, output_tokens}``, as
    :func:`labkit.production.batchsim.mixed_requests` makes them) with ``layout``: every request's output
    token times (seconds, in order), and each pool's busy seconds (``colocated``, or ``prefill`` and
    ``decode``) over all its engines."""
    env = simpy.Environment()
    times: list[list[float]] = [[] for _ in requests]
    pools: dict[str, list[_Engine]] = {}
    if layout.colocated:
        pools["colocated"] = [_Engine(env) for _ in range(layout.colocated)]
        for e in pools["colocated"]:
            env.process(_colocated(env, e, cost, layout, times))
        entry = pools["colocated"]
    else:
        pools["prefill"] = [_Engine(env) for _ in range(layout.prefill)]
        pools["decode"] = [_Engine(env) for _ in range(layout.decode)]
        for e in pools["prefill"]:
            env.process(_prefill(env, e, pools["decode"], cost, layout, times))
        for e in pools["decode"]:
            env.process(_decode(env, e, cost, layout, times))
        entry = pools["prefill"]

    def arrive() -> Generator[Any, Any, None]:
        for q in sorted(range(len(requests)), key=lambda k: requests[k]["arrival_s"]):
            req = requests[q]
            yield env.timeout(max(0.0, req["arrival_s"] - env.now))
            target = _least_loaded(entry)
            target.held += 1
            yield target.inbox.put((q, int(req["input_tokens"]), int(req["output_tokens"])))

    env.process(arrive())
    env.run()
    missing = [i for i, (t, q) in enumerate(zip(times, requests, strict=True))
               if len(t) != q["output_tokens"]]
    if missing:
        raise RuntimeError(f"{layout.name}: {len(missing)} requests did not get all their tokens")
    return times, {name: sum(e.busy_s for e in engines) for name, engines in pools.items()}


def summarize(requests: Sequence[dict[str, Any]], times: Sequence[Sequence[float]],
              busy: dict[str, float], layout: Layout) -> dict[str, float]:
    """TTFT (``ttft_p50_s``, ``ttft_p99_s``: first token minus arrival), gaps between a request's
    consecutive tokens (``gap_p50_s``, ``gap_p99_s``, ``gap_max_s``), output ``tokens_per_s`` from the
    first arrival to the last token, and each pool's busy share of that span (``busy_<pool>``, 0-1)."""
    ttft = [t[0] - q["arrival_s"] for t, q in zip(times, requests, strict=True)]
    gaps = np.concatenate([np.diff(t) for t in times if len(t) > 1] or [np.zeros(0)])
    start = min(q["arrival_s"] for q in requests)
    span = max(t[-1] for t in times) - start
    engines = {"colocated": layout.colocated, "prefill": layout.prefill, "decode": layout.decode}
    return {"ttft_p50_s": percentile(ttft, 50), "ttft_p99_s": percentile(ttft, 99),
            "gap_p50_s": percentile(gaps, 50), "gap_p99_s": percentile(gaps, 99),
            "gap_max_s": float(gaps.max()) if gaps.size else float("nan"),
            "tokens_per_s": sum(len(t) for t in times) / span,
            **{f"busy_{k}": v / (span * engines[k]) for k, v in busy.items()}}


def prompt_mix(n: int, rate: float, short: int, long: int, long_share: float, output_tokens: int,
               seed: int = 0) -> list[dict[str, Any]]:
    """``n`` requests arriving as a Poisson process at ``rate`` per second (the first at 0 s), each with
    a prompt of ``long`` tokens with probability ``long_share`` and of ``short`` tokens otherwise, all
    asking ``output_tokens``."""
    if not 0 <= long_share <= 1 or n < 1 or min(short, long, output_tokens) < 1:
        raise ValueError("need n >= 1, token counts >= 1 and 0 <= long_share <= 1")
    rng = np.random.default_rng(seed)
    arrival = arrivals.arrival_times(n, rate, seed=rng)
    longs = rng.random(n) < long_share
    return [{"id": i, "arrival_s": float(a), "input_tokens": long if x else short,
             "output_tokens": output_tokens} for i, (a, x) in enumerate(zip(arrival, longs, strict=True))]


def capacity_rps(cost: StepCost, mean_input: float, output_tokens: int, engines: int, slots: int) -> float:
    """Requests per second ``engines`` colocated engines finish when always full: each request costs its
    prompt's prefill plus its share of ``output_tokens`` decode steps at ``slots`` answers per step."""
    per_request = mean_input * cost.prefill_s_per_token + output_tokens * cost.decode_step_s(slots) / slots
    return engines / per_request
