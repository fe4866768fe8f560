"""Chapter 02's own checks (labkit/checks/metrics.py) against broken clients: each test streams real
requests from the loopback fake server (conftest's ``srv``) through labkit's clients with one piece of
the timing code mutated, computes the figure the notebook records from the records, and sees the check
fail; the real client, run the same way, holds.

The fake server stands in for each engine's own clock: vLLM's histograms are given its schedule
(prefill_s, step_s, a floor on what it really took), and llama-server's ``timings`` are made from the
durations the server itself measured in its Ollama answer (``prompt_eval_duration``, ``eval_duration``)."""

import time
from typing import Any

import pytest

from labkit.checks import outcome
from labkit.engines import vllm
from labkit.serving import decode_gap, loadgen, ollama_api, openai_api, records, streaming
from labkit.serving.loadspec import ClientSpec, LoadSpec
from labkit.serving.openai_api import llamacpp_server_timing
from labkit.serving.records import RequestRecord

PREFILL_S, STEP_S, TOKENS = 0.05, 0.01, 16
FAKE_SERVER_OPTS = {"prefill_s": PREFILL_S, "step_s": STEP_S}  # of conftest's srv


def _vllm_figures(url: str) -> dict:
    """The notebook's two figures: client means minus the server's own means of the same requests."""
    s = loadgen.run(url, LoadSpec(4, concurrency=1, max_tokens=TOKENS, warmup=0),
                    ClientSpec(model="fake", ignore_eos=True), progress=False)
    n = s.completed
    name_ttft, name_e2e = "vllm:time_to_first_token_seconds", "vllm:e2e_request_latency_seconds"
    after = {f"{name_ttft}_sum": n * PREFILL_S, f"{name_ttft}_count": n,
             f"{name_e2e}_sum": n * (PREFILL_S + (TOKENS - 1) * STEP_S), f"{name_e2e}_count": n}
    server = vllm.server_side_means({}, after)
    return {"server_kind": "vllm", "client_minus_vllm_ttft_ms": s.ttft.mean - server["ttft_s"] * 1e3,
            "client_minus_vllm_e2e_ms": s.e2el.mean - server["e2e_s"] * 1e3}


def test_client_with_a_blocked_event_loop_fails(srv, monkeypatch):
    real = _vllm_figures(srv.url)
    stamp = records.new_record

    def blocked(name: str) -> RequestRecord:  # the harness blocks its loop right after the send stamp
        rec = stamp(name)
        time.sleep(0.25)
        return rec

    monkeypatch.setattr(openai_api, "new_record", blocked)
    broken = _vllm_figures(srv.url)
    assert outcome("metrics", "client_matches_vllm", broken).held is False
    assert outcome("metrics", "client_matches_vllm", real).held is True


def _ollama_figures(url: str) -> dict:
    """The notebook's four figures of one request through the official ollama client."""
    rec = streaming.measure(ollama_api.ollama_backend("fake", host=url), "Explain inference.", TOKENS)
    m, sv = records.request_metrics(rec), rec.server
    assert sv is not None and sv["prompt_eval_s"] is not None and sv["eval_s"] is not None
    return {"ollama_server": "ollama", "ollama_ttft_ms": m["ttft_s"] * 1e3,
            "ollama_prompt_eval_ms": sv["prompt_eval_s"] * 1e3, "ollama_e2e_ms": m["e2e_s"] * 1e3,
            "ollama_eval_ms": sv["eval_s"] * 1e3}


def test_ollama_client_clock_started_late_fails(srv, monkeypatch):
    real = _ollama_figures(srv.url)
    # the send time stamped on another clock than the chunks' (wall time against perf_counter)
    monkeypatch.setattr(ollama_api, "new_record",
                        lambda name: RequestRecord(backend=name, t_sent=time.time()))
    broken = _ollama_figures(srv.url)
    assert outcome("metrics", "ollama_clock_encloses_server", broken).held is False
    assert outcome("metrics", "ollama_clock_encloses_server", real).held is True
    skipped = broken | {"ollama_server": "loopback"}
    assert outcome("metrics", "ollama_clock_encloses_server", skipped).held is None


def _llamacpp_figures(records: list[RequestRecord]) -> dict:
    """The notebook's path: decode_gap's layers over the requests, then its figures as recorded."""
    g = decode_gap.decode_layers(records, bench_tps=1 / STEP_S)
    figs = decode_gap.figures(g, {"gen_tps": 1 / STEP_S, "gen_tps_sd": 0.0, "threads": 1}, reps=1)
    return {"llamacpp_ran": True} | {f"llamacpp_{k}": v[0] for k, v in figs.items()}


def _ollama_records(url: str, n: int = 3) -> list[RequestRecord]:
    """Requests streamed by the ollama client, each given llama-server-style timings made from the
    durations the server measured itself (llama.cpp's rate: the tokens after the first over their time)."""
    out = []
    for _ in range(n):
        rec = streaming.measure(ollama_api.ollama_backend("fake", host=url), "Explain inference.", TOKENS)
        sv = rec.server
        assert sv is not None
        pe, ev, k = sv["prompt_eval_s"], sv["eval_s"], sv["eval_count"]
        assert pe is not None and ev is not None and k is not None
        rec.server = llamacpp_server_timing({"prompt_ms": pe * 1e3, "predicted_ms": ev * 1e3,
                                             "predicted_n": k, "predicted_per_second": (k - 1) / ev})
        out.append(rec)
    return out


def test_tpot_with_the_first_token_folded_in_fails(srv, monkeypatch):
    recs = _ollama_records(srv.url)
    real = _llamacpp_figures(recs)
    right = records.request_metrics

    def folded(rec):  # TPOT as the whole E2E over every token, the wait for the first one included
        m: dict[str, Any] = dict(right(rec))
        m["tps"] = m["output_tokens"] / m["e2e_s"]
        return m

    monkeypatch.setattr(decode_gap, "request_metrics", folded)
    broken = _llamacpp_figures(recs)
    assert outcome("metrics", "llamacpp_client_counts_server_rate", broken).held is False
    assert outcome("metrics", "llamacpp_client_counts_server_rate", real).held is True
    skipped = broken | {"llamacpp_ran": False}
    assert outcome("metrics", "llamacpp_client_counts_server_rate", skipped).held is None


def _openai_records(url: str, n: int = 3) -> list[RequestRecord]:
    """Requests streamed by labkit's OpenAI client (chat, a role-only chunk first, before prefill; token
    counts from the usage total, as for a server without per-chunk counts), each given llama-server-style
    timings of the fake server's schedule (a floor on what it really took)."""
    be = openai_api.openai_backend(url, "fake", ignore_eos=True, continuous_usage=False)
    out = []
    for _ in range(n):
        rec = streaming.measure(be, "Explain inference.", TOKENS)
        rec.server = llamacpp_server_timing({"prompt_ms": PREFILL_S * 1e3, "predicted_n": TOKENS,
                                             "predicted_ms": (TOKENS - 1) * STEP_S * 1e3,
                                             "predicted_per_second": 1 / STEP_S})
        out.append(rec)
    return out


def test_role_chunk_taken_for_the_first_token_fails(srv, monkeypatch):
    real = _llamacpp_figures(_openai_records(srv.url))
    text = openai_api._delta_text
    # a client that reads the role-only opening chunk as text, so it counts as the first token: its
    # "TTFT" ends before prefill does
    monkeypatch.setattr(openai_api, "_delta_text",
                        lambda delta: text(delta) or ("" if "role" not in delta else " "))
    broken = _llamacpp_figures(_openai_records(srv.url))
    assert outcome("metrics", "llamacpp_ttft_encloses_prefill", broken).held is False
    assert outcome("metrics", "llamacpp_ttft_encloses_prefill", real).held is True


def _stream_figures(chunks, count_chunks=False):
    """The chapter's stream_figures (notebooks/02_metrics.ipynb, "What to time, exactly"); with
    ``count_chunks`` the slip the chapter warns about: TPOT divided by chunks instead of tokens."""
    import math

    chunks = [(t, k) for t, k in chunks if k > 0]
    ttft, e2e = chunks[0][0], chunks[-1][0]
    n = len(chunks) if count_chunks else sum(k for _, k in chunks)
    tpot = (e2e - ttft) / (n - 1) if n > 1 else math.nan
    itl = [(t - t_prev) / k for (t_prev, _), (t, k) in zip(chunks, chunks[1:], strict=False)
           for _ in range(k)]
    return {"ttft_s": ttft, "e2e_s": e2e, "tpot_s": tpot, "itl_s": itl}


def _page_gap(rec: RequestRecord, **kw: Any) -> float:
    """The notebook's figure for one record: the largest |stream_figures - request_metrics|."""
    mine, ref = _stream_figures(rec.chunks, **kw), records.request_metrics(rec)
    assert len(mine["itl_s"]) == len(ref["itl_s"])
    pairs = [(mine[k], ref[k]) for k in ("ttft_s", "e2e_s", "tpot_s")]
    pairs += list(zip(mine["itl_s"], ref["itl_s"], strict=True))
    return max(abs(a - b) for a, b in pairs)


def test_stream_figures_dividing_by_chunks_fails():
    hand = RequestRecord(status="ok", t_sent=0.0, t_end=0.5, output_tokens=7,
                         chunks=[(0.20, 1), (0.35, 3), (0.50, 3)])  # the chapter's hand-written stream
    right, broken = _page_gap(hand), _page_gap(hand, count_chunks=True)
    assert outcome("metrics", "page_metrics_match", {"page_metrics_gap_s": broken}).held is False
    assert outcome("metrics", "page_metrics_match", {"page_metrics_gap_s": right}).held is True
    assert broken == pytest.approx(0.1)
