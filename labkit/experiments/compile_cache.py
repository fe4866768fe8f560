"""What a compile cache saves a new process (chapter 05; the tutorial lists it among the cold-start
mitigations of its autoscaling section).

:func:`cold_and_warm` compiles chapter 05's elementwise chain (:func:`labkit.llm.fusion.compile_chain`)
into an empty Inductor cache, then starts a new Python process that compiles the same function on the
same shape, threads and device with the cache the first one left: the first call of a replica that
finds the compiled code on disk (vLLM keeps its ``torch.compile`` output the same way). Seconds are
wall time of the compiled function's first call; the child's imports are timed apart.
"""

from __future__ import annotations

import tempfile
import textwrap
from pathlib import Path
from typing import Any

from ..llm import fusion
from .offline import child_source, run_child

WARM = textwrap.dedent("""\
    import time
    from pathlib import Path
    P, out = json.loads(sys.argv[1]), {}
    t0 = time.perf_counter()
    import torch
    from labkit.llm.fusion import compile_chain
    torch.set_num_threads(P["threads"])
    out["import_s"] = time.perf_counter() - t0
    r = compile_chain(numel=P["numel"], device=P["device"], repeats=1, cache_dir=Path(P["cache_dir"]))
    out["compile_s"], out["hits"] = r["compile_s"], r["cache_hits"]
    """)


def cold_and_warm(numel: int = 4 * 2**20, device: str = "cpu", repeats: int = 7,
                  timeout_s: float = 300.0) -> dict[str, Any]:
    """:func:`labkit.llm.fusion.compile_chain` into an empty cache (its ``compile_s`` is the cold first
    call), then the warm first call in a new process: returns compile_chain's dict plus ``warm_s``
    (seconds), ``warm_hits`` (the child's FX-graph cache hits: 0 means the cache was not used),
    ``warm_import_s`` (the child's torch import, not counted) and ``warm_over_cold``. Raises
    ``RuntimeError`` when the child fails (with its last lines), when the cold compile found code in
    its empty cache or when the warm one found none: either would make the pair mean nothing."""
    import torch

    with tempfile.TemporaryDirectory(prefix="labkit-inductor-") as folder:
        comp = fusion.compile_chain(numel=numel, device=device, repeats=repeats, cache_dir=Path(folder))
        params = {"cache_dir": folder, "numel": numel, "device": device, "threads": torch.get_num_threads()}
        child = run_child(child_source(WARM, sandbox=False), params, timeout_s, offline_env=False)
    out = child["out"]
    if child["rc"] != 0 or not out:
        raise RuntimeError("the warm compile in a new process failed (rc "
                           f"{child['rc']}):\n{child['stderr_tail'].strip()[-600:]}")
    if comp["cache_hits"] or not out["hits"]:
        raise RuntimeError(f"the compile cache did not behave: {comp['cache_hits']} hit(s) in the empty "
                           f"cache, {out['hits']} in the new process that should have found the code there")
    return comp | {"warm_s": out["compile_s"], "warm_hits": out["hits"], "warm_import_s": out["import_s"],
                   "warm_over_cold": out["compile_s"] / comp["compile_s"]}
