"""A load generator for streaming LLM servers: closed loop (fixed concurrency) and open loop
(Poisson or bursty arrivals), every request accounted for, results streamed to JSONL (chapter 02).

Usage (chapter 05 uses the same two calls)::

    from labkit.serving import loadgen
    s = loadgen.run("http://127.0.0.1:8000", n_requests=16, concurrency=4, model="smollm2",
                    max_tokens=32, ignore_eos=True)
    print(s["median_ttft_ms"], s["p99_itl_ms"], s["output_throughput"], s["status_counts"])
    rows = loadgen.sweep("http://127.0.0.1:8000", concurrencies=(1, 2, 4, 8), model="smollm2")

``run`` returns :func:`labkit.serving.metrics.summarize`'s dict (vLLM-style keys such as ``p50_ttft_ms``,
``p99_itl_ms``, ``output_throughput``) plus the run's settings and ``requests``, the list of request
records (kept in memory, not in the summary file). ``target`` is a base URL (an OpenAI-compatible
server; ``endpoint="completions"`` for ``/v1/completions``) or any :class:`labkit.serving.streaming.Backend`
(Ollama, an in-process transformers model).

* Closed loop (``rate=None``): ``concurrency`` requests in flight at all times, a new one sent as
  soon as one finishes: what a fixed pool of users does.
* Open loop (``rate=`` requests/s): arrivals at gamma-distributed gaps with shape ``burstiness``
  (1 = Poisson; below 1 burstier, above 1 more regular), as ``vllm bench serve`` does; they do not
  wait for earlier answers. No cap on requests in flight unless ``concurrency`` asks for one; time
  spent waiting for the cap is the record's ``queue_s`` and, as in vLLM, is not part of TTFT.
* ``warmup`` requests go first, one at a time, and are left out of the figures.
* ``out=DIR`` writes ``DIR/LABEL.jsonl`` (one line per request the moment it finishes: a killed run
  keeps what finished) and ``DIR/LABEL.json`` (the summary).
* Bounded: ``n_requests`` total; per request ``timeout_s`` without data (a read timeout between
  chunks) and optionally ``total_timeout_s``; ``max_duration_s`` for the whole run: requests not
  sent by then are recorded as ``not_sent`` (those in flight finish).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from ..paths import DATA
from . import metrics
from .openai_api import check_openai_server, openai_backend
from .streaming import Backend, ServerError, run_sync

PROMPTS_DIR = DATA / "prompts"


def load_prompts(name: str = "mixed") -> list[dict[str, Any]]:
    """The shipped prompt set ``data/prompts/NAME.jsonl``: dicts with ``id``, ``prompt``, ``kind``
    (short question, medium instruction, long passage: varied input lengths)."""
    path = PROMPTS_DIR / f"{name}.jsonl"
    if not path.exists():
        have = sorted(p.stem for p in PROMPTS_DIR.glob("*.jsonl"))
        raise FileNotFoundError(f"no prompt set {name!r} in {PROMPTS_DIR}; available: {have}")
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def synthetic_requests(n: int, input_tokens: int = 128, output_tokens: int = 32, range_ratio: float = 0.0,
                       tokenizer: Any = None, seed: int = 0) -> list[dict[str, Any]]:
    """``n`` requests with input and output lengths drawn uniformly from ``[len*(1-r), len*(1+r)]``
    (vLLM's "random" dataset). Prompts are words from the shipped prompt set; with ``tokenizer``
    they are cut to the exact token count, without it a word counts as 1.3 tokens. Each dict has
    ``prompt``, ``max_tokens``, ``input_tokens`` (target)."""
    import numpy as np

    if not 0.0 <= range_ratio < 1.0:
        raise ValueError(f"range_ratio must be in [0, 1), got {range_ratio}")
    rng = np.random.default_rng(seed)
    words = " ".join(p["prompt"] for p in load_prompts()).split()
    draw = lambda mean: int(rng.integers(int(mean * (1 - range_ratio)), int(mean * (1 + range_ratio)) + 1))
    out = []
    for i in range(n):
        n_in, n_out = draw(input_tokens), draw(output_tokens)
        start = int(rng.integers(0, len(words)))
        take = [words[(start + j) % len(words)] for j in range(max(1, int(n_in / 1.3) + 8))]
        text = " ".join(take)
        if tokenizer is not None:
            ids = tokenizer(text, add_special_tokens=False)["input_ids"]
            while len(ids) < n_in:
                text += " " + text
                ids = tokenizer(text, add_special_tokens=False)["input_ids"]
            text = tokenizer.decode(ids[:n_in])
        else:
            text = " ".join(take[: max(1, int(n_in / 1.3))])
        out.append({"id": f"synthetic-{i}", "prompt": text, "max_tokens": max(1, n_out),
                    "input_tokens": n_in})
    return out


def arrival_times(n: int, rate: float, burstiness: float = 1.0, seed: int = 0) -> list[float]:
    """Send times (seconds from the start) of ``n`` open-loop requests at ``rate`` per second: gaps
    drawn from a gamma distribution with shape ``burstiness`` and mean ``1/rate`` (shape 1 is an
    exponential: Poisson arrivals). The first request goes at 0."""
    import numpy as np

    if rate <= 0 or burstiness <= 0:
        raise ValueError(f"rate and burstiness must be positive, got {rate}, {burstiness}")
    gaps = np.random.default_rng(seed).gamma(shape=burstiness, scale=1.0 / (rate * burstiness), size=n)
    return [0.0] + np.cumsum(gaps[:-1]).tolist() if n else []


def _plan(prompts: Sequence[Any] | None, n: int, max_tokens: int, seed: int) -> list[dict[str, Any]]:
    import numpy as np

    items = [p if isinstance(p, dict) else {"prompt": str(p)} for p in (prompts or load_prompts())]
    if not items:
        raise ValueError("the prompt list is empty")
    order = np.random.default_rng(seed).permutation(len(items)).tolist()
    picks = [items[order[i % len(items)]] for i in range(n)]
    return [{"id": i, "prompt": p["prompt"], "prompt_id": p.get("id"),
             "max_tokens": int(p.get("max_tokens") or max_tokens)} for i, p in enumerate(picks)]


def _backend(target: str | Backend, model: str | None, **kwargs: Any) -> Backend:
    if isinstance(target, Backend):
        return target
    if model is None:
        names = check_openai_server(target)
        if len(names) != 1:
            raise ServerError(f"{target} serves {names}: pass model= to choose one")
        model = names[0]
    return openai_backend(target, model, **kwargs)


def _jsonable(rec: dict[str, Any], t0: float) -> dict[str, Any]:
    """A record as one JSONL line: times relative to the run's start, figures added."""
    m = metrics.request_metrics(rec) if rec["status"] == "ok" else {}
    line = dict(rec)
    for k in ("t_sent", "t_end"):
        if line.get(k) is not None:
            line[k] = line[k] - t0
    line["text"] = (line.get("text") or "")[:300]
    line.update({k: m.get(k) for k in ("ttft_s", "tpot_s", "e2e_s", "itl_s")})
    return line


async def _execute(backend: Backend, plan: list[dict[str, Any]], concurrency: int | None, rate: float | None,
                   burstiness: float, warmup: int, max_duration_s: float | None, seed: int,
                   sink: Any, progress: bool, label: str) -> tuple[list[dict[str, Any]], float]:
    from tqdm import tqdm

    records: list[dict[str, Any]] = []
    async with backend.session() as session:

        async def one(req: dict[str, Any], phase: str, t_arrival: float) -> dict[str, Any]:
            try:
                rec = await backend.send(session, req["prompt"], req["max_tokens"])
            except Exception as e:  # noqa: BLE001 - a client bug must not lose the run
                rec = {"status": "error", "error": f"{type(e).__name__}: {e}", "t_sent": t_arrival,
                       "t_end": time.perf_counter(), "chunks": []}
            rec.update({"id": req["id"], "prompt_id": req["prompt_id"], "phase": phase,
                        "max_tokens": req["max_tokens"], "queue_s": max(0.0, rec["t_sent"] - t_arrival)})
            return rec

        for i in range(warmup):
            w = await one(plan[i % len(plan)] | {"id": f"warmup-{i}"}, "warmup", time.perf_counter())
            if sink:
                sink.write(json.dumps(_jsonable(w, w["t_sent"])) + "\n")
            if w["status"] != "ok":
                raise ServerError(f"the warm-up request failed ({w['status']}): {w['error']}")

        bar = tqdm(total=len(plan), desc=label, disable=not progress, unit="req", leave=True)
        t0 = time.perf_counter()
        deadline = t0 + max_duration_s if max_duration_s else float("inf")

        def done(rec: dict[str, Any]) -> None:
            records.append(rec)
            if sink:
                sink.write(json.dumps(_jsonable(rec, t0)) + "\n")
                sink.flush()
            bar.update(1)
            bad = sum(r["status"] != "ok" for r in records)
            if bad:
                bar.set_postfix(failed=bad)

        def not_sent(req: dict[str, Any]) -> dict[str, Any]:
            now = time.perf_counter()
            return {"id": req["id"], "prompt_id": req["prompt_id"], "phase": "run", "status": "not_sent",
                    "error": f"max_duration_s={max_duration_s} reached before it was sent", "t_sent": now,
                    "t_end": now, "chunks": [], "max_tokens": req["max_tokens"], "queue_s": 0.0}

        if rate is None:  # closed loop
            pending = list(reversed(plan))

            async def worker() -> None:
                while pending:
                    req = pending.pop()
                    if time.perf_counter() >= deadline:
                        done(not_sent(req))
                        continue
                    done(await one(req, "run", time.perf_counter()))

            await asyncio.gather(*(worker() for _ in range(concurrency or 1)))
        else:  # open loop
            cap = asyncio.Semaphore(concurrency) if concurrency else contextlib.nullcontext()

            async def capped(req: dict[str, Any], t_arrival: float) -> None:
                async with cap:
                    done(await one(req, "run", t_arrival))

            tasks = []
            for req, at in zip(plan, arrival_times(len(plan), rate, burstiness, seed), strict=True):
                now = time.perf_counter()
                if t0 + at > now:  # wake at the arrival, or at the deadline if that comes first
                    await asyncio.sleep(min(t0 + at, deadline) - now)
                if time.perf_counter() >= deadline:
                    done(not_sent(req))
                    continue
                tasks.append(asyncio.create_task(capped(req, time.perf_counter())))
            await asyncio.gather(*tasks)
        sent = [r for r in records if r["status"] != "not_sent"]
        duration = (max(r["t_end"] for r in sent) - t0) if sent else 0.0
        bar.close()
    for r in records:
        r["t_run_start"] = t0
    records.sort(key=lambda r: r["id"])
    return records, duration


def run(target: str | Backend, n_requests: int = 16, concurrency: int | None = None, *,
        model: str | None = None, rate: float | None = None, burstiness: float = 1.0,
        prompts: Sequence[Any] | None = None, max_tokens: int = 32, warmup: int = 1,
        slo: dict[str, float] | None = None, out: str | Path | None = None, label: str | None = None,
        progress: bool = True, max_duration_s: float | None = None, timeout_s: float = 120.0,
        endpoint: str = "chat", ignore_eos: bool = False, tokenizer: Any = None, seed: int = 0,
        check: bool = True, total_timeout_s: float | None = None) -> dict[str, Any]:
    """Send ``n_requests`` streamed requests to ``target`` and summarize them (see the module
    docstring). ``concurrency``: requests in flight in a closed loop (default 1), a cap in an open
    loop (``rate=``, default none); ``prompts``: strings or dicts with ``prompt`` (and optional
    ``max_tokens``), default the shipped set; ``slo``: goodput limits in ms (``{"ttft_ms": 500,
    "tpot_ms": 100}``); times in seconds; ``check``: fail fast with :class:`ServerError` when the
    server is absent or lacks ``model``. ``ValueError`` naming the argument for a bad value."""
    for arg, v, low in (("n_requests", n_requests, 1), ("concurrency", concurrency, 1),
                        ("max_tokens", max_tokens, 1), ("warmup", warmup, 0)):
        if v is not None and (not isinstance(v, int) or v < low):
            raise ValueError(f"{arg} must be a whole number >= {low}, got {v!r}")
    for arg, x in (("rate", rate), ("burstiness", burstiness), ("max_duration_s", max_duration_s),
                   ("timeout_s", timeout_s), ("total_timeout_s", total_timeout_s)):
        if x is not None and not x > 0:
            raise ValueError(f"{arg} must be a positive number, got {x!r}")
    concurrency = (concurrency or 1) if rate is None else concurrency
    be = _backend(target, model, endpoint=endpoint, ignore_eos=ignore_eos, timeout_s=timeout_s,
                  total_timeout_s=total_timeout_s, tokenizer=tokenizer)
    if be.max_concurrency is not None and (concurrency is None or concurrency > be.max_concurrency):
        raise ValueError(f"{be.name} serves at most {be.max_concurrency} request(s) at a time; "
                         f"use concurrency={be.max_concurrency}")
    if check and be.check is not None:
        be.check()
    plan = _plan(prompts, n_requests, max_tokens, seed)
    label = label or (f"c{concurrency}" if rate is None else f"rate{rate:g}")
    sink = None
    paths: dict[str, str] = {}
    if out is not None:
        Path(out).mkdir(parents=True, exist_ok=True)
        paths = {"jsonl": str(Path(out) / f"{label}.jsonl"), "summary_json": str(Path(out) / f"{label}.json")}
        sink = open(paths["jsonl"], "w")  # noqa: SIM115 - closed below, also on errors
    try:
        records, duration = run_sync(_execute(be, plan, concurrency, rate, burstiness, warmup, max_duration_s,
                                              seed, sink, progress, label))
    finally:
        if sink:
            sink.close()
    s = metrics.summarize([r for r in records if r["status"] != "not_sent"], duration_s=duration, slo=slo)
    s["status_counts"]["not_sent"] = sum(r["status"] == "not_sent" for r in records)
    s.update({"label": label, "backend": be.name, "mode": "closed" if rate is None else "open",
              "concurrency": concurrency, "rate": rate, "burstiness": burstiness if rate else None,
              "max_tokens": max_tokens, "warmup": warmup, "n_planned": n_requests,
              "accounted": len(records) == n_requests and sum(s["status_counts"].values()) == n_requests,
              **paths})
    if paths:
        with open(paths["summary_json"], "w") as f:
            json.dump(s, f, indent=1, default=float)
    s["requests"] = records
    return s


def default_requests(concurrency: int) -> int:
    """Requests a closed-loop level sends by default: ``max(8, 2 × concurrency)``, so every slot is
    refilled at least once and a percentile is over at least 8 requests."""
    return max(8, 2 * concurrency)


def sweep(target: str | Backend, concurrencies: Sequence[int] = (1, 2, 4, 8),
          n_requests: int | Mapping[int, int] | None = None, warmup: int = 1,
          **kwargs: Any) -> list[dict[str, Any]]:
    """:func:`run` at each concurrency in turn (closed loop); ``n_requests`` is one count for every
    level or a concurrency -> count mapping, defaulting to :func:`default_requests`; only the
    first level warms up. A list of summaries."""
    out = []
    for i, c in enumerate(concurrencies):
        if isinstance(n_requests, Mapping):
            n = n_requests.get(c) or default_requests(c)
        else:
            n = n_requests or default_requests(c)
        out.append(run(target, n, c, warmup=warmup if i == 0 else 0, check=(i == 0), **kwargs))
    return out


def knee_table(summaries: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per run: concurrency, aggregate output tokens/s, P50/P99 TTFT and TPOT (ms), per-user
    tokens/s (1 / median TPOT), and how many requests and failures each row is over."""
    return [{"concurrency": s["concurrency"], "output_tok_s": s["output_throughput"],
             "p50_ttft_ms": s["p50_ttft_ms"], "p99_ttft_ms": s["p99_ttft_ms"],
             "p50_tpot_ms": s["p50_tpot_ms"], "p99_tpot_ms": s["p99_tpot_ms"],
             "p99_e2el_ms": s["p99_e2el_ms"], "per_user_tok_s": s["median_tps"],
             "completed": s["completed"], "failed": s["failed"]} for s in summaries]
