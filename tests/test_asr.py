"""labkit.media.asr: real-time factor, chunking, and a real (tiny) Whisper timed correctly (chapter 07)."""

import json

import numpy as np
import pytest

from labkit.media import asr
from labkit.media.wer import wer

TEXTS = json.loads((asr.AUDIO_DIR / "texts.json").read_text())


def test_rtf_and_window_arithmetic():
    assert asr.rtf(2.0, 10.0) == pytest.approx(0.2)
    assert asr.hour_seconds(900.0) == pytest.approx(4.0)  # the tutorial's "1 hour in 4 s" = 900x
    assert [asr.encoder_windows(s) for s in (0.5, 30.0, 30.5, 61)] == [1, 1, 2, 3]
    with pytest.raises(ValueError):
        asr.rtf(1.0, 0.0)


def test_transcribe_times_the_call_and_the_lazy_decoding_with_the_lab_timer(monkeypatch):
    from types import SimpleNamespace

    clock = iter([0.01, 1.5])  # the call returns a lazy generator fast; consuming it does the work
    used = []

    def timed(fn, device="cpu"):
        used.append(device)
        return fn(), next(clock)

    monkeypatch.setattr(asr, "timed", timed)
    segments = (SimpleNamespace(text=f" word{i} ") for i in range(3))
    model = SimpleNamespace(transcribe=lambda audio, **kw: (segments, SimpleNamespace(language="en")))
    r = asr.transcribe(model, np.zeros(3 * asr.SAMPLE_RATE, dtype=np.float32))
    assert used == ["cpu", "cpu"] and r["text"] == "word0 word1 word2" and len(r["segments"]) == 3
    assert r["call_s"] == 0.01 and r["wall_s"] == pytest.approx(1.51) and r["audio_s"] == 3.0
    assert r["rtf"] == pytest.approx(1.51 / 3.0) and r["x_realtime"] == pytest.approx(3.0 / 1.51)


def test_chunks_cover_the_audio_and_merge_a_sliver():
    audio = np.zeros(int(7.1 * asr.SAMPLE_RATE), dtype=np.float32)
    pieces = asr.chunks(audio, 2.0)
    assert pieces[0] == (0.0, 2.0) and pieces[-1][1] == pytest.approx(7.1)
    assert all(b > a for a, b in pieces)
    assert all(p[1] == q[0] for p, q in zip(pieces, pieces[1:], strict=False))
    assert len(pieces) == 4  # 0-2, 2-4, 4-6, 6-7.1
    assert len(asr.chunks(np.zeros(int(6.1 * asr.SAMPLE_RATE)), 2.0)) == 3  # 0.1 s tail joins 4-6
    with pytest.raises(ValueError):
        asr.chunks(audio, 0)


def test_shipped_clips_are_16khz_mono_and_match_their_texts():
    for name, text in TEXTS.items():
        audio = asr.load_audio(f"{name}.wav")
        seconds = len(audio) / asr.SAMPLE_RATE
        words_per_min = len(text.split()) / seconds * 60
        assert 100 < words_per_min < 200, (name, words_per_min)
    with pytest.raises(FileNotFoundError, match="make_audio"):
        asr.load_audio("missing.wav")


def test_cpu_gets_int8():
    device, compute_type, _ = asr.whisper_device("cpu")
    assert (device, compute_type) == ("cpu", "int8")
    with pytest.raises(ValueError):
        asr.whisper_device("tpu")


@pytest.mark.slow
def test_tiny_whisper_transcribes_and_the_timer_covers_the_decoding():
    model, info = asr.load_whisper("tiny.en", device="cpu")
    assert info["load_s"] > 0 and info["compute_type"] == "int8"
    audio = asr.load_audio("sentence.wav")
    r = asr.transcribe(model, audio, beam_size=5)
    assert wer(TEXTS["sentence"], r["text"]) <= 0.4, r["text"]  # measured 0.11 (jump/jumps)
    # transcribe() hands back a lazy generator: the work happens while consuming it.
    assert r["wall_s"] > 2 * r["call_s"]
    assert r["cpu_s"] > 0 and r["rtf"] == pytest.approx(r["wall_s"] / r["audio_s"])
    parts = asr.stream(model, audio, chunk_s=2.0)
    assert [round(p["start_s"], 1) for p in parts] == [0.0, 2.0]
    assert all(p["wall_s"] > 0 for p in parts)


def test_whisper_params_match_the_published_counts():
    from labkit.media.asr import WHISPER_LARGE_V3

    assert asr.whisper_params(WHISPER_LARGE_V3) == 1_543_490_560  # openai/whisper-large-v3
    base: dict[str, float] = dict(d_model=512, encoder_layers=6, decoder_layers=6, ffn=2048, positions=1500,
                                  vocab=51865)
    assert asr.whisper_params(base, n_mels=80) == 72_593_920  # openai/whisper-base


def test_ctranslate2_knows_no_mps_device():
    ok, said = asr.ctranslate2_supports("mps")
    assert ok is False and "mps" in said
    assert asr.ctranslate2_supports("cpu")[0] is True
