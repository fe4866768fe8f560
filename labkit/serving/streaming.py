"""Streaming clients that time every token: one interface over a local model, any OpenAI-compatible
server and Ollama (chapter 02).

Each backend returns a request record (see :mod:`labkit.serving.metrics`) with the arrival time of every
chunk that carried generated text and how many tokens it held, counted from the server's own usage
figures, never by counting chunks.

* :func:`openai_backend`: vLLM, SGLang, llama.cpp server, TGI... over HTTP streaming (Server-Sent
  Events) with ``httpx``, ``/v1/chat/completions`` or ``/v1/completions``. Asks for
  ``stream_options: {"include_usage": true, "continuous_usage_stats": true}`` so vLLM reports the
  cumulative token count in every chunk; servers that send only a final usage figure get their
  tokens shared among chunks (or counted by ``tokenizer=`` when given).
* :func:`ollama_backend`: Ollama's native ``/api/generate`` and ``/api/chat`` (newline-delimited
  JSON) through the official ``ollama`` client; records Ollama's own ``eval_count``,
  ``eval_duration``, ``prompt_eval_duration`` beside the client-side timing.
* :func:`generate_timed` / :func:`transformers_backend`: a transformers model in this process,
  timestamps taken in a streamer after a device sync.

Example (any OpenAI-compatible server; ``make serve`` starts the bundled model on port 8000)::

    from labkit.serving import streaming
    be = streaming.openai_backend("http://127.0.0.1:8000", model="smollm2")
    rec = streaming.measure(be, "What is the KV cache?", max_tokens=32)
    print(rec["status"], rec["chunks"][:3], rec["output_tokens"])

Errors are records, not exceptions (``status`` http_error, timeout, broken_stream, connect_error,
error, with ``error`` saying what to do), so a load test keeps everything it measured;
:func:`check_openai_server` fails fast with a clear :class:`ServerError` before a run.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import json
import re
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine
from dataclasses import dataclass
from typing import Any

from .metrics import count_chunk_tokens

OLLAMA_HOST = "http://127.0.0.1:11434"


class ServerError(RuntimeError):
    """The server cannot be benchmarked as asked (not running, wrong model, not streaming)."""


# --- Incremental parsers: bytes arrive split anywhere --------------------------------------------

_EOL = re.compile(rb"\r\n|\n|\r")


class LineSplitter:
    """Bytes in, complete lines out (str, without terminators). ``cr=True`` accepts CRLF, LF and a
    lone CR (the SSE rules); ``cr=False`` splits on LF only (NDJSON). A line is decoded only once
    complete, so a UTF-8 character split across network reads decodes correctly."""

    def __init__(self, cr: bool = True):
        self._buf = b""
        self._eol = _EOL if cr else re.compile(rb"\n")

    def feed(self, data: bytes) -> list[str]:
        self._buf += data
        lines, start = [], 0
        for m in self._eol.finditer(self._buf):
            if m.group() == b"\r" and m.end() == len(self._buf):
                break  # may be the first half of CRLF: wait for the next read
            lines.append(self._buf[start:m.start()].decode("utf-8", errors="replace"))
            start = m.end()
        self._buf = self._buf[start:]
        return lines

    def close(self) -> list[str]:
        """Flush at end of stream: a trailing lone CR ends a line; an unterminated last line is
        returned as is."""
        rest, self._buf = self._buf, b""
        parts = self._eol.split(rest) if rest else []
        if parts and parts[-1] == b"":
            parts.pop()
        return [p.decode("utf-8", errors="replace") for p in parts]


class SSEParser:
    """Server-Sent Events (WHATWG HTML spec, section 9.2): ``feed(bytes)`` returns the ``data`` of
    each event completed by those bytes (multi-line data joined with newlines; events with empty
data are dropped, as the spec says). Comments
    (``: keep-alive``), ``event:``, ``id:`` and ``retry:`` fields are skipped. ``close()`` also
    dispatches an event the server did not end with a blank line."""

    def __init__(self) -> None:
        self._lines = LineSplitter(cr=True)
        self._data: list[str] = []
        self._first = True

    def feed(self, data: bytes) -> list[str]:
        return self._handle(self._lines.feed(data))

    def close(self) -> list[str]:
        events = self._handle(self._lines.close())
        self._dispatch(events)
        return events

    def _dispatch(self, events: list[str]) -> None:
        data, self._data = "\n".join(self._data), []
        if data:  # the spec drops events whose data is empty
            events.append(data)

    def _handle(self, lines: list[str]) -> list[str]:
        events = []
        for line in lines:
            if self._first:
                line, self._first = line.removeprefix("\ufeff"), False
            if line == "":
                self._dispatch(events)
                continue
            if line.startswith(":"):
                continue
            field, _, value = line.partition(":")
            if field == "data":
                self._data.append(value[1:] if value.startswith(" ") else value)
        return events


class NDJSONParser:
    """Newline-delimited JSON (Ollama's streaming format): ``feed(bytes)`` returns the objects
    completed by those bytes; blank lines are skipped; ``close()`` parses an unterminated last
    line. A line that is not JSON raises ``ValueError`` quoting it."""

    def __init__(self) -> None:
        self._lines = LineSplitter(cr=False)

    def feed(self, data: bytes) -> list[Any]:
        return [self._parse(x) for x in self._lines.feed(data) if x.strip()]

    def close(self) -> list[Any]:
        return [self._parse(x) for x in self._lines.close() if x.strip()]

    @staticmethod
    def _parse(line: str) -> Any:
        try:
            return json.loads(line)
        except json.JSONDecodeError as e:
            raise ValueError(f"not a JSON line in the NDJSON stream: {line[:200]!r} ({e})") from None


# --- Request records ---------------------------------------------------------------------------


def new_record(backend: str) -> dict[str, Any]:
    """An empty request record stamped with the send time (``time.perf_counter()``, seconds)."""
    return {"backend": backend, "status": "error", "error": None, "http_status": None,
            "t_sent": time.perf_counter(), "t_end": None, "chunks": [], "output_tokens": None,
            "prompt_tokens": None, "token_source": None, "text": ""}


def finish_record(rec: dict[str, Any], parts: list[tuple[float, str, int | None]],
                  total: int | None = None, tokenizer: Any = None) -> dict[str, Any]:
    """Fill ``chunks``/``output_tokens``/``text`` from ``parts``, the ``(perf_counter time, text,
    cumulative tokens or None)`` of each token-bearing chunk, and stamp ``t_end``."""
    rec["t_end"] = time.perf_counter()
    texts = [p[1] for p in parts]
    cumulative = [p[2] for p in parts]
    counts, n, source = count_chunk_tokens(texts, cumulative, total, tokenizer)
    rec["chunks"] = [[t - rec["t_sent"], k] for (t, _, _), k in zip(parts, counts, strict=True)]
    rec["output_tokens"], rec["token_source"] = n, source
    rec["text"] = "".join(texts)
    return rec


def _fail(rec: dict[str, Any], status: str, error: str) -> dict[str, Any]:
    rec["status"], rec["error"] = status, error
    rec["t_end"] = rec["t_end"] or time.perf_counter()
    return rec


def _error_text(body: bytes) -> str:
    """The message inside an error body (OpenAI ``{"error": {"message"}}``, Ollama ``{"error"}``,
    FastAPI ``{"detail"}``), else the body's start."""
    try:
        obj = json.loads(body)
    except (json.JSONDecodeError, UnicodeDecodeError):
        return body[:300].decode("utf-8", "replace").strip()
    if isinstance(obj, dict):
        err = obj.get("error", obj.get("detail", obj.get("message", obj)))
        if isinstance(err, dict):
            err = err.get("message", err)
        return str(err)[:300]
    return str(obj)[:300]


def base_url_of(url: str) -> str:
    """``http://host:port`` from ``http://host:port``, ``.../`` or ``.../v1``."""
    url = url.rstrip("/")
    return url[: -len("/v1")] if url.endswith("/v1") else url


# --- One streaming interface ---------------------------------------------------------------------


@dataclass(frozen=True)
class Backend:
    """How to send one streamed request: ``send(session, prompt, max_tokens) -> record`` inside
    ``async with session() as s``; ``check()`` raises :class:`ServerError` when the target cannot
    answer; ``max_concurrency`` caps what it can serve (1 for an in-process model)."""

    name: str
    session: Callable[[], contextlib.AbstractAsyncContextManager[Any]]
    send: Callable[[Any, str, int], Awaitable[dict[str, Any]]]
    check: Callable[[], Any] | None = None
    max_concurrency: int | None = None


def run_sync(coro: Coroutine[Any, Any, Any]) -> Any:
    """Run a coroutine to completion from sync code, also inside Jupyter (whose event loop is
    already running: the coroutine then gets a fresh loop in a worker thread)."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(coro)
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        return pool.submit(asyncio.run, coro).result()


def measure(backend: Backend, prompt: str, max_tokens: int = 32) -> dict[str, Any]:
    """Send one streamed request and return its record (sync; works in notebooks)."""

    async def one() -> dict[str, Any]:
        async with backend.session() as s:
            return await backend.send(s, prompt, max_tokens)

    return run_sync(one())


# --- OpenAI-compatible servers (SSE) -----------------------------------------------------------


def check_openai_server(base_url: str, model: str | None = None, timeout_s: float = 5.0) -> list[str]:
    """The model names an OpenAI-compatible server lists at ``/v1/models``; :class:`ServerError`
    when nothing answers, the route is missing, or ``model`` is not among them."""
    import httpx

    base = base_url_of(base_url)
    try:
        r = httpx.get(f"{base}/v1/models", timeout=timeout_s)
    except httpx.ConnectError as e:
        raise ServerError(f"no server answers at {base} ({e}). Start one (`make serve` starts the "
                          "bundled model with vLLM on port 8000) or pass the right URL.") from None
    except httpx.TimeoutException:
        raise ServerError(f"{base} accepted the connection but did not answer /v1/models within "
                          f"{timeout_s} s: is it still loading?") from None
    if r.status_code != 200:
        raise ServerError(f"{base}/v1/models answered HTTP {r.status_code} ({_error_text(r.content)}): "
                          "is this an OpenAI-compatible server? Pass its base URL without /v1/...")
    try:
        names = [m["id"] for m in r.json().get("data", [])]
    except (ValueError, AttributeError, KeyError, TypeError):
        raise ServerError(f"{base}/v1/models did not return an OpenAI model list: "
                          f"{r.text[:200]!r}") from None
    if model is not None and model not in names:
        raise ServerError(f"model {model!r} is not served at {base}; it serves {names}. "
                          f"Pass model={names[0]!r}" if names else f"{base} serves no model")
    return names


def openai_backend(base_url: str, model: str, endpoint: str = "chat", tokenizer: Any = None,
                   ignore_eos: bool = False, continuous_usage: bool = True, temperature: float = 0.0,
                   timeout_s: float = 120.0, extra_body: dict[str, Any] | None = None) -> Backend:
    """A streaming client for ``/v1/chat/completions`` (``endpoint="chat"``) or ``/v1/completions``
    (``"completions"``). ``ignore_eos`` (vLLM, SGLang) makes every request generate exactly
    ``max_tokens``; ``continuous_usage=False`` for servers that reject vLLM's
    ``continuous_usage_stats`` option; ``timeout_s`` bounds each whole request (seconds)."""
    import httpx

    if endpoint not in ("chat", "completions"):
        raise ValueError(f"endpoint must be 'chat' or 'completions', got {endpoint!r}")
    base = base_url_of(base_url)
    url = f"{base}/v1/chat/completions" if endpoint == "chat" else f"{base}/v1/completions"
    name = f"openai-{endpoint}"

    def session() -> httpx.AsyncClient:
        limits = httpx.Limits(max_connections=None, max_keepalive_connections=None)
        return httpx.AsyncClient(timeout=httpx.Timeout(timeout_s, connect=10.0), limits=limits)

    def body(prompt: str, max_tokens: int) -> dict[str, Any]:
        b: dict[str, Any] = {"model": model, "max_tokens": max_tokens, "stream": True,
                             "temperature": temperature,
                             "stream_options": {"include_usage": True}}
        if continuous_usage:
            b["stream_options"]["continuous_usage_stats"] = True
        if ignore_eos:
            b["ignore_eos"] = True
        if endpoint == "chat":
            b["messages"] = [{"role": "user", "content": prompt}]
        else:
            b["prompt"] = prompt
        return b | (extra_body or {})

    async def send(client: httpx.AsyncClient, prompt: str, max_tokens: int) -> dict[str, Any]:
        rec = new_record(name)
        parts: list[tuple[float, str, int | None]] = []
        total = None
        last_cum = 0
        done = finished = False
        try:
            async with asyncio.timeout(timeout_s):
                async with client.stream("POST", url, json=body(prompt, max_tokens)) as r:
                    rec["http_status"] = r.status_code
                    if r.status_code >= 400:
                        msg = _error_text(await r.aread())
                        return _fail(rec, "http_error", f"HTTP {r.status_code} from {url}: {msg}")
                    ctype = r.headers.get("content-type", "")
                    if "text/event-stream" not in ctype:
                        await r.aread()
                        return _fail(rec, "error", f"{url} answered with {ctype or 'no content type'}, "
                                     "not a text/event-stream: the server ignored stream=true, so no "
                                     "token can be timed. Use a server (or endpoint) that streams.")
                    sse = SSEParser()
                    stream = r.aiter_bytes()
                    while not done:
                        data = await anext(stream, None)
                        t = time.perf_counter()
                        events = sse.close() if data is None else sse.feed(data)
                        for ev in events:
                            if ev.strip() == "[DONE]":
                                done = True
                                break
                            obj = json.loads(ev)
                            if isinstance(obj, dict) and "error" in obj:
                                finish_record(rec, parts, total, tokenizer)
                                err = _error_text(ev.encode())
                                return _fail(rec, "error", f"error inside the stream: {err}")
                            usage = obj.get("usage") or {}
                            choices = obj.get("choices") or []
                            if not choices:  # the final usage-only chunk
                                total = usage.get("completion_tokens", total)
                                rec["prompt_tokens"] = usage.get("prompt_tokens", rec["prompt_tokens"])
                                continue
                            c0 = choices[0]
                            delta = c0.get("delta") or {}
                            text = (c0.get("text") or "") if endpoint == "completions" else (
                                (delta.get("reasoning_content") or delta.get("reasoning") or "")
                                + (delta.get("content") or ""))
                            cum = usage.get("completion_tokens")
                            continuous = all(p[2] is not None for p in parts)
                            if text or (cum is not None and cum > last_cum and continuous and parts):
                                parts.append((t, text, cum))
                            elif cum:  # usage rides on a text-less (finish) chunk: a total, not a part
                                total = cum
                            if cum is not None:
                                last_cum = max(last_cum, cum)
                                rec["prompt_tokens"] = usage.get("prompt_tokens", rec["prompt_tokens"])
                            finished = finished or c0.get("finish_reason") is not None
                        if data is None:
                            break
            finish_record(rec, parts, total, tokenizer)
            if not (done or finished):
                return _fail(rec, "broken_stream", "the stream ended before [DONE] or a finish_reason")
            rec["status"] = "ok"
            return rec
        except httpx.ConnectError as e:
            return _fail(rec, "connect_error", f"no server answers at {base} ({e}); start one "
                         "(`make serve`) or check the URL")
        except (TimeoutError, httpx.TimeoutException):
            finish_record(rec, parts, total, tokenizer)
            return _fail(rec, "timeout", f"no complete answer within {timeout_s} s")
        except (httpx.RemoteProtocolError, httpx.ReadError) as e:
            finish_record(rec, parts, total, tokenizer)
            return _fail(rec, "broken_stream", f"connection broke mid-stream: {e}")
        except (json.JSONDecodeError, ValueError, KeyError, TypeError, AttributeError) as e:
            finish_record(rec, parts, total, tokenizer)
            return _fail(rec, "error", f"unexpected stream content ({type(e).__name__}: {e})")

    return Backend(name=f"{name} {base} {model}", session=session, send=send,
                   check=lambda: check_openai_server(base, model))


# --- Ollama's native API (NDJSON) --------------------------------------------------------------


def ollama_available(host: str = OLLAMA_HOST, timeout_s: float = 1.0) -> bool:
    """Whether an Ollama server answers ``/api/version`` at ``host`` (localhost:11434 by default)."""
    import httpx

    try:
        return httpx.get(f"{host.rstrip('/')}/api/version", timeout=timeout_s).status_code == 200
    except httpx.HTTPError:
        return False


def check_ollama(host: str = OLLAMA_HOST, model: str | None = None) -> list[str]:
    """Model names Ollama has at ``host`` (``/api/tags``); :class:`ServerError` when it does not
    answer or lacks ``model`` (names compare with and without the ``:latest`` tag)."""
    import ollama

    try:
        names = [m.model for m in ollama.Client(host=host, timeout=5.0).list().models]
    except ConnectionError:
        raise ServerError(f"no Ollama server answers at {host}: install and start Ollama "
                          "(https://ollama.com/download), then `ollama pull MODEL`") from None
    full = set(names) | {n.removesuffix(":latest") for n in names}
    if model is not None and model not in full:
        raise ServerError(f"Ollama at {host} has no model {model!r}; it has {names}. "
                          f"Run `ollama pull {model}`")
    return names


def ollama_server_timing(final: dict[str, Any]) -> dict[str, float | int | None]:
    """Ollama's own figures from its last streamed object: nanosecond durations to seconds, plus
    the server-side decode rate ``eval_count / eval_duration`` (tokens/s)."""
    ns = lambda k: final[k] / 1e9 if final.get(k) is not None else None
    out = {"eval_count": final.get("eval_count"), "prompt_eval_count": final.get("prompt_eval_count"),
           "eval_s": ns("eval_duration"), "prompt_eval_s": ns("prompt_eval_duration"),
           "load_s": ns("load_duration"), "total_s": ns("total_duration")}
    out["eval_tokens_per_s"] = (out["eval_count"] / out["eval_s"]
                                if out["eval_count"] and out["eval_s"] else None)
    return out


def ollama_backend(model: str, host: str = OLLAMA_HOST, endpoint: str = "generate",
                   temperature: float = 0.0, timeout_s: float = 120.0, raw: bool = False) -> Backend:
    """A streaming client for Ollama's ``/api/generate`` or ``/api/chat`` through the official
    ``ollama`` Python client (``raw=True``: labkit's :class:`NDJSONParser` over ``httpx`` instead,
    same record). ``max_tokens`` becomes ``options.num_predict``. The record's ``server`` dict holds
    Ollama's own timings (:func:`ollama_server_timing`); tokens come from its ``eval_count``."""
    import httpx
    import ollama

    if endpoint not in ("generate", "chat"):
        raise ValueError(f"endpoint must be 'generate' or 'chat', got {endpoint!r}")
    host = host.rstrip("/")
    name = f"ollama-{endpoint}{'-raw' if raw else ''}"

    def payload(prompt: str, max_tokens: int) -> dict[str, Any]:
        p: dict[str, Any] = {"model": model, "stream": True,
                             "options": {"num_predict": max_tokens, "temperature": temperature}}
        if endpoint == "chat":
            p["messages"] = [{"role": "user", "content": prompt}]
        else:
            p["prompt"] = prompt
        return p

    def session() -> Any:
        if raw:
            return httpx.AsyncClient(base_url=host, timeout=httpx.Timeout(timeout_s, connect=10.0))
        return ollama.AsyncClient(host=host, timeout=httpx.Timeout(timeout_s, connect=10.0))

    async def objects(client: Any, prompt: str, max_tokens: int) -> AsyncIterator[dict[str, Any]]:
        p = payload(prompt, max_tokens)
        if not raw:
            call = client.chat if endpoint == "chat" else client.generate
            async for part in await call(**p):
                yield part.model_dump()
            return
        async with client.stream("POST", f"/api/{endpoint}", json=p) as r:
            if r.status_code >= 400:
                raise ollama.ResponseError(_error_text(await r.aread()), r.status_code)
            parser = NDJSONParser()
            async for data in r.aiter_bytes():
                for obj in parser.feed(data):
                    yield obj
            for obj in parser.close():
                yield obj

    async def send(client: Any, prompt: str, max_tokens: int) -> dict[str, Any]:
        rec = new_record(name)
        parts: list[tuple[float, str, int | None]] = []
        final: dict[str, Any] = {}
        try:
            async with asyncio.timeout(timeout_s):
                async for obj in objects(client, prompt, max_tokens):
                    t = time.perf_counter()
                    if obj.get("error"):
                        raise ollama.ResponseError(obj["error"])
                    msg = obj.get("message") or {}
                    text = (obj.get("thinking") or msg.get("thinking") or "") + (
                        obj.get("response") or msg.get("content") or "")
                    if text:
                        parts.append((t, text, None))
                    if obj.get("done"):
                        final = obj
            finish_record(rec, parts, final.get("eval_count"))
            rec["prompt_tokens"] = final.get("prompt_eval_count")
            rec["server"] = ollama_server_timing(final) if final else None
            if not final:
                return _fail(rec, "broken_stream", "the stream ended before Ollama's done=true object")
            rec["status"] = "ok"
            return rec
        except ConnectionError:
            return _fail(rec, "connect_error", f"no Ollama server answers at {host}: start Ollama "
                         "(`ollama serve`) or pass host=")
        except httpx.ConnectError as e:
            return _fail(rec, "connect_error", f"no Ollama server answers at {host} ({e})")
        except ollama.ResponseError as e:
            finish_record(rec, parts)
            status = "http_error" if e.status_code and e.status_code > 0 else "error"
            rec["http_status"] = e.status_code if e.status_code > 0 else None
            return _fail(rec, status, f"Ollama answered {e.status_code}: {e.error}")
        except (TimeoutError, httpx.TimeoutException):
            finish_record(rec, parts)
            return _fail(rec, "timeout", f"no complete answer within {timeout_s} s")
        except (httpx.RemoteProtocolError, httpx.ReadError, ValueError) as e:
            finish_record(rec, parts)
            return _fail(rec, "broken_stream", f"the stream broke: {type(e).__name__}: {e}")

    return Backend(name=f"{name} {host} {model}", session=session, send=send,
                   check=lambda: check_ollama(host, model))


# --- A transformers model in this process --------------------------------------------------------


def generate_timed(model: Any, tokenizer: Any, prompt: str, max_tokens: int = 32,
                   chat: bool = True, ignore_eos: bool = False) -> dict[str, Any]:
    """Greedy-generate up to ``max_tokens`` for ``prompt`` and time every token (a request record).

    The clock starts before tokenization (a server's TTFT includes it too); a streamer receives
    each new token and stamps ``time.perf_counter()`` after :func:`labkit.hardware.machine.synchronize`,
    so on CUDA/MPS the time is when the token exists, not when its kernel was queued. Batch 1:
    every chunk is exactly one token (``token_source`` "streamer"). ``ignore_eos`` forces exactly
    ``max_tokens`` tokens (``min_new_tokens``)."""
    import torch
    from transformers.generation.streamers import BaseStreamer

    from ..hardware.machine import synchronize

    device = str(model.device)
    rec = new_record("transformers")
    times: list[float] = []
    ids: list[int] = []

    class Stamp(BaseStreamer):
        prompt_seen = False

        def put(self, value: Any) -> None:
            if not self.prompt_seen:  # generate() first pushes the prompt
                self.prompt_seen = True
                return
            synchronize(device)
            times.append(time.perf_counter())
            ids.extend(value.reshape(-1).tolist())

        def end(self) -> None:
            pass

    if chat and getattr(tokenizer, "chat_template", None):
        enc = tokenizer.apply_chat_template([{"role": "user", "content": prompt}], add_generation_prompt=True,
                                            return_tensors="pt", return_dict=True)
    else:
        enc = tokenizer(prompt, return_tensors="pt")
    enc = {k: v.to(device) for k, v in enc.items()}
    extra = {"min_new_tokens": max_tokens} if ignore_eos else {}
    try:
        with torch.inference_mode():
            model.generate(**enc, max_new_tokens=max_tokens, do_sample=False, streamer=Stamp(),
                           pad_token_id=tokenizer.pad_token_id or tokenizer.eos_token_id, **extra)
    except Exception as e:  # noqa: BLE001 - recorded, not lost: the record says what failed
        rec["t_end"] = time.perf_counter()
        return _fail(rec, "error", f"{type(e).__name__}: {e}")
    rec["t_end"] = time.perf_counter()
    rec["chunks"] = [[t - rec["t_sent"], 1] for t in times]
    rec["output_tokens"], rec["token_source"] = len(ids), "streamer"
    rec["prompt_tokens"] = int(enc["input_ids"].shape[-1])
    rec["text"] = tokenizer.decode(ids, skip_special_tokens=True)
    rec["status"] = "ok"
    return rec


def transformers_backend(model: Any, tokenizer: Any, chat: bool = True, ignore_eos: bool = False) -> Backend:
    """:func:`generate_timed` behind the :class:`Backend` interface (one request at a time: an
    in-process model has no batching scheduler, so ``max_concurrency`` is 1)."""

    @contextlib.asynccontextmanager
    async def session() -> AsyncIterator[None]:
        yield None

    async def send(_: Any, prompt: str, max_tokens: int) -> dict[str, Any]:
        return await asyncio.to_thread(generate_timed, model, tokenizer, prompt, max_tokens, chat, ignore_eos)

    return Backend(name=f"transformers {getattr(model, 'name_or_path', '')}", session=session,
                   send=send, max_concurrency=1)
