"""Metric definitions against timelines computed by hand (chapter 02)."""

import json
import math

import numpy as np
import pytest
from summaries import fake_summary

from labkit.serving import metrics, records
from labkit.serving.records import RequestRecord
from labkit.stats import summary


def rec(chunks, output_tokens=None, status="ok", t_end=None, prompt_tokens=None):
    t_end = t_end if t_end is not None else (chunks[-1][0] + 0.001 if chunks else 0.0)
    return RequestRecord(status=status, t_sent=10.0, t_end=10.0 + t_end, chunks=[tuple(c) for c in chunks],
                         output_tokens=output_tokens, prompt_tokens=prompt_tokens)


def test_one_token_per_chunk():
    m = records.request_metrics(rec([[0.2, 1], [0.3, 1], [0.4, 1], [0.5, 1]], 4))
    assert m["ttft_s"] == pytest.approx(0.2)
    assert m["e2e_s"] == pytest.approx(0.5)
    assert m["tpot_s"] == pytest.approx(0.1)  # (0.5 - 0.2) / (4 - 1)
    assert m["itl_s"] == pytest.approx([0.1, 0.1, 0.1])
    assert m["chunk_gaps_s"] == pytest.approx([0.1, 0.1, 0.1])
    assert m["tps"] == pytest.approx(10.0)
    assert m["output_tokens_per_s"] == pytest.approx(8.0)


def test_multi_token_chunks_share_their_gap():
    # tokens: 1 at 0.2; 2 at 0.4; 3 at 0.7 -> 6 tokens, decode 0.5 s over 5 tokens
    m = records.request_metrics(rec([[0.2, 1], [0.4, 2], [0.7, 3]], 6))
    assert m["tpot_s"] == pytest.approx(0.1)
    assert m["itl_s"] == pytest.approx([0.1] * 5)
    assert np.mean(m["itl_s"]) == pytest.approx(m["tpot_s"])
    # vLLM-style per-chunk gaps overstate the per-token gap 2.5x here: the trap
    assert np.mean(m["chunk_gaps_s"]) == pytest.approx(0.25)


def test_tokens_in_first_chunk_have_no_gap():
    m = records.request_metrics(rec([[0.2, 3], [0.3, 1]], 4))
    assert m["ttft_s"] == pytest.approx(0.2)
    assert m["itl_s"] == pytest.approx([0.1])
    assert m["tpot_s"] == pytest.approx(0.1 / 3)


def test_one_token_output_has_no_tpot():
    m = records.request_metrics(rec([[0.25, 1]], 1))
    assert m["ttft_s"] == pytest.approx(0.25) and m["e2e_s"] == pytest.approx(0.25)
    assert math.isnan(m["tpot_s"]) and m["itl_s"] == [] and math.isnan(m["tps"])
    s = metrics.summarize([rec([[0.25, 1]], 1)], duration_s=1.0, slo={"ttft_ms": 300, "tpot_ms": 1})
    assert s.tpot.n == 0 and math.isnan(s.tpot.mean)
    assert s.request_goodput == pytest.approx(1.0)  # no TPOT to violate, as in vLLM


def test_output_tokens_from_usage_override_chunk_sum():
    # server says 5 tokens; chunk counts unknown -> TPOT still defined, ITL not
    m = records.request_metrics(rec([[0.2, None], [0.6, None]], 5))
    assert m["tpot_s"] == pytest.approx(0.1)
    assert m["itl_s"] == [] and m["chunk_gaps_s"] == pytest.approx([0.4])


def test_summary_counts_failures_and_uses_only_completed():
    ok1 = rec([[0.1, 1], [0.2, 1]], 2, prompt_tokens=5)
    ok2 = rec([[0.3, 1], [0.5, 1], [0.7, 1]], 3, prompt_tokens=7)
    bad = rec([], None, status="http_error", t_end=0.05)
    broken = rec([[0.2, 1]], 1, status="broken_stream")
    s = metrics.summarize([ok1, ok2, bad, broken], duration_s=2.0)
    assert s.n_requests == 4 and s.completed == 2 and s.failed == 2
    assert s.status_counts["http_error"] == 1 and s.status_counts["broken_stream"] == 1
    assert s.total_output_tokens == 5 and s.total_input_tokens == 12
    assert s.output_throughput == pytest.approx(2.5)
    assert s.request_throughput == pytest.approx(1.0)
    assert s.ttft.n == 2 and s.itl.n == 3
    assert s.ttft.median == pytest.approx(200.0)
    assert s.ttft.p99 == pytest.approx(np.percentile([100, 300], 99))
    assert s.tpot.mean == pytest.approx(np.mean([100, 200]))
    named = s.vllm_names()  # by the names vLLM's result file uses
    assert named["median_ttft_ms"] == s.ttft.median and named["p99_itl_ms"] == s.itl.p99
    assert named["total_token_throughput"] == s.total_token_throughput and named["completed"] == 2
    saved = json.loads(json.dumps(s.to_json()))
    assert saved["p99_ttft_ms"] == s.ttft.p99 and saved["n_itl"] == 3 and "requests" not in saved
    with pytest.raises(ValueError, match="unknown figure"):
        s.spread("ttfb")
    text = metrics.format_report(s)
    assert "2 requests" in text and "3 gaps" in text and "http_error 1" in text
    assert "chunk gap ms" in text and "vLLM's ITL is per chunk" in text  # which ITL is which


def test_summary_duration_defaults_to_first_send_to_last_close():
    a = RequestRecord(status="ok", t_sent=1.0, t_end=2.0, chunks=[(0.5, 1), (1.0, 1)], output_tokens=2)
    b = RequestRecord(status="ok", t_sent=1.5, t_end=4.0, chunks=[(1.0, 1), (2.5, 1)], output_tokens=2)
    assert metrics.summarize([a, b]).duration_s == pytest.approx(3.0)


def test_goodput_needs_every_limit():
    fast = rec([[0.1, 1], [0.15, 1]], 2)
    slow_start = rec([[0.9, 1], [0.95, 1]], 2)
    slow_decode = rec([[0.1, 1], [0.6, 1]], 2)
    s = metrics.summarize([fast, slow_start, slow_decode], duration_s=1.0,
                          slo={"ttft_ms": 500, "tpot_ms": 100})
    assert s.request_goodput == pytest.approx(1.0)
    with pytest.raises(ValueError, match="unknown SLO"):
        metrics.summarize([fast], slo={"ttft": 1})


def test_stats_match_numpy_and_empty_is_nan():
    x = [5.0, 1.0, 9.0, 3.0, 7.0, float("nan")]
    st = summary(x)
    clean = [5.0, 1.0, 9.0, 3.0, 7.0]
    assert st["n"] == 5
    for p in (50, 90, 99):
        assert st[f"p{p}"] == pytest.approx(np.percentile(clean, p))
    assert st["std"] == pytest.approx(np.std(clean))
    empty = summary([])
    assert empty["n"] == 0 and math.isnan(empty["p99"]) and math.isnan(empty["mean"])
    p999 = summary([1.0, 2.0], percentiles=(99.9,))["p99.9"]
    assert p999 == pytest.approx(np.percentile([1, 2], 99.9))


def test_p99_at_least_p50():
    rng = np.random.default_rng(0)
    recs = [rec([[float(t), 1], [float(t) + 0.05, 1]], 2) for t in rng.exponential(0.2, 200)]
    s = metrics.summarize(recs, duration_s=10.0)
    assert s.ttft.p99 >= s.ttft.p90 >= s.ttft.p50


class WordTokenizer:
    """Whitespace tokenizer that, like real ones, prepends BOS when asked for special tokens."""

    def __call__(self, text, add_special_tokens=True):
        ids = list(range(len(text.split())))
        return {"input_ids": ([-1] if add_special_tokens else []) + ids}


def test_token_counting_never_counts_chunks():
    counts, n, src = records.count_chunk_tokens(["a", " b c", " d"], [1, 3, 4], total=4)
    assert counts == [1, 2, 1] and n == 4 and src == "usage-continuous"
    # tokenizer on cumulative text, no BOS per chunk: 1 + 2 + 1 words
    counts, n, src = records.count_chunk_tokens(["a", " b c", " d"], [None] * 3, tokenizer=WordTokenizer())
    assert counts == [1, 2, 1] and n == 4 and src == "tokenizer"
    counts, n, src = records.count_chunk_tokens(["a", " b c", " d"], [None] * 3, total=7,
                                                tokenizer=WordTokenizer())
    assert n == 7 and src == "usage+tokenizer"
    counts, n, src = records.count_chunk_tokens(["x", "y", "z"], [None] * 3, total=3)
    assert counts == [1, 1, 1] and src == "usage"
    counts, n, src = records.count_chunk_tokens(["aaaa", "a", "aaa"], [None] * 3, total=8)
    known = [c for c in counts if c is not None]
    assert len(known) == 3 and sum(known) == 8 and min(known) >= 1 and known[0] > known[1]
    assert src == "usage+chars"
    counts, n, src = records.count_chunk_tokens(["x", "y"], [None, None])
    assert counts == [None, None] and n is None and src == "unknown"


def test_cumulative_usage_tail_goes_to_last_chunk():
    counts, n, _ = records.count_chunk_tokens(["a", "b"], [1, 2], total=3)
    assert counts == [1, 2] and n == 3


def test_gaps_run_from_the_previous_token_bearing_chunk():
    # a text chunk that carries no new token must not swallow the time before it
    m = records.request_metrics(RequestRecord(chunks=[(0.2, 1), (0.3, 0), (0.6, 1)], output_tokens=2))
    assert m["itl_s"] == pytest.approx([0.4])
    assert sum(m["itl_s"]) == pytest.approx(m["e2e_s"] - m["ttft_s"])


def test_partial_cumulative_usage_becomes_a_total():
    # usage seen on some chunks only (e.g. the last text chunk): treat it as the output total
    counts, n, src = records.count_chunk_tokens(["a", "b", "c"], [None, None, 3])
    assert n == 3 and src == "usage" and counts == [1, 1, 1]


def test_goodput_never_passes_an_unknown_tpot():
    """Regression (defect 4): a NaN TPOT passed any TPOT limit. Only outputs of at most one token
    have TPOT 0 (vLLM); unknown token counts fail the SLO and are counted apart."""
    unknown = rec([[0.1, None], [0.9, None]], None)  # no usage, no tokenizer: TPOT unknown
    one = rec([[0.1, 1]], 1)
    slow = rec([[0.1, 1], [0.9, 1]], 2)
    s = metrics.summarize([unknown, one, slow], duration_s=1.0, slo={"tpot_ms": 100})
    assert s.request_goodput == pytest.approx(1.0)  # only the one-token output
    assert s.slo_unknown == 1 and "1 requests with an unknown figure" in metrics.format_report(s)
    assert metrics.meets_slo(records.request_metrics(unknown), {"tpot_ms": 1e9}) is None
    assert metrics.meets_slo(records.request_metrics(unknown), {"ttft_ms": 500}) is True


def test_zero_token_chunks_are_not_first_or_last_token():
    """Regression (defect 7): TTFT and E2E used the first/last chunk even when it held 0 tokens."""
    m = records.request_metrics(RequestRecord(chunks=[(0.2, 0), (0.3, 1), (0.4, 1), (0.5, 0)],
                                              output_tokens=2))
    assert m["ttft_s"] == pytest.approx(0.3) and m["e2e_s"] == pytest.approx(0.4)
    assert m["tpot_s"] == pytest.approx(0.1) and m["itl_s"] == pytest.approx([0.1])
    assert m["chunk_gaps_s"] == pytest.approx([0.1])


@pytest.mark.parametrize(("texts", "total", "expected"), [
    (["a", "b", "c", "d"], 2, [1, 0, 0, 1]),          # fewer tokens than chunks: first and last get one
    (["a", "b", "c", "d", "e"], 3, [1, 0, 1, 0, 1]),  # ... spread evenly
    (["a", "b", "c"], 1, [1, 0, 0]),
    (["a", "b", ""], 3, [1, 1, 1]),                   # the EOS token lands on the text-less finish chunk
    (["a", "b", ""], 2, [1, 1, 0]),
    (["aaa", "a", ""], 6, [3, 2, 1]),                  # EOS first, the rest by characters
    (["", ""], 2, [0, 2]),
])
def test_token_placement_without_per_chunk_counts(texts, total, expected):
    """Regression (defect 7): without per-chunk counts, an EOS token sent in a text-less finish chunk
    went to the first chunk by character share, and zero-token chunks went at the end."""
    assert records.tokens_by_total(texts, total) == expected


def test_finish_chunk_without_text_keeps_its_token_on_the_timeline():
    r = records.new_record("t")
    t0 = r.t_sent
    parts = [(t0 + 0.1, "Hi", None), (t0 + 0.2, " there", None), (t0 + 0.3, "", None)]
    records.finish_record(r, parts, total=3)
    assert [k for _, k in r.chunks] == [1, 1, 1] and r.token_source == "usage"
    assert records.request_metrics(r)["e2e_s"] == pytest.approx(0.3)
    records.finish_record(r, parts, total=2)  # no EOS counted: the empty finish chunk is dropped
    assert [k for _, k in r.chunks] == [1, 1]
    records.finish_record(r, parts)  # no usage at all: counts unknown, the empty chunk dropped too
    assert [k for _, k in r.chunks] == [None, None] and r.token_source == "unknown"


def test_error_text_from_json_html_and_text():
    assert records.error_text(b'{"error": {"message": "model is loading"}}') == "model is loading"
    assert records.error_text(b'{"error": null, "detail": "Not Found"}') == "Not Found"
    html = b"<html><head><title>502 Bad Gateway</title></head><body><h1>502</h1></body></html>"
    assert records.error_text(html) == "502 Bad Gateway"
    assert records.error_text(b"<p>upstream\n  timed out</p>") == "upstream timed out"
    assert records.error_text(b"plain text") == "plain text"


def _timed(ttft: float, step: float, n: int = 5) -> RequestRecord:
    chunks: list[tuple[float, int | None]] = [(ttft + i * step, 1) for i in range(n)]
    return RequestRecord(status="ok", t_sent=0.0, t_end=chunks[-1][0], output_tokens=n, chunks=chunks)


def test_by_prompt_kind_takes_medians_per_kind():
    recs = [_timed(0.1, 0.05), _timed(0.3, 0.05), _timed(0.5, 0.06), _timed(0.9, 0.07)]
    fig = metrics.by_prompt_kind(recs, ["short", "short", "long", "long"])
    assert fig["short"]["ttft_ms"] == pytest.approx(200) and fig["short"]["n"] == 2
    assert fig["long"]["ttft_ms"] == pytest.approx(700) and fig["long"]["tpot_ms"] == pytest.approx(65)
    with pytest.raises(ValueError, match="2 records but 1 kinds"):
        metrics.by_prompt_kind(recs[:2], ["short"])


@pytest.mark.parametrize(("long_tpot", "words"), [(61.0, "stayed within 10%"),
                                                  (79.7, "by much less than TTFT"),
                                                  (200.0, "did not separate"),
                                                  (53.0, "TPOT fell while TTFT rose")])
def test_prompt_length_sentence_follows_the_numbers(long_tpot, words):
    fig = {"short": {"ttft_ms": 106.0, "tpot_ms": 60.4}, "long": {"ttft_ms": 452.0, "tpot_ms": long_tpot}}
    text = metrics.prompt_length_sentence(fig)
    assert words in text and "106 -> 452 ms" in text and f"{long_tpot:.1f}" in text


def test_load_run_tokens_add_up_per_request_when_chunks_carry_several(srv, tmp_path):
    """What chapter 02 once asserted at run time: every token is counted, never a chunk for a token."""
    from labkit.serving import loadgen
    from labkit.serving.loadspec import LoadSpec

    srv.opts["tokens_per_chunk"] = 3
    s = loadgen.run(srv.url, LoadSpec(6, 2, max_tokens=8, warmup=0), out=tmp_path, progress=False)
    assert s.accounted and s.completed == 6
    for r in s.requests:
        assert r.output_tokens == 8 == sum(k or 0 for _, k in r.chunks)
        assert r.token_source == "usage-continuous"
        assert [k for _, k in r.chunks] == [3, 3, 2]


def _level(c, tok_s, p99_ttft_ms):
    return fake_summary(concurrency=c, output_throughput=tok_s, ttft_p99=p99_ttft_ms)


def test_knee_sentence_finds_where_throughput_stops_rising_or_says_it_did_not():
    flat = [_level(1, 20, 100), _level(2, 40, 110), _level(4, 70, 150), _level(8, 72, 400)]
    assert "the knee lies between 4 and 8" in metrics.knee_sentence(flat)
    rising = [_level(1, 23.3, 198), _level(8, 107.8, 500), _level(32, 295.7, 1792)]
    text = metrics.knee_sentence(rising)
    assert "knee lies beyond 32" in text and "107.8 -> 295.7 tok/s" in text and "between" not in text
