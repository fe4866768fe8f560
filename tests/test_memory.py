import pytest
import torch

from labkit.hardware.catalog import ACCELERATORS
from labkit.llm import memory
from labkit.llm.architecture import load_config, param_count


def test_bytes_per_param():
    assert memory.bytes_per_param("torch.bfloat16") == 2
    assert memory.bytes_per_param("q4_1") == 0.625
    with pytest.raises(KeyError, match="known"):
        memory.bytes_per_param("int3")


def test_tutorials_seven_b_example():
    assert memory.weight_bytes(7e9, "fp16") == 14e9
    assert memory.weight_bytes(7e9, "int4") == 3.5e9
    assert memory.rule_of_thumb_gb(7e9, "q4") == pytest.approx((3.5, 4.2))


def test_fits_and_table():
    rtx = ACCELERATORS["RTX 3060 12GB"]
    assert memory.fits(4e9, "fp16", rtx.memory_bytes)  # the tutorial: 4B-8B at FP16 ...
    assert not memory.fits(14e9, "fp16", rtx.memory_bytes)
    assert memory.fits(14e9, "q4_k_m", rtx.memory_bytes)  # ... up to ~14B with Q4
    rows = memory.fit_table(rtx.memory_bytes, {"14B": 14e9})
    assert rows[0]["q4_k_m_fits"] and not rows[0]["bf16_fits"]
    # chapter 04: the tutorial's "4B-8B at FP16" fails for 8B, its "~14B at Q4" holds
    llama8b = param_count(load_config("Llama-3-8B"))["total"]
    assert not memory.fits(llama8b, "bf16", rtx.memory_bytes)
    assert memory.fits(14.8e9, "q4_k_m", rtx.memory_bytes)


def test_qwen3_4b_decode_is_memory_bound_on_every_catalog_accelerator():
    """Chapter 04: batch-1 decode (~1 FLOP/byte) sits left of every datasheet ridge."""
    from labkit.hardware import roofline
    from labkit.llm.kvcache import kv_cache_bytes_for_config

    cfg = load_config("Qwen3-4B")
    params = param_count(cfg)["total"]
    kv = kv_cache_bytes_for_config(cfg, 1024)
    ai = roofline.step_intensity(params, 1, memory.weight_bytes(params, "bf16"), kv)
    for acc in ACCELERATORS.values():
        tflops = acc.tflops.get("bf16", acc.tflops.get("fp16"))
        assert tflops is not None, acc.name
        peak = tflops * 1e12
        assert roofline.is_memory_bound(ai, peak, acc.bandwidth_bytes_per_s), acc.name


def test_bf16_weights_take_two_bytes_per_parameter():
    """Chapter 01: a bf16 model holds exactly 2 bytes per parameter."""
    m = torch.nn.Linear(16, 8).to(torch.bfloat16)
    assert memory.tensor_bytes(m, buffers=False) == 2 * (16 * 8 + 8)


def test_tensor_bytes_counts_tied_once():
    emb = torch.nn.Embedding(10, 4)
    head = torch.nn.Linear(4, 10, bias=False)
    head.weight = emb.weight
    m = torch.nn.ModuleDict({"emb": emb, "head": head})
    assert memory.tensor_bytes(m) == 10 * 4 * 4


def test_safetensors_params(tmp_path):
    from safetensors.torch import save_file

    save_file({"a": torch.zeros(3, 4), "b": torch.zeros(5)}, tmp_path / "m.safetensors")
    assert memory.safetensors_params(tmp_path / "m.safetensors") == 17


def test_catalog():
    h100 = ACCELERATORS["H100 SXM"]
    assert h100.ops_per_byte("fp16") == pytest.approx(295, rel=0.01)  # the tutorial's figure
    with pytest.raises(KeyError, match="fp8"):
        ACCELERATORS["A100 80GB"].ops_per_byte("fp8")
    for acc in ACCELERATORS.values():
        assert acc.source and acc.bandwidth_bytes_per_s > 0 and acc.memory_bytes > 0 and acc.tflops
