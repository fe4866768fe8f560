"""Ollama's native API (``/api/generate``, ``/api/chat``: newline-delimited JSON) through the official
``ollama`` client, with Ollama's own timings beside the client's (chapter 02)."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from typing import Any

import httpx

from .records import Part, RequestRecord, ServerTiming, Status, fail, finish_record, new_record
from .streaming import ServerError

OLLAMA_HOST = "http://127.0.0.1:11434"


def ollama_available(host: str = OLLAMA_HOST, timeout_s: float = 1.0) -> bool:
    """Whether an Ollama server answers ``/api/version`` at ``host`` (localhost:11434 by default)."""
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


@dataclass(frozen=True)
class OllamaBackend:
    """The :class:`~labkit.serving.streaming.Backend` of an Ollama server (chapter 02); made by
    :func:`ollama_backend`, which documents its settings."""

    model: str
    host: str = OLLAMA_HOST
    endpoint: str = "generate"
    temperature: float = 0.0
    timeout_s: float = 120.0
    total_timeout_s: float | None = None
    max_concurrency: int | None = None

    @property
    def kind(self) -> str:
        return f"ollama-{self.endpoint}"

    @property
    def name(self) -> str:
        return f"{self.kind} {self.host} {self.model}"

    def session(self) -> Any:
        """An ``ollama.AsyncClient`` with the read timeout."""
        import ollama

        return ollama.AsyncClient(host=self.host, timeout=httpx.Timeout(self.timeout_s, connect=10.0))

    def check(self) -> None:
        check_ollama(self.host, self.model)

    async def send(self, session: Any, prompt: str, max_tokens: int) -> RequestRecord:
        """Send ``prompt`` on ``session`` (the client :meth:`session` opened) and time its stream."""
        import ollama

        client = session
        rec = new_record(self.kind)
        parts: list[Part] = []
        final: dict[str, Any] = {}
        options = {"num_predict": max_tokens, "temperature": self.temperature}
        try:
            async with asyncio.timeout(self.total_timeout_s):
                if self.endpoint == "chat":
                    messages = [{"role": "user", "content": prompt}]
                    stream = await client.chat(model=self.model, messages=messages, stream=True,
                                               options=options)
                else:
                    stream = await client.generate(model=self.model, prompt=prompt, stream=True,
                                                   options=options)
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
            return fail(rec, "connect_error", f"no Ollama server answers at {self.host}: start Ollama "
                         "(`ollama serve`) or pass host=")
        except httpx.ConnectError as e:
            return fail(rec, "connect_error", f"no Ollama server answers at {self.host} ({e})")
        except ollama.ResponseError as e:
            finish_record(rec, parts)
            status: Status = "http_error" if e.status_code and e.status_code > 0 else "error"
            rec.http_status = e.status_code if e.status_code > 0 else None
            return fail(rec, status, f"Ollama answered {e.status_code}: {e.error}")
        except httpx.TimeoutException:
            finish_record(rec, parts)
            return fail(rec, "timeout", f"no data from Ollama for {self.timeout_s} s (read timeout between "
                        "chunks): raise timeout_s if the model is slow to load")
        except TimeoutError:
            finish_record(rec, parts)
            return fail(rec, "timeout",
                        f"no complete answer within {self.total_timeout_s} s (total_timeout_s)")
        except (httpx.RemoteProtocolError, httpx.ReadError, ValueError) as e:
            finish_record(rec, parts)
            return fail(rec, "broken_stream", f"the stream broke: {type(e).__name__}: {e}")


def ollama_backend(model: str, host: str = OLLAMA_HOST, endpoint: str = "generate",
                   temperature: float = 0.0, timeout_s: float = 120.0,
                   total_timeout_s: float | None = None) -> OllamaBackend:
    """A streaming client for Ollama's ``/api/generate`` or ``/api/chat`` through the official
    ``ollama`` Python client. ``max_tokens`` becomes ``options.num_predict``. The record's ``server``
    holds Ollama's own timings (:func:`ollama_server_timing`); tokens come from its
    ``eval_count``. ``timeout_s``: read timeout between chunks; ``total_timeout_s``: optional bound
    on the whole request (seconds), as for :func:`labkit.serving.openai_api.openai_backend`."""
    if endpoint not in ("generate", "chat"):
        raise ValueError(f"endpoint must be 'generate' or 'chat', got {endpoint!r}")
    return OllamaBackend(model, host.rstrip("/"), endpoint, temperature, timeout_s, total_timeout_s)
