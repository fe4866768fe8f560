"""A GGUF file's header read in milliseconds: its file type and every tensor's type, element count
and bytes (chapter 06 compares llama.cpp's quantization levels with it).

``gguf.GGUFReader`` builds a numpy view of every metadata value, so a model with a 49k-token
vocabulary takes seconds to open; this reader walks the same layout and skips what it does not
need (the tokenizer's strings are skipped by their lengths). The layout, little-endian: ``GGUF``,
a uint32 version (2 or 3), uint64 tensor and key/value counts; each key/value is a string key (uint64
length + UTF-8 bytes), a uint32 value type and the value (an array is a uint32 element type, a uint64
count and the elements); then each tensor's name, uint32 dimension count, uint64 dimensions, uint32
``ggml`` type and uint64 data offset. Sizes in bytes.
"""

from __future__ import annotations

import mmap
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# value types: struct format of the fixed-size ones (8 = string, 9 = array)
_FIXED = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}
_STRING, _ARRAY = 8, 9


@dataclass(frozen=True)
class Tensor:
    """One tensor's entry in the header: its ``ggml`` type name (``Q4_0``, ``F16``...), weights and bytes."""

    name: str
    type: str
    params: int
    bytes: int


@dataclass(frozen=True)
class Header:
    """What :func:`read_header` returns: the format ``version``, the scalar metadata (``general.*``,
    architecture keys; arrays are left out) and the tensors in file order."""

    version: int
    metadata: dict[str, Any]
    tensors: list[Tensor]


class _Cursor:
    def __init__(self, buf: mmap.mmap) -> None:
        self.buf, self.pos = buf, 0

    def take(self, fmt: str) -> Any:
        (v,) = struct.unpack_from("<" + fmt, self.buf, self.pos)
        self.pos += struct.calcsize(fmt)
        return v

    def string(self) -> str:
        n = self.take("Q")
        s = bytes(self.buf[self.pos:self.pos + n]).decode("utf-8", errors="replace")
        self.pos += n
        return s

    def skip_value(self, vtype: int) -> None:
        if vtype == _STRING:
            n = self.take("Q")  # (``self.pos += self.take(...)`` would read pos before take moves it)
            self.pos += n
        elif vtype == _ARRAY:
            etype, count = self.take("I"), self.take("Q")
            if etype in _FIXED:
                self.pos += count * struct.calcsize(_FIXED[etype])
            else:
                for _ in range(count):
                    self.skip_value(etype)
        else:
            self.pos += struct.calcsize(_FIXED[vtype])


def read_header(path: str | Path) -> Header:
    """The header of the GGUF file at ``path`` (tensor data is never read). ``ValueError`` when the
    file is not GGUF version 2 or 3, or names a ``ggml`` type the ``gguf`` package does not know."""
    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as buf:
        c = _Cursor(buf)
        if buf[:4] != b"GGUF":
            raise ValueError(f"{path} is not a GGUF file (it does not start with 'GGUF')")
        c.pos = 4
        version = c.take("I")
        if version not in (2, 3):
            raise ValueError(f"{path}: GGUF version {version}; this reader knows versions 2 and 3")
        n_tensors, n_kv = c.take("Q"), c.take("Q")
        metadata: dict[str, Any] = {}
        for _ in range(n_kv):
            key, vtype = c.string(), c.take("I")
            if vtype in _FIXED:
                metadata[key] = c.take(_FIXED[vtype])
            elif vtype == _STRING:
                metadata[key] = c.string()
            else:
                c.skip_value(vtype)
        tensors = []
        for _ in range(n_tensors):
            name, n_dims = c.string(), c.take("I")
            params = 1
            for _ in range(n_dims):
                params *= c.take("Q")
            try:
                qtype = GGMLQuantizationType(c.take("I"))
            except ValueError as e:
                raise ValueError(f"{path}: tensor {name} has a ggml type unknown to the gguf package") from e
            c.take("Q")  # data offset
            block, block_bytes = GGML_QUANT_SIZES[qtype]
            tensors.append(Tensor(name, qtype.name, params, params // block * block_bytes))
    return Header(version, metadata, tensors)


def summary(path: str | Path) -> dict[str, Any]:
    """Weights and bytes of a GGUF file's tensors: ``params``, ``bytes`` (tensor data only, without the
    metadata), ``bits_per_weight`` (8 x bytes / params), ``file_bytes`` (the whole file), ``file_type``
    (``general.file_type``, a number; :data:`labkit.engines.llamacpp` names it) and ``types``:
    {type name: {"tensors", "params", "bytes"}}."""
    h = read_header(path)
    types: dict[str, dict[str, int]] = {}
    for t in h.tensors:
        row = types.setdefault(t.type, {"tensors": 0, "params": 0, "bytes": 0})
        row["tensors"] += 1
        row["params"] += t.params
        row["bytes"] += t.bytes
    params, nbytes = sum(t.params for t in h.tensors), sum(t.bytes for t in h.tensors)
    bits = 8 * nbytes / params if params else float("nan")
    return {"params": params, "bytes": nbytes, "bits_per_weight": bits,
            "file_bytes": Path(path).stat().st_size, "file_type": h.metadata.get("general.file_type"),
            "types": types}
