import pytest
import torch

from labkit.hardware import microbench
from labkit.llm import fusion


def test_interleaved_times_runs_functions_in_turn():
    calls = []
    out = microbench.interleaved_times({"a": lambda: calls.append("a"), "b": lambda: calls.append("b")},
                                       repeats=3, warmup=1)
    assert calls == ["a", "b"] * 4  # one warm-up round, then three interleaved rounds
    assert set(out) == {"a", "b"}
    assert all(len(t) == 3 and (t >= 0).all() for t in out.values())
    with pytest.raises(ValueError):
        microbench.interleaved_times({"a": lambda: None}, repeats=0)


def test_scale_bytes_counts_read_and_write_per_pass():
    assert fusion.scale_bytes(1000, 4, passes=2) == 16_000  # x*2 then *3: four trips of 4 kB
    assert fusion.scale_bytes(1000, 4, passes=1) == 8_000  # x*6: two trips


def test_scale_fusion_reports_consistent_figures():
    r = fusion.scale_fusion(numel=1 << 16, repeats=3)
    assert r["tensor_bytes"] == (1 << 16) * 4
    assert r["unfused_bytes"] == 4 * r["tensor_bytes"] and r["fused_bytes"] == 2 * r["tensor_bytes"]
    assert r["speedup"] == pytest.approx(r["unfused_s"] / r["fused_s"])
    assert r["fused_gbps"] == pytest.approx(r["fused_bytes"] / r["fused_s"] / 1e9)
    assert len(r["times"]["unfused"]) == 3


def test_chain_ops_matches_the_traced_graph():
    graph = torch.fx.symbolic_trace(fusion.elementwise_chain).graph
    ops = [n for n in graph.nodes if n.op in ("call_function", "call_method")]
    assert len(ops) == fusion.CHAIN_OPS


def test_compile_chain_matches_eager_and_times_compile_apart():
    # the "eager" backend traces with dynamo but generates no code: the plumbing, in seconds
    # (the chapter 05 notebook runs the real Inductor compile)
    r = fusion.compile_chain(numel=4096, repeats=2, fn=lambda x: torch.relu(x * 2 + 1), backend="eager")
    assert r["max_abs_diff"] < 1e-5
    assert r["compile_s"] > 0 and r["eager_s"] > 0 and r["compiled_s"] > 0
    assert r["fused_bytes"] == 2 * 4096 * 4


def test_scale_fusion_carries_its_spread():
    r = fusion.scale_fusion(numel=1 << 16, repeats=3)
    iv = r["speedup_interval"]
    assert iv["n"] == 3 and iv["lo"] <= iv["median"] <= iv["hi"]


def test_a_warm_compile_reports_the_last_cold_one(tmp_path):
    log = tmp_path / "cold.json"
    never = {"cold_s": None, "cold_date": None}
    assert fusion._cold_compile(log, "cpu", 1.0, hits=1) == never  # warm, and no cold run logged yet
    assert fusion._cold_compile(log, "cpu", 14.2, hits=0)["cold_s"] == 14.2  # cold: logged
    warm = fusion._cold_compile(log, "cpu", 3.2, hits=2)
    assert warm["cold_s"] == 14.2 and warm["cold_date"]  # warm: the cold figure, not the warm one
