"""Chapter 02's own checks (metrics): is the lab's timing code right on this machine? Each compares
labkit's client-side clock (TTFT and TPOT from the timestamps of streamed chunks) with an engine's own
clock of the same requests, on the figures ``notebooks/02_metrics.ipynb`` records, and each names the
unit test (``tests/test_lab_checks_metrics.py``) that runs a broken client through it and sees it fail.
A check whose engine did not run here says ``skip``.

The chapter's claims (prefill sets TTFT, decode sets TPS, batching, percentiles, the latency cost of
throughput) are judged by the ledger, ``data/claims/02_metrics.toml``; request accounting and token
counting are unit tests (``tests/test_loadgen.py``, ``tests/test_streaming.py``).
"""

from __future__ import annotations

from . import Values, check

BROKEN = "tests/test_lab_checks_metrics.py::"


def _vllm(v: Values) -> str | None:
    kind = v.get("server_kind")
    return None if kind == "vllm" else f"the server measured is {kind}, not vLLM: no server-side histograms"


@check("metrics", "the client's TTFT and E2E agree with vLLM's own histograms: never earlier (5 ms "
       "slack for the two clocks' start), under 200 ms later",
       needs=("client_minus_vllm_ttft_ms", "client_minus_vllm_e2e_ms"),
       broken=BROKEN + "test_client_with_a_blocked_event_loop_fails",
       # a harness that blocks its event loop for a quarter second after stamping the send time
       fails_on={"server_kind": "vllm", "client_minus_vllm_ttft_ms": 250.0,
                 "client_minus_vllm_e2e_ms": 252.0},
       holds_on={"server_kind": "vllm", "client_minus_vllm_ttft_ms": 9.8, "client_minus_vllm_e2e_ms": 9.0},
       when=_vllm)
def client_matches_vllm(v: Values) -> tuple[bool, str]:
    dt, de = v["client_minus_vllm_ttft_ms"], v["client_minus_vllm_e2e_ms"]
    # the client's clock starts before the server's and stops after it: the difference is HTTP, SSE
    # framing and loopback (a few ms); 200 ms is a harness, not a network, and below -5 ms a clock slip
    return -5 <= dt < 200 and -5 <= de < 200, f"client adds {dt:+.1f} ms TTFT, {de:+.1f} ms E2E"


@check("metrics", "the chapter's stream_figures gives the TTFT, E2E, TPOT and ITL of labkit's "
       "request_metrics on every request it streamed", needs=("page_metrics_gap_s",),
       broken=BROKEN + "test_stream_figures_dividing_by_chunks_fails",
       # TPOT over chunks instead of tokens, on a stream whose chunks carry three tokens (0.2, 0.35, 0.5 s)
       fails_on={"page_metrics_gap_s": 0.1}, holds_on={"page_metrics_gap_s": 0.0})
def page_metrics_match(v: Values) -> tuple[bool, str]:
    x = v["page_metrics_gap_s"]
    return x <= 1e-9, f"largest difference {x:.1e} s"  # the same arithmetic: equal, but for float order


def _real_ollama(v: Values) -> str | None:
    return None if v.get("ollama_server") == "ollama" else "no Ollama server answered on localhost:11434"


@check("metrics", "the Ollama client's clock encloses the server's own: TTFT >= prefill, E2E >= decode",
       needs=("ollama_ttft_ms", "ollama_prompt_eval_ms", "ollama_e2e_ms", "ollama_eval_ms"),
       broken=BROKEN + "test_ollama_client_clock_started_late_fails",
       # a client whose clock starts late (or on another clock than its chunks') reads TTFT below prefill
       fails_on={"ollama_server": "ollama", "ollama_ttft_ms": 41.0, "ollama_prompt_eval_ms": 50.0,
                 "ollama_e2e_ms": 692.0, "ollama_eval_ms": 636.0},
       holds_on={"ollama_server": "ollama", "ollama_ttft_ms": 57.0, "ollama_prompt_eval_ms": 50.0,
                 "ollama_e2e_ms": 692.0, "ollama_eval_ms": 636.0},
       when=_real_ollama)
def ollama_clock_encloses_server(v: Values) -> tuple[bool, str]:
    held = v["ollama_ttft_ms"] >= v["ollama_prompt_eval_ms"] and v["ollama_e2e_ms"] >= v["ollama_eval_ms"]
    return held, (f"TTFT {v['ollama_ttft_ms']:.0f} ms vs prompt_eval {v['ollama_prompt_eval_ms']:.0f} ms; "
                  f"E2E {v['ollama_e2e_ms']:.0f} ms vs eval {v['ollama_eval_ms']:.0f} ms")


def _llamacpp_ran(v: Values) -> str | None:
    # skipped only where the chapter recorded that llama.cpp is not built here (never under CI)
    return "llama.cpp is not built here (make llamacpp builds it)" if v.get("llamacpp_ran") is False else None


@check("metrics", "counting streamed tokens over time gives the engine's own decode rate: labkit's 1/TPOT "
       "within 5% of llama-server's timings (median over requests)",
       needs=("llamacpp_client_over_server",),
       broken=BROKEN + "test_tpot_with_the_first_token_folded_in_fails",
       # a TPOT that divides the whole E2E, first token's wait included, by every token (GuideLLM's way)
       fails_on={"llamacpp_ran": True, "llamacpp_client_over_server": 0.8},
       holds_on={"llamacpp_ran": True, "llamacpp_client_over_server": 1.003},
       when=_llamacpp_ran)
def llamacpp_client_counts_server_rate(v: Values) -> tuple[bool, str]:
    x = v["llamacpp_client_over_server"]
    # 5%: both clocks time the same tokens' gaps, the client's after delivery over loopback; a client
    # that lags the engine, or a TPOT defined otherwise, is off by more
    return 0.95 <= x <= 1.05, f"labkit's 1/TPOT is {x:.3f}x the server's own rate"


@check("metrics", "the first streamed token reaches labkit after llama.cpp's own prefill ends, under "
       "100 ms later (median over requests)",
       needs=("llamacpp_ttft_minus_prefill_ms",),
       broken=BROKEN + "test_role_chunk_taken_for_the_first_token_fails",
       # a client that takes a chat stream's role-only opening chunk (sent before prefill) for the first
       # token, or starts its clock after sending: TTFT below the server's prefill
       fails_on={"llamacpp_ran": True, "llamacpp_ttft_minus_prefill_ms": -48.0},
       holds_on={"llamacpp_ran": True, "llamacpp_ttft_minus_prefill_ms": 11.9},
       when=_llamacpp_ran)
def llamacpp_ttft_encloses_prefill(v: Values) -> tuple[bool, str]:
    d = v["llamacpp_ttft_minus_prefill_ms"]
    # beyond prefill, TTFT holds request parsing, the chat template, tokenization and HTTP: milliseconds
    return 0 <= d < 100, f"labkit's TTFT is {d:+.1f} ms beyond llama-server's prefill"
