"""Static batching measured beside continuous batching, on real engines (chapter 08).

The same requests (all queued at t=0, mixed output lengths) are served two ways:

* :func:`continuous` — vLLM's own scheduler behind its OpenAI API, driven by the load generator in a
  closed loop of ``batch`` requests in flight: a finished request's slot is refilled at the next step.
* :func:`static_gate` — the same vLLM server, but requests are released in groups of ``batch`` and
  the next group waits until every request of the previous one has finished: request-level (static)
  batching, as a gateway in front of the engine would impose it. Same engine, same kernels, only
  the batching policy differs.

Each returns a :class:`BatchRun` (tokens/s, queued latency, the load generator's summary where a
server ran). :func:`step_costs` turns small server runs
(:func:`calibration_runs`, repeated by :func:`alternating_runs`) into the per-step costs
:mod:`labkit.production.batchsim` simulates with, and :func:`paired_rounds` judges the simulator
round by round;
:func:`table_row`, :func:`slot_seconds` and :func:`prompt_tokens_by_id` read a run for the chapter.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, replace
from typing import Any, cast

import numpy as np

from ..serving import loadgen, loadspec, metrics
from ..serving.loadspec import Prompt
from ..serving.metrics import RunSummary
from ..serving.records import RequestRecord
from ..stats import summary
from . import batchsim

Requests = Sequence[dict[str, Any]]


@dataclass(frozen=True)
class BatchRun:
    """One batching policy serving a workload, every request queued at the start (chapter 08).

    ``output_throughput``: tokens/s counting only the tokens each request asked for; the queued
    latencies: milliseconds from the moment every request was queued to its last token;
    ``duration_s``: the whole run; ``summary``: the load generator's figures and records."""

    policy: str
    batch: int
    completed: int
    failed: int
    duration_s: float
    output_throughput: float
    total_output_tokens: int
    p50_queued_e2e_ms: float
    p99_queued_e2e_ms: float
    summary: RunSummary

    @property
    def requests(self) -> tuple[RequestRecord, ...]:
        """The run's request records."""
        return self.summary.requests


@dataclass(frozen=True)
class Round:
    """One round of :func:`alternating_runs`: the calibration runs (at 1, 4 and the batch), then the
    workload under continuous batching and, where asked, under the static gate."""

    calibration: list[RunSummary]
    continuous: BatchRun
    static: BatchRun | None = None


def workload(n: int = 24, short: tuple[int, int] = (4, 16), long: tuple[int, int] = (96, 128),
             long_share: float = 0.25, seed: int = 0) -> list[dict[str, Any]]:
    """``n`` requests from the shipped prompt set with a chat-like mix of output lengths: a share
    ``long_share`` want a long answer (``max_tokens`` uniform in ``long``, inclusive), the rest a
    short one (uniform in ``short``). The mix is what makes static batching wait: almost every
    batch holds one long request that keeps the others' slots."""
    rng = np.random.default_rng(seed)
    prompts = loadgen.load_prompts()
    for name, (lo, hi) in (("short", short), ("long", long)):
        if not 1 <= lo <= hi:
            raise ValueError(f"{name} must be (low, high) tokens with 1 <= low <= high, got {(lo, hi)}")
    if not 0.0 <= long_share <= 1.0:
        raise ValueError(f"long_share must be a fraction in [0, 1], got {long_share}")
    out = []
    for i in range(n):
        lo, hi = long if rng.random() < long_share else short
        out.append({"id": f"w{i}", "prompt": prompts[i % len(prompts)]["prompt"],
                    "max_tokens": int(rng.integers(lo, hi + 1))})
    return out


def _run(url: str, model: str, requests: Requests, concurrency: int) -> RunSummary:
    """``requests`` through the load generator, ``concurrency`` in flight, exactly their ``max_tokens``."""
    prompts = [cast(Prompt, r) for r in requests]
    spec = loadspec.LoadSpec(len(requests), concurrency, prompts=prompts, warmup=0)
    return loadgen.run(url, spec, loadspec.ClientSpec(model=model, ignore_eos=True), progress=False)


def continuous(url: str, model: str, requests: Requests, batch: int) -> BatchRun:
    """Every request offered at once to the server, at most ``batch`` in flight (closed loop): the
    engine's own continuous batching refills a slot as soon as its request finishes."""
    if batch < 1:
        raise ValueError(f"batch must be >= 1, got {batch}")
    s = _run(url, model, requests, min(batch, len(requests)))
    return _queued("continuous", batch, s, min(r.t_sent for r in s.requests))


def static_gate(url: str, model: str, requests: Requests, batch: int) -> BatchRun:
    """Groups of ``batch`` requests sent together; the next group only when the whole previous one
    has finished. Every request is queued at the start, so its end-to-end latency counts the groups
    it waited behind. Summarized over the whole run (one duration, first send to last close)."""
    if batch < 1:
        raise ValueError(f"batch must be >= 1, got {batch}")
    records: list[RequestRecord] = []
    t0 = time.perf_counter()
    for i in range(0, len(requests), batch):
        group = list(requests[i:i + batch])
        records += _run(url, model, group, len(group)).requests
    s = replace(metrics.summarize(records, duration_s=time.perf_counter() - t0), requests=tuple(records))
    return _queued("static", batch, s, t0)


def _queued(policy: str, batch: int, s: RunSummary, t0: float) -> BatchRun:
    """The run ``s`` with latency as the user sees it when every request was queued at ``t0``
    (seconds): the wait for a free slot or an earlier group counts."""
    st = summary(r.t_end - t0 for r in s.requests if r.status == "ok" and r.t_end is not None)
    return BatchRun(policy=policy, batch=batch, completed=s.completed, failed=s.failed,
                    duration_s=s.duration_s, output_throughput=s.output_throughput,
                    total_output_tokens=s.total_output_tokens,
                    p50_queued_e2e_ms=st["p50"] * 1000, p99_queued_e2e_ms=st["p99"] * 1000, summary=s)


def step_costs(single: RunSummary | Sequence[RunSummary],
               batched: Sequence[RunSummary], pick: str = "fastest") -> dict[str, Any]:
    """Per-step costs of a server from load-test summaries, the inputs of
    :func:`labkit.production.batchsim.fit_step_cost`:

    * ``prefill_points`` [(prompt tokens, s)]: from ``single`` (a concurrency-1 run, or several),
      the median TTFT less one decode step (the median inter-token latency: the first token also
      needs a step), at the mean prompt length.
      Calibrate with prompts as long as the workload's: on a CPU the cost per prompt token grows
      with the prompt (attention's share grows with its length).
    * ``decode_points`` [(batch, s)]: the median inter-token latency at each concurrency (at
      concurrency ``c`` a step serves ``c`` streams; the median skips the few gaps stretched by
      another request's prefill, which the simulator adds itself).

    Runs repeated at one concurrency give one point: ``pick="fastest"`` the fastest of them
    (background load only ever slows a run), ``"median"`` their median (the typical run, as chapter
    08 uses beside its median measured run). On a shared 2-core machine a few-second run can land in a
    slower mode for its whole length, so a single run is no calibration; :func:`paired_rounds` judges
    each round against its own calibration."""
    if pick not in ("fastest", "median"):
        raise ValueError(f"pick must be 'fastest' or 'median', got {pick!r}")
    choose = min if pick == "fastest" else (lambda v: float(np.median(v)))
    singles = [single] if isinstance(single, RunSummary) else list(single)
    if not singles:
        raise ValueError("step_costs needs at least one concurrency-1 run")
    tokens = [s.total_input_tokens / max(1, s.completed) for s in singles]
    if not min(tokens) > 0:
        raise ValueError("the concurrency-1 run reported no prompt tokens; the server must return usage")
    prefill_s = [max(s.ttft.median - s.itl.median, 0.0) / 1000.0 for s in singles]
    steps: dict[int, list[float]] = {}
    for s in [*singles, *batched]:
        steps.setdefault(int(s.concurrency or 0), []).append(s.itl.median / 1000.0)
    return {"prefill_points": [(float(np.mean(tokens)), choose(prefill_s))],
            "decode_points": [(c, choose(v)) for c, v in sorted(steps.items())]}


def calibration_runs(url: str, model: str, batch: int = 4) -> list[RunSummary]:
    """The small runs :func:`step_costs` reads (:func:`alternating_runs` repeats them): 3 requests
    one at a time (24 tokens each: a step at batch 1, and the prefill), 8 requests 4 at a time (16
    tokens each: a step at batch 4) and, for ``batch`` > 4, ``max(8, batch)`` requests ``batch`` at
    a time (16 tokens each): a step at the batch the simulator is then used at, so that it does not
    extrapolate a slope measured between 1 and 4 (noise in that slope grows sevenfold at 8)."""
    runs = [_run_tokens(url, model, 3, 1, 24), _run_tokens(url, model, 8, 4, 16)]
    if batch > 4:
        runs.append(_run_tokens(url, model, max(8, batch), batch, 16))
    return runs


def alternating_runs(url: str, model: str, requests: Requests, batch: int, rounds: int = 3,
                     watch_first: AbstractContextManager[Any] | None = None,
                     static: bool = False) -> list[Round]:
    """``rounds`` rounds of :func:`calibration_runs` (at 1, 4 and ``batch``) each followed by
    :func:`continuous` on ``requests`` and, with ``static``, :func:`static_gate` on them too, so that
    a round's calibration and its measured runs share the host's state (a passing burst of load, the
    2-core machine's slow mode) and can be compared pairwise (:func:`paired_rounds`).
    ``watch_first`` (e.g. a monitor's sampler) is entered around the first continuous run only.
    Returns one :class:`Round` per round."""
    if rounds < 1:
        raise ValueError(f"rounds={rounds}: run at least one round")
    out: list[Round] = []
    for i in range(rounds):
        calibration = calibration_runs(url, model, batch)
        with watch_first if (i == 0 and watch_first is not None) else contextlib.nullcontext():
            cont = continuous(url, model, requests, batch)
        out.append(Round(calibration, cont, static_gate(url, model, requests, batch) if static else None))
    return out


def paired_rounds(rounds: Sequence[Round], requests: Requests, batch: int) -> list[dict[str, float]]:
    """Per round of :func:`alternating_runs`, the simulator (:mod:`labkit.production.batchsim`)
    calibrated on that round's runs only, serving ``requests`` with the prompt lengths the server
    counted in that round, against that round's measured runs (chapter 08). Each dict holds
    ``error`` (simulated over measured continuous tokens/s, less 1: +0.1 means 10% more predicted)
    and, where the round ran static batching, ``sim_gain`` (simulated continuous over the gate
    model, ``padded=False``) and ``measured_gain`` (measured continuous over static)."""
    out = []
    for r in rounds:
        cal, cont = r.calibration, r.continuous
        costs = step_costs(cal[0], cal[1:])
        cost = batchsim.fit_step_cost(costs["prefill_points"], costs["decode_points"])
        reqs = batchsim.workload_requests(requests, prompt_tokens_by_id(cont))
        sim = batchsim.simulate_batching("continuous", reqs, cost, batch)["throughput_tok_s"]
        row = {"error": sim / cont.output_throughput - 1}
        if r.static is not None:
            gate = batchsim.simulate_batching("static", reqs, cost, batch, padded=False)["throughput_tok_s"]
            measured = cont.output_throughput / r.static.output_throughput
            row.update(sim_gain=sim / gate, measured_gain=measured)
        out.append(row)
    return out


def _run_tokens(url: str, model: str, n: int, concurrency: int, max_tokens: int) -> RunSummary:
    spec = loadspec.LoadSpec(n, concurrency, max_tokens=max_tokens, warmup=0)
    return loadgen.run(url, spec, loadspec.ClientSpec(model=model, ignore_eos=True), progress=False)


def table_row(s: BatchRun, policy: str | None = None) -> dict[str, Any]:
    """One row of the chapter's batching table from a run of :func:`continuous`,
    :func:`static_gate`: output tokens/s, P50/P99 queued latency (s), seconds."""
    return {"policy": policy or s.policy, "output_tok_s": s.output_throughput,
            "p50_e2e_s": s.p50_queued_e2e_ms / 1000, "p99_e2e_s": s.p99_queued_e2e_ms / 1000,
            "seconds": s.duration_s, "completed": s.completed}


def slot_seconds(s: BatchRun | RunSummary) -> float:
    """Mean seconds a completed request of the run ``s`` held its slot (sent to stream closed)."""
    held = [r.t_end - r.t_sent for r in s.requests if r.status == "ok" and r.t_end is not None]
    if not held:
        raise ValueError("no request of this run completed: nothing to time")
    return float(np.mean(held))


def prompt_tokens_by_id(s: BatchRun | RunSummary) -> dict[Any, int]:
    """``{prompt id: prompt tokens}`` as the server counted them, for the run ``s``'s requests."""
    return {r.prompt_id: r.prompt_tokens for r in s.requests if r.prompt_tokens}
