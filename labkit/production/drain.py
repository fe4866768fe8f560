"""Graceful shutdown, measured (chapter 08): send SIGTERM to a serving engine while streams are in
flight, as Kubernetes does when it removes a pod, and count the streams that still received every
token and those that were cut.

Kubernetes signals only the container's main process, so :func:`sigterm_during_streams` sends one
SIGTERM to the server's own process (the lab's guard passes it on to the engine), never to its whole
process group. vLLM's ``--shutdown-timeout`` (seconds; its default 0 aborts running requests) is the
setting that decides; ``deploy/k8s/vllm.yaml`` sets it (:data:`labkit.production.k8s.SHUTDOWN_TIMEOUT_S`).
Times are seconds.
"""

from __future__ import annotations

import asyncio
import os
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass

import httpx

from ..engines.process import Server, stop
from ..results import record
from ..serving.openai_api import openai_event, request_body
from ..serving.sse import SSEParser
from ..serving.streaming import run_sync

EXIT_WAIT_S = 10.0  # after the last stream ended, how long the process may take to exit


@dataclass
class Stream:
    """One streamed request: ``tokens`` received (the server's cumulative count where it streams
    one, as vLLM and the fake server do; else content chunks), ``finished`` (a ``finish_reason``
    arrived), ``error`` (how it ended otherwise, in a few words)."""

    tokens: int = 0
    finished: bool = False
    error: str | None = None


@dataclass(frozen=True)
class DrainRun:
    """What one SIGTERM did to ``streams`` streams each asking for ``max_tokens`` tokens:
    ``completed`` received every token and a ``finish_reason``, ``cut`` did not; ``tokens_at_term``
    the fewest tokens any stream had when the signal went; ``exit_s`` SIGTERM to the process's exit
    (None if it was still running :data:`EXIT_WAIT_S` after the last stream ended); ``late_request``
    what a request sent just after the signal got (``"refused"``, ``"answered"`` or ``"cut"``);
    ``received`` the tokens each stream got and ``errors`` how the cut ones ended."""

    streams: int
    max_tokens: int
    completed: int
    tokens_at_term: int
    exit_s: float | None
    late_request: str
    received: tuple[int, ...] = ()
    errors: tuple[str, ...] = ()

    @property
    def cut(self) -> int:
        """Streams that did not get every token and a ``finish_reason``."""
        return self.streams - self.completed


async def _stream(client: httpx.AsyncClient, url: str, body: dict, s: Stream) -> None:
    try:
        async with client.stream("POST", url, json=body) as r:
            if r.status_code >= 400:
                s.error = f"HTTP {r.status_code}"
                return
            sse = SSEParser()
            async for data in r.aiter_bytes():
                for ev in sse.feed(data):
                    e = openai_event(ev)
                    if e.done or e.error is not None:
                        s.error = None if e.done else "an error event"
                        return
                    if e.tokens is not None:  # the server's cumulative count (continuous usage stats)
                        s.tokens = max(s.tokens, e.tokens)
                    elif e.choices and e.text:
                        s.tokens += 1
                    if e.finish is not None:
                        s.finished = True
    except httpx.TimeoutException:
        s.error = "no bytes until the read timeout"
    except (httpx.RemoteProtocolError, httpx.ReadError):
        s.error = "connection closed mid-stream"
    except httpx.HTTPError as exc:
        s.error = type(exc).__name__


async def _run(server: Server, model: str, prompt: str, n: int, max_tokens: int, at_tokens: int,
               timeout_s: float, read_timeout_s: float) -> DrainRun:
    url = f"{server.url}/v1/chat/completions"
    body = request_body(model, prompt, max_tokens, ignore_eos=True)
    streams = [Stream() for _ in range(n)]
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=None)
    async with httpx.AsyncClient(timeout=httpx.Timeout(read_timeout_s, connect=5.0), limits=limits) as client:
        tasks = [asyncio.create_task(_stream(client, url, body, s)) for s in streams]
        t0 = time.perf_counter()
        while min(s.tokens for s in streams) < at_tokens and not all(t.done() for t in tasks):
            if time.perf_counter() - t0 > timeout_s:
                raise TimeoutError(f"the {n} streams did not each reach {at_tokens} tokens within "
                                   f"{timeout_s:.0f} s; is the server serving {model!r}?")
            await asyncio.sleep(0.01)
        at_term = min(s.tokens for s in streams)
        os.kill(server.pid, signal.SIGTERM)  # the main process only, as the kubelet does
        t_term = time.perf_counter()
        await asyncio.sleep(0.2)
        late = Stream()
        await _stream(client, url, request_body(model, prompt, 4, ignore_eos=True), late)
        late_request = ("answered" if late.finished else "refused" if late.tokens == 0 else "cut")
        await asyncio.wait(tasks)  # each ends: finished, cut, or no bytes for read_timeout_s
    deadline = time.perf_counter() + EXIT_WAIT_S
    exit_s = None
    while time.perf_counter() < deadline:
        if server.proc.poll() is not None:
            exit_s = time.perf_counter() - t_term
            break
        await asyncio.sleep(0.05)
    cut = [s for s in streams if not (s.finished and s.tokens >= max_tokens)]
    return DrainRun(n, max_tokens, n - len(cut), at_term, exit_s, late_request,
                    tuple(s.tokens for s in streams), tuple(s.error or "ended early" for s in cut))


def sigterm_during_streams(server: Server, model: str, prompt: str = "Tell me a long story.", n: int = 4,
                           max_tokens: int = 64, at_tokens: int = 4, timeout_s: float = 120.0,
                           read_timeout_s: float | None = None) -> DrainRun:
    """Start ``n`` streams of ``max_tokens`` tokens each (``ignore_eos``, so each asks for all of
    them) to ``server`` (an OpenAI-compatible engine serving ``model``); once every stream has
    ``at_tokens`` tokens, send SIGTERM to the server's process and see what each stream gets, what a
    request sent just after the signal gets, and how long the process takes to exit. ``timeout_s``:
    how long the streams may take to reach ``at_tokens``; ``read_timeout_s`` (default ``timeout_s``):
    how long a stream may go without a byte before it counts as cut. The server is gone afterwards
    (SIGKILL if it outlived them)."""
    if not (n >= 1 and 1 <= at_tokens < max_tokens):
        raise ValueError(f"need n >= 1 and 1 <= at_tokens < max_tokens, got n={n}, at_tokens={at_tokens}, "
                         f"max_tokens={max_tokens}")
    try:
        return run_sync(_run(server, model, prompt, n, max_tokens, at_tokens, timeout_s,
                             timeout_s if read_timeout_s is None else read_timeout_s))
    finally:
        stop(server, timeout_s=5.0)  # already gone, or SIGKILL; either way out of the registry


def drain_or_not(start: Callable[[float], Server], model: str, drain_s: float = 60.0, n: int = 4,
                 max_tokens: int = 64, at_tokens: int = 4, timeout_s: float = 60.0,
                 read_timeout_s: float = 6.0, undrained: Server | None = None) -> dict[float, DrainRun]:
    """:func:`sigterm_during_streams` on two servers that ``start(shutdown_timeout_s)`` starts: one that
    drains for ``drain_s`` seconds and one that does not (0, vLLM's default); ``{0: run, drain_s: run}``.
    A stream with no byte for ``read_timeout_s`` counts as cut (tokens come every fraction of a second).
    ``undrained``: a server already running without a drain (chapter 08's own, started with vLLM's
    default) to use for the first instead of starting one; it is gone afterwards, like the other.
    Records the streams each cut (chapter 08's check: the drain keeps them all, and without it the
    signal landed mid-stream, cutting them)."""
    runs = {s: sigterm_during_streams(undrained if s == 0.0 and undrained else start(s), model, n=n,
                                      max_tokens=max_tokens, at_tokens=at_tokens, timeout_s=timeout_s,
                                      read_timeout_s=read_timeout_s) for s in (0.0, drain_s)}
    how = f"{n} streams of {max_tokens} tokens, SIGTERM once each had {at_tokens}"
    record("production", "drain_streams", n, "streams", how)
    record("production", "no_drain_streams_cut", runs[0.0].cut, "streams", f"--shutdown-timeout 0: {how}")
    record("production", "drain_streams_cut", runs[drain_s].cut, "streams",
           f"--shutdown-timeout {drain_s:g}: {how}")
    return runs
