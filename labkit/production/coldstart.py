"""Cold starts, broken down (chapter 08): what a new replica pays before its first token.

* :func:`python_cold_start` starts a fresh Python process that imports torch and transformers,
  loads the profile's LLM from safetensors and answers two requests, and reports each phase in
  seconds: ``interpreter_s`` (process start to the first line of the script), ``imports_s``,
  ``load_s`` (weights into memory), ``first_request_s`` (the first generate, warm-up included)
  and ``warm_request_s`` (the same request again).
* :func:`weight_load` times the weight formats side by side in this process: the safetensors
  file (a plain copy of stored floats) and the bundled GGUF (Q4_1: read and dequantized with the
  ``gguf`` package), round after round in alternating order, with their sizes in bytes, and what a
  download of each would take at a given bandwidth (computed, labelled as such);
  :func:`engine_start_rounds` starts llama-server on the same weights as 4-bit blocks and as floats,
  and :func:`pull_ratio` compares two formats' download plus load or start, round by round.
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
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..engines import llamacpp, process
from ..stats import median_interval

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
                bandwidth_bytes_s: float | None = None, rounds: int = 1) -> list[dict[str, Any]]:
    """Load the same weights from each format in this process, ``rounds`` times in alternating order
    (safetensors first in odd rounds, the GGUF first in even ones): one row per format with ``bytes``
    (file size), ``load_runs`` (seconds to tensors in memory, dequantization included, per round),
    ``load_s`` (their median), ``params`` and ``download_s`` (computed: ``bytes / bandwidth_bytes_s``,
    default :func:`pull_bps`)."""
    loaders = [("safetensors", Path(safetensors_file), _load_safetensors)]
    if gguf_file is not None:
        loaders.append(("gguf", Path(gguf_file), _load_gguf))
    rows: dict[str, dict[str, Any]] = {}
    for r in range(rounds):
        for name, path, load in (loaders if r % 2 == 0 else loaders[::-1]):
            t = time.perf_counter()
            fmt, params = load(path)
            row = rows.setdefault(name, {"format": fmt, "bytes": path.stat().st_size, "params": params,
                                         "load_runs": []})
            row["load_runs"].append(time.perf_counter() - t)
    for row in rows.values():
        row["load_s"] = median_interval(row["load_runs"])["median"]
        row["download_s"] = row["bytes"] / (bandwidth_bytes_s or pull_bps())
    return [rows[name] for name, _, _ in loaders]


def pull_ratio(num: dict[str, Any], den: dict[str, Any], runs: str = "load_runs") -> dict[str, float]:
    """Download plus load (or start), ``num``'s ÷ ``den``'s (rows from :func:`weight_load` or
    :func:`engine_start_rounds`; ``runs`` names their per-round seconds), round by round:
    :func:`labkit.stats.median_interval` of the per-round ratios (``median``, ``lo``, ``hi``, ``n``,
    ``coverage``)."""
    return median_interval([(num["download_s"] + a) / (den["download_s"] + b)
                            for a, b in zip(num[runs], den[runs], strict=True)])


_LOADED = re.compile(r"^(\d+)\.(\d+)\.(\d+)\.(\d+) I srv\s+llama_server: model loaded", re.M)


def llamacpp_loaded_s(log: str | Path, wait_s: float = 2.0) -> float:
    """Seconds from llama-server's start to its ``model loaded`` line, on the clock its log prints
    (``M.SS.mmm.uuu``); waits up to ``wait_s`` for the line. ``ValueError`` when it never comes."""
    end = time.perf_counter() + wait_s
    while True:
        m = _LOADED.search(Path(log).read_text(errors="replace"))
        if m:
            minutes, sec, ms, us = map(int, m.groups())
            return 60 * minutes + sec + ms / 1e3 + us / 1e6
        if time.perf_counter() > end:
            raise ValueError(f"no 'model loaded' line in {log}")
        time.sleep(0.05)


def engine_start_rounds(files: dict[str, Path], rounds: int = 3, threads: int | None = None,
                        bandwidth_bytes_s: float | None = None) -> dict[str, dict[str, Any]]:
    """llama-server started on each GGUF of ``files`` (name -> path) and stopped again, in turn,
    ``rounds`` times, the order reversed every other round: per name ``bytes``, ``download_s``
    (computed: ``bytes / bandwidth_bytes_s``, default :func:`pull_bps`) and ``start_runs`` (seconds
    from the process start to ``model loaded``, per round: :func:`llamacpp_loaded_s`). Chapter 08
    compares the same weights as 4-bit blocks and as floats in one engine that reads both without
    converting them."""
    bps = bandwidth_bytes_s or pull_bps()
    out: dict[str, dict[str, Any]] = {
        n: {"bytes": Path(f).stat().st_size, "download_s": Path(f).stat().st_size / bps,
            "start_runs": []} for n, f in files.items()}
    names = list(files)
    for r in range(rounds):
        for n in (names if r % 2 == 0 else names[::-1]):
            srv = llamacpp.start_llamacpp(files[n], threads=threads, parallel=1, ctx_per_slot=512)
            try:
                out[n]["start_runs"].append(llamacpp_loaded_s(srv.log))
            finally:
                process.stop(srv)
    return out


def _load_safetensors(path: Path) -> tuple[str, int]:
    from safetensors.torch import load_file

    tensors = load_file(str(path))  # memory-mapped: pages are read when touched
    for v in tensors.values():
        v.view(-1)[:: max(1, 4096 // v.element_size())].sum()  # touch every page
    return "safetensors", sum(v.numel() for v in tensors.values())


def _load_gguf(path: Path) -> tuple[str, int]:
    import gguf

    reader = gguf.GGUFReader(str(path))
    params = sum(gguf.quants.dequantize(x.data, x.tensor_type).size for x in reader.tensors)
    return f"GGUF ({_gguf_kind(reader)})", params


def _gguf_kind(reader: Any) -> str:
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
    from the process start, each phase with a colour of its own (a phase key like ``imports_s`` is
    written ``imports``); the legend sits under the axes. Returns the Axes."""
    import matplotlib.pyplot as plt

    if ax is None:
        ax = plt.subplots(figsize=(8, 1.6 + 0.9 * len(bars)), layout="constrained")[1]
    names: list[str] = []  # every phase once, in order of appearance: its colour and legend entry
    for i, parts in enumerate(bars.values()):
        left = 0.0
        for key, seconds in parts.items():
            name = key.removesuffix("_s").replace("_", " ")
            new = name not in names
            names += [name] if new else []
            ax.barh(i, seconds, left=left, color=plt.cm.tab10(names.index(name) % 10),
                    label=name if new else None)
            left += seconds
    ax.set_yticks(range(len(bars)), list(bars))
    ax.set(xlabel="seconds from process start", title="where a cold start goes (measured)")
    ax.legend(fontsize=7, ncol=4, loc="upper center", bbox_to_anchor=(0.5, -0.28))
    return ax


# --- a GPU replica's cold start, itemized (chapter 08) ----------------------------------------------
# What a new replica on a GPU cluster waits for, each phase a labelled figure with its source. Only
# the engine start is measured here; the rest are figures read from cited pages (low, typical, high),
# or bytes ÷ bandwidth computed from them. Sizes in bytes, bandwidths in
# bytes/s, times in seconds.

#: The serving image's compressed size: ``docker pull vllm/vllm-openai:latest`` is about 12 GB
#: (github.com/vllm-project/vllm/issues/27154, October 2025; 9 GB on Docker Hub in August 2024,
#: issues/7609; 28.6 GB unpacked in December 2025, pull/22377).
IMAGE_BYTES = 12e9
#: (fast, typical, slow) figures, each with the pages it was read from (stored copies, read 2026-12-05;
#: a rate computed from a page's size and time says so).
FIGURES: dict[str, tuple[float, float, float, str]] = {
    "node_s": (0.0, 300.0, 900.0,
        "a cluster autoscaler adding a GPU node until pods can use its GPU: 0 when a node with a free GPU"
        " is already up; typical 5 min: AWS GPU nodes joined and ran pods in 4-6 min "
        "(github.com/kubernetes/autoscaler/issues/3464), an AKS A100 node took 284 s to provision and 126"
        " s more to initialize its GPU (github.com/kaito-project/kaito/issues/2325), Microsoft calls 5-10"
        " min expected for A100 nodes (learn.microsoft.com/en-us/answers/a/12767836); high 15 min, the "
        "time cluster-autoscaler's source allows a new GPU node to report its GPU (kubernetes/autoscaler,"
        " cluster-autoscaler/utils/gpu)"),
    "registry_bps": (85e6, 55e6, 30e6,
        "image pull and unpack, bytes/s: 5.6 GB in 101 s on an AKS node, 55 MB/s (kaito issues/2325, "
        "computed); 15-20 GB in 4-6 min, 42-83 MB/s (an AWS Machine Learning Blog post on lazy loading, "
        "news.chathome.org mirror, computed); unpacking held pulls to about 30-35 MB/s "
        "(github.com/moby/moby/issues/21814, github.com/containerd/containerd/issues/2886, computed). "
        "Image streaming or an image cached on the node skips most of it"),
    "storage_bps": (2e9, 300e6, 40e6,
        "weights read, bytes/s: a local NVMe (about 7 GB/s for a typical NVMe, github.com/vllm-"
        "project/vllm/issues/15862; 373 MB/s measured with fio on a cloud VM's data disk, "
        "github.com/ServerlessLLM/ServerlessLLM/issues/193), a network volume as deploy/ mounts (EBS gp3:"
        " 125-1,000 MiB/s provisioned, docs.aws.amazon.com CreateVolume Throughput), one file from the "
        "Hugging Face Hub without hf_transfer, about 40 MB/s "
        "(github.com/huggingface/huggingface_hub/issues/2658)"),
    "capture_s": (10.0, 35.0, 60.0,
        "torch.compile and CUDA graph capture at vLLM's start, as vLLM logs them (no GPU here, so read "
        "from logs others posted): graph capture alone 10 s and with torch.compile 19 + 15 s for "
        "Llama-3-8B (github.com/vllm-project/vllm/pull/11005); a cached compile 7.5 s + capture 17 s "
        "(issues/20264); torch.compile 29 s on an 80 GB GPU (kubernetes-sigs/gateway-api-inference-"
        "extension/pull/550)"),
}


def pull_bps() -> float:
    """The typical registry pull (bytes/s) of :data:`FIGURES`: what a download of weights or an image
    takes in this chapter's models of a start."""
    return FIGURES["registry_bps"][1]


@dataclass(frozen=True)
class Phase:
    """One phase of a cold start: ``seconds`` typical, ``low``/``high`` its range, ``kind`` measured |
    computed | cited (read from pages others posted), ``source``, and ``in_probe``: whether
    it runs after the container starts, so that the startup probe's budget must cover it (node and
    image pull come before)."""

    name: str
    seconds: float
    low: float
    high: float
    kind: str
    source: str
    in_probe: bool


def gpu_replica_budget(weights_bytes: float, engine_start_s: float, image_bytes: float = IMAGE_BYTES,
                       figures: dict[str, tuple[float, float, float, str]] | None = None) -> list[Phase]:
    """The phases of a GPU replica's cold start in order: node, image pull (``image_bytes`` ÷ registry
    bandwidth), weights (``weights_bytes`` ÷ storage bandwidth), engine start (``engine_start_s``,
    measured here: process, imports, KV allocation; range half to twice) and graph capture."""
    a = {**FIGURES, **(figures or {})}
    if weights_bytes <= 0 or engine_start_s <= 0 or image_bytes <= 0:
        raise ValueError("weights_bytes, engine_start_s and image_bytes must be > 0")
    node, reg, sto, cap = a["node_s"], a["registry_bps"], a["storage_bps"], a["capture_s"]
    return [
        Phase("node", node[1], node[0], node[2], "cited", node[3], False),
        Phase("image pull", image_bytes / reg[1], image_bytes / reg[0], image_bytes / reg[2], "computed",
              f"{image_bytes / 1e9:.0f} GB image ÷ {reg[3]}", False),
        Phase("weights", weights_bytes / sto[1], weights_bytes / sto[0], weights_bytes / sto[2], "computed",
              f"{weights_bytes / 1e9:.1f} GB of weights ÷ {sto[3]}", True),
        Phase("engine start", engine_start_s, engine_start_s / 2, engine_start_s * 2, "measured",
              "this machine's engine: process start to /health, less its weight loading", True),
        Phase("graph capture", cap[1], cap[0], cap[2], "cited", cap[3], True),
    ]


def budget_total(phases: list[Phase], which: str = "seconds", in_probe: bool | None = None) -> float:
    """Sum of ``which`` (``seconds``, ``low`` or ``high``) over the phases (only those ``in_probe``
    when given)."""
    return float(sum(getattr(p, which) for p in phases if in_probe is None or p.in_probe == in_probe))


def budget_table(phases: list[Phase]) -> list[dict[str, Any]]:
    """The phases as table rows: ``phase``, ``typical_s``, ``low_s``, ``high_s``, ``kind``, ``probe``
    (whether the startup probe must cover it) and ``source``."""
    return [{"phase": p.name, "typical_s": p.seconds, "low_s": p.low, "high_s": p.high, "kind": p.kind,
             "probe": "yes" if p.in_probe else "no", "source": p.source} for p in phases]


def engine_start(startup_s: float, weights_s: float = float("nan")) -> float:
    """The measured engine start for :func:`gpu_replica_budget` (s): a server's process start to
    ``/health`` (``startup_s``), less the weight loading it logged (``weights_s``, from
    :func:`vllm_phases`; NaN when unknown), which the budget counts apart from storage bandwidth."""
    return startup_s - (weights_s if weights_s == weights_s else 0.0)


def sensitivity(phases: list[Phase]) -> list[dict[str, Any]]:
    """Each phase moved alone to its low and to its high: the total cold start then (s), widest first."""
    typical = budget_total(phases)
    rows = [{"phase": p.name, "low_total_s": typical - p.seconds + p.low,
             "high_total_s": typical - p.seconds + p.high, "kind": p.kind} for p in phases]
    return sorted(rows, key=lambda r: r["high_total_s"] - r["low_total_s"], reverse=True)


def probe_covers(phases: list[Phase], probe_budget_s: float) -> dict[str, Any]:
    """Whether a startup probe's budget (s) covers the phases after the container starts, at their
    typical and high values: ``typical_s``, ``high_s``, ``budget_s``, ``covers_typical``, ``covers_high``."""
    typ, high = budget_total(phases, "seconds", True), budget_total(phases, "high", True)
    return {"typical_s": typ, "high_s": high, "budget_s": float(probe_budget_s),
            "covers_typical": typ <= probe_budget_s, "covers_high": high <= probe_budget_s}


def plot_budget(phases: list[Phase], axes: Any = None) -> Any:
    """Left: the typical cold start as one stacked bar (hatched: measured here). Right: each phase's range
    moved alone (a tornado). Returns the two Axes."""
    import matplotlib.pyplot as plt

    if axes is None:
        axes = plt.subplots(1, 2, figsize=(11, 3.6), layout="constrained", gridspec_kw={"wspace": 0.08})[1]
    left = 0.0
    for i, p in enumerate(phases):
        axes[0].barh(0, p.seconds, left=left, color=plt.cm.tab10(i),
                     hatch="//" if p.kind == "measured" else None, label=f"{p.name} ({p.kind})")
        left += p.seconds
    axes[0].set(yticks=[], xlabel="seconds", title=f"GPU replica cold start: {left / 60:.1f} min typical")
    axes[0].legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.3), ncol=3)
    rows = sensitivity(phases)[::-1]
    typical = budget_total(phases)
    for i, r in enumerate(rows):
        axes[1].barh(i, r["high_total_s"] - r["low_total_s"], left=r["low_total_s"], color="tab:gray")
    axes[1].axvline(typical, color="k", lw=1)
    axes[1].set_yticks(range(len(rows)), [r["phase"] for r in rows])
    axes[1].set(xlabel="total cold start (s), one phase from low to high", title="sensitivity")
    return axes
