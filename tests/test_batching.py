"""Measured batching policies and cold-start phases (chapter 08), against the loopback fake server
and synthetic files: the mechanics, not a model's numbers."""

import json

import pytest

from labkit.serving import batching as B
from labkit.serving import coldstart
from labkit.serving.fakeserver import fake_server


def test_workload_draws_mixed_lengths_deterministically():
    a, b = B.workload(200, seed=3), B.workload(200, seed=3)
    assert a == b and len(a) == 200
    n_long = sum(r["max_tokens"] >= 96 for r in a)
    assert all(4 <= r["max_tokens"] <= 16 or 96 <= r["max_tokens"] <= 128 for r in a)
    assert 30 <= n_long <= 70  # a quarter, give or take
    assert all(r["max_tokens"] == 5 for r in B.workload(10, short=(5, 5), long_share=0.0))
    with pytest.raises(ValueError, match="short"):
        B.workload(4, short=(10, 2))
    with pytest.raises(ValueError, match="long_share"):
        B.workload(4, long_share=1.5)


def test_static_gate_waits_for_the_whole_group_and_continuous_does_not():
    reqs = [{"prompt": f"p{i}", "max_tokens": n} for i, n in enumerate([2, 2, 2, 30, 2, 2, 2, 30])]
    with fake_server(step_s=0.004) as srv:
        st = B.static_gate(srv.url, "fake", reqs, batch=4)
        co = B.continuous(srv.url, "fake", reqs, batch=4)
    assert st["completed"] == co["completed"] == 8 and st["failed"] == co["failed"] == 0
    first, second = st["requests"][:4], st["requests"][4:]
    assert min(r["t_sent"] for r in second) >= max(r["t_end"] for r in first)  # a gate, not a pool
    assert st["total_output_tokens"] == co["total_output_tokens"] == sum(r["max_tokens"] for r in reqs)
    # the long request of group 1 holds group 2 back; continuous refills the three short slots at once
    assert co["duration"] < st["duration"]
    assert co["output_throughput"] > st["output_throughput"]
    for s in (st, co):
        assert s["p99_queued_e2e_ms"] >= s["p99_e2el_ms"] * 0.99


def test_batch_must_be_positive():
    with pytest.raises(ValueError, match="batch"):
        B.static_gate("http://127.0.0.1:1", "m", [{"prompt": "x"}], batch=0)


def test_step_costs_from_summaries():
    single = {"completed": 2, "total_input_tokens": 200, "median_ttft_ms": 50.0, "concurrency": 1,
              "median_itl_ms": 20.0}
    four = {"concurrency": 4, "median_itl_ms": 32.0}
    c = B.step_costs(single, [four])
    assert c["prefill_points"] == [(100.0, pytest.approx(0.03))]  # TTFT less the first token's step
    assert c["decode_points"] == [(1, 0.02), (4, 0.032)]
    from labkit.serving.batchsim import fit_step_cost

    cost = fit_step_cost(c["prefill_points"], c["decode_points"])
    assert cost.prefill_s_per_token == pytest.approx(3e-4) and cost.decode_step_s(4) == pytest.approx(0.032)
    with pytest.raises(ValueError, match="prompt tokens"):
        B.step_costs(single | {"total_input_tokens": 0}, [])


def test_weight_load_reports_bytes_params_and_download_time(tmp_path):
    import torch
    from safetensors.torch import save_file

    path = tmp_path / "w.safetensors"
    save_file({"a": torch.ones(100, 10), "b": torch.zeros(7)}, str(path))
    (row,) = coldstart.weight_load(path, bandwidth_bytes_s=1000.0)
    assert row["params"] == 1007 and row["bytes"] == path.stat().st_size
    assert row["download_s"] == pytest.approx(row["bytes"] / 1000.0)
    assert row["load_s"] >= 0


def test_vllm_phases_parsed_from_a_log(tmp_path):
    log = tmp_path / "vllm.log"
    log.write_text("x INFO [base_loader.py:82] Initializing model took 0.30 seconds\n"
                   "x INFO [default_loader.py:501] Loading weights took 0.57 seconds\n"
                   "x INFO [core.py:402] init engine (profile, create kv cache, warmup model) took 4.04 s\n")
    p = coldstart.vllm_phases(log, startup_s=30.0)
    assert p["weights_s"] == 0.57 and p["model_init_s"] == 0.30 and p["engine_init_s"] == 4.04
    assert p["other_s"] == pytest.approx(30.0 - 4.91)
    log.write_text("nothing known\n")
    p = coldstart.vllm_phases(log, startup_s=10.0)
    assert p["weights_s"] != p["weights_s"] and p["other_s"] == 10.0  # NaN, left out


def test_python_cold_start_phases_from_the_child(monkeypatch):
    stamps = {"t_start": 1.0, "t_imports": 3.0, "t_load": 4.5, "t_first": 5.0, "t_second": 5.25,
              "ttft_first_s": 0.1, "dtype": "float32", "device": "cpu"}
    monkeypatch.setattr(coldstart, "_CHILD", f"print('noise'); print({json.dumps(json.dumps(stamps))})")
    monkeypatch.setattr(coldstart.time, "time", lambda: 0.5)
    r = coldstart.python_cold_start()
    assert (r["interpreter_s"], r["imports_s"], r["load_s"]) == (0.5, 2.0, 1.5)
    assert (r["first_request_s"], r["warm_request_s"], r["total_s"]) == (0.5, 0.25, 4.5)
    monkeypatch.setattr(coldstart, "_CHILD", "import sys; sys.exit('boom')")
    with pytest.raises(RuntimeError, match="boom"):
        coldstart.python_cold_start()
