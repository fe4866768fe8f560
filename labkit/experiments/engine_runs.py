"""Three engines on the same requests (chapter 05, "The inference software stack").

:func:`measure_engine` starts vLLM's CPU build or llama.cpp's llama-server (through
:func:`labkit.engines.server.measured_server`), runs the same prompts at 1, 4 and 8 requests in
flight (:func:`labkit.experiments.compare.measure_server`) and reads the server's resident memory
(:func:`process_tree_memory`, psutil); :func:`transformers_run` wraps transformers ``generate`` the
same way. Each gives an :class:`EngineRun`; :func:`engine_rows` and :func:`memory_rows` tabulate
them, and :mod:`labkit.experiments.format_vs_engine` explains them. :func:`paired_decode_rounds`
measures vLLM and llama.cpp in turn, round after round, for the format/engine split.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

import psutil

from .. import settings
from ..engines import llamacpp, server, vllm
from ..engines.process import lab_servers
from ..llm.memory import tensor_bytes
from ..llm.weight_formats import gguf_summary, read_safetensors_header
from ..models import gguf_path, llm_dir
from ..serving.metrics import RunSummary
from ..serving.records import request_metrics
from ..stats import median_interval
from .compare import measure_server, measure_transformers

#: Requests per level for the servers: one wave per level (a few seconds each on a 2-core CPU).
IN_FLIGHT_REQUESTS: dict[int, int] = {1: 3, 4: 4, 8: 8}


@dataclass
class EngineRun:
    """One engine measured on the chapter's requests (chapter 05). ``name``: a label for tables;
    ``kind``: ``vllm``, ``llamacpp``, ``external`` (your ``LABKIT_BASE_URL`` server), ``transformers``
    or ``skipped`` (``skipped`` then says why); ``weights``: what it serves (``bfloat16
    safetensors``, ``Q4_1 GGUF``); ``threads``: its compute threads, in words; ``runs``: requests in
    flight -> load-generator summary; ``weight_bytes``: bytes of weights one decode step reads
    (every weight once; ``None`` when unknown); ``memory_bytes``: its resident memory, ``memory_what``
    says what was counted; ``startup_s``: seconds until the server answered; ``batching_rounds``:
    output tokens/s at the most in flight ÷ at 1, one ratio per round (:func:`measure_engine`);
    ``target``: the server (:class:`labkit.engines.server.Target`) where it was kept up."""

    name: str
    kind: str
    weights: str = ""
    threads: str = ""
    runs: dict[int, RunSummary] = field(default_factory=dict)
    weight_bytes: float | None = None
    memory_bytes: float | None = None
    memory_what: str = ""
    startup_s: float | None = None
    skipped: str = ""
    batching_rounds: list[float] = field(default_factory=list)
    target: Any = None

    @property
    def batching_gain(self) -> dict[str, float] | None:
        """Output tokens/s at the most requests in flight ÷ at 1 over ``batching_rounds``:
        :func:`labkit.stats.median_interval` (``median``, ``lo``, ``hi``, ``n``, ``coverage``: the
        range of 5 rounds covers the median with 94%); ``None`` without rounds."""
        return median_interval(self.batching_rounds) if self.batching_rounds else None


def process_tree_memory(pid: int) -> dict[str, float]:
    """Resident memory of process ``pid`` and every process it started, through psutil (``/proc`` on
    Linux): ``rss`` (bytes, summed over the processes; a page two of them share counts twice) and
    ``processes``. ``psutil.NoSuchProcess`` when ``pid`` is gone."""
    root = psutil.Process(pid)
    rss, n = 0, 0
    for p in (root, *root.children(recursive=True)):
        with contextlib.suppress(psutil.NoSuchProcess):
            rss += p.memory_info().rss
            n += 1
    return {"rss": float(rss), "processes": float(n)}


def server_pid(url: str) -> int | None:
    """PID of the server the lab started that listens on ``url``'s port (from the registry
    :func:`labkit.engines.process.lab_servers` reads); ``None`` for a server the lab did not start."""
    port = urlsplit(url).port
    return next((int(s["pid"]) for s in lab_servers() if port is not None and s.get("port") == port), None)


def safetensors_tensor_bytes(path: Any) -> int:
    """Bytes of the tensors in a ``.safetensors`` file, from its header (what a forward pass reads)."""
    header = read_safetensors_header(path)
    return sum(t["data_offsets"][1] - t["data_offsets"][0] for k, t in header.items() if k != "__metadata__")


def tpot_range_ms(summary: RunSummary) -> dict[str, float]:
    """Per-request TPOT of a load-generator summary (its ``requests``): ``lo``, ``median``, ``hi`` in
    milliseconds and ``n`` requests with a TPOT (chapter 05's rules compare the extremes)."""
    values = sorted(m["tpot_s"] * 1e3 for r in summary.requests if r.status == "ok"
                    and not math.isnan((m := request_metrics(r))["tpot_s"]))
    if not values:
        raise ValueError("no request in this run produced two tokens or more: no TPOT to take")
    mid = len(values) // 2
    median = values[mid] if len(values) % 2 else (values[mid - 1] + values[mid]) / 2
    return {"lo": values[0], "median": median, "hi": values[-1], "n": float(len(values))}


def transformers_run(model: Any, tokenizer: Any, prompts: Sequence[str], n_requests: int = 4,
                     max_tokens: int = 32, threads: int | None = None) -> EngineRun:
    """transformers ``generate`` on ``prompts`` one request at a time (:func:`measure_transformers`),
    as an :class:`EngineRun` at 1 in flight; its memory is the model's tensors (weights and buffers)
    in this process, which holds much else besides."""
    dtype = str(next(model.parameters()).dtype).removeprefix("torch.")
    s = measure_transformers(model, tokenizer, n_requests, list(prompts)[:n_requests], max_tokens)
    return EngineRun("transformers generate", "transformers", f"{dtype} safetensors",
                     f"{threads} (torch intra-op)" if threads else "torch's default", {1: s},
                     float(tensor_bytes(model, buffers=False)), float(tensor_bytes(model)),
                     "the model's tensors in this process")


def measure_engine(engine: str, prompts: Sequence[str], max_tokens: int = 32,
                   in_flight: Sequence[int] = (1, 4, 8), n_requests: dict[int, int] | None = None,
                   threads: int | None = None, rounds: int = 1,
                   stack: contextlib.ExitStack | None = None, vllm_args: list[str] | None = None
                   ) -> EngineRun:
    """Serve the bundled model with ``engine`` (``vllm``: vLLM's CPU build on the safetensors copy, or
    your ``LABKIT_BASE_URL`` server; ``llamacpp``: llama-server on the Q4_1 GGUF with one slot per
    request in flight), run :func:`measure_server` at each of ``in_flight`` (requests per level:
    ``n_requests``, default :data:`IN_FLIGHT_REQUESTS`), then read the server's resident memory.
    ``threads``: the compute threads each server gets (vLLM's ``OMP_NUM_THREADS``, llama.cpp's
    ``-t``/``-tb``). An engine that cannot run here comes back ``skipped`` with the reason, except
    under CI, where the engine is required and its absence raises. ``rounds``: how many times the
    batching gain (most in flight ÷ 1) is measured: the sweep is round 1, then the two ends again in
    alternating order (most first in even rounds) so a drift of the machine hits both alike.
    ``stack``: keep the server up on this stack (it stops when the stack closes; the run's ``target``
    names it) instead of stopping it on return. ``vllm_args``: extra flags for the vLLM the lab starts
    (e.g. ``["--max-num-batched-tokens", "2048"]``)."""
    asked = n_requests or IN_FLIGHT_REQUESTS
    counts = {c: asked.get(c) or IN_FLIGHT_REQUESTS.get(c, 2 * c) for c in in_flight}
    if engine == "vllm":
        external = settings.base_url() is not None
        if not (external or vllm.vllm_available() or vllm.vllm_required()):
            return EngineRun("vLLM (CPU build)", "skipped", skipped=vllm.unavailable_reason())
        ctx = server.measured_server(threads=threads) if external else \
            server.measured_server(engine="vllm", threads=threads, vllm_args=vllm_args)
        threads_words = "your server's own" if external else f"{threads or 'vLLM default'} (OMP_NUM_THREADS)"
    elif engine == "llamacpp":
        if not (llamacpp.llamacpp_available() or llamacpp.llamacpp_required()):
            return EngineRun("llama.cpp (llama-server)", "skipped", skipped=llamacpp.unavailable_reason())
        threads = threads or llamacpp.llamacpp_threads()
        ctx = server.measured_server(engine="llamacpp",
                                     llamacpp_args={"parallel": max(in_flight), "threads": threads})
        threads_words = f"{threads} (-t, -tb)"
    else:
        raise ValueError(f"engine={engine!r}: choose vllm or llamacpp")
    with contextlib.ExitStack() as own:
        target = (stack or own).enter_context(ctx)
        runs = measure_server(target.url, target.model, tuple(in_flight), counts, prompts, max_tokens)
        top = max(in_flight)
        gains = [runs[top].output_throughput / runs[1].output_throughput] if 1 in runs and top > 1 else []
        for r in range(1, rounds if gains else 0):
            again = measure_server(target.url, target.model, (top, 1) if r % 2 else (1, top), counts, prompts,
                                   max_tokens)
            if (short := {c: s.completed for c, s in again.items() if s.completed != counts[c]}):
                raise RuntimeError(f"{target.engine}: round {r + 1} completed {short} of {counts} requests")
            gains.append(again[top].output_throughput / again[1].output_throughput)
        pid = server_pid(target.url) if target.kind in ("vllm", "llamacpp") else None
        memory = process_tree_memory(pid)["rss"] if pid else None
    weights, weight_bytes = "unknown", None
    if target.kind == "vllm":
        weights = f"{target.dtype} safetensors"
        st_file = llm_dir(target.dtype or "float32") / "model.safetensors"
        weight_bytes = float(safetensors_tensor_bytes(st_file))
    elif target.kind == "llamacpp":
        weights, weight_bytes = f"{target.dtype} GGUF", float(gguf_summary(gguf_path())["bytes"])
    return EngineRun(target.engine, target.kind, weights, threads_words, runs, weight_bytes, memory,
                     "server process RSS after the runs" if memory else "not measured (not started here)",
                     target.startup_s, batching_rounds=gains, target=target if stack else None)


def paired_decode_rounds(prompts: Sequence[str], max_tokens: int = 16, rounds: int = 4, requests: int = 2,
                         threads: int | None = None,
                         targets: dict[str, Any] | None = None) -> dict[str, list[float]]:
    """vLLM's CPU build and llama-server (one slot where this starts them) up at once, measured in turn,
    one request at a time, in ABBA order (vLLM first in even rounds, llama.cpp first in odd ones) so a
    drift of the machine hits both alike: ``{"vllm": [...], "llamacpp": [...]}``, each round's median
    TPOT in ms (chapter 05's engine factor is taken round by round from these). ``targets``:
    ``{"vllm": ..., "llamacpp": ...}``, servers already up (e.g. :func:`measure_engine`'s, kept on a
    stack) to measure instead of starting two. ``RuntimeError`` where either engine cannot run here;
    a request that fails raises too."""
    for ok, why in ((vllm.vllm_available(), vllm.unavailable_reason), (llamacpp.llamacpp_available(),
                                                                         llamacpp.unavailable_reason)):
        if not (ok or targets):
            raise RuntimeError(why())
    out: dict[str, list[float]] = {"vllm": [], "llamacpp": []}
    with contextlib.ExitStack() as stack:
        lc_args = {"parallel": 1, "threads": threads or llamacpp.llamacpp_threads()}
        targets = targets or {
            "vllm": stack.enter_context(server.measured_server(engine="vllm", threads=threads)),
            "llamacpp": stack.enter_context(server.measured_server(engine="llamacpp", llamacpp_args=lc_args))}
        for r in range(rounds):
            for name in (("vllm", "llamacpp") if r % 2 == 0 else ("llamacpp", "vllm")):
                t = targets[name]
                run = measure_server(t.url, t.model, (1,), {1: requests}, prompts, max_tokens)[1]
                if run.completed != requests:
                    raise RuntimeError(f"{t.engine}: {run.status_counts} in round {r + 1}")
                out[name].append(tpot_range_ms(run)["median"])
    return out


def engine_rows(engines: Sequence[EngineRun]) -> list[dict[str, Any]]:
    """One row per engine and requests in flight: ``engine``, ``weights``, ``in_flight``,
    ``requests``, median ``ttft_ms`` and ``tpot_ms``, ``stream_tps`` (1 / median TPOT) and
    ``aggregate_tps`` (all output tokens ÷ the run's seconds). Skipped engines give no row."""
    rows = []
    for e in engines:
        for c, s in e.runs.items():
            rows.append({"engine": e.name, "weights": e.weights, "in_flight": c, "requests": s.completed,
                         "ttft_ms": s.ttft.median, "tpot_ms": s.tpot.median,
                         "stream_tps": s.median_tps, "aggregate_tps": s.output_throughput})
    return rows


def memory_rows(engines: Sequence[EngineRun]) -> list[dict[str, Any]]:
    """One row per measured engine: ``engine``, ``weights``, ``threads``, ``weights_mb`` (what one
    decode step reads), ``resident_mb`` and ``what`` was counted (MB = 10^6 bytes)."""
    mb = (lambda b: None if b is None else b / 1e6)
    return [{"engine": e.name, "weights": e.weights, "threads": e.threads, "weights_mb": mb(e.weight_bytes),
             "resident_mb": mb(e.memory_bytes), "what": e.memory_what} for e in engines if e.runs]
