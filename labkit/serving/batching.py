"""Static batching measured beside continuous batching, on real engines (chapter 08).

The same requests (all queued at t=0, mixed output lengths) are served three ways:

* :func:`continuous` — vLLM's own scheduler behind its OpenAI API, driven by the load generator in a
  closed loop of ``batch`` requests in flight: a finished request's slot is refilled at the next step.
* :func:`static_gate` — the same vLLM server, but requests are released in groups of ``batch`` and
  the next group waits until every request of the previous one has finished: request-level (static)
  batching, as a gateway in front of the engine would impose it. Same engine, same kernels, only
  the batching policy differs.
* :func:`hf_static` — transformers' batched ``generate``: one padded batch of ``batch`` prompts runs
  until its longest output is done; every request returns when its batch ends.

Each returns :func:`labkit.serving.metrics.summarize`-style figures: ``output_throughput`` (useful
output tokens/s: only the tokens each request asked for), ``p50_queued_e2e_ms``/``p99_queued_e2e_ms``
(milliseconds from the moment every request was queued to its last token),
``duration`` (seconds), ``completed``/``failed``. :func:`step_costs` turns two small server runs
into the per-step costs :mod:`labkit.serving.batchsim` simulates with.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import numpy as np

from . import loadgen, metrics

Requests = Sequence[dict[str, Any]]


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


def _run_args(model: str, **kw: Any) -> dict[str, Any]:
    return {"model": model, "ignore_eos": True, "warmup": 0, "progress": False, **kw}


def continuous(url: str, model: str, requests: Requests, batch: int, **kw: Any) -> dict[str, Any]:
    """Every request offered at once to the server, at most ``batch`` in flight (closed loop): the
    engine's own continuous batching refills a slot as soon as its request finishes."""
    if batch < 1:
        raise ValueError(f"batch must be >= 1, got {batch}")
    s = loadgen.run(url, len(requests), concurrency=min(batch, len(requests)), prompts=list(requests),
                    **_run_args(model, **kw))
    s.update(policy="continuous", batch=batch)
    return _queued(s, s["requests"], min(r["t_sent"] for r in s["requests"]))


def static_gate(url: str, model: str, requests: Requests, batch: int, **kw: Any) -> dict[str, Any]:
    """Groups of ``batch`` requests sent together; the next group only when the whole previous one
    has finished. Every request is queued at the start, so its end-to-end latency counts the groups
    it waited behind. Summarized over the whole run (one duration, first send to last close)."""
    if batch < 1:
        raise ValueError(f"batch must be >= 1, got {batch}")
    records: list[dict[str, Any]] = []
    t0 = time.perf_counter()
    for i in range(0, len(requests), batch):
        group = list(requests[i:i + batch])
        s = loadgen.run(url, len(group), concurrency=len(group), prompts=group, **_run_args(model, **kw))
        records += s["requests"]
    s = metrics.summarize(records, duration_s=time.perf_counter() - t0)
    s.update(policy="static", batch=batch, requests=records)
    return _queued(s, records, t0)


def _queued(s: dict[str, Any], records: Requests, t0: float) -> dict[str, Any]:
    """Add latency as the user sees it when every request was queued at ``t0`` (seconds): the wait
    for a free slot or an earlier group counts. ``p50_queued_e2e_ms``, ``p99_queued_e2e_ms``."""
    st = metrics.stats(r["t_end"] - t0 for r in records if r.get("status") == "ok")
    s.update(p50_queued_e2e_ms=st["p50"] * 1000, p99_queued_e2e_ms=st["p99"] * 1000)
    return s


def hf_static(model: Any, tokenizer: Any, requests: Requests, batch: int) -> dict[str, Any]:
    """transformers' batched greedy ``generate`` on groups of ``batch`` prompts (chat template, left
    padding), each group generating its longest ``max_tokens`` (EOS ignored, as in the server runs).
    A request's latency is from the start (all queued) to its group's end. ``output_throughput``
    counts each request's own ``max_tokens``; ``padded_tokens`` the slots spent on tokens nobody asked for."""
    import torch

    from ..hardware.machine import synchronize

    tokenizer.padding_side = "left"
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    ends, useful, padded = [], 0, 0
    t0 = time.perf_counter()
    for i in range(0, len(requests), batch):
        group = list(requests[i:i + batch])
        texts = [tokenizer.apply_chat_template([{"role": "user", "content": r["prompt"]}], tokenize=False,
                                               add_generation_prompt=True) for r in group]
        enc = tokenizer(texts, return_tensors="pt", padding=True, add_special_tokens=False).to(model.device)
        longest = max(int(r["max_tokens"]) for r in group)
        with torch.inference_mode():
            model.generate(**enc, max_new_tokens=longest, min_new_tokens=longest, do_sample=False,
                           pad_token_id=pad)
        synchronize(str(model.device))
        t = time.perf_counter() - t0
        ends += [t] * len(group)
        useful += sum(int(r["max_tokens"]) for r in group)
        padded += sum(longest - int(r["max_tokens"]) for r in group)
    duration = time.perf_counter() - t0
    e2e = metrics.stats(ends)
    return {"policy": "static (transformers)", "batch": batch, "completed": len(ends), "failed": 0,
            "duration": duration, "output_throughput": useful / duration, "total_output_tokens": useful,
            "padded_tokens": padded, "p50_queued_e2e_ms": e2e["p50"] * 1000,
            "p99_queued_e2e_ms": e2e["p99"] * 1000}


def step_costs(single: dict[str, Any], batched: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Per-step costs of a server from load-test summaries, the inputs of
    :func:`labkit.serving.batchsim.fit_step_cost`:

    * ``prefill_points`` [(prompt tokens, s)]: from ``single`` (a concurrency-1 run), its median
      TTFT less one decode step (its median inter-token latency: the first token also needs a
      step), at its mean prompt length. Calibrate with prompts as long as the workload's: on a CPU
      the cost per prompt token grows with the prompt (chapter 08 measured 1.3 ms per token at
      about 110 tokens and over 4 ms at about 570 on 2 AVX2 cores).
    * ``decode_points`` [(batch, s)]: each run's median inter-token latency at its concurrency (at
      concurrency ``c`` a step serves ``c`` streams; the median skips the few gaps stretched by
      another request's prefill, which the simulator adds itself)."""
    tokens = single["total_input_tokens"] / max(1, single["completed"])
    if not tokens > 0:
        raise ValueError("the concurrency-1 run reported no prompt tokens; the server must return usage")
    prefill_s = max(single["median_ttft_ms"] - single["median_itl_ms"], 0.0) / 1000.0
    decode = [(int(s["concurrency"]), s["median_itl_ms"] / 1000.0) for s in [single, *batched]]
    return {"prefill_points": [(tokens, prefill_s)], "decode_points": decode}
