"""labkit.hardware.cpu_vs_gpu (chapter 04): a CPU's cores and SIMD lanes beside a GPU's SMs and "CUDA
cores", the ratios that bound prefill and decode gains, and the thread-scaling measurement."""

import pytest
import torch

from labkit.hardware import cpu_vs_gpu
from labkit.hardware.catalog import ACCELERATORS

# /proc/cpuinfo flags as labkit.hardware.machine.cpu_info keeps them
SAPPHIRE = ["avx", "avx2", "fma", "avx512f", "avx512_bf16", "avx512_vnni", "amx_tile", "amx_bf16", "amx_int8"]
EPYC_ZEN2 = ["avx", "avx2", "fma"]


def test_cuda_cores_and_clock_reproduce_the_datasheet_fp32_figure():
    """SMs x lanes x 2 (FMA) x boost clock must give the catalog's fp32 TFLOPS: the whitepaper figures
    and the datasheet figure are independent inputs, so a typo in either shows here."""
    with_sms = [a for a in ACCELERATORS.values() if a.sms]
    assert {"H100 SXM", "RTX 3060 12GB", "A100 80GB"} <= {a.name for a in with_sms}
    for acc in with_sms:
        computed = acc.cuda_cores * 2 * acc.boost_clock_ghz / 1e3
        assert computed == pytest.approx(acc.tflops["fp32"], rel=0.01), acc.name
    assert ACCELERATORS["H100 SXM"].cuda_cores == 16_896
    assert ACCELERATORS["RTX 3060 12GB"].cuda_cores == 3_584
    assert ACCELERATORS["B200"].cuda_cores == 0  # no whitepaper figures in the catalog: unknown, not guessed


@pytest.mark.parametrize(("flags", "lanes"), [(SAPPHIRE, 16), (EPYC_ZEN2, 8), (["neon", "asimd"], 4),
                                              (["sse2"], 4), ([], 1)])
def test_simd_lanes_from_flags(flags, lanes):
    assert cpu_vs_gpu.simd_lanes(flags) == lanes


def test_cpu_side_uses_the_width_torch_runs_not_just_the_flags():
    cpu = {"physical_cores": 2, "logical_cores": 2, "isa": SAPPHIRE}
    wide = cpu_vs_gpu.cpu_side(cpu, "AVX512", 2.1, 90e9, 9e9)
    capped = cpu_vs_gpu.cpu_side(cpu, "AVX2", 2.1, 45e9, 9e9)  # ATEN_CPU_CAPABILITY=avx2 on the same CPU
    assert (wide["lanes"], capped["lanes"]) == (32, 16)
    assert wide["simd_flags"] == capped["simd_flags"] == 16 and wide["amx"]
    assert wide["peak_fp32"] == pytest.approx(2 * 16 * 2 * 2.1e9)  # 134.4 GFLOP/s, one FMA unit per core
    assert cpu_vs_gpu.cpu_side(cpu, "AVX2", None, 45e9, 9e9)["peak_fp32"] is None
    zen2_cpu = {"physical_cores": 2, "logical_cores": 2, "isa": EPYC_ZEN2}
    zen2 = cpu_vs_gpu.cpu_side(zen2_cpu, "AVX2", 2.45, 60e9, 8e9)
    assert zen2["lanes"] == 16 and not zen2["amx"]


def test_gpu_side_and_the_ratios_that_bound_prefill_and_decode():
    cpu = cpu_vs_gpu.cpu_side({"physical_cores": 2, "logical_cores": 2, "isa": SAPPHIRE}, "AVX512", 2.1,
                              50e9, 9.7e9)
    h100 = cpu_vs_gpu.gpu_side(ACCELERATORS["H100 SXM"])
    assert (h100["cores"], h100["lanes"], h100["measured"]) == (132, 16_896, False)
    r = cpu_vs_gpu.implied_speedups(cpu, h100)
    assert r["lanes"] == pytest.approx(16_896 / 32)
    assert r["flops"] == pytest.approx(67e12 / 50e9)  # 1,340x: what a compute-bound prefill can gain
    assert r["bandwidth"] == pytest.approx(3.35e12 / 9.7e9)  # 345x: what batch-1 decode can gain
    table = cpu_vs_gpu.format_sides([cpu, h100])
    assert "16,896" in table and "measured here" in table and "datasheet" in table
    with pytest.raises(ValueError, match="no SM count"):
        cpu_vs_gpu.gpu_side(ACCELERATORS["Apple M4"])


def test_thread_scaling_measures_both_kernels_and_restores_threads():
    before = torch.get_num_threads()
    out = cpu_vs_gpu.thread_scaling(threads=(1, 2), rounds=2, n=128, nbytes=4 * 2**20, repeats=1)
    assert torch.get_num_threads() == before
    assert out["threads"] == [1, 2]
    assert all(v > 0 for v in (*out["matmul_gflops"].values(), *out["copy_gbps"].values()))
    assert len(out["speedup"]["matmul"]) == len(out["speedup"]["copy"]) == 2
    with pytest.raises(ValueError, match="two thread counts"):
        cpu_vs_gpu.thread_scaling(threads=(1,))
    with pytest.raises(ValueError, match=">= 1"):
        cpu_vs_gpu.thread_scaling(threads=(0, 2))


def test_thread_scaling_restores_threads_when_a_kernel_fails(monkeypatch):
    before = torch.get_num_threads()

    def boom(*a, **k):
        raise RuntimeError("stalled")

    monkeypatch.setattr(cpu_vs_gpu, "time_fn", boom)
    with pytest.raises(RuntimeError, match="stalled"):
        cpu_vs_gpu.thread_scaling(threads=(1, 2), rounds=1, n=16, nbytes=1024)
    assert torch.get_num_threads() == before


def test_bar_plot_has_one_labelled_panel_per_quantity():
    import matplotlib

    matplotlib.use("Agg")
    zen2_cpu = {"physical_cores": 2, "logical_cores": 2, "isa": EPYC_ZEN2}
    cpu = cpu_vs_gpu.cpu_side(zen2_cpu, "AVX2", None, 40e9, 8e9)
    fig = cpu_vs_gpu.bar_plot([cpu, cpu_vs_gpu.gpu_side(ACCELERATORS["RTX 3060 12GB"])])
    assert len(fig.axes) == len(cpu_vs_gpu.PANELS)
    for ax, (what, (unit, _)) in zip(fig.axes, cpu_vs_gpu.PANELS.items(), strict=True):
        assert ax.get_title() == what and ax.get_ylabel().startswith(unit)
        assert len(ax.containers) == 1 and len(ax.containers[0]) == 2  # one bar per side
    lanes, clock = fig.axes[0], fig.axes[1]
    assert lanes.get_yscale() == "log" and "log scale" in lanes.get_ylabel()  # 16 vs 3,584 lanes
    assert "n/a" in [t.get_text() for t in clock.texts]  # no clock given for the CPU
