"""What the engine benchmarks here share: their command line's common options, the skip where the
engine is missing, and the closing time and JSON (benchmarks/llamacpp_roofline.py,
llamacpp_vs_labkit.py and vllm_serve_agreement.py; each is run as ``.venv/bin/python benchmarks/X.py``,
which puts this folder on ``sys.path``).

    a, t0 = setup(parser(__doc__, rounds=3, threads=True), "llamacpp")
    if a is None:
        return 0            # skipped: the engine is not built/installed here (the reason is printed)
    ...
    return finish(t0, figures, a.json)
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any


def parser(doc: str, rounds: int | None = None, threads: bool = False,
           rounds_help: str = "rounds") -> argparse.ArgumentParser:
    """An argument parser described by ``doc``'s first line, with ``--json PATH`` (write the figures
    there), ``--rounds`` (default ``rounds``, described by ``rounds_help``) where given and
    ``--threads`` (llama.cpp's threads, default its own
    :func:`labkit.engines.llamacpp.llamacpp_threads`) where asked."""
    ap = argparse.ArgumentParser(description=doc.splitlines()[0])
    if rounds is not None:
        ap.add_argument("--rounds", type=int, default=rounds, help=f"{rounds_help} (default {rounds})")
    if threads:
        ap.add_argument("--threads", type=int, default=None, help="default: llama.cpp's own")
    ap.add_argument("--json", help="write the figures here")
    return ap


def unavailable(engine: str) -> str | None:
    """Why ``engine`` (``llamacpp`` or ``vllm``) cannot run here, or None when it can."""
    from labkit.engines.server import ENGINES

    if engine not in ("llamacpp", "vllm"):
        raise ValueError(f"engine={engine!r}: choose one of llamacpp, vllm")
    e = ENGINES[engine]
    return None if e.available() else f"{e.name} cannot run here: {e.why_not()}"


def setup(ap: argparse.ArgumentParser, engine: str,
          argv: list[str] | None = None) -> tuple[argparse.Namespace | None, float]:
    """Parse the command line; ``(None, t0)`` after printing why when ``engine`` cannot run here (the
    benchmark then exits 0), else ``(arguments, t0)`` with ``threads`` filled in for llama.cpp.
    ``t0``: :func:`time.perf_counter` at the start, for :func:`finish`."""
    a = ap.parse_args(argv)
    reason = unavailable(engine)
    if reason:
        print(f"{reason}; skipped")
        return None, time.perf_counter()
    if engine == "llamacpp" and "threads" in a:
        from labkit.engines import llamacpp

        a.threads = a.threads or llamacpp.llamacpp_threads()
    return a, time.perf_counter()


def finish(t0: float, figures: Any, json_path: str | None) -> int:
    """Print the seconds since ``t0``, write ``figures`` as JSON to ``json_path`` if given; 0."""
    print(f"total {time.perf_counter() - t0:.0f} s")
    if json_path:
        Path(json_path).write_text(json.dumps(figures, indent=1, default=float))
    return 0
