import pytest
import torch

from labkit.hardware import machine


def test_detect_reports_a_usable_device():
    info = machine.detect()
    assert info["device"] in ("cpu", "cuda", "mps")
    assert info["accelerator"]["memory_bytes"] > 0
    assert info["cpu"]["logical_cores"] >= 1 and info["cpu"]["ram_bytes"] > 0
    torch.ones(2, device=info["device"]).sum().item()  # the detected device really runs work
    text = machine.format_report(info)
    assert info["device"] in text and "GiB" in text


def test_resolve_device():
    assert machine.resolve_device("cpu") == "cpu"
    assert machine.resolve_device("auto") in ("cpu", "cuda", "mps")
    with pytest.raises(ValueError, match="unknown device"):
        machine.resolve_device("tpu")


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the error on machines without CUDA")
def test_unavailable_cuda_is_a_clear_error():
    with pytest.raises(RuntimeError, match="no CUDA GPU"):
        machine.resolve_device("cuda")


def test_cpu_isa_flags_are_known_names():
    isa = machine.cpu_info()["isa"]
    assert set(isa) <= set(machine.ISA_FLAGS)


def test_fake_cuda_detection(monkeypatch):
    class Props:
        name, total_memory, major, minor, multi_processor_count = "Fake H100", 80 * 2**30, 9, 0, 132

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda i: Props)
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda including_emulation=True: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    info = machine.detect()
    acc = info["accelerator"]
    assert info["device"] == "cuda" and acc["compute_capability"] == "9.0"
    assert acc["memory_bytes"] == 80 * 2**30 and acc["fp8"] and acc["bf16"]
    assert "compute cap." in machine.format_report(info)


def test_memory_in_use_grows_with_allocation():
    before = machine.memory_in_use("cpu")
    block = torch.ones(64 * 2**20 // 4)  # 64 MiB, touched
    after = machine.memory_in_use("cpu")
    assert after - before > 32 * 2**20
    del block


def test_cuda_one_liner_raises_without_a_gpu_and_names_it_with_one(monkeypatch):
    import torch

    def no_gpu(i=0):
        raise RuntimeError("Found no NVIDIA driver on your system.")

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.cuda, "get_device_name", no_gpu)
    out = machine.cuda_one_liner()
    assert out == {"ran": False, "output": "RuntimeError: Found no NVIDIA driver on your system."}
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda i=0: "NVIDIA GeForce RTX 3060")
    assert machine.cuda_one_liner() == {"ran": True, "output": "True NVIDIA GeForce RTX 3060"}
