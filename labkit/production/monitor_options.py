"""The options of ``labkit monitor`` (chapter 08's live view): ``--url``, ``--interval`` (seconds),
``--count`` (lines). Only argparse is imported here, so ``labkit`` defines them at start-up without
loading :mod:`labkit.production.monitor` (psutil, httpx, numpy) for every other command."""

from __future__ import annotations

import argparse


def add_monitor_arguments(p: argparse.ArgumentParser) -> None:
    """The options of ``labkit monitor``: ``--url``, ``--interval`` (s), ``--count`` (lines)."""
    p.add_argument("--url", help="a vLLM or llama-server (--metrics) whose /metrics to show too, "
                   "e.g. http://127.0.0.1:8000")
    p.add_argument("--interval", type=float, default=1.0, help="seconds between lines (default 1)")
    p.add_argument("--count", type=int, help="lines to print (default: until Ctrl-C)")
