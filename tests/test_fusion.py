import os
import re

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


def test_the_inductor_cache_folder_is_set_for_the_block_only(tmp_path, monkeypatch):
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", "/earlier")
    with fusion._inductor_cache(tmp_path):
        assert os.environ["TORCHINDUCTOR_CACHE_DIR"] == str(tmp_path)
    assert os.environ["TORCHINDUCTOR_CACHE_DIR"] == "/earlier"
    monkeypatch.delenv("TORCHINDUCTOR_CACHE_DIR")
    with fusion._inductor_cache(tmp_path):
        pass
    assert "TORCHINDUCTOR_CACHE_DIR" not in os.environ
    with fusion._inductor_cache(None):
        assert "TORCHINDUCTOR_CACHE_DIR" not in os.environ


@pytest.mark.parametrize("cold_hits, warm_hits, rc, says", [
    (0, 1, 1, "failed (rc 1)"),                      # the child died
    (1, 1, 0, "1 hit(s) in the empty cache"),        # the cold compile was not cold
    (0, 0, 0, "0 in the new process"),               # the warm one did not find the code
])
def test_a_compile_cache_pair_that_means_nothing_is_refused(monkeypatch, cold_hits, warm_hits, rc, says):
    from labkit.experiments import compile_cache

    cold = {"compile_s": 10.0, "cache_hits": cold_hits}
    monkeypatch.setattr(compile_cache.fusion, "compile_chain", lambda **kw: cold)
    child = {"rc": rc, "out": {"compile_s": 2.0, "hits": warm_hits, "import_s": 1.0}, "stderr_tail": "boom"}
    monkeypatch.setattr(compile_cache, "run_child", lambda *a, **kw: child)
    with pytest.raises(RuntimeError, match=re.escape(says)):
        compile_cache.cold_and_warm(numel=16)
    child["rc"], child["out"]["hits"] = 0, 1
    if not cold_hits:
        assert compile_cache.cold_and_warm(numel=16)["warm_over_cold"] == 0.2
