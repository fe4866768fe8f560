"""labkit.media.asr_stream: the WebSocket ASR protocol, bad frames, vanished clients, queueing (chapter 07).

A fake transcriber stands in for Whisper (it sleeps, counts how many run at once and returns the
chunk's length), so these run in seconds; the notebook drives the real model."""

import asyncio
import socket
import threading
import time

import numpy as np
import pytest

from labkit.media import asr_stream as st
from labkit.media.asr import SAMPLE_RATE

SPEECH = (0.3 * np.sin(np.linspace(0, 2000 * np.pi, int(3.2 * SAMPLE_RATE)))).astype(np.float32)


class Fake:
    """Takes ``delay_s`` per chunk, answers with the chunk's sample count; records peak concurrency."""

    def __init__(self, delay_s: float = 0.0):
        self.delay_s, self.now, self.peak, self.lock = delay_s, 0, 0, threading.Lock()

    def __call__(self, audio: np.ndarray) -> str:
        with self.lock:
            self.now += 1
            self.peak = max(self.peak, self.now)
        time.sleep(self.delay_s)
        with self.lock:
            self.now -= 1
        return f"{len(audio)} samples"


def wait_for(cond, timeout=5.0):
    t0 = time.monotonic()
    while not cond():
        if time.monotonic() - t0 > timeout:
            return False
        time.sleep(0.02)
    return True


def test_pcm16_round_trip_and_frame_validation():
    frame = st.encode_pcm16(SPEECH[:SAMPLE_RATE])
    assert len(frame) == 2 * SAMPLE_RATE
    audio, code, error = st.check_frame(frame, 0.1, 5.0)
    assert audio is not None
    assert code == 1000 and error == "" and np.abs(audio - SPEECH[:SAMPLE_RATE]).max() < 1e-4
    assert st.check_frame("hello", 0.1, 5.0)[1] == 1003
    assert st.check_frame(frame[:-1], 0.1, 5.0)[1] == 1007  # odd byte count
    short = st.check_frame(frame[:1000], 0.1, 5.0)  # 31 ms
    assert short[1] == 1007 and "minimum" in short[2]
    long = st.check_frame(st.encode_pcm16(np.zeros(6 * SAMPLE_RATE)), 0.1, 5.0)
    assert long[1] == 1009 and "split" in long[2]


def test_one_stream_gets_a_partial_per_chunk_in_order_with_its_text():
    with st.StreamingASRServer(Fake(0.01)) as server:
        out = st.run_sync(st.stream_clip, server.url, SPEECH, 1.0, realtime=False)
        assert server.url.startswith("ws://127.0.0.1:") and server.port > 0
        assert wait_for(lambda: server.live == 0)
    assert [r["seq"] for r in out] == [0, 1, 2]  # 3.2 s in 1 s chunks: the 0.2 s tail joins the last
    assert [r["text"] for r in out] == ["16000 samples", "16000 samples", "19200 samples"]
    assert all(r["rtt_s"] > 0 and r["infer_s"] >= 0.009 and r["wait_s"] < 0.05 for r in out)
    assert out[-1]["rtt_s"] > 2 * 0.009  # sent at once, the last chunk waited for the two before it
    assert server.chunks == 3 and server.opened == 1 and server.dropped == 0


def test_realtime_pacing_sends_each_chunk_when_its_audio_has_been_spoken():
    with st.StreamingASRServer(Fake()) as server:
        t0 = time.perf_counter()
        st.run_sync(st.stream_clip, server.url, SPEECH[: 2 * SAMPLE_RATE], 0.5)
        took = time.perf_counter() - t0
    assert 1.9 < took < 3.0  # 2 s of audio at real-time pace, not at once


@pytest.mark.parametrize("bad, code", [("text instead of audio", 1003), (b"\x00" * 3201, 1007),
                                       (b"\x00" * 200, 1007), (b"\x00" * (2 * 6 * SAMPLE_RATE), 1009)])
def test_a_bad_frame_gets_an_error_and_a_close_code_and_the_server_serves_on(bad, code):
    with st.StreamingASRServer(Fake()) as server:
        msg, close_code = st.run_sync(st.send_raw, server.url, bad)
        assert msg["type"] == "error" and msg["code"] == code == close_code
        assert "send" in msg["error"] or "split" in msg["error"]  # says what to do
        out = st.run_sync(st.stream_clip, server.url, SPEECH, 2.0, realtime=False)  # still serving
        assert len(out) == 2 and server.rejected == 1
        assert server.wait_idle(5)


def test_the_client_raises_the_servers_refusal():
    with st.StreamingASRServer(Fake(), max_chunk_s=0.5) as server, pytest.raises(RuntimeError, match="split"):
        st.run_sync(st.stream_clip, server.url, SPEECH, 1.0, realtime=False)


def test_a_client_that_vanishes_mid_stream_frees_its_session_and_tasks():
    with st.StreamingASRServer(Fake(0.2)) as server:
        idle_tasks = server.tasks()
        st.run_sync(st.vanish, server.url, SPEECH)  # reset while its chunk is being transcribed
        assert wait_for(lambda: server.opened == 1 and server.live == 0), server.live
        assert wait_for(lambda: server.tasks() == idle_tasks)
        assert server.dropped == 1
        assert len(st.run_sync(st.stream_clip, server.url, SPEECH, 2.0, realtime=False)) == 2


def test_a_silent_half_open_client_is_dropped_by_the_keepalive_ping():
    with st.StreamingASRServer(Fake(), ping_interval=0.2, ping_timeout=0.2, close_timeout=0.2) as server:
        idle_tasks = server.tasks()
        sock = socket.create_connection(("127.0.0.1", server.port))
        sock.sendall(b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
                     b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n")
        assert b"101" in sock.recv(4096).split(b"\r\n")[0]  # upgraded; now it never answers a ping
        assert wait_for(lambda: server.live == 1, 2)
        assert wait_for(lambda: server.live == 0 and server.tasks() == idle_tasks, 3)
        sock.close()
    assert server.dropped == 1


@pytest.mark.parametrize("parallel", [1, 3])
def test_concurrent_streams_queue_for_the_inference_slots(parallel):
    fake = Fake(0.15)
    with st.StreamingASRServer(fake, parallel=parallel) as server:
        runs = st.run_sync(st.run_streams, server.url, SPEECH[:SAMPLE_RATE], 1.0, 3, realtime=False)
        assert wait_for(lambda: server.live == 0)
    assert fake.peak == parallel and server.chunks == 3 and server.opened == 3
    waits = sorted(r["wait_s"] for run in runs for r in run)
    if parallel == 1:  # the second waits one inference, the third two
        assert waits[0] < 0.05 and 0.1 < waits[1] < 0.25 and 0.25 < waits[2] < 0.45
        assert sorted(run[0]["rtt_s"] for run in runs)[2] > 0.4
    else:
        assert waits[-1] < 0.05


def test_bad_settings_are_refused_and_run_sync_reraises():
    with pytest.raises(ValueError, match="parallel"):
        st.StreamingASRServer(Fake(), parallel=0)
    with pytest.raises(ValueError, match="min_chunk_s"):
        st.StreamingASRServer(Fake(), min_chunk_s=2, max_chunk_s=1)

    async def boom():
        await asyncio.sleep(0)
        raise KeyError("x")

    with pytest.raises(KeyError):
        st.run_sync(boom)
    with pytest.raises(RuntimeError, match="not running"):
        st.StreamingASRServer(Fake()).tasks()
