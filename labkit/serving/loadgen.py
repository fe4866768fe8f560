"""A load generator for streaming LLM servers: closed loop (fixed concurrency) and open loop
(Poisson or bursty arrivals), every request accounted for, results streamed to JSONL (chapter 02).

Usage (chapter 05 uses the same two calls)::

    from labkit.serving.loadgen import ClientSpec, LoadSpec, run, sweep
    client = ClientSpec(model="smollm2", ignore_eos=True)
    s = run("http://127.0.0.1:8000", LoadSpec(n_requests=16, concurrency=4, max_tokens=32), client)
    print(s.ttft.median, s.itl.p99, s.output_throughput, s.status_counts)
    rows = sweep("http://127.0.0.1:8000", (1, 2, 4, 8), LoadSpec(max_tokens=32), client)

A run is a target, a :class:`~labkit.serving.loadspec.LoadSpec` (what to send, how to pace it) and,
for a URL, a :class:`~labkit.serving.loadspec.ClientSpec` (model, endpoint, timeouts). ``run``
returns a :class:`~labkit.serving.metrics.RunSummary` (``s.ttft.p50`` and ``s.itl.p99`` in ms,
``s.output_throughput``, ...) with the run's settings and ``requests``, every
:class:`~labkit.serving.records.RequestRecord` (kept in memory, not in the summary file).
``target`` is a base URL (an OpenAI-compatible server) or any
:class:`labkit.serving.streaming.Backend` (Ollama, an in-process transformers model).

* Closed loop (no ``rate``): ``concurrency`` requests in flight at all times, a new one sent as
  soon as one finishes: what a fixed pool of users does.
* Open loop (``rate`` requests/s): arrivals at gamma-distributed gaps with shape ``burstiness``
  (1 = Poisson; below 1 burstier, above 1 more regular), as ``vllm bench serve`` does; they do not
  wait for earlier answers. No cap on requests in flight unless ``concurrency`` asks for one; time
  spent waiting for the cap is the record's ``queue_s`` and, as in vLLM, is not part of TTFT.
* ``warmup`` requests go first, one at a time, and are left out of the figures.
* ``out=DIR`` writes ``DIR/LABEL.jsonl`` (one line per request the moment it finishes, by
  :meth:`RequestRecord.to_json <labkit.serving.records.RequestRecord.to_json>`: a killed run
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
from dataclasses import replace
from pathlib import Path
from typing import IO, Any, Literal, NamedTuple

import numpy as np
from tqdm import tqdm

from ..paths import DATA
from ..settings import watched
from . import metrics
from .arrivals import arrival_times
from .loadspec import ClientSpec, LoadSpec, Prompt
from .metrics import RunSummary
from .openai_api import check_openai_server, openai_backend
from .records import RequestRecord
from .streaming import Backend, ServerError, run_sync

PROMPTS_DIR = DATA / "prompts"


def load_prompts(name: str = "mixed") -> list[Prompt]:
    """The shipped prompt set ``data/prompts/NAME.jsonl``: dicts with ``id``, ``prompt``, ``kind``
    (short question, medium instruction, long passage: varied input lengths)."""
    path = PROMPTS_DIR / f"{name}.jsonl"
    if not path.exists():
        have = sorted(p.stem for p in PROMPTS_DIR.glob("*.jsonl"))
        raise FileNotFoundError(f"no prompt set {name!r} in {PROMPTS_DIR}; available: {have}")
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def synthetic_requests(n: int, input_tokens: int = 128, output_tokens: int = 32, range_ratio: float = 0.0,
                       tokenizer: Any = None, seed: int = 0) -> list[Prompt]:
    """``n`` requests with input and output lengths drawn uniformly from ``[len*(1-r), len*(1+r)]``
    (vLLM's "random" dataset). Prompts are words from the shipped prompt set; with ``tokenizer``
    they are cut to the exact token count, without it a word counts as 1.3 tokens. Each dict has
    ``prompt``, ``max_tokens``, ``input_tokens`` (target)."""
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
        out.append(Prompt(id=f"synthetic-{i}", prompt=text, max_tokens=max(1, n_out), input_tokens=n_in))
    return out


class _Planned(NamedTuple):
    """One request of a run's plan: its number, text, prompt id in its set, tokens to ask for."""

    id: int | str
    prompt: str
    prompt_id: int | str | None
    max_tokens: int


def _plan(spec: LoadSpec) -> list[_Planned]:
    items = [p if isinstance(p, dict) else Prompt(prompt=str(p)) for p in (spec.prompts or load_prompts())]
    order = np.random.default_rng(spec.seed).permutation(len(items)).tolist()
    picks = [items[order[i % len(items)]] for i in range(spec.requests)]
    return [_Planned(i, p["prompt"], p.get("id"), int(p.get("max_tokens") or spec.max_tokens))
            for i, p in enumerate(picks)]


def _backend(target: str | Backend, client: ClientSpec | None) -> Backend:
    if not isinstance(target, str):
        if client is not None:
            raise ValueError(f"{target.name} is a Backend: it brings its own client settings. Pass "
                             "them to openai_backend/ollama_backend, or pass the server's URL with this "
                             "ClientSpec")
        return target
    client = client or ClientSpec()
    model = client.model
    if model is None:
        names = check_openai_server(target)
        if len(names) != 1:
            raise ServerError(f"{target} serves {names}: pass ClientSpec(model=...) to choose one")
        model = names[0]
    return openai_backend(target, model, endpoint=client.endpoint, tokenizer=client.tokenizer,
                          ignore_eos=client.ignore_eos, timeout_s=client.timeout_s,
                          total_timeout_s=client.total_timeout_s)


async def _execute(backend: Backend, plan: list[_Planned], spec: LoadSpec, sink: IO[str] | None,
                   progress: bool, label: str) -> tuple[list[RequestRecord], float]:
    concurrency, rate, burstiness, seed = spec.in_flight, spec.rate, spec.burstiness, spec.seed
    max_duration_s = spec.max_duration_s
    records: list[RequestRecord] = []
    async with backend.session() as session:

        async def one(req: _Planned, phase: Literal["run", "warmup"], t_arrival: float) -> RequestRecord:
            try:
                rec = await backend.send(session, req.prompt, req.max_tokens)
            except Exception as e:  # noqa: BLE001 - a client bug must not lose the run
                rec = RequestRecord(backend=backend.name, error=f"{type(e).__name__}: {e}", t_sent=t_arrival,
                                    t_end=time.perf_counter())
            rec.id, rec.prompt_id, rec.phase, rec.max_tokens = req.id, req.prompt_id, phase, req.max_tokens
            rec.queue_s = max(0.0, rec.t_sent - t_arrival)
            return rec

        for i in range(spec.warmup):
            w = await one(plan[i % len(plan)]._replace(id=f"warmup-{i}"), "warmup", time.perf_counter())
            if sink:
                sink.write(w.to_json(w.t_sent) + "\n")
            if w.status != "ok":
                raise ServerError(f"the warm-up request failed ({w.status}): {w.error}")

        bar = tqdm(total=len(plan), desc=label, disable=not progress, unit="req", leave=True)
        t0 = time.perf_counter()
        deadline = t0 + max_duration_s if max_duration_s else float("inf")

        def done(rec: RequestRecord) -> None:
            records.append(rec)
            if sink:
                sink.write(rec.to_json(t0) + "\n")
                sink.flush()
            bar.update(1)
            bad = sum(r.status != "ok" for r in records)
            if bad:
                bar.set_postfix(failed=bad)

        def not_sent(req: _Planned) -> RequestRecord:
            now = time.perf_counter()
            return RequestRecord(backend=backend.name, status="not_sent", t_sent=now, t_end=now,
                                 error=f"max_duration_s={max_duration_s} reached before it was sent",
                                 id=req.id, prompt_id=req.prompt_id, phase="run", max_tokens=req.max_tokens,
                                 queue_s=0.0)

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

            async def capped(req: _Planned, t_arrival: float) -> None:
                async with cap:
                    done(await one(req, "run", t_arrival))

            tasks = []
            for req, at in zip(plan, arrival_times(len(plan), rate, burstiness, seed).tolist(), strict=True):
                now = time.perf_counter()
                if t0 + at > now:  # wake at the arrival, or at the deadline if that comes first
                    await asyncio.sleep(min(t0 + at, deadline) - now)
                if time.perf_counter() >= deadline:
                    done(not_sent(req))
                    continue
                tasks.append(asyncio.create_task(capped(req, time.perf_counter())))
            await asyncio.gather(*tasks)
        sent = [r for r in records if r.status != "not_sent"]
        duration = (max(r.t_end or r.t_sent for r in sent) - t0) if sent else 0.0
        bar.close()
    for r in records:
        r.t_run_start = t0
    records.sort(key=lambda r: int(r.id or 0))  # run requests are numbered 0, 1, ...
    return records, duration


def run(target: str | Backend, spec: LoadSpec | None = None, client: ClientSpec | None = None, *,
        slo: Mapping[str, float] | None = None, out: str | Path | None = None, label: str | None = None,
        progress: bool | None = None, check: bool = True) -> RunSummary:
    """Send the requests ``spec`` describes (default ``LoadSpec()``: 8 requests, one at a time) to
    ``target`` and summarize them (see the module docstring). ``client``: how to reach a URL
    target (default: its only model, chat endpoint); ``slo``: goodput limits in ms
    (``{"ttft_ms": 500, "tpot_ms": 100}``); ``out``: a folder for ``LABEL.jsonl`` and
    ``LABEL.json`` (``label`` default ``c<concurrency>`` or ``rate<rate>``); ``check``: fail fast
    with :class:`ServerError` when the server is absent or lacks the model; ``progress``: a bar per
    request (default: only when a person watches, :func:`labkit.settings.watched`; never in a page a
    headless run saves). ``ValueError`` saying what to pass when the target cannot take the
    concurrency asked for."""
    spec = spec or LoadSpec()
    progress = watched() if progress is None else progress
    concurrency = spec.in_flight
    be = _backend(target, client)
    if be.max_concurrency is not None and (concurrency is None or concurrency > be.max_concurrency):
        raise ValueError(f"{be.name} serves at most {be.max_concurrency} request(s) at a time; "
                         f"use LoadSpec(concurrency={be.max_concurrency})")
    if check:
        be.check()
    plan = _plan(spec)
    label = label or (f"c{concurrency}" if spec.closed else f"rate{spec.rate:g}")
    sink: IO[str] | None = None
    paths: dict[str, str] = {}
    if out is not None:
        Path(out).mkdir(parents=True, exist_ok=True)
        paths = {"jsonl": str(Path(out) / f"{label}.jsonl"), "summary_json": str(Path(out) / f"{label}.json")}
        sink = open(paths["jsonl"], "w")  # noqa: SIM115 - closed below, also on errors
    try:
        records, duration = run_sync(_execute(be, plan, spec, sink, progress, label))
    finally:
        if sink:
            sink.close()
    s = metrics.summarize([r for r in records if r.status != "not_sent"], duration_s=duration, slo=slo)
    counts = s.status_counts | {"not_sent": sum(r.status == "not_sent" for r in records)}
    n = spec.requests
    s = replace(s, status_counts=counts, label=label, backend=be.name,
                mode="closed" if spec.closed else "open", concurrency=concurrency, rate=spec.rate,
                burstiness=None if spec.closed else spec.burstiness,
                max_tokens=spec.max_tokens, warmup=spec.warmup, n_planned=n,
                accounted=len(records) == n and sum(counts.values()) == n,
                jsonl=paths.get("jsonl"), summary_json=paths.get("summary_json"), requests=tuple(records))
    if s.summary_json:
        with open(s.summary_json, "w") as f:
            json.dump(s.to_json(), f, indent=1, default=float)
    return s


def sweep(target: str | Backend, concurrencies: Sequence[int] = (1, 2, 4, 8), spec: LoadSpec | None = None,
          client: ClientSpec | None = None, *, n_requests: Mapping[int, int] | None = None,
          slo: Mapping[str, float] | None = None, out: str | Path | None = None,
          progress: bool | None = None) -> list[RunSummary]:
    """:func:`run` at each concurrency in turn (closed loop), with ``spec`` for everything else.
    Requests per level: ``n_requests[c]`` where given, else ``spec.n_requests`` for every level,
    else :func:`~labkit.serving.loadspec.default_requests`; only the first level warms up and checks
    the server. A list of summaries. ``ValueError`` when ``spec`` sets ``rate`` or ``concurrency``
    (each level sets them)."""
    spec = spec or LoadSpec()
    if not spec.closed or spec.concurrency is not None:
        raise ValueError("sweep runs one closed loop per concurrency: leave rate and concurrency out "
                         "of its LoadSpec (use run for an open loop)")
    out_runs = []
    for i, c in enumerate(concurrencies):
        level = replace(spec, concurrency=c, n_requests=(n_requests or {}).get(c) or spec.n_requests,
                        warmup=spec.warmup if i == 0 else 0)
        out_runs.append(run(target, level, client, slo=slo, out=out, progress=progress, check=(i == 0)))
    return out_runs


def knee_table(summaries: Sequence[RunSummary]) -> list[dict[str, Any]]:
    """One row per run: concurrency, aggregate output tokens/s, P50/P99 TTFT and TPOT (ms), per-user
    tokens/s (1 / median TPOT), and how many requests and failures each row is over."""
    return [{"concurrency": s.concurrency, "output_tok_s": s.output_throughput,
             "p50_ttft_ms": s.ttft.p50, "p99_ttft_ms": s.ttft.p99,
             "p50_tpot_ms": s.tpot.p50, "p99_tpot_ms": s.tpot.p99,
             "p99_e2el_ms": s.e2el.p99, "per_user_tok_s": s.median_tps,
             "completed": s.completed, "failed": s.failed} for s in summaries]
