"""Streaming speech recognition over a real WebSocket: server, real-time client, round trips (chapter 07).

The tutorial's target for live ASR is about 200 ms round trip per audio chunk, over WebSocket
streaming. This module serves one shared transcriber (the chapter's faster-whisper model) to any
number of connections and measures what a client sees.

Protocol (one connection = one audio stream):

* client -> server: **binary** frames, each one chunk of 16 kHz mono PCM, signed 16-bit
  little-endian (``pcm_s16le``), between ``min_chunk_s`` and ``max_chunk_s`` seconds long.
* server -> client: JSON text. First ``{"type": "ready", "sample_rate", "format", "min_chunk_s",
  "max_chunk_s"}``, then one ``{"type": "partial", "seq", "audio_s", "text", "wait_s", "infer_s"}``
  per chunk, in order (``wait_s``: seconds queued for the model, ``infer_s``: seconds transcribing).
* a bad frame gets ``{"type": "error", "code", "error"}`` (what was wrong and what to send instead),
  then the server closes that connection with the code: 1003 for a text frame, 1007 for a payload
  that is not whole samples or is shorter than ``min_chunk_s``, 1009 for one over ``max_chunk_s``.
  Other connections are not affected.

One model serves every connection: inference runs in a worker thread behind a semaphore of
``parallel`` slots (default 1), so concurrent streams queue for it, honestly, in the round trip.
A client that vanishes (TCP reset, or silence past the keepalive ping) ends its handler; the
server's ``live`` count and its task count go back to where they were. The server runs its own
event loop in a daemon thread, bound to 127.0.0.1 on a free port: it dies with the process.

Round trips are stamped with ``time.perf_counter`` (the clock under
:func:`labkit.hardware.microbench.timed`; CPU work only, nothing to synchronize): from the moment
``send`` of a chunk returned (its last byte handed to the socket) to the arrival of its partial.
Seconds throughout.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import numpy as np
from websockets.asyncio.client import connect
from websockets.asyncio.server import ServerConnection, serve
from websockets.exceptions import ConnectionClosed
from websockets.protocol import State

from .asr import SAMPLE_RATE, chunks, transcribe

FORMAT = "pcm_s16le"  # 16 kHz mono, signed 16-bit little-endian samples
BYTES_PER_SAMPLE = 2
T = TypeVar("T")


def encode_pcm16(audio: np.ndarray) -> bytes:
    """float samples in [-1, 1] -> ``pcm_s16le`` bytes (clipped)."""
    return (np.clip(np.asarray(audio, dtype=np.float32), -1.0, 1.0) * 32767).astype("<i2").tobytes()


def check_frame(message: str | bytes, min_chunk_s: float, max_chunk_s: float
                ) -> tuple[np.ndarray | None, int, str]:
    """Validate one client frame: ``(float32 samples, 1000, "")`` when it is good, else
    ``(None, close code, what to do)``."""
    if isinstance(message, str):
        return None, 1003, (f"got a text frame; send audio as binary frames of 16 kHz mono {FORMAT} "
                            "(int16 little-endian)")
    n = len(message)
    if n % BYTES_PER_SAMPLE:
        return None, 1007, (f"frame of {n} bytes is not whole 16-bit samples; send {FORMAT} "
                            "(2 bytes per sample, an even byte count)")
    seconds = n / BYTES_PER_SAMPLE / SAMPLE_RATE
    if seconds < min_chunk_s:
        return None, 1007, (f"frame holds {seconds * 1000:.0f} ms of audio, under the "
                            f"{min_chunk_s * 1000:.0f} ms minimum; send chunks of "
                            f"{min_chunk_s:g}..{max_chunk_s:g} s at 16 kHz")
    if seconds > max_chunk_s:
        return None, 1009, (f"frame holds {seconds:.2f} s of audio, over the {max_chunk_s:g} s maximum; "
                            f"split it into chunks of {min_chunk_s:g}..{max_chunk_s:g} s")
    return np.frombuffer(message, dtype="<i2").astype(np.float32) / 32767, 1000, ""


def whisper_transcriber(model: Any, beam_size: int = 1, **options: Any) -> Callable[[np.ndarray], str]:
    """A transcriber for :class:`StreamingASRServer`: each chunk on its own through
    :func:`labkit.media.asr.transcribe` (one 30 s encoder window per chunk)."""
    return lambda audio: str(transcribe(model, audio, beam_size=beam_size, **options)["text"])


class StreamingASRServer:
    """A WebSocket ASR server in a background thread (see the module docstring for the protocol).
    ``with StreamingASRServer(fn) as server: server.url``. ``live``: connections open now;
    ``opened``, ``dropped`` (ended without a close handshake), ``rejected`` (bad frames), ``chunks``."""

    def __init__(self, transcriber: Callable[[np.ndarray], str], *, parallel: int = 1,
                 min_chunk_s: float = 0.1, max_chunk_s: float = 5.0, ping_interval: float = 5.0,
                 ping_timeout: float = 5.0, close_timeout: float = 2.0, host: str = "127.0.0.1",
                 port: int = 0):
        if parallel < 1:
            raise ValueError(f"parallel must be at least 1 inference slot, got {parallel}")
        if not 0 < min_chunk_s <= max_chunk_s:
            raise ValueError(f"need 0 < min_chunk_s <= max_chunk_s, got {min_chunk_s}, {max_chunk_s}")
        self.transcriber, self.parallel = transcriber, parallel
        self.min_chunk_s, self.max_chunk_s = min_chunk_s, max_chunk_s
        self.ping_interval, self.ping_timeout, self.close_timeout = ping_interval, ping_timeout, close_timeout
        self.host, self.port = host, port
        self.live = self.opened = self.dropped = self.rejected = self.chunks = 0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        return f"ws://{self.host}:{self.port}/"

    def start(self) -> StreamingASRServer:
        """Start serving (returns once the port is bound); ``RuntimeError`` when it cannot."""
        ready, failure = threading.Event(), []

        def main() -> None:
            try:
                asyncio.run(self._serve(ready))
            except BaseException as e:  # surfaced to start()'s caller
                failure.append(e)
                ready.set()

        self._thread = threading.Thread(target=main, name="asr-websocket-server", daemon=True)
        self._thread.start()
        if not ready.wait(30) or failure:
            raise RuntimeError(f"the ASR WebSocket server did not start on {self.host}:{self.port}: "
                               f"{failure[0] if failure else 'timed out'}")
        return self

    async def _serve(self, ready: threading.Event) -> None:
        self._loop, self._stop = asyncio.get_running_loop(), asyncio.Event()
        self._slots = asyncio.Semaphore(self.parallel)
        # frames up to 4x the limit reach check_frame (a clear message); beyond, websockets' own 1009
        hard_limit = int(self.max_chunk_s * SAMPLE_RATE * BYTES_PER_SAMPLE * 4)
        async with serve(self._handle, self.host, self.port, max_size=hard_limit, compression=None,
                         ping_interval=self.ping_interval, ping_timeout=self.ping_timeout,
                         close_timeout=self.close_timeout) as server:
            self.port = next(iter(server.sockets)).getsockname()[1]
            ready.set()
            await self._stop.wait()

    async def _handle(self, ws: ServerConnection) -> None:
        self.live, self.opened = self.live + 1, self.opened + 1
        try:
            await ws.send(json.dumps(dict(type="ready", sample_rate=SAMPLE_RATE, format=FORMAT,
                                          min_chunk_s=self.min_chunk_s, max_chunk_s=self.max_chunk_s)))
            seq = 0
            async for message in ws:
                audio, code, error = check_frame(message, self.min_chunk_s, self.max_chunk_s)
                if audio is None:
                    self.rejected += 1
                    await ws.send(json.dumps(dict(type="error", code=code, error=error)))
                    await ws.close(code, error[:120])
                    return
                t0 = time.perf_counter()
                async with self._slots:  # one shared model: streams queue here
                    if ws.state is not State.OPEN:  # the client left while this chunk waited
                        break
                    t1 = time.perf_counter()
                    text = await asyncio.to_thread(self.transcriber, audio)
                    t2 = time.perf_counter()
                self.chunks += 1
                await ws.send(json.dumps(dict(type="partial", seq=seq, audio_s=len(audio) / SAMPLE_RATE,
                                              text=text, wait_s=t1 - t0, infer_s=t2 - t1)))
                seq += 1
        except ConnectionClosed:
            pass
        finally:
            if ws.close_code is None or ws.close_code == 1006:  # no close handshake: the client vanished
                self.dropped += 1
            self.live -= 1

    def _call(self, make: Callable[[], Awaitable[T]], timeout: float = 10.0) -> T:
        if self._loop is None:
            raise RuntimeError("the server is not running: call start() first")
        return asyncio.run_coroutine_threadsafe(make(), self._loop).result(timeout)  # type: ignore[arg-type]

    def tasks(self) -> int:
        """Tasks alive on the server's event loop, besides the one asking (the serving ones included)."""
        async def count() -> int:
            return len(asyncio.all_tasks()) - 1
        return self._call(count)

    def wait_idle(self, timeout: float = 10.0) -> bool:
        """Wait until no connection is open (``live`` is 0); ``False`` if ``timeout`` seconds pass first."""
        end = time.monotonic() + timeout
        while self.live:
            if time.monotonic() > end:
                return False
            time.sleep(0.02)
        return True

    def stop(self) -> None:
        """Close every connection and the listening socket; wait for the thread to end."""
        if self._loop is not None and self._thread is not None and self._thread.is_alive():
            self._loop.call_soon_threadsafe(self._stop.set)
            self._thread.join(15)
        self._loop = None

    def __enter__(self) -> StreamingASRServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


async def stream_clip(url: str, audio: np.ndarray, chunk_s: float, *, realtime: bool = True,
                      start: float | None = None) -> list[dict[str, Any]]:
    """Stream ``audio`` (16 kHz float samples) to ``url`` in ``chunk_s`` chunks
    (:func:`labkit.media.asr.chunks`), each sent when its last sample would have been spoken
    (``start`` + its end time, ``realtime``) or at once. One dict per chunk: ``seq, start_s, end_s,
    rtt_s`` (send returned -> partial received), ``wait_s, infer_s, text``. ``RuntimeError`` with
    the server's message when it rejects a frame."""
    spans = chunks(audio, chunk_s)
    frames = [encode_pcm16(audio[int(a * SAMPLE_RATE):int(b * SAMPLE_RATE)]) for a, b in spans]
    sent: dict[int, float] = {}
    out: list[dict[str, Any]] = []
    async with connect(url, compression=None, proxy=None, max_size=2**22) as ws:
        hello = json.loads(await ws.recv())
        if hello.get("type") != "ready":
            raise RuntimeError(f"expected the server's ready message, got {hello}")

        async def receive() -> None:
            while len(out) < len(frames):
                msg = json.loads(await ws.recv())
                arrived = time.perf_counter()
                if msg.get("type") != "partial":
                    raise RuntimeError(f"the server refused the stream: {msg.get('error', msg)}")
                a, b = spans[msg["seq"]]
                out.append(dict(seq=msg["seq"], start_s=a, end_s=b, rtt_s=arrived - sent[msg["seq"]],
                                wait_s=msg["wait_s"], infer_s=msg["infer_s"], text=msg["text"]))

        receiver = asyncio.create_task(receive())
        t0 = time.perf_counter() if start is None else start
        for i, (frame, (_, end)) in enumerate(zip(frames, spans, strict=True)):
            if realtime:
                await asyncio.sleep(max(0.0, t0 + end - time.perf_counter()))
            sent[i] = time.perf_counter()  # replaced below; a reply can never find the key missing
            await ws.send(frame)
            sent[i] = time.perf_counter()
            if receiver.done():
                break
        await receiver  # raises the server's refusal, if any
    return out


async def run_streams(url: str, audio: np.ndarray, chunk_s: float, streams: int,
                      realtime: bool = True) -> list[list[dict[str, Any]]]:
    """``streams`` clients streaming ``audio`` at once, chunk boundaries aligned (every stream's chunk
    arrives at the same moment: the worst case for queueing); one :func:`stream_clip` list each."""
    start = time.perf_counter() + 0.05
    return list(await asyncio.gather(*(stream_clip(url, audio, chunk_s, realtime=realtime, start=start)
                                       for _ in range(streams))))


async def send_raw(url: str, message: str | bytes) -> tuple[dict[str, Any], int | None]:
    """Send one frame as it is (e.g. a malformed one) and return the server's answer and close code."""
    async with connect(url, compression=None, proxy=None) as ws:
        await ws.recv()  # ready
        await ws.send(message)
        answer = json.loads(await ws.recv())
        await ws.wait_closed()
        return answer, ws.close_code


async def vanish(url: str, audio: np.ndarray, chunk_s: float = 1.0) -> None:
    """A client that sends one chunk and drops the TCP connection without a close handshake."""
    ws = await connect(url, compression=None, proxy=None)
    await ws.recv()  # ready
    await ws.send(encode_pcm16(audio[: int(chunk_s * SAMPLE_RATE)]))
    ws.transport.abort()  # a reset, as when a laptop lid shuts


def run_sync(fn: Callable[..., Awaitable[T]], *args: Any, **kwargs: Any) -> T:
    """``fn(*args, **kwargs)`` (a coroutine function) run to completion from synchronous code, Jupyter
    included (whose own event loop is busy): a fresh loop in a short-lived thread.
    ``run_sync(run_streams, url, audio, 1.0, 2)``."""
    box: dict[str, Any] = {}

    def main() -> None:
        try:
            box["value"] = asyncio.run(fn(*args, **kwargs))  # type: ignore[arg-type]
        except BaseException as e:
            box["error"] = e

    worker = threading.Thread(target=main, name="asr-websocket-client", daemon=True)
    worker.start()
    worker.join()
    if "error" in box:
        raise box["error"]
    return box["value"]
