"""labkit.hardware.catalog: datasheet entries, matching the name torch gives a GPU to one of them, and
the datasheet TFLOPS of a torch dtype (chapters 00 and 04; ``labkit gpu-check`` compares with them)."""

import pytest

from labkit.hardware import catalog
from labkit.hardware.catalog import ACCELERATORS, Accelerator


@pytest.mark.parametrize(("gpu", "entry"), [
    ("NVIDIA H100 80GB HBM3", "H100 SXM"),
    ("NVIDIA H100 PCIe", None),  # lower clocks and bandwidth than the SXM datasheet
    ("NVIDIA H100 NVL", None),
    ("NVIDIA H200", "H200"),
    ("NVIDIA H200 NVL", None),
    ("NVIDIA GH200 480GB", None),
    ("NVIDIA B200", "B200"),
    ("NVIDIA A100-SXM4-80GB", "A100 80GB"),
    ("NVIDIA A100 80GB PCIe", "A100 80GB"),
    ("NVIDIA A100-PCIE-40GB", None),
    ("NVIDIA L4", "L4"),
    ("NVIDIA L40S", None),
    ("NVIDIA GeForce RTX 3060", "RTX 3060 12GB"),
    ("NVIDIA GeForce RTX 3060 Ti", None),
    ("NVIDIA GeForce RTX 4090", "RTX 4090"),
    ("NVIDIA GeForce RTX 4090 D", None),
    ("Tesla T4", None),
])
def test_match_accelerator_by_torch_name(gpu, entry):
    acc = catalog.match_accelerator(gpu)
    assert (acc.name if acc else None) == entry


def test_match_rules_name_catalog_entries_and_others_match_by_words():
    assert set(catalog.MATCH_RULES) <= set(ACCELERATORS)  # a renamed entry must not silently drop its rule
    l40s = Accelerator("L40S", 48e9, 864e9, {"fp16": 362.0})
    assert catalog.match_accelerator("NVIDIA L40S", {"L40S": l40s}) is l40s
    assert catalog.match_accelerator("NVIDIA L40", {"L40S": l40s}) is None


def test_datasheet_tflops_per_torch_dtype():
    h100 = ACCELERATORS["H100 SXM"]
    assert catalog.datasheet_tflops(h100, "bfloat16") == h100.tflops["bf16"]
    assert catalog.datasheet_tflops(h100, "float32") == h100.tflops["fp32"]
    assert catalog.datasheet_tflops(h100, "float32", tf32=True) == h100.tflops["tf32"]
    assert catalog.datasheet_tflops(ACCELERATORS["B200"], "float32") is None  # no fp32 figure listed
    assert catalog.datasheet_tflops(None, "float16") is None


def test_entries_are_consistent_and_this_machine_is_marked_measured():
    for acc in ACCELERATORS.values():
        assert acc.memory_bytes > 0 and acc.bandwidth_bytes_per_s > 0 and acc.source.startswith("https://")
        assert acc.tflops.get("fp16", acc.tflops.get("bf16")) is not None
    assert ACCELERATORS["H100 SXM"].ops_per_byte("fp16") == pytest.approx(989.4e12 / 3.35e12)
    with pytest.raises(KeyError, match="fp8"):
        ACCELERATORS["A100 80GB"].ops_per_byte("fp8")
    here = catalog.this_machine("laptop", 16e9, 50e9, {"fp32": 1.0})
    assert here.name == "laptop (measured here)" and here.ops_per_byte("fp32") == pytest.approx(1e12 / 50e9)
