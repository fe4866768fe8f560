"""The server a chapter measures, chosen in one place (chapters 02, 05, 06 and 08).

:func:`measured_server` yields, in this order of preference: your server (``LABKIT_BASE_URL``,
with ``LABKIT_MODEL``), vLLM's CPU build serving the bundled model (Linux x86_64, after ``make
serve-setup``), llama.cpp's server on the bundled GGUF (any platform, after ``make llamacpp``), a
hard failure on CI (where vLLM must run), or a loopback server that simulates an engine's timing and
says so (``kind == "simulated"``: the mechanics are real, the numbers are not a model's).
``engine="llamacpp"`` (or ``"vllm"``) asks for that engine only: a chapter that teaches it starts it
itself. Whatever it started, it stops on exit, and dies with the process that started it.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .. import settings
from ..serving.openai_api import check_openai_server
from . import llamacpp, vllm
from .fakeserver import fake_server
from .process import Server, running

#: The simulated engine: 50 ms prefill, 30 ms per decode step, +10 ms per extra stream in a step.
SIMULATED: dict[str, Any] = {"prefill_s": 0.05, "step_s": 0.03, "batch_cost_s": 0.01}


@dataclass
class Target:
    """A server to measure: ``url`` (``http://host:port``), ``model`` (served name), ``engine`` (a
    label for tables), ``kind`` (``external``, ``vllm``, ``llamacpp`` or ``simulated``), and for an
    engine the lab started the ``dtype`` it serves (a GGUF type for llama.cpp), ``startup_s``
    (seconds to ready), its ``log`` file and its process (``server``; chapter 08 sends it SIGTERM)."""

    url: str
    model: str
    engine: str
    kind: str
    dtype: str | None = None
    startup_s: float | None = None
    log: Path | None = None
    notes: list[str] = field(default_factory=list)
    server: Server | None = None


ENGINES = ("auto", "vllm", "llamacpp")


@contextlib.contextmanager
def measured_server(vllm_args: list[str] | None = None, engine: str = "auto",
                    llamacpp_args: dict[str, Any] | None = None, **vllm_kwargs: Any) -> Iterator[Target]:
    """``with measured_server() as t:`` the :class:`Target` to load-test (see the module doc).
    ``vllm_args``: extra command-line flags for vLLM (e.g. ``["--no-enable-prefix-caching"]``);
    other keywords go to :func:`labkit.engines.vllm.start_vllm`; ``llamacpp_args`` to
    :func:`labkit.engines.llamacpp.start_llamacpp` (``parallel=``, ``threads=``, ``gguf=``).
    ``engine``: ``auto`` (the order above), ``vllm`` or ``llamacpp`` (that engine or an error
    saying how to get it)."""
    if engine not in ENGINES:
        raise ValueError(f"engine={engine!r}: choose one of {', '.join(ENGINES)}")
    url = settings.base_url()
    if url and engine == "auto":
        model = settings.served_model() or check_openai_server(url)[0]
        yield Target(url, model, f"your server at {url}", "external")
    elif engine in ("auto", "vllm") and vllm.vllm_available():
        with running(vllm.start_vllm, extra=vllm_args, **vllm_kwargs) as server:
            yield Target(server.url, server.model, "vLLM (CPU build)", "vllm", server.dtype,
                         server.startup_s, server.log, server=server)
    elif engine == "vllm" or (engine == "auto" and vllm.vllm_required()):
        raise RuntimeError(f"vLLM cannot run here: {vllm.unavailable_reason()}")
    elif engine in ("auto", "llamacpp") and llamacpp.llamacpp_available():
        with running(llamacpp.start_llamacpp, **(llamacpp_args or {})) as server:
            yield Target(server.url, server.model, "llama.cpp (llama-server)", "llamacpp", server.dtype,
                         server.startup_s, server.log, server=server)
    elif engine == "llamacpp":
        raise RuntimeError(f"llama.cpp cannot run here: {llamacpp.unavailable_reason()}")
    else:
        with fake_server(model="simulated", **SIMULATED) as srv:
            yield Target(srv.url, "simulated", "simulated server (no model)", "simulated",
                         notes=[vllm.unavailable_reason(), llamacpp.unavailable_reason()])
