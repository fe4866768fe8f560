"""Ollama's native API (``/api/generate``, ``/api/chat``: newline-delimited JSON) through the official
``ollama`` client, with Ollama's own timings beside the client's (chapter 02)."""

from __future__ import annotations

import asyncio
import time
from typing import Any

from .records import Part, RequestRecord, ServerTiming, Status, fail, finish_record, new_record
from .streaming import Backend, ServerError

OLLAMA_HOST = "http://127.0.0.1:11434"


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
        names = [m.model for m in ollama.Client(host=host, timeout=5.0).list().models if m.model]
    except ConnectionError:
        raise ServerError(f"no Ollama server answers at {host}: install and start Ollama "
                          "(https://ollama.com/download), then `ollama pull MODEL`") from None
    full = set(names) | {n.removesuffix(":latest") for n in names}
    if model is not None and model not in full:
        raise ServerError(f"Ollama at {host} has no model {model!r}; it has {names}. "
                          f"Run `ollama pull {model}`")
    return names


def ollama_server_timing(final: dict[str, Any]) -> ServerTiming:
    """Ollama's own figures from its last streamed object (a JSON object): nanosecond durations to
    seconds, plus the server-side decode rate ``eval_count / eval_duration`` (tokens/s)."""
    ns = lambda k: final[k] / 1e9 if final.get(k) is not None else None
    n, eval_s = final.get("eval_count"), ns("eval_duration")
    return ServerTiming(eval_count=n, prompt_eval_count=final.get("prompt_eval_count"), eval_s=eval_s,
                        prompt_eval_s=ns("prompt_eval_duration"), load_s=ns("load_duration"),
                        total_s=ns("total_duration"), eval_tokens_per_s=n / eval_s if n and eval_s else None)


def ollama_backend(model: str, host: str = OLLAMA_HOST, endpoint: str = "generate",
                   temperature: float = 0.0, timeout_s: float = 120.0,
                   total_timeout_s: float | None = None) -> Backend:
    """A streaming client for Ollama's ``/api/generate`` or ``/api/chat`` through the official
    ``ollama`` Python client. ``max_tokens`` becomes ``options.num_predict``. The record's ``server``
    holds Ollama's own timings (:func:`ollama_server_timing`); tokens come from its
    ``eval_count``. ``timeout_s``: read timeout between chunks; ``total_timeout_s``: optional bound
    on the whole request (seconds), as for :func:`labkit.serving.openai_api.openai_backend`."""
    import httpx
    import ollama

    if endpoint not in ("generate", "chat"):
        raise ValueError(f"endpoint must be 'generate' or 'chat', got {endpoint!r}")
    host = host.rstrip("/")
    name = f"ollama-{endpoint}"

    def session() -> Any:
        return ollama.AsyncClient(host=host, timeout=httpx.Timeout(timeout_s, connect=10.0))

    async def send(client: Any, prompt: str, max_tokens: int) -> RequestRecord:
        rec = new_record(name)
        parts: list[Part] = []
        final: dict[str, Any] = {}
        options = {"num_predict": max_tokens, "temperature": temperature}
        try:
            async with asyncio.timeout(total_timeout_s):
                if endpoint == "chat":
                    stream = await client.chat(model=model, messages=[{"role": "user", "content": prompt}],
                                               stream=True, options=options)
                else:
                    stream = await client.generate(model=model, prompt=prompt, stream=True, options=options)
                async for part in stream:
                    t = time.perf_counter()
                    obj = part.model_dump()
                    msg = obj.get("message") or {}
                    text = (obj.get("thinking") or msg.get("thinking") or "") + (
                        obj.get("response") or msg.get("content") or "")
                    if text:
                        parts.append((t, text, None))
                    if obj.get("done"):
                        final = obj
            finish_record(rec, parts, final.get("eval_count"))
            rec.prompt_tokens = final.get("prompt_eval_count")
            rec.server = ollama_server_timing(final) if final else None
            if not final:
                return fail(rec, "broken_stream", "the stream ended before Ollama's done=true object")
            rec.status = "ok"
            return rec
        except ConnectionError:
            return fail(rec, "connect_error", f"no Ollama server answers at {host}: start Ollama "
                         "(`ollama serve`) or pass host=")
        except httpx.ConnectError as e:
            return fail(rec, "connect_error", f"no Ollama server answers at {host} ({e})")
        except ollama.ResponseError as e:
            finish_record(rec, parts)
            status: Status = "http_error" if e.status_code and e.status_code > 0 else "error"
            rec.http_status = e.status_code if e.status_code > 0 else None
            return fail(rec, status, f"Ollama answered {e.status_code}: {e.error}")
        except httpx.TimeoutException:
            finish_record(rec, parts)
            return fail(rec, "timeout", f"no data from Ollama for {timeout_s} s (read timeout between "
                        "chunks): raise timeout_s if the model is slow to load")
        except TimeoutError:
            finish_record(rec, parts)
            return fail(rec, "timeout", f"no complete answer within {total_timeout_s} s (total_timeout_s)")
        except (httpx.RemoteProtocolError, httpx.ReadError, ValueError) as e:
            finish_record(rec, parts)
            return fail(rec, "broken_stream", f"the stream broke: {type(e).__name__}: {e}")

    return Backend(name=f"{name} {host} {model}", session=session, send=send,
                   check=lambda: check_ollama(host, model))
