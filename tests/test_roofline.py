import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from labkit.hardware import roofline as rl


def test_ops_per_byte_matches_tutorial_h100_example():
    # 989 TFLOPS / 3.35 TB/s ≈ 295 ops per byte
    assert rl.ridge_point(989e12, 3.35e12) == pytest.approx(295.2, abs=0.1)


def test_bad_input_is_refused():
    with pytest.raises(ValueError):
        rl.ridge_point(0, 1e12)
    with pytest.raises(ValueError):
        rl.decode_ceiling_tokens_per_s(1e12, 0)


def test_gemm_counts():
    assert rl.gemm_bytes(2, 3, 4, dtype_bytes=2) == (8 + 12 + 6) * 2
    # batch 1 through a square weight: intensity ~ 2 / dtype_bytes = 1 FLOP/byte in fp16
    assert rl.gemm_intensity(1, 4096, 4096, 2) == pytest.approx(1.0, rel=1e-3)


@given(st.integers(1, 256), st.integers(16, 2048))
def test_gemm_intensity_grows_with_batch(m, n):
    assert rl.gemm_intensity(2 * m, n, n) > rl.gemm_intensity(m, n, n)


def test_decode_ceiling_and_achieved_fraction():
    # an 8 GB model on 3.35 TB/s: at most ~419 tokens/s
    ceiling = rl.decode_ceiling_tokens_per_s(3.35e12, 8e9)
    assert ceiling == pytest.approx(418.75)
    assert rl.bandwidth_achieved(ceiling / 2, 8e9, 3.35e12) == pytest.approx(0.5)


def test_decode_is_memory_bound_and_prefill_is_not_on_h100():
    params, wbytes = 4e9, 8e9  # a 4B model in bf16
    decode = rl.step_intensity(params, 1, wbytes)
    prefill = rl.step_intensity(params, 2048, wbytes)
    assert decode == pytest.approx(1.0)
    assert rl.is_memory_bound(decode, 989e12, 3.35e12)
    assert not rl.is_memory_bound(prefill, 989e12, 3.35e12)


def test_attainable_is_min_of_roofs():
    assert rl.attainable_flops(1.0, 100.0, 10.0) == 10.0
    assert rl.attainable_flops(1000.0, 100.0, 10.0) == 100.0


def test_roofline_plot_has_one_series_per_roof_and_point():
    import matplotlib

    matplotlib.use("Agg")
    roofs = [{"name": "H100 SXM", "peak_flops": 989e12, "bandwidth": 3.35e12},
             {"name": "this CPU", "peak_flops": 2e11, "bandwidth": 1.4e10}]
    points = [{"label": "decode", "intensity": 1.0, "flops_per_s": 1e9},
              {"label": "matmul 1024", "intensity": 170.0, "flops_per_s": 1.5e11}]
    marks = [{"label": "prefill 2048 (computed)", "intensity": 1000.0}]
    fig = rl.roofline_plot(roofs, points, marks)
    ax = fig.axes[0]
    labelled = [ln for ln in ax.get_lines() if not ln.get_label().startswith("_")]
    assert [ln.get_label() for ln in labelled] == ["H100 SXM", "this CPU", "decode", "matmul 1024",
                                                   "prefill 2048 (computed)"]
    assert list(labelled[4].get_xdata()) == [1000.0, 1000.0]
    # each roof line is flat at its peak on the right and follows the bandwidth slope on the left
    x, y = labelled[0].get_data()
    assert y[-1] == pytest.approx(989e12)
    assert y[0] == pytest.approx(x[0] * 3.35e12)
    assert ax.get_xscale() == "log" and ax.get_yscale() == "log"
    assert labelled[2].get_data()[0][0] == 1.0 and math.isclose(labelled[2].get_data()[1][0], 1e9)
    import matplotlib.pyplot as plt

    plt.close(fig)
