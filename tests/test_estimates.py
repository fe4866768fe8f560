import pytest
import torch

from labkit import estimates
from labkit.catalog import ACCELERATORS


def test_bytes_per_param():
    assert estimates.bytes_per_param("torch.bfloat16") == 2
    assert estimates.bytes_per_param("q4_1") == 0.625
    with pytest.raises(KeyError, match="known"):
        estimates.bytes_per_param("int3")


def test_tutorials_seven_b_example():
    assert estimates.weight_bytes(7e9, "fp16") == 14e9
    assert estimates.weight_bytes(7e9, "int4") == 3.5e9
    assert estimates.rule_of_thumb_gb(7e9, "q4") == pytest.approx((3.5, 4.2))


def test_tutorials_min_gpu_example():
    # DeepSeek-V3, 671B at FP8 on 192 GB B200s: 671 x 1 x 1.8 / 192 = 6.3 -> 7
    # (the tutorial then rounds up to a node of 8)
    assert estimates.min_gpus(671e9, "fp8", 192e9) == 7


def test_fits_and_table():
    rtx = ACCELERATORS["RTX 3060 12GB"]
    assert estimates.fits(4e9, "fp16", rtx.memory_bytes)  # the tutorial: 4B-8B at FP16 ...
    assert not estimates.fits(14e9, "fp16", rtx.memory_bytes)
    assert estimates.fits(14e9, "q4_k_m", rtx.memory_bytes)  # ... up to ~14B with Q4
    rows = estimates.fit_table(rtx.memory_bytes, {"14B": 14e9})
    assert rows[0]["q4_k_m_fits"] and not rows[0]["bf16_fits"]


def test_tensor_bytes_counts_tied_once():
    emb = torch.nn.Embedding(10, 4)
    head = torch.nn.Linear(4, 10, bias=False)
    head.weight = emb.weight
    m = torch.nn.ModuleDict({"emb": emb, "head": head})
    assert estimates.tensor_bytes(m) == 10 * 4 * 4


def test_safetensors_params(tmp_path):
    from safetensors.torch import save_file

    save_file({"a": torch.zeros(3, 4), "b": torch.zeros(5)}, tmp_path / "m.safetensors")
    assert estimates.safetensors_params(tmp_path / "m.safetensors") == 17


def test_catalog():
    h100 = ACCELERATORS["H100 SXM"]
    assert h100.ops_per_byte("fp16") == pytest.approx(295, rel=0.01)  # the tutorial's figure
    with pytest.raises(KeyError, match="fp8"):
        ACCELERATORS["A100 80GB"].ops_per_byte("fp8")
    for acc in ACCELERATORS.values():
        assert acc.source and acc.bandwidth_bytes_per_s > 0 and acc.memory_bytes > 0 and acc.tflops
