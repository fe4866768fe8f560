import platform

import pytest
from summaries import fake_summary

from labkit.engines import vllm
from labkit.experiments import compare as engines
from labkit.experiments import engine_runs as er
from labkit.experiments import format_vs_engine as fve
from labkit.serving.metrics import RunSummary
from labkit.table import format_rows


def test_reference_table_covers_the_tutorials_engines():
    names = [e["engine"] for e in engines.ENGINES]
    assert {"vLLM", "SGLang", "TensorRT-LLM"} <= set(names)
    trt = next(e for e in engines.ENGINES if e["engine"] == "TensorRT-LLM")
    assert trt["nvidia"] == "✓" and trt["amd"] == trt["apple"] == trt["x86_cpu"] == "✗"
    here = engines.available_here()
    assert set(names) <= set(here) and all(isinstance(v, str) and v for v in here.values())


def test_short_prompts_are_the_same_workload_each_time():
    a, b = engines.short_prompts(10), engines.short_prompts(10)
    assert a == b and len(a) == 10 and all(len(p) < 200 for p in a)


def test_measure_server_against_a_batching_fake_server(srv):
    # a step costs 20 ms plus 2 ms per stream in flight: batching 8 streams wins on aggregate
    srv.opts.update(step_s=0.02, batch_cost_s=0.002, max_tokens=8)
    runs = engines.measure_server(srv.url, "fake", concurrencies=(1, 8), n_requests={1: 2, 8: 8},
                                  max_tokens=8)
    assert set(runs) == {1, 8}
    assert runs[1].completed == 2 and runs[8].completed == 8
    assert runs[8].output_throughput > 2 * runs[1].output_throughput
    rows = engines.compare({"fake, concurrency 1": runs[1], "fake, concurrency 8": runs[8]})
    assert [r["concurrency"] for r in rows] == [1, 8]
    assert rows[1]["aggregate_tps"] == runs[8].output_throughput
    assert rows[0]["single_stream_tps"] == runs[1].median_tps
    table = format_rows(rows)
    assert "fake, concurrency 8" in table and len(table.splitlines()) == 3


def test_vllm_required_only_under_ci_on_linux_x86(monkeypatch):
    monkeypatch.delenv("CI", raising=False)
    assert vllm.vllm_required() is False
    monkeypatch.setenv("CI", "true")
    assert vllm.vllm_required() is (platform.system() == "Linux" and platform.machine() == "x86_64")
    monkeypatch.setenv("CI", "false")
    assert vllm.vllm_required() is False


@pytest.mark.slow
def test_measure_transformers_sequential_with_the_bundled_model():
    from labkit.models import load_llm
    from labkit.settings import set_threads

    set_threads()  # on 2 shared cores torch's default thread count is many times slower
    model, tok = load_llm(dtype="bfloat16", device="cpu")
    s = engines.measure_transformers(model, tok, n_requests=2, max_tokens=4)
    assert s.completed == 2 and s.total_output_tokens == 8
    assert s.concurrency == 1 and s.mean_tps > 0


# --- three engines on the same requests (chapter 05) ---------------------------------------------


def _run(tpot_ms: float, throughput: float, ttft_ms: float = 100.0) -> RunSummary:
    return fake_summary(tpot_median=tpot_ms, median_tps=1000 / tpot_ms, output_throughput=throughput,
                        ttft_median=ttft_ms, completed=4)


def test_step_anatomy_known_answer():
    a = fve.step_anatomy(20.0, 132.0, 8)  # 16 ms per stream, 4 ms shared
    assert a["per_stream_ms"] == pytest.approx(16.0) and a["fixed_ms"] == pytest.approx(4.0)
    assert a["fixed_share"] == pytest.approx(0.2)
    with pytest.raises(ValueError, match="n >= 2"):
        fve.step_anatomy(20.0, 30.0, 1)


def test_attribution_splits_the_format_from_the_engine():
    slow = er.EngineRun("vLLM", "vllm", "bfloat16 safetensors", runs={1: _run(60, 16), 8: _run(81, 90)},
                             weight_bytes=270e6)
    fast = er.EngineRun("llama.cpp", "llamacpp", "Q4_1 GGUF", runs={1: _run(20, 45), 8: _run(132, 55)},
                             weight_bytes=90e6)
    a = fve.attribution(slow, fast, bandwidth_bytes_per_s=10e9)
    assert a["bytes_ratio"] == pytest.approx(3.0) and a["tpot_ratio"] == pytest.approx(3.0)
    assert a["engine_factor"] == pytest.approx(1.0)
    assert a["slow_floor_ms"] == pytest.approx(27.0) and a["fast_floor_ms"] == pytest.approx(9.0)
    assert a["slow_bandwidth_share"] == pytest.approx(27 / 60)
    assert a["slow_c8_over_c1"] == pytest.approx(90 / 16) and a["fast_fixed_share"] == pytest.approx(0.2)
    text = "\n".join(fve.attribution_lines(slow, fast, a))
    assert "3.00x from the format x 1.00x from the engine" in text
    assert "llama.cpp 4.0 ms per step (under its weight reads" in text  # 4 ms < the 9 ms floor
    assert "vLLM 57.0 ms per step +" in text and "(under" not in text.split("vLLM 57.0")[1].split(";")[0]
    with pytest.raises(ValueError, match="weight bytes"):
        fve.attribution(er.EngineRun("x", "external", runs={1: _run(60, 16)}), fast, 10e9)


def test_tables_leave_out_skipped_engines():
    ran = er.EngineRun("llama.cpp", "llamacpp", "Q4_1 GGUF", "1 (-t, -tb)",
                            {1: _run(20, 45), 4: _run(60, 60)}, weight_bytes=96.6e6, memory_bytes=523e6,
                            memory_what="server process RSS")
    skipped = er.EngineRun("vLLM (CPU build)", "skipped", skipped="no vLLM here")
    rows = er.engine_rows([ran, skipped])
    assert [r["in_flight"] for r in rows] == [1, 4] and rows[1]["aggregate_tps"] == 60
    mem = er.memory_rows([ran, skipped])
    assert len(mem) == 1 and mem[0]["resident_mb"] == pytest.approx(523)
    assert mem[0]["weights_mb"] == pytest.approx(96.6)


def test_process_tree_memory_counts_the_children():
    import os
    import subprocess
    import sys

    alone = er.process_tree_memory(os.getpid())
    assert alone["rss"] > 10e6 and alone["processes"] >= 1
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        with_child = er.process_tree_memory(os.getpid())
        assert with_child["processes"] == alone["processes"] + 1 and with_child["rss"] > alone["rss"]
    finally:
        child.kill()
        child.wait()


def test_server_pid_reads_the_lab_registry(monkeypatch):
    monkeypatch.setattr(er, "lab_servers", lambda: [{"pid": 4242, "port": 8123, "engine": "llamacpp"}])
    assert er.server_pid("http://127.0.0.1:8123") == 4242
    assert er.server_pid("http://127.0.0.1:9000") is None


def test_safetensors_tensor_bytes_adds_up_the_header(tmp_path):
    import torch
    from safetensors.torch import save_file

    tensors = {"a": torch.zeros(3, 5, dtype=torch.bfloat16), "b": torch.zeros(7)}
    save_file(tensors, str(tmp_path / "m.safetensors"))
    assert er.safetensors_tensor_bytes(tmp_path / "m.safetensors") == 3 * 5 * 2 + 7 * 4


def test_measure_engine_skips_with_the_reason(monkeypatch):
    from labkit.engines import llamacpp

    monkeypatch.delenv("LABKIT_BASE_URL", raising=False)
    monkeypatch.setattr(llamacpp, "llamacpp_available", lambda: False)
    monkeypatch.setattr(llamacpp, "llamacpp_required", lambda: False)
    monkeypatch.setattr(vllm, "vllm_available", lambda: False)
    monkeypatch.setattr(vllm, "vllm_required", lambda: False)
    for name in ("llamacpp", "vllm"):
        e = er.measure_engine(name, ["hi"])
        assert e.kind == "skipped" and e.skipped and not e.runs
    with pytest.raises(ValueError, match="vllm or llamacpp"):
        er.measure_engine("ollama", ["hi"])


def test_measure_engine_against_your_server(srv, monkeypatch):
    srv.opts.update(step_s=0.01, batch_cost_s=0.001, max_tokens=6)
    monkeypatch.setenv("LABKIT_BASE_URL", srv.url)
    monkeypatch.setenv("LABKIT_MODEL", "fake")
    e = er.measure_engine("vllm", engines.short_prompts(4), max_tokens=6, in_flight=(1, 4),
                               n_requests={1: 2, 4: 4})
    assert e.kind == "external" and e.memory_bytes is None and e.weight_bytes is None
    assert e.runs[1].completed == 2 and e.runs[4].completed == 4
    t = er.tpot_range_ms(e.runs[4])
    assert t["n"] == 4 and t["lo"] <= t["median"] <= t["hi"]


@pytest.mark.slow  # starts llama.cpp on the bundled GGUF
def test_measure_engine_serves_the_gguf_with_llamacpp():
    from labkit.engines import llamacpp

    if not llamacpp.llamacpp_available():
        if llamacpp.llamacpp_required():
            pytest.fail(f"CI must build llama.cpp: {llamacpp.unavailable_reason()}")
        pytest.skip(llamacpp.unavailable_reason())
    e = er.measure_engine("llamacpp", engines.short_prompts(2), max_tokens=6, in_flight=(1, 2),
                               n_requests={1: 1, 2: 2}, threads=1)
    assert e.kind == "llamacpp" and e.weights == "Q4_1 GGUF" and e.threads.startswith("1 ")
    assert e.runs[2].completed == 2 and e.memory_bytes is not None and e.weight_bytes is not None
    assert 90e6 < e.weight_bytes < 100e6 < e.memory_bytes  # the GGUF's tensors, then weights + KV + runtime



def test_measure_engine_repeats_the_batching_gain_in_alternating_order(monkeypatch):
    """Round 1 is the sweep, then the two ends again, most in flight first in even rounds; the gain is
    taken round by round (a stand-in server whose throughput doubles, then triples, at 8)."""
    import contextlib

    from labkit.engines import server
    from labkit.engines.server import Target

    monkeypatch.setenv("LABKIT_BASE_URL", "http://127.0.0.1:9")
    orders, gains = [], iter([2.0, 3.0, 2.0, 3.0])

    @contextlib.contextmanager
    def stand_in(**_):
        yield Target("http://127.0.0.1:9", "m", "external", "your server")

    def measure(url, model, concurrencies, n_requests, prompts, max_tokens):
        orders.append(tuple(concurrencies))
        top = next(gains)
        return {c: fake_summary(completed=n_requests[c], output_throughput=10.0 * (top if c == 8 else 1))
                for c in concurrencies}

    monkeypatch.setattr(server, "measured_server", stand_in)
    monkeypatch.setattr(er, "measure_server", measure)
    e = er.measure_engine("vllm", ["hi"], in_flight=(1, 8), rounds=4)
    assert orders == [(1, 8), (8, 1), (1, 8), (8, 1)]
    assert e.batching_rounds == [2.0, 3.0, 2.0, 3.0]
    assert e.batching_gain is not None and e.batching_gain["median"] == 2.5
    assert (e.batching_gain["lo"], e.batching_gain["hi"], e.batching_gain["n"]) == (2.0, 3.0, 4)
    gains = iter([2.0])
    one = er.measure_engine("vllm", ["hi"], in_flight=(1, 8))  # rounds=1: the sweep's gain only
    assert one.batching_rounds == [2.0]


def test_paired_rounds_alternate_the_engines_and_keep_both_up(monkeypatch):
    """ABBA order over the rounds, each server started once for all of them (stand-ins for both)."""
    import contextlib

    from labkit.engines import llamacpp, server
    from labkit.engines.server import Target

    monkeypatch.setattr(vllm, "vllm_available", lambda: True)
    monkeypatch.setattr(llamacpp, "llamacpp_available", lambda: True)
    started, order = [], []

    @contextlib.contextmanager
    def stand_in(engine, **_):
        started.append(engine)
        yield Target(f"http://127.0.0.1:9/{engine}", engine, engine, engine)

    def measure(url, model, concurrencies, n_requests, prompts, max_tokens):
        order.append(model)
        return {1: fake_summary(completed=n_requests[1], tpot_median=10.0 if model == "vllm" else 4.0)}

    monkeypatch.setattr(server, "measured_server", stand_in)
    monkeypatch.setattr(er, "measure_server", measure)
    monkeypatch.setattr(er, "tpot_range_ms", lambda run: {"median": run.tpot.median})
    out = er.paired_decode_rounds(["hi"], rounds=4, requests=2)
    assert started == ["vllm", "llamacpp"]
    assert order == ["vllm", "llamacpp", "llamacpp", "vllm"] * 2
    assert out == {"vllm": [10.0] * 4, "llamacpp": [4.0] * 4}


def test_paired_rounds_measure_servers_already_up_without_starting_any(monkeypatch):
    from labkit.engines import server
    from labkit.engines.server import Target

    monkeypatch.setattr(vllm, "vllm_available", lambda: False)  # not needed: the servers are given
    monkeypatch.setattr(server, "measured_server", lambda **_: pytest.fail("started a server"))
    monkeypatch.setattr(er, "measure_server", lambda url, model, c, n, p, m: {1: fake_summary(
        completed=n[1], tpot_median=10.0 if model == "vllm" else 4.0)})
    monkeypatch.setattr(er, "tpot_range_ms", lambda run: {"median": run.tpot.median})
    up = {e: Target(f"http://127.0.0.1:9/{e}", e, e, e) for e in ("vllm", "llamacpp")}
    out = er.paired_decode_rounds(["hi"], rounds=2, targets=up)
    assert out == {"vllm": [10.0] * 2, "llamacpp": [4.0] * 2}


def test_measure_engine_keeps_its_server_up_on_a_given_stack(monkeypatch):
    import contextlib

    from labkit.engines import server
    from labkit.engines.server import Target

    monkeypatch.setenv("LABKIT_BASE_URL", "http://127.0.0.1:9")
    events = []

    @contextlib.contextmanager
    def stand_in(**_):
        events.append("up")
        yield Target("http://127.0.0.1:9", "m", "external", "your server")
        events.append("down")

    monkeypatch.setattr(server, "measured_server", stand_in)
    monkeypatch.setattr(er, "measure_server", lambda url, model, c, n, p, m: {
        k: fake_summary(completed=n[k], output_throughput=1.0) for k in c})
    with contextlib.ExitStack() as stack:
        e = er.measure_engine("vllm", ["hi"], in_flight=(1, 8), stack=stack)
        assert events == ["up"] and e.target is not None and e.target.url == "http://127.0.0.1:9"
    assert events == ["up", "down"]
    assert er.measure_engine("vllm", ["hi"], in_flight=(1, 8)).target is None and events[-1] == "down"


def test_paired_rounds_need_both_engines(monkeypatch):
    monkeypatch.setattr(vllm, "vllm_available", lambda: False)
    with pytest.raises(RuntimeError):
        er.paired_decode_rounds(["hi"])
