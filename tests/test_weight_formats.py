import numpy as np
import pytest
import torch
from safetensors import safe_open
from safetensors.torch import save_file

from labkit.llm import weight_formats as wf


@pytest.fixture
def tiny_checkpoint(tmp_path):
    sd = {"a.weight": torch.randn(64, 32), "b.bias": torch.arange(10, dtype=torch.bfloat16)}
    st = tmp_path / "m.safetensors"
    save_file(sd, str(st))
    return sd, st


def test_header_read_by_hand_matches_safe_open(tiny_checkpoint):
    sd, st = tiny_checkpoint
    header = wf.read_safetensors_header(st)
    with safe_open(str(st), framework="pt") as f:
        assert sorted(k for k in header if k != "__metadata__") == sorted(f.keys())
    assert header["a.weight"]["dtype"] == "F32" and header["a.weight"]["shape"] == [64, 32]
    start, end = header["b.bias"]["data_offsets"]
    assert end - start == 10 * 2


def test_header_rejects_a_non_safetensors_file(tmp_path):
    bad = tmp_path / "bad.safetensors"
    bad.write_bytes(b"\xff" * 16)
    with pytest.raises(ValueError, match="implausible"):
        wf.read_safetensors_header(bad)


def test_pickle_copy_and_load_timings(tiny_checkpoint, tmp_path):
    sd, st = tiny_checkpoint
    pt = wf.write_pickle_copy(st, tmp_path / "m.pt")
    loaded = torch.load(pt, weights_only=True)  # our own file, plain tensors
    assert all(torch.equal(loaded[k], sd[k]) for k in sd)
    r = wf.time_loads(st, pt, repeats=2)
    assert set(r) == {"safetensors", "safetensors one tensor", "torch.load", "torch.load mmap"}
    assert all(v["open_s"] > 0 and v["ready_s"] > 0 for v in r.values())


def test_touch_pages_reads_every_tensor():
    sd = {"x": torch.ones(10_000), "y": torch.ones(3)}
    assert wf.touch_pages(sd, page_bytes=4) == 10_003


def test_crafted_checkpoint_is_refused_and_never_runs(tmp_path):
    marker = tmp_path / "PWNED"
    path = wf.write_crafted_checkpoint(tmp_path / "evil.pt", marker)
    assert not marker.exists()  # writing it ran nothing
    assert "builtins.exec" in wf.pickle_globals(path)  # the pickle asks for exec(...)
    ok, message = wf.safe_load(path)
    assert not ok and "exec" in message
    assert not marker.exists()  # and refusing it ran nothing either


def test_safe_load_accepts_plain_weights(tmp_path):
    torch.save({"w": torch.zeros(2)}, tmp_path / "ok.pt")
    assert wf.safe_load(tmp_path / "ok.pt") == (True, "")
    assert wf.pickle_globals(tmp_path / "ok.pt") == []


def test_q4_1_block_by_hand_matches_gguf_library():
    import gguf

    rng = np.random.default_rng(0)
    blocks = np.concatenate([
        np.array([0.05, -0.4], dtype=np.float16).view(np.uint8)[None, :].repeat(3, 0),
        rng.integers(0, 256, size=(3, 16), dtype=np.uint8)], axis=1)
    expected = gguf.quants.dequantize(blocks.reshape(-1), gguf.GGMLQuantizationType.Q4_1)
    ours = np.concatenate([wf.dequantize_q4_1_block(b) for b in blocks])
    np.testing.assert_allclose(ours, expected.reshape(-1), rtol=1e-6)
    with pytest.raises(ValueError):
        wf.dequantize_q4_1_block(b"\x00" * 19)


def test_gguf_summary_and_blocks_of_a_written_file(tmp_path):
    import gguf

    path = tmp_path / "tiny.gguf"
    x = np.random.default_rng(0).standard_normal((4, 64)).astype(np.float32)
    q = gguf.quants.quantize(x, gguf.GGMLQuantizationType.Q4_1)
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_block_count(2)
    w.add_tensor("blk.0.ffn_down.weight", q, raw_shape=q.shape, raw_dtype=gguf.GGMLQuantizationType.Q4_1)
    w.add_tensor("output_norm.weight", np.ones(64, dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    s = wf.gguf_summary(path)
    assert s["types"]["Q4_1"] == {"tensors": 1, "params": 256, "bytes": 8 * 20, "block_size": 32,
                                  "block_bytes": 20, "bits_per_weight": 5.0}
    assert s["types"]["F32"]["bits_per_weight"] == 32.0 and s["params"] == 320
    assert s["metadata"] == {"general.architecture": "llama", "llama.block_count": 2}
    t = wf.gguf_tensor(path, "blk.0.ffn_down.weight")
    by_hand = np.concatenate([wf.dequantize_q4_1_block(t.data[r, 20 * b:20 * (b + 1)])
                              for r in range(4) for b in range(2)])
    np.testing.assert_allclose(by_hand, gguf.quants.dequantize(t.data, t.tensor_type).reshape(-1), rtol=1e-6)
    assert np.abs(by_hand.reshape(4, 64) - x).max() < 0.3  # 4-bit codes: coarse but close
    with pytest.raises(KeyError):
        wf.gguf_tensor(path, "missing")


def _summary_by_gguf_reader(path) -> dict:
    """gguf_summary as it was computed before it read the header itself: through ``gguf.GGUFReader``."""
    import collections

    import gguf

    reader = gguf.GGUFReader(str(path))
    types: dict = collections.defaultdict(lambda: {"tensors": 0, "params": 0, "bytes": 0})
    for t in reader.tensors:
        row = types[t.tensor_type.name]
        block, block_bytes = gguf.GGML_QUANT_SIZES[t.tensor_type]
        row.update(block_size=block, block_bytes=block_bytes, bits_per_weight=8 * block_bytes / block)
        row["tensors"] += 1
        row["params"] += int(t.n_elements)
        row["bytes"] += int(t.n_bytes)
    meta = {k: f.contents() for k, f in reader.fields.items() if not k.startswith(("tokenizer.", "GGUF."))}
    return {"types": dict(types), "params": sum(r["params"] for r in types.values()),
            "bytes": sum(r["bytes"] for r in types.values()),
            "metadata": {k: v for k, v in meta.items() if isinstance(v, str | int | float)}}


@pytest.mark.slow  # parses the bundled GGUF twice (about 4 s)
def test_gguf_summary_from_the_header_matches_the_gguf_reader():
    from labkit.llm.gguf_bytes import gguf_bytes_per_token
    from labkit.models import gguf_path

    ours, theirs = wf.gguf_summary(gguf_path()), _summary_by_gguf_reader(gguf_path())
    assert ours == theirs
    assert list(ours["types"]) == list(theirs["types"]) and ours["metadata"]["general.file_type"] == 3
    per_token = gguf_bytes_per_token(gguf_path(), context=32)
    assert per_token["weights"] == theirs["bytes"] and per_token["layers"] == 30


def test_disassembly_shows_the_call_without_running_it(tmp_path):
    marker = tmp_path / "PWNED"
    text = wf.pickle_disassembly(wf.write_crafted_checkpoint(tmp_path / "evil.pt", marker))
    assert "exec" in text and "REDUCE" in text and str(marker) in text
    assert not marker.exists()
