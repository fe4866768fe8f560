"""Where generation speed goes between llama-bench and the client (chapter 02): the layer
arithmetic of labkit.serving.decode_gap on hand-written records, and llama.cpp's timings."""

from typing import Any

import httpx
import pytest

from labkit.serving import decode_gap
from labkit.serving.openai_api import llamacpp_server_timing
from labkit.serving.records import RequestRecord

# the usage chunk of a real llama-server stream (SmolLM2 Q4_1, 2 threads): 31 gaps in 408.74 ms
TIMINGS = {"cache_n": 0, "prompt_n": 37, "prompt_ms": 149.084, "prompt_per_token_ms": 4.029,
           "prompt_per_second": 248.18, "predicted_n": 32, "predicted_ms": 408.74,
           "predicted_per_token_ms": 13.185, "predicted_per_second": 75.843}


def test_llamacpp_timing_in_seconds_and_its_own_rate():
    t = llamacpp_server_timing(TIMINGS)
    assert t["eval_count"] == 32 and t["prompt_eval_count"] == 37
    assert t["eval_s"] == pytest.approx(0.40874) and t["prompt_eval_s"] == pytest.approx(0.149084)
    assert t["total_s"] == pytest.approx(0.557824) and t["load_s"] is None
    # the server's rate counts the 31 tokens after the first, as 1/TPOT does
    assert t["eval_tokens_per_s"] == pytest.approx(31 / 0.40874, rel=1e-4)
    assert llamacpp_server_timing({})["eval_tokens_per_s"] is None


def record(pid, ttft, step, n=5, server_tps=None, prefill=None):
    """A streamed request: first token at ``ttft`` s, then one token every ``step`` s."""
    chunks: list[tuple[float, int | None]] = [(ttft + i * step, 1) for i in range(n)]
    sv: Any = None
    if server_tps is not None:
        sv = {"eval_count": n, "prompt_eval_count": 10, "eval_s": (n - 1) / server_tps,
              "prompt_eval_s": prefill, "load_s": None, "total_s": None, "eval_tokens_per_s": server_tps}
    return RequestRecord(status="ok", t_sent=0.0, t_end=chunks[-1][0], chunks=chunks, output_tokens=n,
                         prompt_tokens=10, server=sv, prompt_id=pid)


def plain(tps):
    return {"eval_count": 5, "prompt_eval_count": 10, "eval_s": 4 / tps, "prompt_eval_s": 0.01,
            "load_s": None, "total_s": None, "eval_tokens_per_s": tps}


def test_layers_add_up_to_the_clients_time_per_token():
    # model 10 ms/token; server alone 12.5 ms; streamed 20 ms on its clock; client sees 25 ms
    recs = [record(i, 0.1, 0.025, server_tps=50.0, prefill=0.09) for i in range(3)]
    g = decode_gap.decode_layers(recs, 100.0, {i: plain(80.0) for i in range(3)})
    assert g["n"] == 3 and g["layers"] == ["sampling", "streaming", "delivery"]
    assert g["model_ms_per_token"] == pytest.approx(10.0)
    assert g["sampling_ms"]["median"] == pytest.approx(2.5)
    assert g["streaming_ms"]["median"] == pytest.approx(7.5)
    assert g["delivery_ms"]["median"] == pytest.approx(5.0)
    total = g["model_ms_per_token"] + sum(g[f"{k}_ms"]["median"] for k in g["layers"])
    assert total == pytest.approx(1e3 / g["client_tps"]["median"])
    assert g["client_over_server"]["median"] == pytest.approx(0.8)
    assert g["client_over_bench"]["median"] == pytest.approx(0.4)
    assert g["unstreamed_over_bench"]["median"] == pytest.approx(0.8)
    assert g["e2e_tps"]["median"] == pytest.approx(5 / 0.2)
    assert g["ttft_minus_prefill_ms"]["median"] == pytest.approx(10.0)
    text = decode_gap.gap_sentences(g)
    assert "+2.50 ms" in text and "+7.50 ms" in text and "the largest layer: streaming" in text


def test_without_the_unstreamed_clock_the_server_is_one_layer():
    recs = [record(0, 0.1, 0.025, server_tps=50.0, prefill=0.09)]
    g = decode_gap.decode_layers(recs, 100.0)
    assert g["layers"] == ["server", "delivery"] and "unstreamed_tps" not in g
    assert g["server_ms"]["median"] == pytest.approx(10.0)
    assert "not streamed" not in decode_gap.gap_sentences(g)


def test_a_layer_on_both_sides_of_zero_is_called_noise():
    recs = [record(i, 0.1, 0.02, server_tps=50.0, prefill=0.09) for i in range(3)]
    g = decode_gap.decode_layers(recs, 50.0, {0: plain(45.0), 1: plain(50.0), 2: plain(55.0)})
    assert g["sampling_ms"]["lo"] < 0 < g["sampling_ms"]["hi"]
    assert "(within this run's noise)" in decode_gap.gap_sentences(g).splitlines()[6]


def test_requests_without_the_servers_timing_are_left_out():
    recs = [record(0, 0.1, 0.02), record(1, 0.1, 0.02, server_tps=50.0),
            RequestRecord(status="timeout", server=plain(50.0), prompt_id=2)]
    rows = decode_gap.per_request(recs, {1: plain(40.0)})
    assert [r["prompt_id"] for r in rows] == [1] and rows[0]["unstreamed_tps"] == 40.0
    assert rows[0]["prefill_ms"] is None
    with pytest.raises(ValueError, match="timing"):
        decode_gap.decode_layers([record(0, 0.1, 0.02)], 50.0)
    with pytest.raises(ValueError, match="unstreamed"):
        decode_gap.decode_layers(recs, 50.0, {7: plain(40.0)})
    with pytest.raises(ValueError, match="positive"):
        decode_gap.decode_layers(recs, 0.0)


def test_unstreamed_timing_posts_a_plain_request(monkeypatch):
    sent: dict[str, Any] = {}

    def post(url, json, timeout):
        sent.update(url=url, body=json)
        return httpx.Response(200, json={"choices": [], "timings": TIMINGS},
                              request=httpx.Request("POST", url))

    monkeypatch.setattr(httpx, "post", post)
    t = decode_gap.unstreamed_timing("http://127.0.0.1:9/v1", "smollm2", "Hi", 32)
    assert sent["url"] == "http://127.0.0.1:9/v1/chat/completions"
    assert sent["body"]["stream"] is False and sent["body"]["ignore_eos"] and sent["body"]["max_tokens"] == 32
    assert t["eval_tokens_per_s"] == pytest.approx(75.843)
    monkeypatch.setattr(httpx, "post", lambda url, json, timeout: httpx.Response(
        200, json={"choices": []}, request=httpx.Request("POST", url)))
    with pytest.raises(RuntimeError, match="timings"):
        decode_gap.unstreamed_timing("http://127.0.0.1:9", "m", "Hi")


def test_figures_are_what_the_chapter_records():
    recs = [record(i, 0.1, 0.025, server_tps=50.0, prefill=0.09) for i in range(3)]
    g = decode_gap.decode_layers(recs, 100.0, {i: plain(80.0) for i in range(3)})
    f = decode_gap.figures(g, {"gen_tps": 100.0, "gen_tps_sd": 4.0, "threads": 2}, reps=3)
    assert f["threads"][0] == 2
    assert f["bench_gen_tps"][0] == 100.0 and f["bench_gen_tps"][3] == (96.0, 104.0, 3)
    spread = f["sampling_ms"][3]
    assert f["sampling_ms"][0] == pytest.approx(2.5) and spread is not None and spread[2] == 3
    assert "server_ms" not in f and "client_over_server" in f
    assert all(unit for _, unit, _, _ in f.values())


def test_threads_on_every_cpu_are_said():
    g = decode_gap.decode_layers([record(0, 0.1, 0.025, server_tps=50.0, prefill=0.09)], 100.0)
    assert "take all 2 logical CPUs" in decode_gap.gap_sentences(g, threads=2, cpus=2)
    assert "logical CPUs" not in decode_gap.gap_sentences(g, threads=1, cpus=2)
    assert "logical CPUs" not in decode_gap.gap_sentences(g)


def test_llama_benchs_spread_widens_what_depends_on_it():
    recs = [record(i, 0.1, 0.025, server_tps=50.0, prefill=0.09) for i in range(3)]
    plain3 = {i: plain(80.0) for i in range(3)}
    tight = decode_gap.decode_layers(recs, 100.0, plain3)
    wide = decode_gap.decode_layers(recs, 100.0, plain3, bench_sd=10.0)
    assert wide["sampling_ms"]["median"] == tight["sampling_ms"]["median"] == pytest.approx(2.5)
    assert wide["sampling_ms"]["lo"] == pytest.approx(12.5 - 1e3 / 90) and wide["sampling_ms"]["hi"] == \
        pytest.approx(12.5 - 1e3 / 110)
    assert wide["client_over_bench"]["lo"] == pytest.approx(40 / 110)
    assert wide["client_over_bench"]["hi"] == pytest.approx(40 / 90)
    assert wide["delivery_ms"] == tight["delivery_ms"]  # llama-bench plays no part in it
    assert "100.0 ± 10.0 tok/s" in decode_gap.gap_sentences(wide)
    # a stalled repetition: sd as large as the mean leaves the low end near 0, an interval all but unbounded
    stalled = decode_gap.decode_layers(recs, 100.0, plain3, bench_sd=120.0)
    assert stalled["client_over_bench"]["hi"] == pytest.approx(40 / 0.1)
    assert stalled["client_over_bench"]["median"] == tight["client_over_bench"]["median"]
    with pytest.raises(ValueError, match="bench_sd"):
        decode_gap.decode_layers(recs, 100.0, plain3, bench_sd=-1.0)


def test_a_layer_below_zero_everywhere_is_said():
    recs = [record(i, 0.1, 0.02, server_tps=50.0, prefill=0.09) for i in range(3)]
    g = decode_gap.decode_layers(recs, 40.0, {i: plain(45.0 + i) for i in range(3)})
    assert g["sampling_ms"]["hi"] < 0
    text = decode_gap.gap_sentences(g)
    assert "(below zero on every request)" in text.splitlines()[6]
    assert "the largest layer" not in text and "no layer added time in this run" in text


def test_a_layer_that_rounds_to_zero_prints_no_minus_sign():
    g = decode_gap.decode_layers([record(0, 0.1, 0.025, server_tps=50.0, prefill=0.09)], 100.0)
    g["delivery_ms"] = {"median": -0.004, "lo": -0.001, "hi": 0.1, "n": 1}
    g["ttft_minus_prefill_ms"] = {"median": -0.01, "lo": -0.04, "hi": 1.0, "n": 1}
    text = decode_gap.gap_sentences(g)
    assert "-0.00" not in text and "-0.0 " not in text and "+0.00 ms [+0.00, +0.10]" in text
    assert "waited 0.0 ms [0.0, 1.0]" in text
