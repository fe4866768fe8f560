"""Kernel fusion, measured (chapter 05, "The inference software stack").

Elementwise work is memory-bound: each operation reads its input from memory and writes its
output back, and the arithmetic in between is nearly free. Doing ``x * 2`` then ``* 3`` moves
the tensor four times (read, write, read, write); the fused ``x * 6`` moves it twice. A chain of
such operations gains the same way when ``torch.compile`` fuses it into one generated loop.

Timings here are wall seconds; bytes are bytes moved between memory and the compute units,
counted the minimal way (each input read once, each output written once).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np

from ..hardware.microbench import interleaved_times, timed
from ..stats import ratio_interval


def scale_bytes(numel: int, element_size: int, passes: int) -> int:
    """Bytes moved by ``passes`` elementwise passes over a tensor: each reads and writes it once."""
    return 2 * passes * numel * element_size


def scale_fusion(numel: int = 32 * 2**20, device: str = "cpu", dtype: str = "float32",
                 repeats: int = 7) -> dict:
    """The tutorial's example, measured: ``y = (x * 2) * 3`` as two passes vs ``y = x * 6`` as one.

    Outputs are preallocated (``out=``) so the timing is memory traffic, not the allocator.
    Returns ``{"unfused_s", "fused_s"}`` (median seconds), ``"unfused_bytes"``/``"fused_bytes"``
    (4× and 2× the tensor size), ``"unfused_gbps"``/``"fused_gbps"`` (bytes moved ÷ median
    time, GB/s), ``"speedup"`` (unfused ÷ fused time), ``"speedup_interval"`` (per-round
    unfused ÷ fused time, :func:`labkit.stats.ratio_interval`),
    ``"tensor_bytes"`` and ``"times"``.
    """
    import torch

    tdtype = getattr(torch, dtype)
    x = torch.randn(numel, device=device, dtype=tdtype)
    tmp, y_unfused, y_fused = torch.empty_like(x), torch.empty_like(x), torch.empty_like(x)

    def unfused() -> None:
        torch.mul(x, 2, out=tmp)
        torch.mul(tmp, 3, out=y_unfused)

    def fused() -> None:
        torch.mul(x, 6, out=y_fused)

    times = interleaved_times({"unfused": unfused, "fused": fused}, device, repeats=repeats)
    if not torch.equal(y_unfused, y_fused) and not torch.allclose(y_unfused, y_fused):
        raise AssertionError("x*2*3 and x*6 disagree: the two versions do not compute the same thing")
    size = x.numel() * x.element_size()
    un_b, fu_b = scale_bytes(x.numel(), x.element_size(), 2), scale_bytes(x.numel(), x.element_size(), 1)
    un_s, fu_s = float(np.median(times["unfused"])), float(np.median(times["fused"]))
    return {"unfused_s": un_s, "fused_s": fu_s, "unfused_bytes": un_b, "fused_bytes": fu_b,
            "unfused_gbps": un_b / un_s / 1e9, "fused_gbps": fu_b / fu_s / 1e9, "speedup": un_s / fu_s,
            "tensor_bytes": size, "times": times,
            "speedup_interval": ratio_interval(times["unfused"], times["fused"])}


def elementwise_chain(x: Any) -> Any:
    """A GELU-like chain of eleven elementwise operations (:data:`CHAIN_OPS`). Eager PyTorch runs
    each as its own kernel with a full-size temporary between them; a fusing compiler makes one
    pass that reads ``x`` and writes the result."""
    import torch

    y = x * 1.5 + 0.5
    y = torch.sigmoid(y) * y
    y = torch.tanh(y) * 0.7 - 0.1
    y = y * y + x
    return torch.relu(y) / 2


CHAIN_OPS = 11  # operations (eager kernels) in elementwise_chain; each reads and writes a full tensor


def compile_chain(numel: int = 4 * 2**20, device: str = "cpu", repeats: int = 7,
                  fn: Callable = elementwise_chain, backend: str = "inductor",
                  cache_dir: Path | None = None) -> dict:
    """Eager vs ``torch.compile`` on an elementwise chain, compile time reported apart.

    The first call of the compiled function traces, generates and compiles code (C++ via the
    system compiler on CPU, Triton on CUDA); that is ``compile_s``. Later calls are timed
    interleaved with eager. Returns ``{"compile_s", "eager_s", "compiled_s"}`` (seconds; the two
    run times are medians), ``"speedup"`` (eager ÷ compiled), ``"max_abs_diff"`` between the two
    outputs, ``"eager_min_bytes"`` (each of the :data:`CHAIN_OPS` kernels reads and writes the
    tensor at least once), ``"fused_bytes"`` (one read of ``x``, one write), ``"cache_hits"``
    (inductor FX-graph cache hits during compilation: > 0 means an earlier run's compiled code
    was reused and compile time is the warm figure), ``"speedup_interval"``
    (per-round eager ÷ compiled time, :func:`labkit.stats.ratio_interval`) and ``"times"``.
    ``backend``: passed to ``torch.compile`` ("eager" only traces, generating no code: for tests).
    ``cache_dir``: Inductor's on-disk cache for this compile (``TORCHINDUCTOR_CACHE_DIR``, set for the
    first call only): an empty folder makes the compile cold whatever earlier runs left behind.
    """
    import torch

    x = torch.randn(numel, device=device)
    compiled = torch.compile(fn, backend=backend)
    try:
        from torch._dynamo.utils import counters

        hits_before = counters["inductor"]["fxgraph_cache_hit"]
    except Exception:  # noqa: BLE001 - counters are internal; the figure is informative only
        counters, hits_before = None, 0
    with _inductor_cache(cache_dir):
        compile_s = timed(lambda: compiled(x), device)[1]
    hits = counters["inductor"]["fxgraph_cache_hit"] - hits_before if counters is not None else 0
    times = interleaved_times({"eager": lambda: fn(x), "compiled": lambda: compiled(x)}, device,
                              repeats=repeats)
    diff = float((fn(x) - compiled(x)).abs().max())
    eager_s, comp_s = float(np.median(times["eager"])), float(np.median(times["compiled"]))
    size = x.numel() * x.element_size()
    return {"compile_s": compile_s, "eager_s": eager_s, "compiled_s": comp_s,
            "speedup": eager_s / comp_s,
            "max_abs_diff": diff, "eager_min_bytes": scale_bytes(x.numel(), x.element_size(), CHAIN_OPS),
            "fused_bytes": 2 * size, "cache_hits": int(hits), "numel": numel, "times": times,
            "speedup_interval": ratio_interval(times["eager"], times["compiled"])}


@contextlib.contextmanager
def _inductor_cache(folder: Path | None) -> Iterator[None]:
    """Inductor's on-disk cache in ``folder`` while the block runs (as ``TORCHINDUCTOR_CACHE_DIR``,
    which Inductor reads on every use), the earlier setting after it; nothing changes when ``None``."""
    if folder is None:
        yield
        return
    before = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(folder)
    try:
        yield
    finally:
        if before is None:
            os.environ.pop("TORCHINDUCTOR_CACHE_DIR", None)
        else:
            os.environ["TORCHINDUCTOR_CACHE_DIR"] = before
