"""The engines the lab starts, and the server a chapter measures, chosen in one place (chapters 02, 05,
06 and 08; ``labkit bench --vllm/--llamacpp``).

:data:`ENGINES` holds one :class:`Engine` record per engine the lab can run: vLLM's CPU build serving
the bundled model (Linux x86_64, after ``make serve-setup``), llama.cpp's server on the bundled GGUF
(any platform, after ``make llamacpp``) and a loopback server that simulates an engine's timing and
says so (``kind == "simulated"``: the mechanics are real, the numbers are not a model's).
:func:`measured_server` yields, in this order of preference: your server (``LABKIT_BASE_URL``, with
``LABKIT_MODEL``), vLLM, llama.cpp, a hard failure where CI requires an engine that is missing, or the
simulated server. ``engine="llamacpp"`` (or ``"vllm"``) asks for that engine only. Whatever it
started, it stops on exit, and dies with the process that started it.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
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
    """A running server to measure: ``url`` (``http://host:port``), ``model`` (served name), ``engine``
    (a label for tables), ``kind`` (``external``, ``vllm``, ``llamacpp`` or ``simulated``), ``notes``
    (why a better engine did not run) and, for an engine the lab started, its process (``server``;
    chapter 08 sends it SIGTERM), which also gives the ``dtype`` it serves (a GGUF type for
    llama.cpp), ``startup_s`` (seconds to ready) and its ``log`` file."""

    url: str
    model: str
    engine: str
    kind: str
    notes: list[str] = field(default_factory=list)
    server: Server | None = None

    @property
    def dtype(self) -> str | None:
        return self.server.dtype if self.server else None

    @property
    def startup_s(self) -> float | None:
        return self.server.startup_s if self.server else None

    @property
    def log(self) -> Path | None:
        return self.server.log if self.server else None


@dataclass(frozen=True)
class Engine:
    """An engine the lab can start: ``kind`` (``vllm``, ``llamacpp``, ``simulated``), ``name`` (for
    errors), ``label`` (for tables), whether it can run here (``available``) and why not (``why_not``,
    saying what to do), whether CI must run it (``required``), and ``start`` (keywords of
    :func:`labkit.engines.vllm.start_vllm` or :func:`labkit.engines.llamacpp.start_llamacpp`; ``None``
    for the simulated server, which is no process). :meth:`serve` is the ``with`` form."""

    kind: str
    name: str
    label: str
    available: Callable[[], bool]
    why_not: Callable[[], str]
    required: Callable[[], bool]
    start: Callable[..., Server] | None = None

    @contextlib.contextmanager
    def serve(self, **kwargs: Any) -> Iterator[Target]:
        """``with engine.serve() as t:`` the :class:`Target` of this engine, started now and stopped on
        exit; ``RuntimeError`` saying what to do when it cannot run here."""
        if not self.available():
            raise RuntimeError(f"{self.name} cannot run here: {self.why_not()}")
        if self.start is None:
            with fake_server(model="simulated", **(SIMULATED | kwargs)) as srv:
                yield Target(srv.url, "simulated", self.label, self.kind)
            return
        with running(self.start, **kwargs) as server:
            yield Target(server.url, server.model, self.label, self.kind, server=server)


# Each callable looks its function up when called, so that a test's monkeypatch of the module reaches it.
ENGINES: dict[str, Engine] = {
    "vllm": Engine("vllm", "vLLM", "vLLM (CPU build)", lambda: vllm.vllm_available(),
                   lambda: vllm.unavailable_reason(), lambda: vllm.vllm_required(),
                   lambda **kw: vllm.start_vllm(**kw)),
    "llamacpp": Engine("llamacpp", "llama.cpp", "llama.cpp (llama-server)",
                       lambda: llamacpp.llamacpp_available(), lambda: llamacpp.unavailable_reason(),
                       lambda: llamacpp.llamacpp_required(), lambda **kw: llamacpp.start_llamacpp(**kw)),
    "simulated": Engine("simulated", "the simulated server", "simulated server (no model)", lambda: True,
                        lambda: "", lambda: False),
}
CHOICES = ("auto", "vllm", "llamacpp")


@contextlib.contextmanager
def measured_server(vllm_args: list[str] | None = None, engine: str = "auto",
                    llamacpp_args: dict[str, Any] | None = None, **vllm_kwargs: Any) -> Iterator[Target]:
    """``with measured_server() as t:`` the :class:`Target` to load-test (see the module doc).
    ``vllm_args``: extra command-line flags for vLLM (e.g. ``["--no-enable-prefix-caching"]``);
    other keywords go to :func:`labkit.engines.vllm.start_vllm`; ``llamacpp_args`` to
    :func:`labkit.engines.llamacpp.start_llamacpp` (``parallel=``, ``threads=``, ``gguf=``).
    ``engine``: ``auto`` (the order above), ``vllm`` or ``llamacpp`` (that engine or an error
    saying how to get it)."""
    if engine not in CHOICES:
        raise ValueError(f"engine={engine!r}: choose one of {', '.join(CHOICES)}")
    url = settings.base_url()
    if url and engine == "auto":
        model = settings.served_model() or check_openai_server(url)[0]
        yield Target(url, model, f"your server at {url}", "external")
        return
    args = {"vllm": {"extra": vllm_args, **vllm_kwargs}, "llamacpp": llamacpp_args or {}}
    for kind in (("vllm", "llamacpp") if engine == "auto" else (engine,)):
        e = ENGINES[kind]
        if e.available() or engine == kind or e.required():  # asked for, or CI must run it: its error
            with e.serve(**args[kind]) as t:
                yield t
            return
    with ENGINES["simulated"].serve() as t:
        t.notes += [ENGINES[k].why_not() for k in ("vllm", "llamacpp")]
        yield t
