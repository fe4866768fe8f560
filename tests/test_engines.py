import platform

import pytest

from labkit.engines import compare as engines
from labkit.engines import vllm
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
    assert runs[1]["completed"] == 2 and runs[8]["completed"] == 8
    assert runs[8]["output_throughput"] > 2 * runs[1]["output_throughput"]
    rows = engines.compare({"fake, concurrency 1": runs[1], "fake, concurrency 8": runs[8]})
    assert [r["concurrency"] for r in rows] == [1, 8]
    assert rows[1]["aggregate_tps"] == runs[8]["output_throughput"]
    assert rows[0]["single_stream_tps"] == runs[1]["median_tps"]
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
    assert s["completed"] == 2 and s["total_output_tokens"] == 8
    assert s["concurrency"] == 1 and s["mean_tps"] > 0
