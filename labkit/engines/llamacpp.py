"""llama.cpp, the engine most readers run on a laptop: its server and its own tools on a GGUF
(chapters 02, 04, 05, 06 and 08). The tools come from ``make llamacpp``
(:mod:`labkit.engines.llamacpp_build`); everything here runs them as subprocesses.

Usage::

    from labkit.engines.llamacpp import bench
    from labkit.engines.server import ENGINES
    with ENGINES["llamacpp"].serve() as t:  # the bundled SmolLM2 Q4_1 GGUF as "smollm2"; ready in ~1 s
        ...                                 # the same OpenAI API as vLLM's (labkit.serving.loadgen)
    bench(threads=2)                        # llama-bench: prompt and generation tok/s

Server flags (:func:`llamacpp_command`): ``--alias`` (otherwise it serves the model under its file
path), ``-t``/``-tb`` threads, ``--parallel`` slots (requests decoded together, continuous batching),
``-c`` the context of all slots together (``ctx_per_slot`` x slots: 2048 each, as vLLM's
``--max-model-len``), ``--metrics`` (Prometheus at ``/metrics``, names starting ``llamacpp:``).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path
from typing import Any

from .. import settings
from ..llm.gguf_header import read_header
from ..models import SERVED_NAME, gguf_path
from . import llamacpp_build, process
from .process import Server, free_port

__all__ = ["bench", "gguf_type", "llamacpp_available", "parse_bench", "perplexity", "quantize",
           "start_llamacpp"]

#: llama-quantize's names for the levels chapter 06 compares (F32/F16 are not quantized).
LEVELS = ("F16", "Q8_0", "Q4_K_M", "Q4_0")


def llamacpp_available() -> bool:
    """Whether ``make llamacpp`` has built the tools here."""
    return llamacpp_build.available()


def unavailable_reason() -> str:
    """Why :func:`llamacpp_available` is False, and what to do."""
    return llamacpp_build.unavailable_reason()


def llamacpp_required() -> bool:
    """Whether a chapter must not skip its llama.cpp cells: under CI (``$CI`` set) on a machine
    that can build the tools, where ``make test`` builds them first."""
    return settings.under_ci() and not llamacpp_build.missing_prerequisites()


def llamacpp_threads() -> int:
    """Threads for llama.cpp: ``$LABKIT_LLAMACPP_THREADS``, else every logical CPU up to 8 (llama.cpp's
    decode is memory-bound: past a few cores more threads stop helping). No core is left free for the
    client: on 2 cores, two llama.cpp threads beside the load generator still decode faster than one
    (``LABKIT_LLAMACPP_THREADS=1 labkit bench --llamacpp`` against the default shows it)."""
    env = os.environ.get("LABKIT_LLAMACPP_THREADS", "").strip()
    if env:
        if not env.isdigit() or int(env) < 1:
            raise ValueError(f"LABKIT_LLAMACPP_THREADS={env!r} is not a whole number >= 1; "
                             "set it to 1, 2, ...")
        return int(env)
    return max(1, min(8, os.cpu_count() or 1))


def _tool(name: str) -> str:
    exe = llamacpp_build.tool(name)
    if exe is None:
        raise RuntimeError(unavailable_reason())
    return str(exe)


def _gguf(path: str | Path | None) -> Path:
    if path is None:
        return gguf_path()
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no GGUF file at {path}")
    return path


def llamacpp_command(gguf: str | Path, port: int, served_name: str = SERVED_NAME,
                     threads: int | None = None, parallel: int = 4, ctx_per_slot: int = 2048,
                     extra: list[str] | None = None) -> list[str]:
    """llama-server's command line (see the module doc for the flags)."""
    t = str(threads or llamacpp_threads())
    return [_tool("llama-server"), "-m", str(gguf), "--host", "127.0.0.1", "--port", str(port),
            "--alias", served_name, "-t", t, "-tb", t, "--parallel", str(parallel),
            "-c", str(ctx_per_slot * parallel), "--metrics", "--no-webui", *(extra or [])]


def start_llamacpp(gguf: str | Path | None = None, port: int | None = None, served_name: str = SERVED_NAME,
                   threads: int | None = None, parallel: int = 4, ctx_per_slot: int = 2048,
                   log_path: str | Path | None = None, ready_timeout_s: float = 120.0,
                   extra: list[str] | None = None) -> Server:
    """Start llama-server on ``127.0.0.1:port`` (a free port by default) serving ``gguf`` (default: the
    bundled SmolLM2 Q4_1) as ``served_name``; wait for ``/health``; the :class:`Server` (its ``dtype``
    is the GGUF's type, e.g. ``Q4_1``). It dies with this process; stop it with :func:`stop`."""
    gguf = _gguf(gguf)
    port = port or free_port()
    cmd = llamacpp_command(gguf, port, served_name, threads, parallel, ctx_per_slot, extra)
    return process.start(cmd, port, "llamacpp", served_name, gguf_type(gguf), log_path=log_path,
                         ready_timeout_s=ready_timeout_s, name="llama-server")



# GGUF general.file_type -> llama.cpp's name for it (the types the lab meets).
_FILE_TYPES = {0: "F32", 1: "F16", 2: "Q4_0", 3: "Q4_1", 7: "Q8_0", 8: "Q5_0", 9: "Q5_1", 10: "Q2_K",
               11: "Q3_K_S", 12: "Q3_K_M", 13: "Q3_K_L", 14: "Q4_K_S", 15: "Q4_K_M", 16: "Q5_K_S",
               17: "Q5_K_M", 18: "Q6_K", 32: "BF16"}


def gguf_type(path: str | Path) -> str:
    """The GGUF's file type as llama.cpp names it (``Q4_1``, ``Q8_0``, ``F16``...), read from its
    ``general.file_type`` by :mod:`labkit.llm.gguf_header` (milliseconds; ``gguf.GGUFReader`` parses
    the tokenizer's 49k strings first, about 5 s per call)."""
    code = read_header(path).metadata.get("general.file_type")
    if code is None:
        return "unknown"
    return _FILE_TYPES.get(int(code), f"type {code}")


def parse_bench(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """llama-bench's ``-o json`` rows as :func:`bench` reports them: per test (``gen`` when it
    generates, else ``prompt``) ``<key>_tps`` (mean tok/s), ``<key>_tps_sd`` (standard deviation) and
    ``<key>_tps_samples`` (tok/s of each repetition, llama-bench's ``samples_ts``: feed them to
    :func:`labkit.stats.median_interval`)."""
    out: dict[str, Any] = {}
    for row in rows:
        key = "gen_tps" if row.get("n_gen", 0) > 0 else "prompt_tps"
        out[key], out[f"{key}_sd"] = float(row["avg_ts"]), float(row["stddev_ts"])
        out[f"{key}_samples"] = [float(x) for x in row.get("samples_ts") or [row["avg_ts"]]]
    return out


def bench(gguf: str | Path | None = None, threads: int | None = None, prompt: int = 128, gen: int = 64,
          reps: int = 3, timeout_s: float = 300.0) -> dict[str, Any]:
    """llama-bench on ``gguf`` (default: the bundled one): ``prompt_tps`` (prompt processing, tok/s,
    ``prompt`` tokens at once) and ``gen_tps`` (generation at batch 1, tok/s, ``gen`` tokens), each the
    mean of ``reps`` runs with its standard deviation (``*_sd``) and every run's tok/s (``*_samples``,
    a list), ``threads``, ``size_bytes`` and ``type``. llama-bench times the model alone: no sampling,
    no detokenization, no HTTP."""
    gguf = _gguf(gguf)
    t = threads or llamacpp_threads()
    cmd = [_tool("llama-bench"), "-m", str(gguf), "-t", str(t), "-p", str(prompt), "-n", str(gen),
           "-r", str(reps), "-o", "json"]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s)
    if r.returncode:
        raise RuntimeError(f"llama-bench failed (exit {r.returncode}):\n{r.stderr[-2000:]}")
    return {"threads": t, "size_bytes": float(gguf.stat().st_size), **parse_bench(json.loads(r.stdout)),
            "type": gguf_type(gguf)}


def quantize(src: str | Path, dst: str | Path, level: str, threads: int | None = None,
             timeout_s: float = 300.0) -> Path:
    """``llama-quantize src dst level`` (``level`` as llama.cpp names it: ``Q8_0``, ``Q4_K_M``,
    ``Q4_0``, ``F16``...), reusing ``dst`` if it already exists; the path of the new GGUF.
    ``--allow-requantize`` because the lab's only weights are already quantized (Q4_1)."""
    dst = Path(dst)
    if dst.exists() and dst.stat().st_size > 0:
        return dst
    tmp = dst.with_suffix(".part")
    cmd = [_tool("llama-quantize"), "--allow-requantize", str(src), str(tmp), level,
           str(threads or llamacpp_threads())]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s)
    if r.returncode:
        raise RuntimeError(f"llama-quantize to {level} failed (exit {r.returncode}):\n{r.stderr[-2000:]}")
    tmp.replace(dst)
    return dst


_PPL = re.compile(r"Final estimate: PPL = ([0-9.]+) \+/- ([0-9.]+)")


def perplexity(gguf: str | Path, text_file: str | Path, ctx: int = 256, chunks: int | None = None,
               threads: int | None = None, timeout_s: float = 300.0) -> dict[str, float]:
    """llama-perplexity of ``gguf`` on ``text_file`` in windows of ``ctx`` tokens (the second half of each
    window is scored): ``ppl`` and its standard error ``ppl_se``, and ``chunks`` scored."""
    cmd = [_tool("llama-perplexity"), "-m", str(gguf), "-f", str(text_file), "-c", str(ctx),
           "-t", str(threads or llamacpp_threads()), "-b", str(ctx)]
    if chunks:
        cmd += ["--chunks", str(chunks)]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s)
    text = r.stdout + r.stderr
    m = _PPL.search(text)
    if r.returncode or not m:
        raise RuntimeError(f"llama-perplexity failed (exit {r.returncode}):\n{text[-2000:]}")
    n = re.search(r"calculating perplexity over (\d+) chunks", text)
    return {"ppl": float(m.group(1)), "ppl_se": float(m.group(2)),
            "chunks": float(n.group(1)) if n else float("nan")}
