"""Cold starts, broken down (chapter 08): what a new replica pays before its first token.

* :func:`python_cold_start` starts a fresh Python process that imports torch and transformers,
  loads the profile's LLM from safetensors and answers two requests, and reports each phase in
  seconds: ``interpreter_s`` (process start to the first line of the script), ``imports_s``,
  ``load_s`` (weights into memory), ``first_request_s`` (the first generate, warm-up included)
  and ``warm_request_s`` (the same request again).
* :func:`weight_load` times the weight formats side by side in this process: the safetensors
  file (a plain copy of stored floats) and the bundled GGUF (Q4_1: read and dequantized with the
  ``gguf`` package), with their sizes in bytes, and what a download of each would take at a given
  bandwidth (computed, labelled as such).
* :func:`vllm_phases` reads the phases vLLM logs while it starts (weights, engine init with KV
  cache and warm-up) from the log of a server :func:`labkit.engines.vllm.start_vllm` started; the
  rest of its measured time to ``/health`` is the process, imports and API server.
* :func:`plot_breakdown` stacks the phases (seconds) of each start-up in one bar
  (:func:`vllm_bar` makes vLLM's).

The page cache is warm when the lab runs (the files were read before), so load times here are
memory copies and decoding; a cold disk or a container pull adds ``bytes / bandwidth``.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

_CHILD = r"""
import json, sys, time
t_start = time.time()
import torch, transformers  # noqa: F401
from transformers import AutoModelForCausalLM  # noqa: F401  (the lazy module's real import)
from labkit.hardware.capability import compute_dtype
from labkit.hardware.machine import resolve_device
from labkit.models import load_llm, llm_source
from labkit.serving.local import generate_timed
from labkit.settings import profile
dev = resolve_device(profile().device)
dtype = compute_dtype(dev) if profile().llm_dtype == "auto" else profile().llm_dtype
llm_source(dtype=dtype)  # converts a bundled model once, outside the timing
t_imports = time.time()
model, tok = load_llm(dtype=dtype, device=dev)
t_load = time.time()
first = generate_timed(model, tok, "Say hello.", max_tokens=8, ignore_eos=True)
t_first = time.time()
generate_timed(model, tok, "Say hello.", max_tokens=8, ignore_eos=True)
t_second = time.time()
print(json.dumps({"t_start": t_start, "t_imports": t_imports, "t_load": t_load, "t_first": t_first,
                  "t_second": t_second, "ttft_first_s": first.chunks[0][0] if first.chunks else None,
                  "dtype": str(model.dtype).removeprefix("torch."), "device": str(model.device)}))
"""


def python_cold_start(timeout_s: float = 600.0) -> dict[str, Any]:
    """A fresh interpreter loads the profile's LLM and answers twice; each phase in seconds (see
    the module docstring) plus ``total_s`` (process start to the first answer). Environment (threads,
    profile) is inherited. ``RuntimeError`` with the child's stderr if it fails."""
    t0 = time.time()
    p = subprocess.run([sys.executable, "-c", _CHILD], capture_output=True, text=True, timeout=timeout_s)
    if p.returncode != 0:
        raise RuntimeError(f"the cold-start process failed (exit {p.returncode}):\n{p.stderr[-2000:]}")
    last = [ln for ln in p.stdout.splitlines() if ln.startswith("{")][-1]
    t = json.loads(last)
    return {"interpreter_s": t["t_start"] - t0, "imports_s": t["t_imports"] - t["t_start"],
            "load_s": t["t_load"] - t["t_imports"], "first_request_s": t["t_first"] - t["t_load"],
            "warm_request_s": t["t_second"] - t["t_first"], "total_s": t["t_first"] - t0,
            "dtype": t["dtype"], "device": t["device"]}


def weight_load(safetensors_file: str | Path, gguf_file: str | Path | None = None,
                bandwidth_bytes_s: float = 100e6) -> list[dict[str, Any]]:
    """Load the same weights from each format in this process: one row per format with ``bytes``
    (file size), ``load_s`` (seconds to tensors in memory, dequantization included), ``params``
    and ``download_s`` (computed: ``bytes / bandwidth_bytes_s``, default 100 MB/s)."""
    from safetensors.torch import load_file

    rows = []
    st = Path(safetensors_file)
    t = time.perf_counter()
    tensors = load_file(str(st))  # memory-mapped: pages are read when touched
    for v in tensors.values():
        v.view(-1)[:: max(1, 4096 // v.element_size())].sum()  # touch every page
    rows.append({"format": "safetensors", "bytes": st.stat().st_size, "load_s": time.perf_counter() - t,
                 "params": sum(v.numel() for v in tensors.values())})
    del tensors
    if gguf_file is not None:
        import gguf

        g = Path(gguf_file)
        t = time.perf_counter()
        reader = gguf.GGUFReader(str(g))
        params = sum(gguf.quants.dequantize(x.data, x.tensor_type).size for x in reader.tensors)
        rows.append({"format": f"GGUF ({_gguf_kind(reader)})", "bytes": g.stat().st_size,
                     "load_s": time.perf_counter() - t, "params": params})
    for r in rows:
        r["download_s"] = r["bytes"] / bandwidth_bytes_s
    return rows


def _gguf_kind(reader: Any) -> str:
    from collections import Counter

    kinds = Counter(x.tensor_type.name for x in reader.tensors)
    return kinds.most_common(1)[0][0]


_PHASES = {"weights_s": r"Loading weights took ([\d.]+) s",
           "model_init_s": r"Initializing model took ([\d.]+) s",
           "engine_init_s": r"init engine \(.*?\) took ([\d.]+) s"}


def vllm_phases(log: str | Path, startup_s: float) -> dict[str, float]:
    """vLLM's own startup phases (seconds) from its log: ``weights_s``, ``model_init_s``,
    ``engine_init_s`` (KV cache allocation, profiling and warm-up), and ``other_s``: the rest of
    the measured ``startup_s`` (process start to ``/health`` answering: Python, imports, API
    server). A phase missing from the log (another vLLM version) is NaN and left out of ``other_s``."""
    text = Path(log).read_text(errors="replace")
    out = {}
    for key, pattern in _PHASES.items():
        m = re.search(pattern, text)
        out[key] = float(m.group(1)) if m else float("nan")
    known = sum(v for v in out.values() if v == v)
    out["other_s"] = startup_s - known
    return out


def vllm_bar(phases: dict[str, float], first_request_s: float) -> dict[str, float]:
    """:func:`vllm_phases` as the segments of one bar of :func:`plot_breakdown` (seconds), with the
    first request's time to first token after them."""
    return {"process, imports, API": phases["other_s"], "model init": phases["model_init_s"],
            "weights": phases["weights_s"], "engine init (KV cache, warm-up)": phases["engine_init_s"],
            "first request": first_request_s}


def plot_breakdown(bars: dict[str, dict[str, float]], ax: Any = None) -> Any:
    """One horizontal stacked bar per start-up (``{label: {phase: seconds}}``), the phases in order
    from the process start. Returns the Axes."""
    import matplotlib.pyplot as plt

    if ax is None:
        ax = plt.subplots(figsize=(8, 0.8 + 0.9 * len(bars)))[1]
    for i, parts in enumerate(bars.values()):
        left = 0.0
        for j, (name, seconds) in enumerate(parts.items()):
            ax.barh(i, seconds, left=left, color=plt.cm.tab10((j + 3 * i) % 10), label=name)
            left += seconds
    ax.set_yticks(range(len(bars)), list(bars))
    ax.set(xlabel="seconds from process start", title="where a cold start goes (measured)")
    ax.legend(fontsize=7, ncol=3, loc="upper right")
    return ax
