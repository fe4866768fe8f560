import pytest
import torch

from labkit.hardware import capability as cap


@pytest.mark.parametrize(
    ("device", "bf16", "fp16", "speedup", "dtype"),
    [
        ("cpu", True, True, None, "bfloat16"),      # AMX / AVX-512 BF16 Xeon
        ("cpu", True, False, None, "bfloat16"),
        ("cpu", False, False, 0.015, "float32"),    # AVX2-only EPYC: bf16 67x slower
        ("cpu", False, False, 0.9, "float32"),      # close, but slower: fp32
        ("cpu", False, False, 1.0, "bfloat16"),     # measured as fast (e.g. an ARM core with bf16 dot)
        ("cpu", False, False, 1.7, "bfloat16"),
        ("cpu", False, False, None, "float32"),     # nothing known: the safe choice
        ("cuda", True, True, None, "bfloat16"),     # Ampere and newer
        ("cuda", False, True, None, "float16"),     # Turing, Volta
        ("cuda:1", False, True, None, "float16"),
        ("mps", True, True, None, "bfloat16"),      # macOS 14+
        ("mps", False, True, None, "float16"),
    ],
)
def test_choose_dtype_for_every_capability(device, bf16, fp16, speedup, dtype):
    chosen, reason = cap.choose_dtype(device, bf16, fp16, speedup)
    assert chosen == dtype
    assert reason  # every choice comes with a sentence saying why


def test_choose_dtype_reasons_name_the_measurement():
    assert "67x slower" in cap.choose_dtype("cpu", False, False, 1 / 67)[1]
    assert "1.20x" in cap.choose_dtype("cpu", False, False, 1.2)[1]


def test_unknown_device_is_a_clear_error():
    with pytest.raises(ValueError, match="cpu, cuda or mps"):
        cap.choose_dtype("tpu", True)
    with pytest.raises(ValueError, match="cpu, cuda or mps"):
        cap.capability("xla")


@pytest.mark.parametrize(("env", "native"), [("", True), ("AVX2", False), ("avx2", False),
                                              ("AVX512_CORE", False), ("AVX512_CORE_AMX", True)])
def test_onednn_isa_cap_removes_native_bf16(monkeypatch, env, native):
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", env)
    monkeypatch.setattr(torch.ops.mkldnn, "_is_mkldnn_bf16_supported", lambda: True, raising=False)
    _, bf16, _ = cap.cpu_flags()
    assert bf16 is native


def test_cpu_without_native_bf16_measures_and_falls_back(monkeypatch):
    cap.capability.cache_clear()
    monkeypatch.setattr(cap, "cpu_flags", lambda: ("AVX2", False, False))
    monkeypatch.setattr(cap, "measure_bf16_speedup", lambda: 0.02)
    try:
        c = cap.capability("cpu")
        assert (c.isa, c.bf16_native, c.bf16_speedup, c.dtype) == ("AVX2", False, 0.02, "float32")
        assert "50x slower" in cap.format_capability(c)
        assert cap.compute_dtype("cpu") == "float32"
    finally:
        cap.capability.cache_clear()


def test_cpu_with_native_bf16_does_not_measure(monkeypatch):
    cap.capability.cache_clear()
    monkeypatch.setattr(cap, "cpu_flags", lambda: ("AVX512", True, True))
    monkeypatch.setattr(cap, "measure_bf16_speedup", lambda: pytest.fail("should not measure"))
    try:
        c = cap.capability("cpu")
        assert c.dtype == "bfloat16" and c.bf16_speedup is None
        assert "native 16-bit: bf16, fp16" in cap.format_capability(c)
    finally:
        cap.capability.cache_clear()


def test_this_machine_gets_a_dtype_torch_runs():
    c = cap.capability("cpu")
    x = torch.ones(4, 4, dtype=getattr(torch, c.dtype))
    assert (x @ x).sum().item() == 64
    assert c.isa == torch.backends.cpu.get_cpu_capability()


def test_measured_speedup_is_a_positive_ratio():
    assert cap.measure_bf16_speedup(n=64, repeats=1) > 0


def test_pre_ampere_gpu_gets_fp16_even_where_torch_emulates_bf16(monkeypatch):
    """torch.cuda.is_bf16_supported() says True on a T4/V100 because bf16 can be emulated there;
    the lab asks for native support only, so such a GPU computes in fp16."""
    cap.capability.cache_clear()
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda including_emulation=True: including_emulation)
    try:
        c = cap.capability("cuda")
        assert (c.bf16_native, c.dtype) == (False, "float16")
    finally:
        cap.capability.cache_clear()
