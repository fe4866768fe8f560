"""Inference engines side by side (chapter 05, "The inference software stack").

:data:`ENGINES` is a short reference of the engines the tutorial names (and the local ones the lab
uses) with where each runs; :func:`available_here` says which of them this machine can run now.
:func:`compare` puts measured load-generator summaries of several engines in one table:
single-stream decode speed (tokens/s a user sees) and aggregate throughput (tokens/s the
machine produces for everyone). Measuring is :mod:`labkit.serving.loadgen`'s job; serving is
:mod:`labkit.engines.vllm`'s and :mod:`labkit.engines.llamacpp`'s.

Three engines on the same requests, with memory: :mod:`labkit.experiments.engine_runs`; which part of
their differences is the weight format's and which the engine's: :mod:`labkit.experiments.format_vs_engine`.
"""

from __future__ import annotations

import importlib.util
import platform
from collections.abc import Sequence
from typing import Any

from ..engines.llamacpp import llamacpp_available
from ..engines.llamacpp import unavailable_reason as llamacpp_reason
from ..engines.vllm import unavailable_reason, vllm_available
from ..serving.loadgen import load_prompts, run, sweep
from ..serving.loadspec import ClientSpec, LoadSpec, default_requests
from ..serving.local import transformers_backend
from ..serving.metrics import RunSummary
from ..serving.ollama_api import ollama_available

#: Where each engine runs (✓ supported, ~ partial or experimental, ✗ no), as documented by each
#: project; "formats" are the weight formats it loads directly.
ENGINES: list[dict[str, str]] = [
    {"engine": "vLLM", "nvidia": "✓", "amd": "✓", "apple": "~ CPU only", "x86_cpu": "✓",
     "formats": "safetensors (HF), GGUF (partial)",
     "strength": "widest model support, PagedAttention, the largest community"},
    {"engine": "SGLang", "nvidia": "✓", "amd": "✓", "apple": "✗", "x86_cpu": "~ Xeon",
     "formats": "safetensors (HF)",
     "strength": "RadixAttention prefix cache, strong on MoE and structured output"},
    {"engine": "TensorRT-LLM", "nvidia": "✓", "amd": "✗", "apple": "✗", "x86_cpu": "✗",
     "formats": "compiled engines built from HF checkpoints",
     "strength": "highest raw throughput on NVIDIA, more setup"},
    {"engine": "llama.cpp", "nvidia": "✓", "amd": "✓", "apple": "✓ Metal", "x86_cpu": "✓",
     "formats": "GGUF", "strength": "runs anywhere, many quantization types"},
    {"engine": "Ollama", "nvidia": "✓", "amd": "✓", "apple": "✓ Metal", "x86_cpu": "✓",
     "formats": "GGUF (via llama.cpp)", "strength": "one-command local serving"},
    {"engine": "transformers", "nvidia": "✓", "amd": "✓", "apple": "✓ MPS", "x86_cpu": "✓",
     "formats": "safetensors (HF), GGUF (dequantized)",
     "strength": "reference implementation; generate() batches only what it is handed"},
]


def available_here() -> dict[str, str]:
    """Engine name -> what this machine can do with it right now, in words (nothing is started)."""
    def has(module: str) -> bool:
        return importlib.util.find_spec(module) is not None

    cuda = False
    try:
        import torch

        cuda = torch.cuda.is_available()
    except ImportError:
        pass
    out = {"vLLM": "runs here (CPU build, .venv-vllm)" if vllm_available()
           else f"not here: {unavailable_reason()}"}
    out["SGLang"] = "installed" if has("sglang") else "not installed (needs a GPU or a Xeon CPU build)"
    if has("tensorrt_llm") and cuda:
        out["TensorRT-LLM"] = "installed, NVIDIA GPU present"
    else:
        out["TensorRT-LLM"] = "not here: NVIDIA GPUs only" if not cuda else "not installed"

    out["llama.cpp"] = ("runs here (llama-server, built by make llamacpp)" if llamacpp_available()
                        else f"not here: {llamacpp_reason()}")
    out["Ollama"] = "server answering" if ollama_available() else "no server running"
    out["transformers"] = f"runs here ({platform.machine()})"
    return out


def compare(rows: dict[str, RunSummary]) -> list[dict[str, Any]]:
    """One row per run: ``rows`` maps a label ("vLLM, concurrency 8") to a summary from
    :func:`labkit.serving.metrics.summarize` (or :mod:`labkit.serving.loadgen`). Each row has ``run``,
    ``concurrency``, ``requests``, ``single_stream_tps`` (mean decode tokens/s of one request
    after its first token), ``aggregate_tps`` (all output tokens ÷ wall seconds of the run),
    ``median_ttft_ms`` and ``duration_s``."""
    out = []
    for label, s in rows.items():
        out.append({"run": label, "concurrency": s.concurrency,
                    "requests": s.completed, "single_stream_tps": s.median_tps,
                    "aggregate_tps": s.output_throughput, "median_ttft_ms": s.ttft.median,
                    "duration_s": s.duration_s})
    return out


# --- measuring ----------------------------------------------------------------------------------


def short_prompts(n: int = 8) -> list[str]:
    """The first ``n`` short questions of the shipped prompt set (``data/prompts/mixed.jsonl``):
    the same workload for every engine, with short prompts so decode dominates."""
    short = [p["prompt"] for p in load_prompts() if p.get("kind") == "short"]
    if not short:
        raise ValueError("the shipped prompt set has no 'short' prompts")
    return (short * (n // len(short) + 1))[:n]


def measure_transformers(model: Any, tokenizer: Any, n_requests: int = 4,
                         prompts: Sequence[str] | None = None, max_tokens: int = 32) -> RunSummary:
    """transformers ``generate``, one request after another (it has no scheduler to batch
    requests that arrive separately), through :func:`labkit.serving.loadgen.run` with exactly
    ``max_tokens`` tokens per request. The load generator's :class:`RunSummary`."""
    backend = transformers_backend(model, tokenizer, ignore_eos=True)
    spec = LoadSpec(n_requests, 1, max_tokens=max_tokens, prompts=list(prompts or short_prompts(n_requests)))
    return run(backend, spec, progress=False)


def measure_server(url: str, model: str, concurrencies: Sequence[int] = (1, 8),
                   n_requests: dict[int, int] | None = None, prompts: Sequence[str] | None = None,
                   max_tokens: int = 32) -> dict[int, RunSummary]:
    """Closed-loop runs of :func:`labkit.serving.loadgen.run` against an OpenAI-compatible server at
    each concurrency, exactly ``max_tokens`` tokens per request (``ignore_eos``). ``n_requests``:
    concurrency -> requests (default :func:`labkit.serving.loadspec.default_requests`). One warm-up
    request before the first run. Returns concurrency -> summary."""
    counts = {c: (n_requests or {}).get(c) or default_requests(c) for c in concurrencies}
    spec = LoadSpec(max_tokens=max_tokens, prompts=list(prompts or short_prompts(max(counts.values()))))
    runs = sweep(url, concurrencies, spec, ClientSpec(model=model, ignore_eos=True), n_requests=counts,
                 progress=False)
    return dict(zip(concurrencies, runs, strict=True))
