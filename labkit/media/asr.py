"""Speech recognition with Whisper through faster-whisper (CTranslate2), timed correctly (chapter 07).

Whisper is an encoder-decoder transformer: the encoder reads a log-mel spectrogram of a fixed
30 s window, the decoder writes text tokens one at a time with a KV cache, like an LLM. The
timing pitfall: ``WhisperModel.transcribe`` returns a *lazy generator*; the decoding happens
while you iterate over the segments. :func:`transcribe` times the full consumption, reports
wall-clock and CPU time, and keeps model load time out of it. Wall-clock figures go through
:func:`labkit.hardware.microbench.timed`, the lab's one timer (CTranslate2 calls return when their
work is done, so it synchronizes the CPU only: no GPU clock to wait for).

Units: seconds throughout. ``rtf`` is the real-time factor, processing time / audio duration
(below 1 = faster than real time); ``x_realtime`` is its inverse, the "N x real-time" figure the
tutorial prints as "RTF". :func:`encoder_windows` counts the 30 s windows a clip costs.
"""

from __future__ import annotations

import os
import platform
import time
from pathlib import Path
from typing import Any

import numpy as np

from ..hardware.microbench import timed
from ..models import whisper_dir
from ..paths import DATA, used
from ..settings import profile

SAMPLE_RATE = 16_000  # Hz; Whisper resamples every input to this
WINDOW_S = 30.0  # seconds of audio the encoder always processes (shorter clips are padded)
MIN_CHUNK_S = 0.25  # shortest chunk worth sending on its own
REALTIME_TARGET_S = 0.200  # the tutorial's round-trip latency target per streamed chunk
AUDIO_DIR = DATA / "audio"
# Decoding options for clean comparisons: greedy temperature only (no fallback re-decodes),
# no timestamp tokens (with them faster-whisper sometimes decodes a second window), English.
CLEAN = dict(without_timestamps=True, temperature=0.0, language="en", condition_on_previous_text=False)


# Whisper large-v3's shape, from its config.json on the Hugging Face hub (openai/whisper-large-v3,
# read 2025): d_model 1280, 32 encoder and 32 decoder layers, FFN 5120, 1500 encoder positions per
# 30 s window, vocabulary 51,866.
WHISPER_LARGE_V3 = {"d_model": 1280, "encoder_layers": 32, "decoder_layers": 32, "ffn": 5120,
                    "positions": 1500, "vocab": 51866, "window_s": 30.0}



def whisper_device(device: str = "auto") -> tuple[str, str, str]:
    """``(device, compute_type, note)`` for CTranslate2: CUDA with float16 when a CUDA GPU is
    visible, else the CPU with int8. CTranslate2 has no Apple MPS backend: on a Mac the model
    runs on the CPU (int8), and the note says so."""
    import ctranslate2

    cuda = ctranslate2.get_cuda_device_count() > 0
    mac = platform.system() == "Darwin" and platform.machine() == "arm64"
    if device in ("auto", "cuda") and cuda:
        return "cuda", "float16", ""
    if device == "cuda":
        raise RuntimeError("device 'cuda' requested but CTranslate2 sees no CUDA GPU; use 'auto' or 'cpu'")
    if device not in ("auto", "cpu", "mps"):
        raise ValueError(f"unknown device {device!r}; use auto, cpu, cuda or mps")
    note = (
        "faster-whisper (CTranslate2) has no MPS backend: running on the CPU with int8"
        if mac or device == "mps"
        else ""
    )
    return "cpu", "int8", note


def load_whisper(
    name: str | None = None, device: str = "auto", compute_type: str | None = None, cpu_threads: int = 1
) -> tuple[Any, dict[str, Any]]:
    """Load a faster-whisper model; return ``(model, info)`` with info keys ``name, device,
    compute_type, load_s, note``. ``name``: ``tiny.en``/``base`` (bundled) or a size such as
    ``large-v3`` (full profile, downloads); default the profile's ``whisper``."""
    from faster_whisper import WhisperModel

    name = name or profile().whisper
    dev, default_ct, note = whisper_device(device)
    compute_type = compute_type or default_ct
    path = whisper_dir(name)
    model, load_s = timed(
        lambda: WhisperModel(
            path,
            device=dev,
            compute_type=compute_type,
            cpu_threads=cpu_threads,
            local_files_only=os.path.isdir(path),
        )
    )
    info = dict(name=name, device=dev, compute_type=compute_type, load_s=load_s, note=note)
    return model, info


def load_audio(path: str | Path) -> np.ndarray:
    """Decode an audio file to float32 mono samples at 16 kHz (bare names resolve in ``data/audio``)."""
    from faster_whisper import decode_audio

    path = Path(path)
    if not path.exists() and (AUDIO_DIR / path).exists():
        path = AUDIO_DIR / path
    if not path.exists():
        raise FileNotFoundError(
            f"{path} not found; the lab's clips are in {AUDIO_DIR} "
            "(recreate them with `python data/audio/make_audio.py`)"
        )
    used(path)
    return decode_audio(str(path), sampling_rate=SAMPLE_RATE)


def rtf(processing_s: float, audio_s: float) -> float:
    """Real-time factor: processing seconds per second of audio (below 1 = faster than real time)."""
    if audio_s <= 0:
        raise ValueError(f"audio duration must be positive, got {audio_s}")
    return processing_s / audio_s


def encoder_windows(audio_s: float) -> int:
    """30 s encoder windows Whisper pays for to transcribe ``audio_s`` seconds sequentially (at least 1)."""
    return max(1, int(np.ceil(audio_s / WINDOW_S - 1e-9)))


def transcribe(model: Any, audio: np.ndarray, beam_size: int = 1, **options: Any) -> dict[str, Any]:
    """Transcribe ``audio`` (16 kHz samples) and time it properly.

    Returns ``text``, ``audio_s``, ``call_s`` (time until ``transcribe()`` returned the lazy
    generator: not the work), ``wall_s`` and ``cpu_s`` (call plus consuming every segment;
    CPU time of this process, all threads), ``rtf`` (wall_s / audio_s), ``x_realtime`` and
    ``segments``. ``options`` override :data:`CLEAN` (e.g. ``language=None`` to detect it).
    """
    r = _consume_timed(lambda: model.transcribe(audio, beam_size=beam_size, **{**CLEAN, **options}), audio)
    r["rtf"] = rtf(r["wall_s"], r["audio_s"])
    return r


def _consume_timed(call: Any, audio: np.ndarray) -> dict[str, Any]:
    """Run a faster-whisper ``transcribe`` call and consume its lazy segment generator, timing both
    (wall clock through :func:`timed`; ``cpu_s`` is this process's CPU time, all threads)."""
    c0 = time.process_time()
    (lazy, info), call_s = timed(call)
    segments, consume_s = timed(lambda: list(lazy))  # the decoding happens here
    wall_s, cpu_s = call_s + consume_s, time.process_time() - c0
    audio_s = len(audio) / SAMPLE_RATE
    text = " ".join(s.text.strip() for s in segments).strip()
    return dict(
        text=text,
        audio_s=audio_s,
        call_s=call_s,
        wall_s=wall_s,
        cpu_s=cpu_s,
        x_realtime=audio_s / wall_s,
        language=info.language,
        segments=segments,
    )


def chunks(audio: np.ndarray, chunk_s: float) -> list[tuple[float, float]]:
    """Fixed ``(start_s, end_s)`` pieces covering ``audio``; the last may be shorter (a remainder
    under :data:`MIN_CHUNK_S` is merged into it rather than sent alone)."""
    if chunk_s <= 0:
        raise ValueError(f"chunk_s must be positive, got {chunk_s}")
    total = len(audio) / SAMPLE_RATE
    edges = [float(e) for e in np.arange(0.0, total, chunk_s)] + [total]
    if len(edges) > 2 and edges[-1] - edges[-2] < MIN_CHUNK_S:  # a sliver at the end joins the last chunk
        del edges[-2]
    return list(zip(edges[:-1], edges[1:], strict=True))


def stream(
    model: Any, audio: np.ndarray, chunk_s: float = 2.0, beam_size: int = 1, **options: Any
) -> list[dict[str, Any]]:
    """Simulated streaming: transcribe fixed ``chunk_s`` pieces one after another, as a live
    client would send them, each on its own (no context carried over). One dict per chunk:
    ``start_s, end_s`` and :func:`transcribe`'s fields; ``wall_s`` is that chunk's latency."""
    out = []
    for start, end in chunks(audio, chunk_s):
        r = transcribe(model, audio[int(start * SAMPLE_RATE) : int(end * SAMPLE_RATE)], beam_size, **options)
        out.append(dict(start_s=start, end_s=end, **r))
    return out


def batch_transcribe(
    model: Any, audio: np.ndarray, chunk_s: float = 2.0, batch_size: int = 8, beam_size: int = 1,
    **options: Any,
) -> dict[str, Any]:
    """The same fixed chunks as :func:`stream`, transcribed through faster-whisper's
    ``BatchedInferencePipeline`` (``batch_size`` windows per encoder/decoder call). Returns
    :func:`transcribe`'s fields (without ``rtf``) and ``chunks``."""
    from faster_whisper import BatchedInferencePipeline

    opts = {**CLEAN, **options}
    opts.pop("condition_on_previous_text", None)
    clips = [{"start": a, "end": b} for a, b in chunks(audio, chunk_s)]
    pipe = BatchedInferencePipeline(model)
    r = _consume_timed(
        lambda: pipe.transcribe(
            audio, beam_size=beam_size, batch_size=batch_size, clip_timestamps=clips, vad_filter=False, **opts
        ),
        audio,
    )
    r["chunks"] = len(clips)
    return r


def hour_seconds(x_realtime: float) -> float:
    """Seconds to transcribe one hour of audio at ``x_realtime`` times real time."""
    return 3600.0 / x_realtime


def whisper_params(shape: dict[str, float], n_mels: int = 128, text_positions: int = 448) -> int:
    """Parameters of a Whisper model of ``shape`` (``d_model``, ``encoder_layers``, ``decoder_layers``,
    ``ffn``, ``positions``, ``vocab``; e.g. :data:`WHISPER_LARGE_V3`): two convolutions
    and learned positions before the encoder, attention (q, v, out with bias, k without) and MLP blocks
    with layer norms, cross-attention in the decoder, a token embedding tied with the output layer.
    Large-v3 (128 mel bins): 1,543,490,560."""
    d, ffn = int(shape["d_model"]), int(shape["ffn"])
    attention = 4 * d * d + 3 * d
    mlp = 2 * d * ffn + ffn + d
    encoder_layer = attention + mlp + 2 * 2 * d
    decoder_layer = 2 * attention + mlp + 3 * 2 * d
    stem = (n_mels * d * 3 + d) + (d * d * 3 + d) + int(shape["positions"]) * d + 2 * d
    head = int(shape["vocab"]) * d + text_positions * d + 2 * d
    layers = int(shape["encoder_layers"]) * encoder_layer + int(shape["decoder_layers"]) * decoder_layer
    return layers + stem + head


def ctranslate2_supports(device: str) -> tuple[bool, str]:
    """``(supported, what CTranslate2 said)``: whether faster-whisper's backend accepts ``device``
    (``"cpu"``, ``"cuda"``, ``"mps"``) as a device name, asked through its compute-type query. A
    known device without hardware (CUDA on a CPU machine) counts as supported: the name is valid."""
    import ctranslate2

    try:
        types = ctranslate2.get_supported_compute_types(device)
    except ValueError as e:  # an unknown device name
        return False, f"ValueError: {e}"
    except RuntimeError as e:  # a known backend without a working device here
        return True, f"known device, none usable here: {' '.join(str(e).split())[:80]}"
    return True, f"compute types {', '.join(sorted(types))}"
