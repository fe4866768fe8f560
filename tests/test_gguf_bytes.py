"""Bytes a batch-1 decode step reads from a GGUF (chapter 04, labkit.llm.gguf_bytes): tensor bytes from
the file's tensors, the KV cache from its metadata, on a tiny written GGUF and on the bundled model."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from labkit.llm.gguf_bytes import gguf_bytes_per_token


def _tiny(path: Path, key_length: int | None = None) -> Path:
    import gguf

    w = gguf.GGUFWriter(str(path), "llama")
    w.add_block_count(2)
    w.add_embedding_length(64)
    w.add_head_count(4)
    w.add_head_count_kv(2)
    if key_length:
        w.add_key_length(key_length)
    w.add_token_list([f"tok{i}" for i in range(100)])  # metadata: in the file, not in the bytes read
    w.add_tensor("token_embd.weight", np.ones((100, 64), dtype=np.float16))
    w.add_tensor("output_norm.weight", np.ones(64, dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def test_tiny_gguf(tmp_path):
    b = gguf_bytes_per_token(_tiny(tmp_path / "t.gguf"), context=10)
    assert b["weights"] == 100 * 64 * 2 + 64 * 4
    assert (b["layers"], b["kv_heads"], b["head_dim"]) == (2, 2, 16)  # head dim = 64 / 4 heads
    assert b["kv"] == 2 * 2 * 2 * 16 * 10 * 2  # K and V x layers x KV heads x head dim x tokens x f16
    assert b["total"] == b["weights"] + b["kv"] and b["file_bytes"] > b["weights"]
    assert gguf_bytes_per_token(tmp_path / "t.gguf")["kv"] == 0  # an empty context reads weights only


def test_key_length_wins_over_the_division(tmp_path):
    b = gguf_bytes_per_token(_tiny(tmp_path / "k.gguf", key_length=32), context=1, kv_dtype_bytes=1)
    assert b["head_dim"] == 32 and b["kv"] == 2 * 2 * 2 * 32


def test_metadata_missing(tmp_path):
    import gguf

    w = gguf.GGUFWriter(str(tmp_path / "m.gguf"), "llama")
    w.add_tensor("x", np.ones(4, dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    with pytest.raises(ValueError, match="block_count"):
        gguf_bytes_per_token(tmp_path / "m.gguf")


def test_bundled_model():
    from labkit.models import gguf_path

    b = gguf_bytes_per_token(gguf_path(), context=32)
    # SmolLM2-135M: 30 layers, 3 KV heads of 64; f16 KV = 23,040 bytes per token
    assert (b["layers"], b["kv_heads"], b["head_dim"]) == (30, 3, 64) and b["kv"] == 32 * 23_040
    assert 90e6 < b["weights"] < b["file_bytes"] < 100e6
