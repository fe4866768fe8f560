"""OpenAI-compatible streaming servers (vLLM, SGLang, llama.cpp's server, TGI) over Server-Sent Events
with ``httpx``, timed chunk by chunk (chapter 02).

:func:`openai_event` turns one SSE event into what the timing needs (text, cumulative token count,
error, finish reason); it is pure, so every stream shape a server sends is a table row in
``tests/test_openai_events.py``. :func:`openai_backend` reads the stream, stamps each event and
builds the request record (:mod:`labkit.serving.records`). llama.cpp's server adds its own
``timings`` to the stream's usage chunk; :func:`llamacpp_server_timing` keeps them in the record's
``server``, as the Ollama client keeps Ollama's."""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass
from typing import Any, NamedTuple

import httpx

from .records import Part, RequestRecord, ServerTiming, Status, error_text, fail, finish_record, new_record
from .sse import SSEEvent, SSEParser
from .streaming import ServerError, base_url_of


def check_openai_server(base_url: str, model: str | None = None, timeout_s: float = 5.0) -> list[str]:
    """The model names an OpenAI-compatible server lists at ``/v1/models``; :class:`ServerError`
    when nothing answers, the route is missing, or ``model`` is not among them."""
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
        raise ServerError(f"{base}/v1/models answered HTTP {r.status_code} ({error_text(r.content)}): "
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


class OpenAIEvent(NamedTuple):
    """What one streamed event means for the timing: ``text`` generated in it (content, reasoning,
    tool-call names and arguments: all generated tokens), ``tokens`` the cumulative output count
    the server reports (``usage.completion_tokens``; None when absent), ``error`` what the server
    reported (None: no error), ``finish`` the ``finish_reason``, ``done`` the ``[DONE]`` sentinel,
    ``choices`` whether it carried choices (a usage-only chunk does not), ``prompt_tokens``,
    ``server`` the server's own timings (llama.cpp's ``timings`` object; None when absent)."""

    text: str = ""
    tokens: int | None = None
    error: str | None = None
    finish: str | None = None
    done: bool = False
    choices: bool = False
    prompt_tokens: int | None = None
    server: ServerTiming | None = None


def llamacpp_server_timing(timings: dict[str, Any]) -> ServerTiming:
    """llama-server's own ``timings`` of one request (sent with the stream's last usage chunk and in
    its native ``/completion`` answer), milliseconds to seconds: ``prompt_n`` tokens of prefill in
    ``prompt_ms`` (cached prompt tokens not counted), ``predicted_n`` tokens generated, the first of
    them at the end of prefill, the rest in ``predicted_ms``. ``eval_tokens_per_s`` is its
    ``predicted_per_second``, which divides the ``predicted_n - 1`` tokens after the first by
    ``predicted_ms``: the server's 1/TPOT, comparable with the client's (chapter 02)."""
    ms = lambda k: float(timings[k]) / 1e3 if timings.get(k) is not None else None
    prompt_s, eval_s, rate = ms("prompt_ms"), ms("predicted_ms"), timings.get("predicted_per_second")
    total = prompt_s + eval_s if prompt_s is not None and eval_s is not None else None
    return ServerTiming(eval_count=timings.get("predicted_n"), prompt_eval_count=timings.get("prompt_n"),
                        eval_s=eval_s, prompt_eval_s=prompt_s, load_s=None, total_s=total,
                        eval_tokens_per_s=float(rate) if rate is not None else None)


def _delta_text(delta: dict[str, Any]) -> str:
    text = (delta.get("reasoning_content") or delta.get("reasoning") or "") + (delta.get("content") or "")
    if "tool_calls" in delta or "function_call" in delta:
        calls = [c.get("function") or {} for c in delta.get("tool_calls") or ()]
        for fn in [*calls, delta.get("function_call") or {}]:
            text += (fn.get("name") or "") + (fn.get("arguments") or "")
    return text


def openai_event(ev: SSEEvent | str) -> OpenAIEvent:
    """One SSE event (or its data string) of an OpenAI-compatible stream as an :class:`OpenAIEvent`.

    Errors: an ``event: error`` or llama.cpp's ``error:`` field, a data object whose ``error`` is
    set (``"error": null`` is no error) or whose ``object`` is ``"error"`` (vLLM's error format).
    Text: ``choices[0].text`` (``/v1/completions``) or the delta's ``content``, ``reasoning_content``
    / ``reasoning`` and ``tool_calls`` (GuideLLM counts tool-call deltas as generated tokens too).
    ``ValueError`` when the data is not a JSON object."""
    kind, data = ("message", ev) if isinstance(ev, str) else ev
    if kind == "error":
        return OpenAIEvent(error=error_text(data) if data.strip() else "an error event without a message")
    if data.strip() == "[DONE]":
        return OpenAIEvent(done=True)
    obj = json.loads(data)
    if not isinstance(obj, dict):
        raise ValueError(f"a stream event that is not a JSON object: {data[:100]!r}")
    if obj.get("error") or obj.get("object") == "error":
        return OpenAIEvent(error=error_text(data))
    usage = obj.get("usage") or {}
    tokens, prompt_tokens = usage.get("completion_tokens"), usage.get("prompt_tokens")
    timings = obj.get("timings")
    server = llamacpp_server_timing(timings) if isinstance(timings, dict) else None
    choices = obj.get("choices") or []
    if not choices:
        return OpenAIEvent(tokens=tokens, prompt_tokens=prompt_tokens, server=server)
    c0 = choices[0]
    text = _delta_text(c0["delta"] or {}) if "delta" in c0 else (c0.get("text") or "")
    return OpenAIEvent(text, tokens, None, c0.get("finish_reason"), False, True, prompt_tokens, server)


def request_body(model: str, prompt: str, max_tokens: int, endpoint: str = "chat", ignore_eos: bool = False,
                 continuous_usage: bool = True, temperature: float = 0.0,
                 extra_body: dict[str, Any] | None = None) -> dict[str, Any]:
    """The JSON body :func:`openai_backend` posts (also what the overhead benchmark's bare reader
    sends, so both receive the same bytes): streaming, ``stream_options.include_usage`` and, unless
    ``continuous_usage=False``, vLLM's ``continuous_usage_stats`` (a cumulative count per chunk)."""
    b: dict[str, Any] = {"model": model, "max_tokens": max_tokens, "stream": True, "temperature": temperature,
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


@dataclass(frozen=True)
class OpenAIBackend:
    """The :class:`~labkit.serving.streaming.Backend` of an OpenAI-compatible server (chapter 02); made
    by :func:`openai_backend`, which documents its settings and decisions. ``base``: ``http://host:port``."""

    base: str
    model: str
    endpoint: str = "chat"
    tokenizer: Any = None
    ignore_eos: bool = False
    continuous_usage: bool = True
    temperature: float = 0.0
    timeout_s: float = 120.0
    extra_body: dict[str, Any] | None = None
    total_timeout_s: float | None = None
    finish_grace_s: float = 2.0
    max_concurrency: int | None = None

    @property
    def kind(self) -> str:
        return f"openai-{self.endpoint}"

    @property
    def name(self) -> str:
        return f"{self.kind} {self.base} {self.model}"

    @property
    def url(self) -> str:
        return f"{self.base}/v1/{'chat/completions' if self.endpoint == 'chat' else 'completions'}"

    def session(self) -> Any:
        """An ``httpx.AsyncClient`` with the read timeout and no connection cap."""
        limits = httpx.Limits(max_connections=None, max_keepalive_connections=None)
        return httpx.AsyncClient(timeout=httpx.Timeout(self.timeout_s, connect=10.0), limits=limits)

    def check(self) -> None:
        check_openai_server(self.base, self.model)

    async def send(self, session: Any, prompt: str, max_tokens: int) -> RequestRecord:
        """Send ``prompt`` on ``session`` (the client :meth:`session` opened) and time its stream."""
        client: httpx.AsyncClient = session
        rec = new_record(self.kind)
        parts: list[Part] = []
        total: int | None = None
        last_cum = 0
        done = finished = False
        body = request_body(self.model, prompt, max_tokens, self.endpoint, self.ignore_eos,
                            self.continuous_usage, self.temperature, self.extra_body)

        def end(status: Status, error: str = "", note: str | None = None) -> RequestRecord:
            finish_record(rec, parts, total, self.tokenizer)
            rec.note = note
            if status != "ok":
                return fail(rec, status, error)
            rec.status = "ok"
            return rec

        def cut(status: Status, error: str, what: str) -> RequestRecord:
            if finished:  # every token arrived: ok, as vllm bench serve counts it
                return end("ok", note=f"{what} after finish_reason, before [DONE]; counted ok")
            return end(status, error)

        try:
            async with asyncio.timeout(self.total_timeout_s) as limit:
                async with client.stream("POST", self.url, json=body) as r:
                    rec.http_status = r.status_code
                    if r.status_code >= 400:
                        msg = error_text(await r.aread())
                        return fail(rec, "http_error", f"HTTP {r.status_code} from {self.url}: {msg}")
                    ctype = r.headers.get("content-type", "")
                    if "text/event-stream" not in ctype:
                        await r.aread()
                        return fail(rec, "error", f"{self.url} answered with {ctype or 'no content type'}, "
                                     "not a text/event-stream: the server ignored stream=true, so no "
                                     "token can be timed. Use a server (or endpoint) that streams.")
                    sse = SSEParser()
                    stream = r.aiter_bytes()
                    while not done:
                        data = await anext(stream, None)
                        t = time.perf_counter()
                        for ev in sse.close() if data is None else sse.feed(data):
                            e = openai_event(ev)
                            if e.done:
                                done = True
                                break
                            if e.error is not None:
                                return end("error", f"the server reported an error in the stream: {e.error}")
                            if e.prompt_tokens is not None:
                                rec.prompt_tokens = e.prompt_tokens
                            if e.server is not None:
                                rec.server = e.server
                            if not e.choices:  # a usage-only chunk: the total
                                total = e.tokens if e.tokens is not None else total
                                continue
                            cum = e.tokens
                            if e.text or (cum is not None and cum > last_cum) or (e.finish and not finished):
                                parts.append((t, e.text, cum))
                            last_cum = max(last_cum, cum or 0)
                            if e.finish is not None and not finished:
                                finished = True
                                grace = asyncio.get_running_loop().time() + self.finish_grace_s
                                limit.reschedule(min(grace, limit.when() or grace))
                        if data is None:
                            break
            if not (done or finished):
                return end("broken_stream", "the stream ended before [DONE] or a finish_reason: the "
                           "answer may be cut short")
            return end("ok")
        except httpx.ConnectError as e:
            return fail(rec, "connect_error", f"no server answers at {self.base} ({e}); start one "
                         "(`make serve`) or check the URL")
        except httpx.ConnectTimeout:
            return fail(rec, "connect_error", f"{self.base} did not accept the connection within 10 s")
        except httpx.TimeoutException:
            return cut("timeout", f"no data from the server for {self.timeout_s} s (the read timeout between "
                       "chunks): raise timeout_s if it is slow to start", "read timeout")
        except TimeoutError:  # total_timeout_s, or finish_grace_s after finish_reason
            return cut("timeout", f"no complete answer within {self.total_timeout_s} s (total_timeout_s)",
                       f"the stream stayed open {self.finish_grace_s} s")
        except (httpx.RemoteProtocolError, httpx.ReadError) as e:
            return cut("broken_stream", f"connection broke mid-stream: {e}", f"connection broke ({e})")
        except (ValueError, KeyError, TypeError, AttributeError) as e:
            return end("error", f"unexpected stream content ({type(e).__name__}: {e})")


def openai_backend(base_url: str, model: str, endpoint: str = "chat", tokenizer: Any = None,
                   ignore_eos: bool = False, continuous_usage: bool = True, temperature: float = 0.0,
                   timeout_s: float = 120.0, extra_body: dict[str, Any] | None = None,
                   total_timeout_s: float | None = None, finish_grace_s: float = 2.0) -> OpenAIBackend:
    """A streaming client for ``/v1/chat/completions`` (``endpoint="chat"``) or ``/v1/completions``
    (``"completions"``). ``ignore_eos`` (vLLM, SGLang) makes every request generate exactly
    ``max_tokens``; ``continuous_usage=False`` for servers that reject vLLM's
    ``continuous_usage_stats`` option.

    Timeouts (seconds), as GuideLLM's: ``timeout_s`` is a read timeout, the longest wait for the
    next bytes (so a long generation never times out while tokens flow); ``total_timeout_s``
    optionally bounds the whole request. After ``finish_reason`` the client waits at most
    ``finish_grace_s`` for the usage chunk and ``[DONE]``, then stops reading (status ok).

    Decisions: ``[DONE]`` or a ``finish_reason`` completes a request; a stream that ends without
    either is ``broken_stream``. A connection reset (or a server that keeps the connection open)
    after ``finish_reason`` but before ``[DONE]`` is counted ``ok``, as ``vllm bench serve``
    counts it: every token arrived; the record's ``note`` says what happened. An error the server
    reports inside the stream is status ``error``, even when ``[DONE]`` follows."""
    if endpoint not in ("chat", "completions"):
        raise ValueError(f"endpoint must be 'chat' or 'completions', got {endpoint!r}")
    return OpenAIBackend(base_url_of(base_url), model, endpoint, tokenizer, ignore_eos, continuous_usage,
                         temperature, timeout_s, extra_body, total_timeout_s, finish_grace_s)
