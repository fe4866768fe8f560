"""A GPU replica's cold start, itemized (labkit.production.coldstart, chapter 08)."""

import matplotlib
import pytest

from labkit.production import coldstart, deploy, k8s, k8s_pod

matplotlib.use("Agg")
QWEN_BF16 = 8.05e9  # Qwen3-4B's weights in bf16 (4.02e9 parameters x 2 bytes)


def test_budget_items_are_bytes_over_bandwidth_and_labelled():
    phases = coldstart.gpu_replica_budget(QWEN_BF16, engine_start_s=30.0)
    by = {p.name: p for p in phases}
    assert list(by) == ["node", "image pull", "weights", "engine start", "graph capture"]
    assert by["weights"].seconds == pytest.approx(QWEN_BF16 / 300e6)           # 27 s from a network volume
    assert by["weights"].low == pytest.approx(QWEN_BF16 / 2e9)                 # 4 s from local NVMe
    assert by["image pull"].seconds == pytest.approx(coldstart.IMAGE_BYTES / 55e6)
    assert {p.kind for p in phases} == {"cited", "computed", "measured"}
    assert by["engine start"].kind == "measured" and by["node"].kind == "cited"
    assert by["graph capture"].kind == "cited"
    assert [p.in_probe for p in phases] == [False, False, True, True, True]
    assert all(p.low <= p.seconds <= p.high and p.source for p in phases)
    # far longer than the 71 s the fleet used before (a CPU vLLM start plus 8 GB at 200 MB/s)
    assert coldstart.budget_total(phases) > 5 * 60


def test_sensitivity_moves_one_phase_at_a_time():
    phases = coldstart.gpu_replica_budget(QWEN_BF16, engine_start_s=30.0)
    rows = coldstart.sensitivity(phases)
    typical = coldstart.budget_total(phases)
    widths = [r["high_total_s"] - r["low_total_s"] for r in rows]
    assert widths == sorted(widths, reverse=True) and rows[0]["phase"] == "node"
    for r in rows:
        assert r["low_total_s"] <= typical <= r["high_total_s"]


def test_the_manifests_startup_probe_covers_the_budget_and_would_catch_a_short_one():
    phases = coldstart.gpu_replica_budget(QWEN_BF16, engine_start_s=30.0)
    ok = coldstart.probe_covers(phases, k8s_pod.COLD_START_S)
    assert ok["covers_high"], ok  # 900 s >= weights at 40 MB/s + engine x2 + capture high
    short = coldstart.probe_covers(phases, 60)  # a probe sized on a CPU start would kill the pod
    assert short["covers_typical"] is False and short["covers_high"] is False


def test_bad_budget_inputs_raise():
    with pytest.raises(ValueError, match="weights_bytes"):
        coldstart.gpu_replica_budget(0, 30.0)


def test_plot_budget():
    axes = coldstart.plot_budget(coldstart.gpu_replica_budget(QWEN_BF16, 30.0))
    assert len(axes) == 2 and len(axes[1].patches) == 5


def test_budget_table_and_engine_start():
    rows = coldstart.budget_table(coldstart.gpu_replica_budget(QWEN_BF16, 30.0))
    assert [r["phase"] for r in rows][:2] == ["node", "image pull"] and rows[2]["probe"] == "yes"
    assert all(r["low_s"] <= r["typical_s"] <= r["high_s"] for r in rows)
    assert coldstart.engine_start(28.0, 2.5) == pytest.approx(25.5)
    assert coldstart.engine_start(28.0) == 28.0  # no weight phase logged: the whole start


def test_probe_budget_is_read_from_the_generated_manifest():
    from labkit.llm.architecture import load_config

    docs = deploy.manifests("Qwen/Qwen3-4B", load_config("Qwen3-4B"), gpu="L4")
    assert deploy.startup_budget_s(docs) == k8s_pod.COLD_START_S
    assert k8s.probe_budget_s({}) == 30  # Kubernetes' defaults: 3 failures 10 s apart
    phases = coldstart.gpu_replica_budget(QWEN_BF16, engine_start_s=30.0)
    assert coldstart.probe_covers(phases, deploy.startup_budget_s(docs))["covers_high"]
