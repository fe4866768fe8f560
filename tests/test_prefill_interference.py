"""A long prompt's prefill against running answers (labkit.experiments.prefill_interference, chapter 05):
the gap arithmetic on made-up records, each engine's server flags and cache settings, and a caller's
running server used for its budget; the measurement itself runs in the chapter (vLLM, or llama.cpp
where vLLM cannot run) and in benchmarks/chunked_prefill.py (either engine)."""

import pytest

from labkit.experiments.prefill_interference import Interference, gaps_around
from labkit.serving.records import RequestRecord


def _stream(times, t_sent=100.0):
    return RequestRecord(status="ok", t_sent=t_sent, chunks=[(t, 1) for t in times])


def test_the_stall_is_the_longest_gap_over_the_prefill_and_the_itl_the_median_of_the_rest():
    # tokens every 0.1 s, then one 1.0 s gap while the long prompt prefilled (101.0 to 101.9)
    a = _stream([0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.9, 2.0, 2.1])
    b = _stream([0.15, 0.25, 0.35, 0.45, 0.55, 0.65, 0.75, 0.85, 0.95, 1.5, 1.95, 2.05])
    stall, itl = gaps_around([a, b], start=101.0, end=101.9)
    assert stall == pytest.approx(1.0)
    assert itl == pytest.approx(0.1)


def test_an_answer_that_ended_before_the_prefill_did_is_refused():
    with pytest.raises(ValueError, match="ended before"):
        gaps_around([_stream([0.1, 0.2, 0.3])], start=100.25, end=100.5)


def test_a_prefill_between_no_tokens_is_refused():
    with pytest.raises(ValueError, match="straddled"):
        gaps_around([_stream([5.0, 5.1, 5.2])], start=100.2, end=100.5)  # it began after the prefill


def test_medians_over_rounds():
    r = Interference(64, stall_s=[0.3, 0.1, 0.2], itl_s=[0.05, 0.06, 0.07], long_ttft_s=[1.0, 2.0, 3.0])
    assert (r.median("stall_s"), r.median("itl_s"), r.median("long_ttft_s")) == (0.2, 0.06, 2.0)


def test_each_engine_gets_its_own_budget_flag_and_no_prompt_cache(monkeypatch):
    from labkit.experiments import prefill_interference as pi

    seen: dict[str, dict] = {}
    monkeypatch.setattr(pi.vllm, "start_vllm", lambda **kw: seen.setdefault("vllm", kw))
    monkeypatch.setattr(pi.llamacpp, "start_llamacpp", lambda **kw: seen.setdefault("llamacpp", kw))
    pi.start("vllm", 64, streams=4, threads=1)
    pi.start("llamacpp", 64, streams=4, threads=1)
    assert seen["vllm"]["extra"] == ["--max-num-batched-tokens", "64"]  # otherwise the chapter's settings
    assert seen["llamacpp"]["extra"] == ["-b", "64", "-ub", "64"] and seen["llamacpp"]["parallel"] == 5
    assert pi.flag("vllm", 64) == "vLLM --max-num-batched-tokens 64"
    assert pi.flag("llamacpp", 8) == "llama-server -b 8"
    # no round reuses a cached prompt: llama-server is told per request, vLLM gets a salt per round
    assert pi.no_cache("llamacpp", 0) == pi.no_cache("llamacpp", 1) == {"cache_prompt": False}
    salts = [pi.no_cache("vllm", r)["cache_salt"] for r in range(3)]
    assert len(set(salts)) == 3


def test_a_running_server_is_used_for_its_budget_and_left_running(monkeypatch):
    from types import SimpleNamespace

    from labkit.experiments import prefill_interference as pi

    started: list[int] = []
    stopped: list = []
    asked: list[tuple[str, str]] = []
    mine = SimpleNamespace(url="http://kept", model="m")

    def start(engine, budget, streams, threads=None):
        started.append(budget)
        return SimpleNamespace(url=f"http://new{budget}", model="m")

    async def fake_round(url, model, short, long, streams, tokens, after_s, extra_body):
        asked.append((url, extra_body["cache_salt"]))
        t0 = 100.0
        run = [RequestRecord(status="ok", t_sent=t0, chunks=[(0.1 * i, 1) for i in range(1, 40)])
               for _ in range(streams)]
        return run, RequestRecord(status="ok", t_sent=t0 + 1.0, chunks=[(1.2, 1)], prompt_tokens=468)

    monkeypatch.setattr(pi, "start", start)
    monkeypatch.setattr(pi.process, "stop", stopped.append)
    monkeypatch.setattr(pi, "_round", fake_round)
    monkeypatch.setattr(pi.vllm, "vllm_available", lambda: True)
    out = pi.measure("long", batches=(2048, 64), rounds=2, engine="vllm", running={2048: mine})
    assert started == [64] and [s.url for s in stopped] == ["http://new64"]  # the kept one is not stopped
    assert [u for u, _ in asked] == ["http://kept", "http://new64", "http://new64", "http://kept"]
    assert asked[0][1] == asked[1][1] != asked[2][1]  # one salt per round, the same for both budgets
    assert out[2048].flag == "vLLM --max-num-batched-tokens 2048" and out[64].long_tokens == 468
    with pytest.raises(ValueError, match="does not hold"):
        pi.measure("long", batches=(64,), engine="vllm", running={2048: mine})


def test_an_unknown_engine_is_refused_before_anything_starts():
    from labkit.experiments import prefill_interference as pi

    with pytest.raises(ValueError, match="choose llamacpp or vllm"):
        pi.measure("a long prompt", engine="sglang")
    with pytest.raises(ValueError, match="choose llamacpp or vllm"):
        pi.start("sglang", 64, streams=4)
