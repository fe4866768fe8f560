"""Start and stop a real inference engine: vLLM's CPU build serving the bundled model behind an
OpenAI-compatible API on 127.0.0.1 (chapter 02; chapter 05 compares engines with it).

vLLM pins its own torch, so it lives in its own venv, ``.venv-vllm`` (``make serve-setup``; Linux
x86_64 only). Everything here talks to it as a subprocess: nothing imports vLLM.

Usage::

    from labkit.serving.loadgen import run
    from labkit.serving.loadspec import ClientSpec, LoadSpec
    from labkit.engines.server import ENGINES
    if ENGINES["vllm"].available():
        with ENGINES["vllm"].serve() as t:    # about 20-40 s until /health answers on 2 CPU cores
            s = run(t.url, LoadSpec(n_requests=8, concurrency=4, max_tokens=32), ClientSpec(model=t.model))
            print(s.ttft.median, s.output_throughput)

``make serve`` (= ``python -m labkit.engines.vllm --port 8000``) runs the same server in the foreground.

Flags, and why (see :func:`vllm_command` and :func:`vllm_env`):

* ``--dtype``: what :func:`labkit.hardware.capability.compute_dtype` picks for this CPU, and the bundled
  model's folder converted to it: bfloat16 where the CPU has native bf16 (AVX-512 BF16/AMX),
  float32 elsewhere. On an AVX2-only CPU vLLM served bf16 at 9 tok/s at both concurrency 1 and 4
  (no batching gain: every step was compute-bound on emulated bf16); fp32 gave 16 and 37 tok/s.
* ``--max-model-len 2048``: the longest sequence it accepts; small, so the KV cache is small too.
* ``--enforce-eager``: no graph capture/compilation: faster start, nothing to compile on CPU.
* ``VLLM_CPU_KVCACHE_SPACE=1``: 1 GiB of KV cache (the default is 4 GiB). SmolLM2 stores
  30 layers x 2 (K, V) x 3 KV heads x 64 x 2 bytes = 23 KB per token: about 46,000 tokens fit.
* Threads: on machines with at most 2 logical CPUs, ``VLLM_CPU_OMP_THREADS_BIND=nobind`` and
  ``OMP_NUM_THREADS=1``: vLLM's default ("auto") reserves a core for its API process and pins one
  compute thread per remaining core, which on 2 shared cores pins the model to one core that other
  work also wants. With the threads set by hand the model worker can run inside the engine process
  (``--distributed-executor-backend uni`` + ``VLLM_ENABLE_V1_MULTIPROCESSING=0``), which saves
  starting a third Python process that imports torch (seconds on a 2-core CPU). Elsewhere vLLM's defaults are
  kept (``auto``: one pinned thread per physical core, a separate worker process). Override with
  ``threads=`` or by exporting the variables yourself.
"""

from __future__ import annotations

import argparse
import os
import platform
import signal
import subprocess
import sys
from pathlib import Path

from .. import settings
from ..hardware.capability import compute_dtype
from ..models import SERVED_NAME, llm_dir
from ..paths import REPO
from . import process, prometheus
from .process import Server, free_port, guarded, stop

__all__ = ["start_vllm", "vllm_available"]

VLLM_VENV = REPO / ".venv-vllm"


def vllm_python() -> Path:
    """The Python of the vLLM venv (``$LABKIT_VLLM_PYTHON`` overrides ``.venv-vllm/bin/python``)."""
    return Path(os.environ.get("LABKIT_VLLM_PYTHON") or VLLM_VENV / "bin" / "python")


def vllm_available() -> bool:
    """Whether vLLM can be started here: Linux x86_64 and ``make serve-setup`` has finished."""
    if platform.system() != "Linux" or platform.machine() != "x86_64":
        return False
    py = vllm_python()
    if "LABKIT_VLLM_PYTHON" in os.environ:
        return py.exists()
    return py.exists() and (VLLM_VENV / ".installed").exists()


def vllm_required() -> bool:
    """Whether a chapter must not skip its vLLM cells: on Linux x86_64 under CI (``$CI`` set,
    as GitHub Actions, GitLab and most CI systems do), where ``make test`` installs vLLM first."""
    return (platform.system() == "Linux" and platform.machine() == "x86_64"
            and settings.under_ci())


def unavailable_reason() -> str:
    """Why :func:`vllm_available` is False, and what to do."""
    if platform.system() != "Linux" or platform.machine() != "x86_64":
        return (f"vLLM's CPU build runs on Linux x86_64 only (this is {platform.system()} "
                f"{platform.machine()}); point the chapter at any OpenAI-compatible server with "
                "LABKIT_BASE_URL=http://host:port and LABKIT_MODEL=name")
    return f"no vLLM venv at {VLLM_VENV}: run `make serve-setup` (about 2-4 minutes, 3.4 GB)"


def vllm_env(threads: int | None = None, kv_cache_gib: int = 1) -> dict[str, str]:
    """Environment for the server process: CPU KV-cache size (GiB), thread binding (see the module
    docstring), offline hub, no usage reporting."""
    env = dict(os.environ)
    env.update({"VLLM_CPU_KVCACHE_SPACE": str(kv_cache_gib), "HF_HUB_OFFLINE": "1",
                "TRANSFORMERS_OFFLINE": "1", "VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1",
                "VLLM_LOGGING_COLOR": "0"})
    if _hand_threads(threads):
        env.setdefault("VLLM_CPU_OMP_THREADS_BIND", "nobind")
        env["OMP_NUM_THREADS"] = str(threads or 1)
        env["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    return env


def _hand_threads(threads: int | None) -> bool:
    return threads is not None or (os.cpu_count() or 1) <= 2


def served_dtype() -> str:
    """The dtype vLLM serves the bundled model in on this CPU:
    :func:`labkit.hardware.capability.compute_dtype`
    (``bfloat16`` with native bf16, else ``float32``)."""
    return compute_dtype("cpu")


def vllm_command(model_dir: str | Path, port: int, served_name: str = SERVED_NAME,
                 max_model_len: int = 2048, dtype: str = "float32", threads: int | None = None,
                 extra: list[str] | None = None) -> list[str]:
    """The server's command line (``vllm serve`` itself fails for the ``vllm-cpu`` distribution,
    so the API server module is run directly)."""
    uni = ["--distributed-executor-backend", "uni"] if _hand_threads(threads) else []
    return [str(vllm_python()), "-m", "vllm.entrypoints.openai.api_server", "--host", "127.0.0.1",
            "--port", str(port), "--model", str(model_dir), "--served-model-name", served_name,
            "--dtype", dtype, "--max-model-len", str(max_model_len), "--enforce-eager", *uni,
            *(extra or [])]


def start_vllm(model_dir: str | Path | None = None, port: int | None = None, served_name: str = SERVED_NAME,
               max_model_len: int = 2048, kv_cache_gib: int = 1, threads: int | None = None,
               log_path: str | Path | None = None, ready_timeout_s: float = 240.0,
               extra: list[str] | None = None, dtype: str | None = None) -> Server:
    """Start vLLM on ``127.0.0.1:port`` (a free port by default) serving ``model_dir`` (default: the
    bundled SmolLM2's safetensors folder in ``dtype``) as ``served_name``, wait for ``/health``,
    return the :class:`Server`. ``dtype`` defaults to :func:`served_dtype`. Stop it with :func:`stop`."""
    if not vllm_available():
        raise RuntimeError(unavailable_reason())
    dtype = dtype or served_dtype()
    if model_dir is None:
        model_dir = llm_dir(dtype)
    port = port or free_port()
    cmd = vllm_command(model_dir, port, served_name, max_model_len, dtype, threads=threads, extra=extra)
    # SIGTERM when this process dies: vLLM then stops its own engine process too.
    return process.start(cmd, port, "vllm", served_name, dtype, log_path=log_path,
                         env=vllm_env(threads, kv_cache_gib), death_signal=signal.SIGTERM,
                         ready_timeout_s=ready_timeout_s, name="vLLM")



def server_side_means(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    """Mean server-side TTFT and E2E latency (seconds) of the requests served between two
    :func:`labkit.engines.prometheus.scrape` snapshots (prefix ``vllm:``), from the histograms'
    ``_sum``/``_count`` deltas; ``n_ttft_s`` and ``n_e2e_s`` count the requests each mean is over."""
    out: dict[str, float] = {}
    for key, figure in (("ttft_s", "ttft"), ("e2e_s", "e2e")):
        d = prometheus.histogram_delta(before, after, prometheus.RENAMED[figure][0])
        out[key], out[f"n_{key}"] = d["mean"], d["count"]
    return out


def _interrupt(signum: int, _frame: object) -> None:
    raise KeyboardInterrupt(signal.Signals(signum).name)


def main(argv: list[str] | None = None) -> int:
    """``make serve``: the bundled model on 127.0.0.1 in the foreground until Ctrl-C."""
    ap = argparse.ArgumentParser(description="serve the bundled model with vLLM (CPU) on 127.0.0.1")
    ap.add_argument("--port", type=int, default=8000)
    ap.add_argument("--max-model-len", type=int, default=2048)
    ap.add_argument("--kv-cache-gib", type=int, default=1)
    a = ap.parse_args(argv)
    if not vllm_available():
        print(f"error: {unavailable_reason()}", file=sys.stderr)
        return 1

    dtype = served_dtype()
    cmd = vllm_command(llm_dir(dtype), a.port, max_model_len=a.max_model_len, dtype=dtype)
    env = vllm_env(kv_cache_gib=a.kv_cache_gib)
    keys = ("VLLM_CPU_KVCACHE_SPACE", "VLLM_CPU_OMP_THREADS_BIND", "OMP_NUM_THREADS",
            "VLLM_ENABLE_V1_MULTIPROCESSING")
    shown = {k: env[k] for k in keys if k in env}
    print(" ".join(f"{k}={v}" for k, v in shown.items()), " ".join(cmd), flush=True)
    print(f"OpenAI API at http://127.0.0.1:{a.port}/v1 (model {SERVED_NAME!r}) once /health answers; "
          "Ctrl-C stops it", flush=True)
    # Guarded: vLLM gets SIGTERM if this process dies (even by SIGKILL). SIGTERM to this process
    # (kill, systemd, a closed terminal's SIGHUP) stops vLLM like Ctrl-C does.
    proc = subprocess.Popen(guarded(cmd, signal.SIGTERM), env=env, stdin=subprocess.PIPE,
                            start_new_session=True)
    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, _interrupt)
    try:
        return proc.wait()
    except KeyboardInterrupt:  # vLLM shuts down cleanly on SIGTERM
        stop(proc, timeout_s=30)
        return 0


if __name__ == "__main__":
    sys.exit(main())
