"""Static, dynamic and continuous batching of one engine, simulated with simpy (chapter 08).

Chapter 08 measures a real vLLM server at a few concurrencies; this module extends those points by
discrete-event simulation. :func:`fit_step_cost` turns measured prefill times and decode-step times
into a :class:`StepCost` (seconds per prompt token; seconds per decode step as a line in the batch
size). Requests come from :func:`mixed_requests` (a synthetic mix) or :func:`workload_requests`
(a measured workload), their arrival times from :mod:`labkit.serving.arrivals`.
:func:`simulate_batching` then runs one engine under one policy, as two simpy processes
(arrivals and the engine), and times every request:

* ``static``: wait until ``max_batch`` requests are queued (or no more will arrive: flush the rest),
  then run the batch: prefill = its prompt tokens x ``prefill_s_per_token``, then decode steps at
  the batch's size until its longest output is done. A request whose output is shorter keeps its
  slot to the end (static batching's waste), and every request of the batch returns when the batch
  ends (request-level batching, like HF ``generate``). With ``padded=False`` finished sequences
  leave the steps (a gate in front of vLLM): the slots still wait, but cost nothing.
* ``dynamic``: like static, but a batch also starts once the oldest queued request has waited
  ``timeout_s`` seconds (or at once if it already has when the engine frees up).
* ``continuous`` (iteration-level, what vLLM does): at the start of each step, waiting requests are
  admitted up to ``max_batch`` running; the step lasts their prefill plus one decode step at the
  running batch size, and every running request (the new ones too) gets one token. A request
  leaves as soon as it has its ``output_tokens`` and its slot is refilled at the next step.

In every policy a request costs its prefill plus one decode step per output token. Times reported
are what the client sees: for static and dynamic (non-streaming, request level) the first token
arrives with the whole answer at batch end, so TTFT = e2e latency; for continuous (streaming) the
first token arrives at the end of the step that prefilled the request.

Usage::

    from labkit.production import batchsim
    cost = batchsim.fit_step_cost(prefill_points, decode_points)   # your measured (n, seconds) pairs
    reqs = batchsim.mixed_requests(64, rate=2.0, seed=0)
    for policy in ("static", "dynamic", "continuous"):
        r = batchsim.simulate_batching(policy, reqs, cost, max_batch=16)
        print(policy, r["throughput_tok_s"], r["p99_e2e_s"], r["accounted"])
    runs = {p: [{"rate": r, **batchsim.simulate_batching(p, batchsim.mixed_requests(64, rate=r), cost, 16)}
                for r in (0.5, 1, 2, 4)] for p in batchsim.POLICIES}   # one list per policy, rising rate
    batchsim.plot_tradeoff(runs)
"""

from __future__ import annotations

from collections.abc import Generator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import simpy

from ..serving import arrivals
from ..stats import percentile

POLICIES = ("static", "dynamic", "continuous")


@dataclass
class StepCost:
    """An engine's cost model: ``prefill_s_per_token`` seconds per prompt token; a decode step at
    batch size b takes ``decode_base_s + decode_per_seq_s * b`` seconds."""

    prefill_s_per_token: float
    decode_base_s: float
    decode_per_seq_s: float

    def decode_step_s(self, batch: int) -> float:
        """Seconds of one decode step (one token for each of ``batch`` sequences)."""
        return self.decode_base_s + self.decode_per_seq_s * batch


def _points(points: Sequence[tuple[float, float]], name: str) -> tuple[np.ndarray, np.ndarray]:
    arr = np.asarray(points, dtype=float)
    if arr.size == 0:
        raise ValueError(f"{name} is empty: pass at least one (count, seconds) pair")
    if arr.ndim != 2 or arr.shape[1] != 2:
        raise ValueError(f"{name} must be (count, seconds) pairs, got shape {arr.shape}")
    if not np.all(np.isfinite(arr)) or np.any(arr <= 0):
        raise ValueError(f"{name} must hold positive, finite counts and seconds, got {arr.tolist()}")
    return arr[:, 0], arr[:, 1]


def fit_step_cost(prefill_points: Sequence[tuple[int, float]],
                  decode_points: Sequence[tuple[int, float]]) -> StepCost:
    """A :class:`StepCost` from measurements. ``prefill_points``: (prompt tokens, seconds of
    prefill); the per-token slope of a least-squares line (an intercept is allowed and dropped), or
    seconds/tokens for a single prompt length. ``decode_points``: (batch size, seconds per decode
    step); ``numpy.polyfit`` of degree 1, or a flat line (``decode_per_seq_s=0``) for a single batch
    size. Fitted values below zero (noise) are clamped to zero."""
    tok, sec = _points(prefill_points, "prefill_points")
    per_tok = np.polyfit(tok, sec, 1)[0] if np.unique(tok).size > 1 else sec.sum() / tok.sum()
    bs, step = _points(decode_points, "decode_points")
    per_seq, base = np.polyfit(bs, step, 1) if np.unique(bs).size > 1 else (0.0, step.mean())
    return StepCost(max(float(per_tok), 0.0), max(float(base), 0.0), max(float(per_seq), 0.0))


def mixed_requests(n: int, input_tokens: tuple[int, int] = (32, 128),
                   output_tokens: tuple[int, int] = (8, 64), rate: float | None = None,
                   seed: int = 0) -> list[dict[str, Any]]:
    """``n`` requests ``{id, arrival_s, input_tokens, output_tokens}`` with token counts uniform on the
    inclusive ranges. ``rate=None``: all arrive at 0 s (an offline batch); else Poisson arrivals at
    ``rate`` requests/s (exponential gaps, :func:`labkit.serving.arrivals.gaps`, drawn after the
    token counts from ``numpy.random.default_rng(seed)``)."""
    if n < 1:
        raise ValueError(f"n={n}: ask for at least one request")
    for name, (lo, hi) in (("input_tokens", input_tokens), ("output_tokens", output_tokens)):
        if not 0 <= lo <= hi or (name == "output_tokens" and lo < 1):
            raise ValueError(f"{name}={(lo, hi)} must be an increasing (low, high) range, output >= 1 token")
    if rate is not None and not rate > 0:
        raise ValueError(f"rate={rate} must be positive requests/s (or None for all at once)")
    rng = np.random.default_rng(seed)
    ins = rng.integers(input_tokens[0], input_tokens[1] + 1, n)
    outs = rng.integers(output_tokens[0], output_tokens[1] + 1, n)
    arr = np.zeros(n) if rate is None else np.cumsum(arrivals.gaps(n, rate, seed=rng))
    return [{"id": i, "arrival_s": float(arr[i]), "input_tokens": int(ins[i]), "output_tokens": int(outs[i])}
            for i in range(n)]


def workload_requests(work: Sequence[dict[str, Any]], prompt_tokens: float | Mapping[Any, int],
                      rate: float | None = None, burstiness: float = 1.0,
                      seed: int = 0) -> list[dict[str, Any]]:
    """Simulator requests for a measured workload (dicts with ``id`` and ``max_tokens``, as
    :func:`labkit.production.batching.workload` makes): ``output_tokens`` its ``max_tokens``,
    ``input_tokens`` ``prompt_tokens`` (a number, or ``{work id: tokens}`` as the server counted
    them, their mean for an id it lacks). ``rate=None``: all arrive at 0 s; else at ``rate``
    requests/s, the first at 0 s (:func:`labkit.serving.arrivals.arrival_times`)."""
    if not work:
        raise ValueError("work is empty: pass the measured requests (batching.workload)")
    if isinstance(prompt_tokens, Mapping):
        if not prompt_tokens:
            raise ValueError("prompt_tokens is an empty mapping: the server reported no prompt lengths")
        mean = float(np.mean(list(prompt_tokens.values())))
        tokens = [prompt_tokens.get(w["id"], mean) for w in work]
    else:
        tokens = [prompt_tokens] * len(work)
    arr = np.zeros(len(work)) if rate is None else arrivals.arrival_times(len(work), rate, burstiness, seed)
    return [{"id": i, "arrival_s": float(a), "input_tokens": int(t), "output_tokens": int(w["max_tokens"])}
            for i, (w, t, a) in enumerate(zip(work, tokens, arr, strict=True))]


def _check(policy: str, requests: Sequence[dict[str, Any]], max_batch: int, timeout_s: float) -> None:
    if policy not in POLICIES:
        raise ValueError(f"policy={policy!r}: choose one of {POLICIES}")
    if not isinstance(max_batch, int | np.integer) or max_batch < 1:
        raise ValueError(f"max_batch={max_batch!r} must be an integer >= 1")
    if policy == "dynamic" and not timeout_s > 0:
        raise ValueError(f"timeout_s={timeout_s} must be positive seconds for dynamic batching")
    if not requests:
        raise ValueError("requests is empty: build some with mixed_requests()")
    bad = [r.get("id") for r in requests
           if r["output_tokens"] < 1 or r["input_tokens"] < 0 or r["arrival_s"] < 0]
    if bad:
        raise ValueError(f"requests {bad[:5]} need output_tokens >= 1, input_tokens >= 0, arrival_s >= 0")


def simulate_batching(policy: str, requests: Sequence[dict[str, Any]], cost: StepCost, max_batch: int,
                      timeout_s: float = 0.1, padded: bool = True) -> dict[str, Any]:
    """Serve ``requests`` (dicts as :func:`mixed_requests` makes) on one engine under ``policy``
    (see the module docstring) with at most ``max_batch`` sequences per batch; ``timeout_s`` is
    dynamic batching's longest wait (s). ``padded=False`` (static and dynamic only) models a gate in
    front of an engine that drops finished sequences from its steps (chapter 08's measured static
    policy on vLLM): a batch still waits for its longest request, but each step costs the decode step
    at the number of sequences still generating, and each request returns when it is done.
    Returns ``policy``, ``n``, ``completed``, ``accounted``
    (completed + still queued + still running == n), ``makespan_s`` (first arrival to last answer),
    ``throughput_tok_s`` (output tokens / makespan), ``request_throughput`` (requests/s),
    ``p50/p90/p99_e2e_s`` and ``p50/p99_ttft_s`` (client-visible, s), ``mean_batch`` (sequences
    holding a slot, weighted by busy time), ``busy_fraction`` and ``requests``: per-request records
    ``{id, arrival_s, start_s, first_token_s, end_s}`` in arrival order."""
    _check(policy, requests, max_batch, timeout_s)
    reqs = sorted(requests, key=lambda r: r["arrival_s"])
    recs = [{"id": r["id"], "arrival_s": float(r["arrival_s"]), "start_s": np.nan, "first_token_s": np.nan,
             "end_s": np.nan} for r in reqs]
    env = simpy.Environment()
    queue: list[int] = []                  # indices into reqs, oldest first
    st: dict[str, Any] = {"arrived": 0, "done": 0, "busy": 0.0, "slot_s": 0.0, "wake": env.event()}
    running: list[list[int]] = []          # continuous only: [index, tokens still to make]

    def arrivals() -> Generator[Any, Any, None]:
        for i, r in enumerate(reqs):
            if r["arrival_s"] > env.now:
                yield env.timeout(r["arrival_s"] - env.now)
            queue.append(i)
            st["arrived"] += 1
            if not st["wake"].triggered:
                st["wake"].succeed()

    def sleep(deadline: float | None = None) -> Generator[Any, Any, None]:
        """Wait for the next arrival (or ``deadline``, an absolute time)."""
        events = [st["wake"]] + ([env.timeout(max(deadline - env.now, 0.0))] if deadline is not None else [])
        yield env.any_of(events)
        if st["wake"].triggered:
            st["wake"] = env.event()

    def step(seconds: float, slots: int) -> Generator[Any, Any, None]:
        yield env.timeout(seconds)
        st["busy"] += seconds
        st["slot_s"] += slots * seconds

    def request_level() -> Generator[Any, Any, None]:
        while st["done"] < len(reqs):
            deadline = reqs[queue[0]]["arrival_s"] + timeout_s if queue and policy == "dynamic" else None
            ready = len(queue) >= max_batch or (queue and st["arrived"] == len(reqs)) or \
                (deadline is not None and env.now >= deadline - 1e-9)
            if not ready:
                yield from sleep(deadline)
                continue
            batch, queue[:] = queue[:max_batch], queue[max_batch:]
            t0 = env.now
            prefill = cost.prefill_s_per_token * sum(reqs[i]["input_tokens"] for i in batch)
            outs = np.array([reqs[i]["output_tokens"] for i in batch])
            live = (outs[None, :] >= np.arange(1, outs.max() + 1)[:, None]).sum(axis=1)  # per step
            steps = np.full(live.size, len(batch)) if padded else live
            ends = t0 + prefill + np.cumsum([cost.decode_step_s(int(b)) for b in steps])
            yield from step(float(ends[-1] - t0), len(batch))
            for i, o in zip(batch, outs, strict=True):
                end = float(env.now) if padded else float(ends[o - 1])
                recs[i].update(start_s=float(t0), first_token_s=end, end_s=end)
            st["done"] += len(batch)

    def iteration_level() -> Generator[Any, Any, None]:
        while st["done"] < len(reqs):
            if not running and not queue:
                yield from sleep()
                continue
            new, queue[:] = queue[:max_batch - len(running)], queue[max_batch - len(running):]
            for i in new:
                recs[i]["start_s"] = float(env.now)
                running.append([i, reqs[i]["output_tokens"]])
            prefill = cost.prefill_s_per_token * sum(reqs[i]["input_tokens"] for i in new)
            yield from step(prefill + cost.decode_step_s(len(running)), len(running))
            for i in new:
                recs[i]["first_token_s"] = float(env.now)
            for item in running:
                item[1] -= 1
                if item[1] == 0:
                    recs[item[0]]["end_s"] = float(env.now)
                    st["done"] += 1
            running[:] = [item for item in running if item[1] > 0]

    env.process(arrivals())
    env.process(iteration_level() if policy == "continuous" else request_level())
    env.run()
    return _summary(policy, reqs, recs, st["busy"], st["slot_s"], len(queue) + len(running))


def _summary(policy: str, reqs: list[dict[str, Any]], recs: list[dict[str, Any]], busy: float, slot_s: float,
             left: int) -> dict[str, Any]:
    ends = np.array([r["end_s"] for r in recs])
    done = ~np.isnan(ends)
    arr = np.array([r["arrival_s"] for r in recs])
    e2e = (ends - arr)[done]
    ttft = (np.array([r["first_token_s"] for r in recs]) - arr)[done]
    makespan = float(ends[done].max() - arr.min()) if done.any() else 0.0
    tokens = sum(q["output_tokens"] for q, ok in zip(reqs, done, strict=True) if ok)
    pct = percentile
    return {"policy": policy, "n": len(reqs), "completed": int(done.sum()),
            "accounted": int(done.sum()) + left == len(reqs), "makespan_s": makespan,
            "throughput_tok_s": tokens / makespan if makespan > 0 else float("nan"),
            "request_throughput": int(done.sum()) / makespan if makespan > 0 else float("nan"),
            "p50_e2e_s": pct(e2e, 50), "p90_e2e_s": pct(e2e, 90), "p99_e2e_s": pct(e2e, 99),
            "p50_ttft_s": pct(ttft, 50), "p99_ttft_s": pct(ttft, 99),
            "mean_batch": slot_s / busy if busy > 0 else 0.0,
            "busy_fraction": busy / makespan if makespan > 0 else 0.0, "requests": recs}


def plot_tradeoff(results_by_policy: dict[str, list[dict[str, Any]]], ax: Any = None,
                  measured: dict[str, Any] | Sequence[dict[str, Any]] | None = None) -> Any:
    """Throughput (output tokens/s, x) against P99 end-to-end latency (s, y), one line per policy (its
    results at rising arrival rates);
    ``measured`` point(s) ``{"label", "throughput_tok_s", "p99_e2e_s"}`` (from a real server) drawn
    as labelled stars. The y axis is logarithmic when latencies span more than 10x. Returns the Axes."""
    if ax is None:
        import matplotlib.pyplot as plt

        ax = plt.subplots(figsize=(6, 3.5))[1]
    ys: list[float] = []
    for policy, results in results_by_policy.items():
        x, y = [r["throughput_tok_s"] for r in results], [r["p99_e2e_s"] for r in results]
        ax.plot(x, y, "o-", ms=4, label=policy)
        ys += y
    points = [measured] if isinstance(measured, dict) else list(measured or [])
    for m in points:
        ax.plot(m["throughput_tok_s"], m["p99_e2e_s"], "k*", ms=10)
        ax.annotate(m["label"], (m["throughput_tok_s"], m["p99_e2e_s"]), textcoords="offset points",
                    xytext=(5, 5))
        ys.append(m["p99_e2e_s"])
    pos = [v for v in ys if v > 0 and np.isfinite(v)]
    if len(pos) > 1 and max(pos) > 10 * min(pos):
        ax.set_yscale("log")
    ax.set(xlabel="throughput (output tokens/s)", ylabel="P99 end-to-end latency (s)",
           title="Batching policies: throughput vs tail latency")
    ax.legend()
    return ax
