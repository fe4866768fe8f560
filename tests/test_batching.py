"""Measured batching policies and cold-start phases (chapter 08), against the loopback fake server
and synthetic files: the mechanics, not a model's numbers."""

import json
from dataclasses import replace
from typing import Any

import pytest
from summaries import fake_summary

from labkit.engines.fakeserver import fake_server
from labkit.production import batching as B
from labkit.production import coldstart
from labkit.serving import metrics


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
    reqs: list[dict[str, Any]] = [{"prompt": f"p{i}", "max_tokens": n}
                                  for i, n in enumerate([2, 2, 2, 30, 2, 2, 2, 30])]
    with fake_server(step_s=0.004) as srv:
        st = B.static_gate(srv.url, "fake", reqs, batch=4)
        co = B.continuous(srv.url, "fake", reqs, batch=4)
    assert st.completed == co.completed == 8 and st.failed == co.failed == 0
    first, second = st.requests[:4], st.requests[4:]
    assert min(r.t_sent for r in second) >= max(r.t_end or 0.0 for r in first)  # a gate, not a pool
    assert st.total_output_tokens == co.total_output_tokens == sum(r["max_tokens"] for r in reqs)
    # the long request of group 1 holds group 2 back; continuous refills the three short slots at once
    assert co.duration_s < st.duration_s
    assert co.output_throughput > st.output_throughput
    for s in (st, co):
        assert s.summary is not None and s.p99_queued_e2e_ms >= s.summary.e2el.p99 * 0.99


def test_batch_must_be_positive():
    with pytest.raises(ValueError, match="batch"):
        B.static_gate("http://127.0.0.1:1", "m", [{"prompt": "x"}], batch=0)


def test_step_costs_from_summaries():
    single = fake_summary(completed=2, total_input_tokens=200, ttft_median=50.0, concurrency=1,
                          itl_median=20.0)
    four = fake_summary(concurrency=4, itl_median=32.0)
    c = B.step_costs(single, [four])
    assert c["prefill_points"] == [(100.0, pytest.approx(0.03))]  # TTFT less the first token's step
    assert c["decode_points"] == [(1, 0.02), (4, 0.032)]
    from labkit.production.batchsim import fit_step_cost

    cost = fit_step_cost(c["prefill_points"], c["decode_points"])
    assert cost.prefill_s_per_token == pytest.approx(3e-4) and cost.decode_step_s(4) == pytest.approx(0.032)
    with pytest.raises(ValueError, match="prompt tokens"):
        B.step_costs(replace(single, total_input_tokens=0), [])


def test_step_costs_take_the_fastest_or_the_median_of_repeated_runs():
    """Calibration runs slowed by background load (the second here) do not set the fastest costs."""
    ones = [fake_summary(completed=3, total_input_tokens=300, ttft_median=t, concurrency=1, itl_median=i)
            for t, i in ((70.0, 40.0), (160.0, 60.0), (72.0, 42.0))]
    fours = [fake_summary(concurrency=4, itl_median=m) for m in (48.0, 68.0, 50.0)]
    c = B.step_costs(ones, fours)
    assert c["prefill_points"] == [(100.0, pytest.approx(0.030))]
    assert c["decode_points"] == [(1, pytest.approx(0.040)), (4, pytest.approx(0.048))]
    m = B.step_costs(ones, fours, pick="median")
    assert m["prefill_points"] == [(100.0, pytest.approx(0.030))]       # 30, 100, 30 ms
    assert m["decode_points"] == [(1, pytest.approx(0.042)), (4, pytest.approx(0.050))]
    with pytest.raises(ValueError, match="at least one"):
        B.step_costs([], fours)
    with pytest.raises(ValueError, match="pick"):
        B.step_costs(ones, fours, pick="mean")


def test_paired_rounds_judge_each_round_by_its_own_calibration():
    """A round in the host's slow mode (every step 1.5x) is as predictable as a fast one when it is
    compared with its own calibration; mixing the fast calibration with the slow run is +50% off."""
    from labkit.serving.records import RequestRecord

    def cal(step_ms):
        one = fake_summary(completed=3, total_input_tokens=30, ttft_median=2 * step_ms, concurrency=1,
                           itl_median=step_ms)
        return [one, *(fake_summary(concurrency=c, itl_median=step_ms) for c in (4, 8))]

    work = [{"id": f"w{i}", "max_tokens": 10} for i in range(8)]
    recs = [RequestRecord(prompt_id=f"w{i}", prompt_tokens=10) for i in range(8)]

    def cont(step_ms):   # 8 requests of 10 tokens at once: a prefill (a step's time) and 10 steps
        return B.BatchRun("continuous", 8, 8, 0, 1.0, 80 / (11 * step_ms / 1000), 80, 0.0, 0.0,
                          summary=fake_summary(requests=tuple(recs)))

    fast, slow = (B.Round(cal(ms), cont(ms)) for ms in (40.0, 60.0))
    errors = [r["error"] for r in B.paired_rounds([fast, slow], work, batch=8)]
    assert errors[0] == pytest.approx(errors[1], abs=0.02)
    assert "sim_gain" not in B.paired_rounds([fast], work, 8)[0]
    mixed_round = B.Round(fast.calibration, slow.continuous)
    (mixed,) = B.paired_rounds([mixed_round], work, 8)
    assert mixed["error"] == pytest.approx(errors[1] + 0.5 * (1 + errors[1]), abs=0.02)
    # a static run in the round: the measured gain is that round's continuous over its own static run
    static = replace(cont(60.0), policy="static", output_throughput=cont(60.0).output_throughput / 2)
    (paired,) = B.paired_rounds([replace(slow, static=static)], work, 8)
    assert paired["measured_gain"] == pytest.approx(2.0)
    assert paired["sim_gain"] == pytest.approx(1.0, abs=0.05)


def test_weight_load_reports_bytes_params_and_download_time(tmp_path):
    import torch
    from safetensors.torch import save_file

    path = tmp_path / "w.safetensors"
    save_file({"a": torch.ones(100, 10), "b": torch.zeros(7)}, str(path))
    (row,) = coldstart.weight_load(path, bandwidth_bytes_s=1000.0, rounds=3)
    assert row["params"] == 1007 and row["bytes"] == path.stat().st_size
    assert row["download_s"] == pytest.approx(row["bytes"] / 1000.0)
    assert len(row["load_runs"]) == 3 and row["load_s"] == sorted(row["load_runs"])[1]


def test_weight_load_alternates_the_formats_and_compares_them_round_by_round(tmp_path, monkeypatch):
    order = []

    def fake(name):
        def load(path):
            order.append(name)
            return name, 10
        return load

    monkeypatch.setattr(coldstart, "_load_safetensors", fake("st"))
    monkeypatch.setattr(coldstart, "_load_gguf", fake("gguf"))
    for name in ("a", "b"):
        (tmp_path / name).write_bytes(b"x" * 100)
    rows = coldstart.weight_load(tmp_path / "a", tmp_path / "b", bandwidth_bytes_s=100.0, rounds=4)
    assert order == ["st", "gguf", "gguf", "st"] * 2 and [r["format"] for r in rows] == ["st", "gguf"]
    rows[0]["load_runs"], rows[1]["load_runs"] = [1.0, 1.0, 1.0], [0.0, 1.0, 3.0]  # download 1 s each
    r = coldstart.pull_ratio(rows[1], rows[0])
    assert (r["median"], r["lo"], r["hi"], r["n"]) == (1.0, 0.5, 2.0, 3)


def test_llamacpp_start_is_read_off_its_own_log(tmp_path):
    log = tmp_path / "llama.log"
    log.write_text("0.00.006.880 I srv    load_model: loading model 'x.gguf'\n"
                   "1.02.522.538 I srv  llama_server: model loaded\n")
    assert coldstart.llamacpp_loaded_s(log) == pytest.approx(62.522538)
    log.write_text("0.00.006.880 I srv    load_model: loading model 'x.gguf'\n")
    with pytest.raises(ValueError, match="model loaded"):
        coldstart.llamacpp_loaded_s(log, wait_s=0.1)


def test_engine_start_rounds_alternate_the_files_and_stop_every_server(tmp_path, monkeypatch):
    from labkit.engines import llamacpp, process

    files = {}
    for name, size in (("Q4_1", 100), ("F32", 500)):
        files[name] = tmp_path / f"{name}.gguf"
        files[name].write_bytes(b"x" * size)
    started, stopped = [], []

    def start(gguf, **_):
        started.append(gguf.stem)
        log = tmp_path / f"{gguf.stem}-{len(started)}.log"
        log.write_text(f"0.00.{len(started):03d}.000 I srv  llama_server: model loaded\n")
        return process.Server(url="u", pid=0, log=log, model="m", proc=None)  # type: ignore[arg-type]

    monkeypatch.setattr(llamacpp, "start_llamacpp", start)
    monkeypatch.setattr(process, "stop", lambda srv: stopped.append(srv.log.name))
    rows = coldstart.engine_start_rounds(files, rounds=3, bandwidth_bytes_s=100.0)
    assert started == ["Q4_1", "F32", "F32", "Q4_1", "Q4_1", "F32"] and len(stopped) == 6
    assert rows["Q4_1"]["start_runs"] == [0.001, 0.004, 0.005] and rows["F32"]["download_s"] == 5.0
    r = coldstart.pull_ratio(rows["Q4_1"], rows["F32"], "start_runs")
    assert r["n"] == 3 and r["hi"] < 1  # 1 s of download against 5


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


def test_calibration_runs_feed_step_costs_and_the_chapter_readers():
    with fake_server(step_s=0.004) as srv:
        c1, c4 = B.calibration_runs(srv.url, "fake")
        assert [c.concurrency for c in B.calibration_runs(srv.url, "fake", batch=6)] == [1, 4, 6]
        cont = B.continuous(srv.url, "fake", [{"id": f"w{i}", "prompt": "p" * (i + 1), "max_tokens": 3}
                                              for i in range(6)], batch=3)
    assert (c1.concurrency, c1.completed, c4.concurrency, c4.completed) == (1, 3, 4, 8)
    assert c1.total_output_tokens == 3 * 24 and c4.total_output_tokens == 8 * 16
    costs = B.step_costs(c1, [c4])
    assert [b for b, _ in costs["decode_points"]] == [1, 4] and costs["prefill_points"][0][0] > 0
    held = B.slot_seconds(cont)
    assert 3 * 0.004 <= held < 5.0        # at least its three steps
    seen = B.prompt_tokens_by_id(cont)
    assert set(seen) <= {f"w{i}" for i in range(6)} and all(v > 0 for v in seen.values())
    row = B.table_row(cont)
    assert row["policy"] == "continuous" and row["completed"] == 6 and row["output_tok_s"] > 0
    assert row["p50_e2e_s"] <= row["p99_e2e_s"] and B.table_row(cont, "renamed")["policy"] == "renamed"
    with pytest.raises(ValueError, match="no request"):
        B.slot_seconds(fake_summary())


def test_cold_start_breakdown_plot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    phases = {"weights_s": 1.0, "model_init_s": 0.5, "engine_init_s": 4.0, "other_s": 10.0}
    bar = coldstart.vllm_bar(phases, 0.25)
    assert list(bar.values()) == [10.0, 0.5, 1.0, 4.0, 0.25]
    ax = coldstart.plot_breakdown({"python": {"imports": 2.0, "load": 1.0}, "vLLM": bar})
    widths = [p.get_width() for p in ax.patches]
    assert widths == [2.0, 1.0, 10.0, 0.5, 1.0, 4.0, 0.25]
    assert max(p.get_x() + p.get_width() for p in ax.patches) == pytest.approx(15.75)   # stacked
    assert [t.get_text() for t in ax.get_yticklabels()] == ["python", "vLLM"]
    plt.close(ax.figure)


def test_alternating_runs_interleave_calibration_and_the_measured_run():
    class Watch:
        entered = 0

        def __enter__(self):
            Watch.entered += 1

        def __exit__(self, *exc):
            return False

    work = [{"id": f"w{i}", "prompt": "p" * (i + 1), "max_tokens": 2} for i in range(4)]
    with fake_server(step_s=0.002) as srv:
        rounds = B.alternating_runs(srv.url, "fake", work, batch=6, rounds=2, watch_first=Watch(),
                                    static=True)
        with pytest.raises(ValueError, match="at least one round"):
            B.alternating_runs(srv.url, "fake", work, batch=2, rounds=0)
    assert len(rounds) == 2 and Watch.entered == 1
    for r in rounds:
        assert r.static is not None
        assert [s.concurrency for s in r.calibration] == [1, 4, 6]
        assert r.continuous.policy == "continuous" and r.continuous.completed == 4
        # each continuous run starts after its round's calibration ended, in order
        assert r.static.policy == "static" and r.static.completed == 4
        runs: list[metrics.RunSummary | B.BatchRun] = [*r.calibration, r.continuous, r.static]
        sent = [[q.t_sent for q in s.requests] for s in runs]
        assert all(max(a) < min(b) for a, b in zip(sent[:-1], sent[1:], strict=True))
    assert rounds[0].static is not None
    assert max(q.t_sent for q in rounds[0].static.requests) < min(
        q.t_sent for q in rounds[1].calibration[0].requests)
