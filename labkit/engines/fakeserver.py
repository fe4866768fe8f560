"""A zero-work streaming server on loopback that speaks the OpenAI SSE and Ollama NDJSON protocols
(chapter 02): for testing clients, measuring a load generator's own overhead, and demonstrating
metrics on machines where no real engine runs. Stdlib only (asyncio); it never leaves 127.0.0.1.

It "generates" the words ``tok0 tok1 ...`` with configurable timing: ``prefill_s`` before the first
token, ``step_s`` per decode step plus ``batch_cost_s`` per stream in flight (a crude model of a
batching engine: a step costs more with more sequences, so aggregate throughput saturates), and
``tokens_per_chunk`` tokens per chunk (the trap that breaks per-chunk ITL). It honours
``stream_options.include_usage`` / ``continuous_usage_stats`` and Ollama's ``eval_count`` /
``eval_duration`` fields, ``max_completion_tokens`` and content-part messages (what ``vllm bench
serve`` sends), and can misbehave on purpose: ``fail_every`` (every n-th request answers
``fail_status``), ``break_after`` (drop the connection after n chunks), ``streaming=False`` (ignore
``stream: true``). Wrong model names get 404s in each API's own error format.

Example::

    from labkit.engines.fakeserver import fake_server
    with fake_server(step_s=0.01, tokens_per_chunk=2) as srv:
        print(srv.url)          # http://127.0.0.1:PORT, OpenAI routes under /v1, Ollama under /api
        srv.opts["fail_every"] = 3   # options can change while it runs

``python -m labkit.engines.fakeserver --port 8011 --step-ms 0`` runs one in the foreground (the overhead
benchmark starts it in its own process so it does not share the client's CPU time slice); there SIGTERM
drains as vLLM's ``--shutdown-timeout`` does (``--shutdown-timeout``, default 0: streams are cut).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import signal
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

DEFAULTS: dict[str, Any] = {
    "model": "fake", "prefill_s": 0.0, "step_s": 0.0, "batch_cost_s": 0.0, "tokens_per_chunk": 1,
    "max_tokens": 16, "role_chunk": True, "fail_every": 0, "fail_status": 500, "break_after": None,
    "streaming": True,
}
REASONS = {200: "OK", 400: "Bad Request", 404: "Not Found", 429: "Too Many Requests",
           500: "Internal Server Error", 503: "Service Unavailable"}


@dataclass
class FakeServer:
    """A running fake server: ``url`` (``http://127.0.0.1:PORT``), ``opts`` (live options),
    ``requests`` (how many generation requests it has received), ``active`` / ``peak_active``
    (streams in flight now / at most)."""

    url: str = ""
    opts: dict[str, Any] = field(default_factory=lambda: dict(DEFAULTS))
    requests: int = 0
    active: int = 0
    peak_active: int = 0
    _loop: asyncio.AbstractEventLoop | None = None
    _server: asyncio.AbstractServer | None = None


async def _read_request(reader: asyncio.StreamReader) -> tuple[str, str, dict[str, str], bytes] | None:
    line = await reader.readline()
    if not line:
        return None
    method, path, _ = line.decode("latin-1").split(" ", 2)
    headers = {}
    while (h := await reader.readline()) not in (b"\r\n", b"\n", b""):
        k, _, v = h.decode("latin-1").partition(":")
        headers[k.strip().lower()] = v.strip()
    body = await reader.readexactly(int(headers.get("content-length", 0) or 0))
    return method, path.split("?")[0], headers, body


def _head(status: int, ctype: str, length: int | None = None) -> bytes:
    lines = [f"HTTP/1.1 {status} {REASONS.get(status, 'Error')}", f"Content-Type: {ctype}"]
    lines.append(f"Content-Length: {length}" if length is not None else "Transfer-Encoding: chunked")
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


async def _send_json(w: asyncio.StreamWriter, status: int, obj: Any) -> None:
    data = json.dumps(obj).encode()
    w.write(_head(status, "application/json", len(data)) + data)
    await w.drain()


def _chunk(data: bytes) -> bytes:
    return f"{len(data):x}\r\n".encode() + data + b"\r\n"


def _prompt_text(req: dict[str, Any]) -> str:
    """The prompt's text: ``prompt`` (a string or a list of them), or the ``messages``' contents,
    each a string or OpenAI content parts (``[{"type": "text", "text": ...}]``, what ``vllm bench
    serve`` sends)."""
    if "prompt" in req:
        p = req["prompt"]
        return " ".join(map(str, p)) if isinstance(p, list) else str(p)
    out = []
    for m in req.get("messages") or []:
        content = m.get("content") or ""
        if isinstance(content, list):
            content = " ".join(str(part.get("text", "")) for part in content if isinstance(part, dict))
        out.append(str(content))
    return " ".join(out)


def _max_tokens(req: dict[str, Any], default: int) -> int:
    """``max_completion_tokens`` (OpenAI's newer name), ``max_tokens``, Ollama's
    ``options.num_predict``, else ``default``."""
    ollama = (req.get("options") or {}).get("num_predict")
    return int(req.get("max_completion_tokens") or req.get("max_tokens") or ollama or default)


async def _stream(srv: FakeServer, w: asyncio.StreamWriter, api: str, req: dict[str, Any]) -> None:
    """Write one streamed answer: SSE for the OpenAI routes, NDJSON for Ollama's."""
    o = srv.opts
    ollama = api.startswith("ollama")
    n = _max_tokens(req, o["max_tokens"])
    k = max(1, int(o["tokens_per_chunk"]))
    so = req.get("stream_options") or {}
    usage_each = bool(so.get("continuous_usage_stats"))
    n_prompt = len(_prompt_text(req).split())
    w.write(_head(200, "application/x-ndjson" if ollama else "text/event-stream"))
    t0 = time.perf_counter()

    def frame(obj: dict[str, Any]) -> bytes:
        data = json.dumps(obj).encode()
        return _chunk(data + b"\n" if ollama else b"data: " + data + b"\n\n")

    def openai_obj(text: str | None, done_tokens: int, finish: str | None) -> dict[str, Any]:
        if api == "openai-chat":
            delta = {"role": "assistant", "content": ""} if text is None else {"content": text}
            choice = {"index": 0, "delta": delta, "finish_reason": finish}
        else:
            choice = {"index": 0, "text": text or "", "finish_reason": finish}
        obj: dict[str, Any] = {"id": "fake", "object": "chunk", "model": o["model"], "choices": [choice]}
        if usage_each:
            obj["usage"] = {"prompt_tokens": n_prompt, "completion_tokens": done_tokens,
                            "total_tokens": n_prompt + done_tokens}
        return obj

    if api == "openai-chat" and o["role_chunk"]:
        w.write(frame(openai_obj(None, 0, None)))
    await asyncio.sleep(o["prefill_s"])
    t_first = time.perf_counter()
    sent = chunks = 0
    while sent < n:
        if chunks:
            await asyncio.sleep(o["step_s"] * k + o["batch_cost_s"] * srv.active * k)
        if o["break_after"] is not None and chunks >= o["break_after"]:
            w.transport.abort()  # no terminating chunk: the client sees a broken stream
            return
        m = min(k, n - sent)
        text = "".join(f" tok{sent + i}" for i in range(m))
        sent += m
        chunks += 1
        last = sent >= n
        if ollama:
            obj = {"model": o["model"], "created_at": "", "done": False}
            chat = api == "ollama-chat"
            obj |= {"message": {"role": "assistant", "content": text}} if chat else {"response": text}
            w.write(frame(obj))
        else:
            w.write(frame(openai_obj(text, sent, "length" if last else None)))
        await w.drain()
    t_end = time.perf_counter()
    if ollama:
        final = {"model": o["model"], "created_at": "", "done": True, "done_reason": "length",
                 "total_duration": int((t_end - t0) * 1e9), "load_duration": 0,
                 "prompt_eval_count": n_prompt, "prompt_eval_duration": int((t_first - t0) * 1e9),
                 "eval_count": n, "eval_duration": int((t_end - t_first) * 1e9)}
        chat = api == "ollama-chat"
        final |= {"message": {"role": "assistant", "content": ""}} if chat else {"response": ""}
        w.write(frame(final))
    else:
        if so.get("include_usage"):
            w.write(frame({"id": "fake", "object": "chunk", "model": o["model"], "choices": [],
                           "usage": {"prompt_tokens": n_prompt, "completion_tokens": n,
                                     "total_tokens": n_prompt + n}}))
        w.write(_chunk(b"data: [DONE]\n\n"))
    w.write(b"0\r\n\r\n")
    await w.drain()


ROUTES = {"/v1/chat/completions": "openai-chat", "/v1/completions": "openai-completions",
          "/api/generate": "ollama-generate", "/api/chat": "ollama-chat"}


async def _handle(srv: FakeServer, reader: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
    o = srv.opts
    try:
        while (req := await _read_request(reader)) is not None:
            method, path, _, body = req
            if method == "GET":
                if path == "/v1/models":
                    models = [{"id": o["model"], "object": "model"}]
                    await _send_json(w, 200, {"object": "list", "data": models})
                elif path == "/api/tags":
                    await _send_json(w, 200, {"models": [{"name": o["model"], "model": o["model"]}]})
                elif path in ("/health", "/api/version"):
                    await _send_json(w, 200, {"version": "fake"})
                else:
                    await _send_json(w, 404, {"detail": "Not Found"})
                continue
            api = ROUTES.get(path)
            if api is None:
                await _send_json(w, 404, {"detail": "Not Found"})
                continue
            srv.requests += 1
            ollama = api.startswith("ollama")
            try:
                data = json.loads(body or b"{}")
                _prompt_text(data), _max_tokens(data, 1)
            except (ValueError, TypeError, AttributeError) as e:
                msg = f"malformed request body: {type(e).__name__}: {e}"
                await _send_json(w, 400, {"error": msg if ollama else {"message": msg, "code": 400}})
                continue
            if data.get("model") != o["model"]:
                err = (f"model '{data.get('model')}' not found" if ollama else
                       {"message": f"The model `{data.get('model')}` does not exist.",
                        "type": "NotFoundError", "code": 404})
                await _send_json(w, 404, {"error": err})
                continue
            if o["fail_every"] and srv.requests % o["fail_every"] == 0:
                msg = f"injected failure on request {srv.requests}"
                await _send_json(w, o["fail_status"], {"error": msg if ollama else {"message": msg}})
                continue
            if not o["streaming"] or data.get("stream") is False:
                n = _max_tokens(data, o["max_tokens"])
                text = "".join(f" tok{i}" for i in range(n))
                await _send_json(w, 200, {"response": text, "done": True} if ollama else
                                 {"choices": [{"index": 0, "message": {"role": "assistant", "content": text},
                                               "text": text, "finish_reason": "length"}]})
                continue
            srv.active += 1
            srv.peak_active = max(srv.peak_active, srv.active)
            try:
                await _stream(srv, w, api, data)
            finally:
                srv.active -= 1
    except (ConnectionError, asyncio.IncompleteReadError):
        pass
    finally:
        w.close()


async def _drain(srv: FakeServer, timeout_s: float, stopped: asyncio.Event) -> None:
    """On SIGTERM, as vLLM's ``--shutdown-timeout``: take no new connections, let the streams in
    flight finish for up to ``timeout_s`` seconds (0: none), then stop, cutting what is left."""
    assert srv._server is not None
    srv._server.close()
    deadline = time.perf_counter() + timeout_s
    while srv.active and time.perf_counter() < deadline:
        await asyncio.sleep(0.01)
    stopped.set()


async def _serve(srv: FakeServer, port: int, ready: threading.Event | None = None,
                 shutdown_timeout_s: float | None = None) -> None:
    """Serve until closed; with ``shutdown_timeout_s`` (a process of its own), until SIGTERM has
    drained it (:func:`_drain`); returning cancels the streams still open."""
    srv._server = await asyncio.start_server(lambda r, w: _handle(srv, r, w), "127.0.0.1", port)
    srv.url = f"http://127.0.0.1:{srv._server.sockets[0].getsockname()[1]}"
    srv._loop = asyncio.get_running_loop()
    if ready is not None:
        ready.set()
    if shutdown_timeout_s is not None:
        stopped = asyncio.Event()
        timeout = shutdown_timeout_s
        srv._loop.add_signal_handler(signal.SIGTERM,
                                     lambda: asyncio.ensure_future(_drain(srv, timeout, stopped)))
        await stopped.wait()
        return
    with contextlib.suppress(asyncio.CancelledError):
        async with srv._server:
            await srv._server.serve_forever()


@contextlib.contextmanager
def fake_server(port: int = 0, **opts: Any) -> Iterator[FakeServer]:
    """Run a :class:`FakeServer` on ``127.0.0.1:port`` (0: a free port) in a background thread;
    options as in :data:`DEFAULTS` (times in seconds)."""
    srv = FakeServer(opts=_options(opts))
    ready = threading.Event()
    thread = threading.Thread(target=lambda: asyncio.run(_serve(srv, port, ready)), daemon=True)
    thread.start()
    if not ready.wait(10):
        raise RuntimeError("the fake server did not start within 10 s")
    try:
        yield srv
    finally:
        if srv._loop and srv._server:
            srv._loop.call_soon_threadsafe(srv._server.close)
        thread.join(5)


def _options(opts: dict[str, Any]) -> dict[str, Any]:
    unknown = set(opts) - set(DEFAULTS)
    if unknown:
        raise ValueError(f"unknown fake server options {sorted(unknown)}; known: {sorted(DEFAULTS)}")
    return DEFAULTS | opts


def reset(srv: FakeServer, timeout_s: float = 5.0, **opts: Any) -> FakeServer:
    """``srv`` as if just started with ``opts``: waits up to ``timeout_s`` seconds for the streams in
    flight to end, then sets the options and zeroes ``requests`` and ``peak_active`` (one server can
    then serve many tests)."""
    new = _options(opts)
    deadline = time.perf_counter() + timeout_s
    while srv.active and time.perf_counter() < deadline:
        time.sleep(0.01)
    srv.opts.clear()
    srv.opts.update(new)
    srv.requests, srv.peak_active = 0, srv.active
    return srv


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description="zero-work OpenAI/Ollama streaming server on 127.0.0.1")
    ap.add_argument("--port", type=int, default=8011)
    ap.add_argument("--model", default="fake")
    ap.add_argument("--step-ms", type=float, default=0.0)
    ap.add_argument("--prefill-ms", type=float, default=0.0)
    ap.add_argument("--tokens-per-chunk", type=int, default=1)
    ap.add_argument("--shutdown-timeout", type=float, default=0.0,
                    help="seconds streams in flight may finish after SIGTERM (vLLM's option; 0 cuts them)")
    a = ap.parse_args(argv)
    opts = {"model": a.model, "step_s": a.step_ms / 1e3, "prefill_s": a.prefill_ms / 1e3,
            "tokens_per_chunk": a.tokens_per_chunk}
    srv = FakeServer(opts=DEFAULTS | opts)
    print(f"fake server on http://127.0.0.1:{a.port}", flush=True)
    asyncio.run(_serve(srv, a.port, shutdown_timeout_s=a.shutdown_timeout))


if __name__ == "__main__":
    main()
