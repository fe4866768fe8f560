"""Chapter 02's figures for the report, read from the page's variables once the chapter has run
(its closing cell calls :func:`labkit.figures.keep`)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from ..engines import llamacpp
from ..results import record, unmeasured
from ..serving import decode_gap
from . import take


def keep(page: Mapping[str, Any]) -> None:
    """Record chapter 02's figures from ``page``, the notebook's variables at its end."""

    # 4. Ollama's native API
    (by_kind_ms, d_e2e, d_ttft, engine, is_vllm, one_slow, prof, runs, server_side, st, target) = take(
        page, "by_kind_ms d_e2e d_ttft engine is_vllm one_slow prof runs server_side st target")
    by_c = {s.concurrency: s for s in runs}
    slow = next(k for k in range(1, 10_000) if np.percentile([0.1] * (10_000 - k) + [2.0] * k, 99) >= 2.0)
    record("metrics", "server_kind", target.kind, "", engine)
    (page_metrics_gap, swept) = take(page, "page_metrics_gap swept")
    record("metrics", "page_metrics_gap_s", page_metrics_gap, "s",
           f"largest |stream_figures - request_metrics| over TTFT, E2E, TPOT and every ITL of {len(swept)} "
           "streamed requests (the chapter's code against labkit's tested copy)")
    for kind in ("short", "long"):
        record("metrics", f"ttft_{kind}_ms", by_kind_ms[kind]["ttft_ms"], "ms",
               f"{prof.llm} in this process: median TTFT")
        record("metrics", f"tpot_{kind}_ms", by_kind_ms[kind]["tpot_ms"], "ms",
               f"{prof.llm} in this process: median TPOT")
    record("metrics", "ttft_long_over_short", by_kind_ms["long"]["ttft_ms"] / by_kind_ms["short"]["ttft_ms"],
           "x", f"{prof.llm} in this process: median TTFT, long vs short prompts")
    record("metrics", "tpot_long_over_short", by_kind_ms["long"]["tpot_ms"] / by_kind_ms["short"]["tpot_ms"],
           "x", f"{prof.llm} in this process: median TPOT, long vs short prompts")
    for c in (4, 32):
        record("metrics", f"throughput_c{c}_over_c1",
               by_c[c].output_throughput / by_c[1].output_throughput, "x",
               f"{engine}: output tokens/s at {c} vs 1 requests in flight")
    for c in (2, 4, 8, 32):
        record("metrics", f"per_slot_tok_s_c{c}", by_c[c].output_throughput / c, "tokens/s",
               f"{engine}: output tokens/s per request in flight at {c}")
    for c in (1, 2, 32):
        record("metrics", f"p99_e2e_ms_c{c}", by_c[c].e2el.p99, "ms",
               f"{engine}: P99 E2E at {c} in flight")
    record("metrics", "p99_ttft_ms_c32", by_c[32].ttft.p99, "ms", f"{engine}: P99 TTFT at 32 in flight")
    record("metrics", "p50_ttft_ms_c1", by_c[1].ttft.p50, "ms", f"{engine}: median TTFT alone")
    record("metrics", "p99_e2e_c32_over_c1", by_c[32].e2el.p99 / by_c[1].e2el.p99, "x",
           f"{engine}: P99 E2E")
    record("metrics", "p99_over_mean_ttft_c32", by_c[32].ttft.p99 / by_c[32].ttft.mean, "x",
           f"{engine}, TTFT at 32")
    record("metrics", "p99_ms_two_slow_in_100", st["p99"] * 1e3, "ms",
           "100 latencies of 0.1 s, two of them 2 s")
    record("metrics", "p99_ms_one_slow_in_100", one_slow["p99"] * 1e3, "ms",
           "100 latencies of 0.1 s, one of them 2 s")
    record("metrics", "p99_2s_slow_share", slow / 10_000, "x",
           f"fewest of 10,000 latencies at 2 s for a P99 of 2 s: {slow}")
    if is_vllm:
        record("metrics", "client_minus_vllm_ttft_ms", d_ttft, "ms",
               f"mean over {server_side['n_ttft_s']:.0f} requests")
        record("metrics", "client_minus_vllm_e2e_ms", d_e2e, "ms",
               f"mean over {server_side['n_ttft_s']:.0f} requests")
    ctx, label, om, orec, sv = take(page, "ctx label om orec sv")
    record("metrics", "ollama_server", "ollama" if ctx is None else "loopback", "", label)
    if target.kind == "simulated":  # a simulator's figures are no measurement of an engine
        for key in ("throughput_c4_over_c1", "throughput_c32_over_c1", "p99_e2e_c32_over_c1",
                    "p99_over_mean_ttft_c32"):
            unmeasured("metrics", key,
                       f"no engine could run here, only labkit's simulated server: {'; '.join(target.notes)}")
    if orec.status == "ok":
        for key, secs in (("ttft", om["ttft_s"]), ("prompt_eval", sv["prompt_eval_s"]), ("e2e", om["e2e_s"]),
                          ("eval", sv["eval_s"])):
            record("metrics", f"ollama_{key}_ms", secs * 1e3, "ms", f"{label}, one request")

    # labkit's tokens/s next to llama-bench's
    ran = take(page, "ran")[0]
    record("metrics", "llamacpp_ran", ran, "", "measured" if ran else llamacpp.unavailable_reason())
    if not ran:
        unmeasured("metrics", "llamacpp_client_over_bench", llamacpp.unavailable_reason())
    if ran:
        gap, lbench, BENCH_REPS = take(page, "gap lbench BENCH_REPS")
        for key, (value, unit, note, spread) in decode_gap.figures(gap, lbench, reps=BENCH_REPS).items():
            record("metrics", f"llamacpp_{key}", value, unit, note, spread=spread)
