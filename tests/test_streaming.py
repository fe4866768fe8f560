"""SSE parsing across arbitrary network splits, and every streaming backend against the loopback fake
server: OpenAI chat/completions over SSE, Ollama through the official client (chapter 02). Every
stream shape a real server sends is in test_openai_events.py (table) and test_stream_shapes.py
(end to end)."""

import json
import time

import httpx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from labkit.engines.fakeserver import fake_server
from labkit.serving import local, ollama_api, openai_api, records, sse, streaming


def split_at(data: bytes, cuts: list[int]) -> list[bytes]:
    points = sorted({c % (len(data) + 1) for c in cuts})
    return [data[a:b] for a, b in zip([0, *points], [*points, len(data)], strict=True)]


def feed_all(parser, pieces):
    out = []
    for p in pieces:
        out += parser.feed(p)
    return out + parser.close()


line_text = st.text(st.characters(blacklist_categories=["Cs"], blacklist_characters="\r\n"), max_size=30)
eol = st.sampled_from(["\n", "\r\n", "\r"])


@settings(max_examples=300, deadline=None)
@given(events=st.lists(st.lists(line_text, min_size=1, max_size=3), max_size=6),
       eols=st.lists(eol, min_size=40, max_size=40), comments=st.booleans(),
       cuts=st.lists(st.integers(0, 10_000), max_size=12))
def test_sse_roundtrip_any_split(events, eols, comments, cuts):
    """Events written with any mix of LF/CRLF/CR, comments and multi-line data parse back the same
    however the bytes are split (including inside a CRLF or a UTF-8 character)."""
    it = iter(eols * 10)
    wire = ""

    def end_line() -> str:  # a lone CR followed by LF would be one CRLF: write CR CRLF instead
        e = next(it)
        return "\r\n" if wire.endswith("\r") and e == "\n" else e

    for ev in events:
        if comments:
            wire += ": keep-alive"
            wire += end_line()
        for line in ev:
            wire += f"data: {line}"
            wire += end_line()
        wire += end_line()
    parsed = feed_all(sse.SSEParser(), split_at(wire.encode(), cuts))
    expected = ["\n".join(ev) for ev in events]
    assert parsed == [("message", e) for e in expected if e]  # empty data dispatches nothing (the spec)


@settings(max_examples=200, deadline=None)
@given(kinds=st.lists(st.sampled_from(["data", "event-error", "error-field", "named"]), max_size=6),
       eols=st.sampled_from(["\n", "\r\n"]), cuts=st.lists(st.integers(0, 10_000), max_size=12))
def test_sse_event_types_and_error_fields_any_split(kinds, eols, cuts):
    """``event: error`` and llama.cpp's ``error:`` field come out as error events, other event types
    keep their name, however the bytes are split."""
    wire, expected = "", []
    for i, kind in enumerate(kinds):
        msg = f'{{"message": "ü{i}"}}'
        if kind == "data":
            wire += f"data: {msg}{eols}{eols}"
            expected.append(("message", msg))
        elif kind == "event-error":
            wire += f"event: error{eols}data:{msg}{eols}{eols}"
            expected.append(("error", msg))
        elif kind == "error-field":
            wire += f"error: {msg}{eols}{eols}"
            expected.append(("error", msg))
        else:
            wire += f"event: ping{eols}id: {i}{eols}retry: 5{eols}data: {msg}{eols}{eols}"
            expected.append(("ping", msg))
    assert feed_all(sse.SSEParser(), split_at(wire.encode(), cuts)) == expected


@settings(max_examples=200, deadline=None)
@given(text=st.text(st.characters(whitelist_categories=("Lu", "Ll", "Nd", "Zs", "Po")), max_size=40),
       eols=st.lists(eol, min_size=1, max_size=8), cuts=st.lists(st.integers(0, 10_000), max_size=8))
def test_line_splitter_agrees_with_httpx(text, eols, cuts):
    """labkit's line splitter against the library's: httpx's ``iter_lines`` on the same pieces."""
    words = text.split(" ")
    wire = "".join(w + eols[i % len(eols)] for i, w in enumerate(words)).encode()
    pieces = split_at(wire, cuts)
    ours = feed_all(sse.LineSplitter(), pieces)
    theirs = list(httpx.Response(200, content=iter(pieces)).iter_lines())
    assert ours == theirs


# --- backends against the loopback fake server ---------------------------------------------------


FAKE_SERVER_OPTS = {"step_s": 0.004, "prefill_s": 0.05}  # of conftest's srv, reset before every test


@pytest.mark.parametrize("endpoint", ["chat", "completions"])
@pytest.mark.parametrize("k", [1, 3])
def test_openai_stream_counts_tokens_not_chunks(srv, endpoint, k):
    srv.opts["tokens_per_chunk"] = k
    r = streaming.measure(openai_api.openai_backend(srv.url, "fake", endpoint=endpoint), "hi there", 10)
    assert r.status == "ok", r.error
    assert r.output_tokens == 10 and r.token_source == "usage-continuous"
    assert [c[1] for c in r.chunks] == [k] * (10 // k) + ([10 % k] if 10 % k else [])
    assert r.text.split() == [f"tok{i}" for i in range(10)]
    m = records.request_metrics(r)
    assert len(m["itl_s"]) == 10 - k  # the first chunk's extra tokens have no gap
    assert len(m["chunk_gaps_s"]) == len(r.chunks) - 1


def test_role_only_chunk_does_not_count_as_first_token(srv):
    srv.opts.update(prefill_s=0.3, role_chunk=True)  # role chunk goes out at once, token after 0.3 s
    r = streaming.measure(openai_api.openai_backend(srv.url, "fake"), "hi", 3)
    assert r.status == "ok" and len(r.chunks) == 3
    assert records.request_metrics(r)["ttft_s"] >= 0.3


def test_final_usage_only_server(srv):
    srv.opts["tokens_per_chunk"] = 2
    be = openai_api.openai_backend(srv.url, "fake", continuous_usage=False)
    r = streaming.measure(be, "hi", 7)
    assert r.status == "ok" and r.output_tokens == 7 and r.token_source == "usage+chars"
    assert sum(c[1] or 0 for c in r.chunks) == 7


@pytest.mark.parametrize("endpoint", ["generate", "chat"])
def test_ollama_ndjson_client_and_server_timing(srv, endpoint):
    """The official ``ollama`` client against a server speaking Ollama's documented streaming
    protocol: Ollama's eval_count/eval_duration are kept beside the client's timing, and the
    server-side durations fit inside the client-side ones."""
    be = ollama_api.ollama_backend("fake", host=srv.url, endpoint=endpoint)
    r = streaming.measure(be, "hi", 6)
    assert r.status == "ok", r.error
    assert r.output_tokens == 6 and r.token_source == "usage" and len(r.chunks) == 6
    sv = r.server
    assert sv is not None
    assert sv["eval_count"] == 6 and sv["prompt_eval_count"] == 1
    m = records.request_metrics(r)
    assert sv["total_s"] is not None and r.t_end is not None
    assert sv["total_s"] <= (r.t_end - r.t_sent) + 1e-3
    assert sv["prompt_eval_s"] == pytest.approx(0.05, abs=0.04)
    assert sv["prompt_eval_s"] is not None and m["ttft_s"] >= sv["prompt_eval_s"] - 1e-3


def test_errors_are_records_with_clear_messages(srv):
    r = streaming.measure(openai_api.openai_backend(srv.url, "gpt-nope"), "hi", 4)
    assert r.status == "http_error" and r.http_status == 404 and "gpt-nope" in (r.error or "")
    r = streaming.measure(ollama_api.ollama_backend("nope", host=srv.url), "hi", 4)
    assert r.status == "http_error" and "not found" in (r.error or "")
    srv.opts["fail_every"] = 1
    r = streaming.measure(openai_api.openai_backend(srv.url, "fake"), "hi", 4)
    assert r.status == "http_error" and r.http_status == 500 and "injected" in (r.error or "")
    srv.opts.update(fail_every=0, streaming=False)
    r = streaming.measure(openai_api.openai_backend(srv.url, "fake"), "hi", 4)
    assert r.status == "error" and "text/event-stream" in (r.error or "") and "stream" in (r.error or "")
    srv.opts.update(streaming=True, break_after=2)
    r = streaming.measure(openai_api.openai_backend(srv.url, "fake"), "hi", 8)
    assert r.status == "broken_stream" and len(r.chunks) == 2  # what arrived is kept
    r = streaming.measure(ollama_api.ollama_backend("fake", host=srv.url), "hi", 8)
    assert r.status == "broken_stream" and len(r.chunks) == 2
    srv.opts.update(break_after=None, step_s=0.5)
    t = time.perf_counter()
    r = streaming.measure(openai_api.openai_backend(srv.url, "fake", timeout_s=0.3), "hi", 8)
    assert r.status == "timeout" and "read timeout" in (r.error or "") and time.perf_counter() - t < 2.0
    assert len(r.chunks) == 1  # the first token arrived before the stall
    r = streaming.measure(ollama_api.ollama_backend("fake", host=srv.url, timeout_s=0.3), "hi", 8)
    assert r.status == "timeout" and len(r.chunks) == 1


def test_read_timeout_is_between_chunks_and_total_is_optional(srv):
    """A generation longer than ``timeout_s`` completes while tokens keep flowing (the old timeout
    bounded the whole request); ``total_timeout_s`` bounds it when asked."""
    srv.opts.update(step_s=0.05)
    be = openai_api.openai_backend(srv.url, "fake", timeout_s=0.3)
    r = streaming.measure(be, "hi", 12)  # about 0.6 s in all, never 0.3 s without a byte
    assert r.status == "ok" and r.output_tokens == 12
    r = streaming.measure(openai_api.openai_backend(srv.url, "fake", total_timeout_s=0.3), "hi", 12)
    assert r.status == "timeout" and "total_timeout_s" in (r.error or "") and 3 <= len(r.chunks) < 12
    r = streaming.measure(ollama_api.ollama_backend("fake", host=srv.url, timeout_s=0.3), "hi", 12)
    assert r.status == "ok" and r.output_tokens == 12


def test_fake_server_speaks_vllm_bench_request_format(srv):
    """Regression (defect 8): OpenAI content-part messages (what ``vllm bench serve`` sends) raised a
    TypeError in the fake server and the connection dropped; ``max_completion_tokens`` was ignored."""
    body = {"model": "fake", "stream": True, "max_completion_tokens": 5,
            "messages": [{"role": "user", "content": [{"type": "text", "text": "two words"}]}],
            "stream_options": {"include_usage": True}}
    with httpx.stream("POST", f"{srv.url}/v1/chat/completions", json=body, timeout=5) as r:
        events = [e.data for e in sse.SSEParser().feed(r.read())]
    usage = json.loads(events[-2])["usage"]
    assert events[-1] == "[DONE]" and usage["completion_tokens"] == 5 and usage["prompt_tokens"] == 2
    bad = httpx.post(f"{srv.url}/v1/chat/completions", content=b"{not json", timeout=5)
    assert bad.status_code == 400 and "malformed" in bad.json()["error"]["message"]


def test_no_server_is_a_clear_error():
    with fake_server() as s:
        url = s.url  # a port that was just free and is closed again below
    r = streaming.measure(openai_api.openai_backend(url, "fake"), "hi", 4)
    assert r.status == "connect_error" and "no server answers" in (r.error or "")
    r = streaming.measure(ollama_api.ollama_backend("fake", host=url), "hi", 4)
    assert r.status == "connect_error"
    with pytest.raises(streaming.ServerError, match="no server answers"):
        openai_api.check_openai_server(url)
    assert not ollama_api.ollama_available(url)
    with pytest.raises(streaming.ServerError, match="no Ollama server"):
        ollama_api.check_ollama(url)


def test_server_checks(srv):
    assert openai_api.check_openai_server(srv.url + "/v1/", "fake") == ["fake"]
    with pytest.raises(streaming.ServerError, match="'wrong' is not served.*fake"):
        openai_api.check_openai_server(srv.url, "wrong")
    assert ollama_api.ollama_available(srv.url)
    assert ollama_api.check_ollama(srv.url, "fake") == ["fake"]
    with pytest.raises(streaming.ServerError, match="ollama pull other"):
        ollama_api.check_ollama(srv.url, "other")


@pytest.mark.slow
def test_transformers_streamer_times_every_token():
    from labkit.models import load_llm
    from labkit.settings import set_threads

    set_threads()
    model, tok = load_llm("smollm2-135m")
    r = local.generate_timed(model, tok, "Count: one, two,", max_tokens=6, ignore_eos=True)
    assert r.status == "ok" and r.output_tokens == 6 and r.token_source == "streamer"
    times = [c[0] for c in r.chunks]
    assert len(times) == 6 and times == sorted(times) and times[0] > 0
    assert r.t_end is not None and r.t_end - r.t_sent >= times[-1]
    be = local.transformers_backend(model, tok)
    assert be.max_concurrency == 1
    assert (streaming.measure(be, "Hi", 2).output_tokens or 0) <= 2


def test_usage_on_the_finish_chunk_is_the_total():
    """TGI and some llama.cpp servers put `usage` on the last chunk that still has `choices`
    (finish_reason, empty delta) instead of a separate usage-only chunk."""
    def ev(obj):
        return ("data: " + json.dumps(obj) + "\n\n").encode()

    body = b"".join([
        ev({"choices": [{"index": 0, "delta": {"role": "assistant", "content": None}}]}),
        *(ev({"choices": [{"index": 0, "delta": {"content": w}}]}) for w in ("Hello", " world", "!")),
        ev({"choices": [{"index": 0, "finish_reason": "stop", "delta": {}}],
            "usage": {"completion_tokens": 3, "prompt_tokens": 5}}),
        b"data: [DONE]\n\n",
    ])
    transport = httpx.MockTransport(
        lambda req: httpx.Response(200, headers={"content-type": "text/event-stream"}, content=body))
    backend = openai_api.openai_backend("http://test", "m")

    async def go():
        async with httpx.AsyncClient(transport=transport) as client:
            return await backend.send(client, "hi", 8)

    import asyncio

    rec = asyncio.run(go())
    assert rec.status == "ok" and rec.output_tokens == 3 and rec.token_source == "usage"
    assert [k for _, k in rec.chunks] == [1, 1, 1]  # the empty finish chunk holds no token
    assert len(records.request_metrics(rec)["itl_s"]) == 2
