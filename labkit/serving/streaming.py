"""One interface over every streaming client that times tokens (chapter 02): a :class:`Backend`
knows how to send one streamed request and return its request record (see
:mod:`labkit.serving.records`); :func:`measure` sends one from sync code (notebooks included).

The backends:

* :func:`labkit.serving.openai_api.openai_backend`: vLLM, SGLang, llama.cpp server, TGI... over
  HTTP streaming (Server-Sent Events) with ``httpx``, ``/v1/chat/completions`` or
  ``/v1/completions``. Asks for ``stream_options: {"include_usage": true,
  "continuous_usage_stats": true}`` so vLLM reports the cumulative token count in every chunk.
* :func:`labkit.serving.ollama_api.ollama_backend`: Ollama's native ``/api/generate`` and
  ``/api/chat`` (newline-delimited JSON) through the official ``ollama`` client, with Ollama's own
  ``eval_count``, ``eval_duration``, ``prompt_eval_duration`` beside the client-side timing.
* :func:`labkit.serving.local.generate_timed` / ``transformers_backend``: a transformers model in
  this process, timestamps taken in a streamer after a device sync.

Example (any OpenAI-compatible server; ``make serve`` starts the bundled model on port 8000)::

    from labkit.serving import openai_api, streaming
    be = openai_api.openai_backend("http://127.0.0.1:8000", model="smollm2")
    rec = streaming.measure(be, "What is the KV cache?", max_tokens=32)
    print(rec.status, rec.chunks[:3], rec.output_tokens)

Errors are records, not exceptions (``status`` http_error, timeout, broken_stream, connect_error,
error, with ``error`` saying what to do), so a load test keeps everything it measured;
``check_openai_server`` fails fast with a clear :class:`ServerError` before a run. Timeouts are a
read timeout between chunks (``timeout_s``) plus an optional total (``total_timeout_s``), as in
GuideLLM, so a long generation that keeps streaming never times out."""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
from collections.abc import Coroutine
from typing import Any, Protocol

from ..settings import check_url
from .records import RequestRecord


class ServerError(RuntimeError):
    """The server cannot be benchmarked as asked (not running, wrong model, not streaming)."""


def base_url_of(url: str) -> str:
    """``http://host:port`` from ``http://host:port``, ``.../`` or ``.../v1``; ``ValueError`` saying
    what to write when the URL has no ``http://`` or ``https://`` scheme."""
    return check_url(url, drop_v1=True)


class Backend(Protocol):
    """How to send one streamed request (the three implementations are listed above): ``send(session,
    prompt, max_tokens)`` returns its :class:`RequestRecord` inside ``async with backend.session() as
    session``; ``check()`` raises :class:`ServerError` when the target cannot answer as asked;
    ``name`` labels its records; ``max_concurrency`` caps what it can serve (1 for an in-process
    model, None for no cap)."""

    @property
    def name(self) -> str: ...

    @property
    def max_concurrency(self) -> int | None: ...

    def session(self) -> contextlib.AbstractAsyncContextManager[Any]: ...

    async def send(self, session: Any, prompt: str, max_tokens: int) -> RequestRecord: ...

    def check(self) -> None: ...


def run_sync(coro: Coroutine[Any, Any, Any]) -> Any:
    """Run a coroutine to completion from sync code, also inside Jupyter (whose event loop is
    already running: the coroutine then gets a fresh loop in a worker thread)."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(coro)
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        return pool.submit(asyncio.run, coro).result()


def measure(backend: Backend, prompt: str, max_tokens: int = 32) -> RequestRecord:
    """Send one streamed request and return its record (sync; works in notebooks)."""

    async def one() -> RequestRecord:
        async with backend.session() as s:
            return await backend.send(s, prompt, max_tokens)

    return run_sync(one())
