"""Make the test speech for chapter 07 from texts.json with espeak-ng (the committed WAVs came from this).

    apt-get install -y espeak-ng          # Debian/Ubuntu; `brew install espeak-ng` on macOS
    .venv/bin/python data/audio/make_audio.py

Voice en-us at 145 words per minute (the default voice was recognised far worse), written as
16 kHz mono 16-bit WAV, the rate Whisper resamples everything to anyway. espeak-ng speaks at
22,050 Hz; the signal is resampled with scipy's polyphase filter.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import tempfile
import wave
from pathlib import Path

import numpy as np
from scipy.signal import resample_poly

HERE = Path(__file__).resolve().parent
VOICE, WPM, RATE = "en-us", 145, 16_000


def speak(text: str) -> tuple[np.ndarray, int]:
    """espeak-ng's waveform for ``text`` as int16 samples and its sample rate."""
    if shutil.which("espeak-ng") is None:
        raise SystemExit("espeak-ng not found: `apt-get install -y espeak-ng` (or `brew install espeak-ng`)")
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "speech.wav"
        subprocess.run(
            ["espeak-ng", "-v", VOICE, "-s", str(WPM), "-w", str(path), text], check=True, capture_output=True
        )
        with wave.open(str(path)) as w:
            if w.getnchannels() != 1 or w.getsampwidth() != 2:
                raise SystemExit(f"expected 16-bit mono from espeak-ng, got {w.getparams()}")
            return np.frombuffer(w.readframes(w.getnframes()), dtype=np.int16), w.getframerate()


def write_wav(path: Path, samples: np.ndarray, rate: int) -> None:
    with wave.open(str(path), "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(rate)
        w.writeframes(samples.astype(np.int16).tobytes())


def main() -> None:
    texts = json.loads((HERE / "texts.json").read_text())
    for name, text in texts.items():
        samples, rate = speak(text)
        out = resample_poly(samples.astype(np.float64), RATE, rate)
        out = np.clip(np.round(out), -32768, 32767)
        write_wav(HERE / f"{name}.wav", out, RATE)
        print(f"{name}.wav: {len(out) / RATE:.1f} s, {len(text.split())} words")


if __name__ == "__main__":
    main()
