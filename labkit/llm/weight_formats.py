"""How weights are stored and loaded: safetensors, pickle checkpoints, GGUF (chapter 05).

* safetensors: an 8-byte little-endian header length, a JSON header (name -> dtype, shape,
  byte offsets), then raw tensor bytes. Nothing in it can run code, and a loader can
  memory-map it so that opening costs almost nothing and bytes are read when first used.
* ``torch.save`` checkpoints are zip files holding a *pickle*. Unpickling may call any
  importable function the file names, so a crafted file runs code when loaded.
  ``torch.load(weights_only=True)`` (the default since PyTorch 2.6) only accepts tensors and
  plain containers and refuses anything else. This module writes such a crafted file to show
  the refusal; it never loads it unsafely.
* GGUF (llama.cpp, Ollama): a header of key/value metadata, then tensors, many of them
  quantized in blocks of 32 weights that share a scale (and a minimum).

Times in seconds, sizes in bytes.
"""

from __future__ import annotations

import collections
import functools
import io
import json
import pickle
import pickletools
import struct
import time
import zipfile
from pathlib import Path
from typing import Any

import numpy as np

from .gguf_header import read_header

# --- safetensors -------------------------------------------------------------------------------


def read_safetensors_header(path: str | Path) -> dict[str, Any]:
    """The JSON header of a ``.safetensors`` file, read by hand: first 8 bytes are the header
    length (little-endian u64), then that many bytes of JSON. No tensor data is read."""
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        if n > 100_000_000:
            raise ValueError(f"{path}: header length {n} is implausible; is this a safetensors file?")
        return json.loads(f.read(n))


def touch_pages(state_dict: dict[str, Any], page_bytes: int = 4096) -> float:
    """Read one element per memory page of every tensor (forces a memory-mapped file into RAM
    without doing real arithmetic). Returns a number so the work cannot be skipped."""
    total = 0.0
    for t in state_dict.values():
        flat = t.reshape(-1)
        step = max(1, page_bytes // t.element_size())
        total += float(flat[::step].float().sum())
    return total


def write_pickle_copy(safetensors_path: str | Path, out: str | Path) -> Path:
    """Write the tensors of a safetensors file as a ``torch.save`` (pickle) checkpoint at ``out``
    (kept if it already exists and is newer). Returns ``out``."""
    import torch
    from safetensors.torch import load_file

    out, src = Path(out), Path(safetensors_path)
    if not out.exists() or out.stat().st_mtime < src.stat().st_mtime:
        out.parent.mkdir(parents=True, exist_ok=True)
        tmp = out.with_suffix(".tmp")
        torch.save(load_file(src), tmp)
        tmp.replace(out)
    return out


def time_loads(safetensors_path: str | Path, pickle_path: str | Path, repeats: int = 5) -> dict[str, dict]:
    """Load the same weights several ways, interleaved, each repetition in turn.

    For each way, ``{"open_s": median seconds until the call returns, "ready_s": median seconds
    until every page of every tensor has been read}``, both from the same runs. Ways:
    ``safetensors`` (``load_file``, memory-mapped), ``safetensors one tensor`` (``safe_open`` +
    one ``get_tensor``: what a loader that shards or streams weights pays up front),
    ``torch.load`` (``weights_only=True``, reads everything) and ``torch.load mmap``
    (``weights_only=True, mmap=True``).
    Files are read through the OS page cache: a first, cold read from disk is slower for all.
    """
    import torch
    from safetensors import safe_open
    from safetensors.torch import load_file

    st, pt = str(safetensors_path), str(pickle_path)
    with safe_open(st, framework="pt") as f:
        first = next(iter(f.keys()))

    def st_one() -> dict[str, Any]:
        with safe_open(st, framework="pt") as f:
            return {first: f.get_tensor(first)}

    ways = {
        "safetensors": lambda: load_file(st),
        "safetensors one tensor": st_one,
        "torch.load": lambda: torch.load(pt, weights_only=True),
        "torch.load mmap": lambda: torch.load(pt, weights_only=True, mmap=True),
    }
    for warm in ("safetensors", "torch.load"):  # warm-up: both files in the page cache
        touch_pages(ways[warm]())
    times: dict[str, dict[str, list[float]]] = {k: {"open_s": [], "ready_s": []} for k in ways}
    for _ in range(repeats):  # interleaved: each repetition loads every way once, in turn
        for name, fn in ways.items():
            t0 = time.perf_counter()
            sd = fn()
            t1 = time.perf_counter()
            touch_pages(sd)
            t2 = time.perf_counter()
            del sd
            times[name]["open_s"].append(t1 - t0)
            times[name]["ready_s"].append(t2 - t0)
    return {k: {m: float(np.median(v)) for m, v in t.items()} for k, t in times.items()}


# --- the pickle hazard -------------------------------------------------------------------------


class _Payload:
    """An object whose pickle says "call exec(code)" when unpickled. Used only to *write* a
    crafted file; pickling it runs nothing (``__reduce__`` only returns a description)."""

    def __init__(self, code: str):
        self.code = code

    def __reduce__(self) -> tuple[Any, ...]:
        return (exec, (self.code,))


def write_crafted_checkpoint(path: str | Path, marker: str | Path) -> Path:
    """Write a ``torch.save`` checkpoint that looks like weights but whose pickle would, if
    loaded unsafely, create the file ``marker``. Returns ``path``. NEVER load it with
    ``weights_only=False`` or ``pickle.load``; :func:`safe_load` shows it being refused."""
    import torch

    code = f"open({str(marker)!r}, 'w').write('this ran because a checkpoint was unpickled')"
    torch.save({"weight": torch.zeros(4, 4), "config": _Payload(code)}, str(path))
    return Path(path)


def pickle_globals(path: str | Path) -> list[str]:
    """The functions and classes a ``torch.save`` checkpoint's pickle names that ``weights_only``
    does not allow (``torch.serialization.get_unsafe_globals_in_checkpoint``: read, never run)."""
    import torch

    return list(torch.serialization.get_unsafe_globals_in_checkpoint(str(path)))


def safe_load(path: str | Path) -> tuple[bool, str]:
    """Try ``torch.load(path, weights_only=True)``. Returns ``(True, "")`` when it loaded, else
    ``(False, the reason it was refused)``, e.g. "WeightsUnpickler error: Unsupported global:
    GLOBAL exec was not an allowed global by default"."""
    import torch

    try:
        torch.load(str(path), weights_only=True)
    except pickle.UnpicklingError as e:
        lines = [ln.strip() for ln in str(e).splitlines() if ln.strip()]
        reason = next((ln for ln in lines if "Unsupported global" in ln), lines[0] if lines else repr(e))
        return False, reason.split(". Please use")[0]
    return True, ""


# --- GGUF --------------------------------------------------------------------------------------


@functools.lru_cache(maxsize=2)
def _gguf_reader(path: str) -> Any:
    """``gguf.GGUFReader`` of ``path`` (for tensor data: :func:`gguf_tensor`). Opening it takes
    seconds in Python (the tokenizer's 49k strings): open once."""
    import gguf

    return gguf.GGUFReader(path)


def gguf_summary(path: str | Path) -> dict[str, Any]:
    """Tensors of a GGUF file grouped by type: ``{"types": {type name: {"tensors", "params",
    "bytes", "block_size", "block_bytes", "bits_per_weight"}}, "params", "bytes", "metadata":
    {key: value} for the scalar ``general.*`` and architecture keys}``. Read from the header alone
    (:func:`labkit.llm.gguf_header.read_header`, milliseconds; ``gguf.GGUFReader`` takes seconds),
    with the ``gguf`` package's block sizes."""
    import gguf

    header = read_header(path)
    types: dict[str, dict[str, Any]] = collections.defaultdict(
        lambda: {"tensors": 0, "params": 0, "bytes": 0})
    for t in header.tensors:
        row = types[t.type]
        block, block_bytes = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType[t.type]]
        row.update(block_size=block, block_bytes=block_bytes, bits_per_weight=8 * block_bytes / block)
        row["tensors"] += 1
        row["params"] += t.params
        row["bytes"] += t.bytes
    meta = {k: v for k, v in header.metadata.items()
            if not k.startswith("tokenizer.") and isinstance(v, str | int | float)}
    return {"types": dict(types), "params": sum(r["params"] for r in types.values()),
            "bytes": sum(r["bytes"] for r in types.values()), "metadata": meta}


def gguf_tensor(path: str | Path, name: str | None = None, type_name: str = "Q4_1") -> Any:
    """The raw ``gguf.ReaderTensor`` called ``name``, or the first tensor of ``type_name``."""
    for t in _gguf_reader(str(path)).tensors:
        if (name is not None and t.name == name) or (name is None and t.tensor_type.name == type_name):
            return t
    raise KeyError(f"no tensor {name or 'of type ' + type_name} in {path}")


def dequantize_q4_1_block(block: bytes | np.ndarray) -> np.ndarray:
    """Decode one 20-byte Q4_1 block into 32 float32 weights, by hand: bytes 0-1 are the scale
    ``d`` (float16), 2-3 the minimum ``m`` (float16), then 16 bytes of 4-bit codes ``q`` (low
    nibbles are weights 0-15, high nibbles 16-31); each weight is ``d * q + m``."""
    raw = np.frombuffer(bytes(block), dtype=np.uint8)
    if raw.size != 20:
        raise ValueError(f"a Q4_1 block is 20 bytes, got {raw.size}")
    d, m = raw[:4].view(np.float16).astype(np.float32)
    qs = raw[4:]
    q = np.concatenate([qs & 0x0F, qs >> 4]).astype(np.float32)
    return d * q + m


def pickle_disassembly(path: str | Path) -> str:
    """The opcodes of a ``torch.save`` checkpoint's pickle (``data.pkl`` in its zip) as text, from
    ``pickletools.dis``: it decodes the instructions without executing any of them, so the
    ``GLOBAL``/``STACK_GLOBAL`` + ``REDUCE`` pair that would call a function can be read safely."""
    with zipfile.ZipFile(path) as z:
        name = next(n for n in z.namelist() if n.endswith("data.pkl"))
        data = z.read(name)
    out = io.StringIO()
    pickletools.dis(data, out=out)
    return out.getvalue()
