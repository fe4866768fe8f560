"""A real engine end to end: vLLM's CPU build serving the bundled model on 127.0.0.1, started once
per test session (about 20-90 s on 2 CPU cores, depending on load), driven by the load generator,
and labkit's client-side TTFT/E2E checked against vLLM's own server-side histograms (chapter 02).

Skipped where vLLM cannot run (not Linux x86_64, or no ``make serve-setup``), except on CI on Linux
x86_64, where the Makefile installs it and a missing server is a failure. Every test here is
``slow`` (it needs the server); ``make test`` runs them, ``pytest -m "not slow"`` leaves them out."""

import pytest

from labkit import models
from labkit.engines import process, prometheus, vllm
from labkit.engines.vllm import vllm_required
from labkit.serving import loadgen, loadspec, openai_api, streaming

pytestmark = pytest.mark.slow  # each test uses the session's real vLLM server
SERVED = loadspec.ClientSpec(model=models.SERVED_NAME, ignore_eos=True)


@pytest.fixture(scope="session")
def vllm_url():
    if not vllm.vllm_available():
        if vllm_required():
            pytest.fail(f"vLLM is required on CI on Linux x86_64: {vllm.unavailable_reason()}")
        pytest.skip(vllm.unavailable_reason())
    server = vllm.start_vllm(ready_timeout_s=300)
    print(f"\nvLLM ready in {server.startup_s:.1f} s at {server.url} (log {server.log})")
    try:
        yield server.url
    finally:
        process.stop(server)
        assert server.proc.poll() is not None, "the vLLM server did not stop"


def test_load_test_against_vllm(vllm_url):
    s = loadgen.run(vllm_url, loadspec.LoadSpec(4, 2, max_tokens=12, warmup=1), SERVED, progress=False)
    assert s.accounted and s.completed == 4, s.status_counts
    for r in s.requests:
        assert r.output_tokens == 12 and r.token_source == "usage-continuous"
        assert sum(c[1] or 0 for c in r.chunks) == 12  # counted from vLLM's usage, per chunk
        assert r.prompt_tokens and r.prompt_tokens > 0
    # one ITL per token after the first chunk's: 11 per request when every chunk carries one token;
    # under load vLLM may put two tokens in a chunk, the first one included
    first = [next(k for _, k in r.chunks if k) for r in s.requests]
    assert s.ttft.p99 >= s.ttft.p50 > 0 and s.itl.n == sum(12 - k for k in first)
    assert s.output_throughput > 0


def test_client_timing_against_vllm_server_histograms(vllm_url):
    """Same requests, two clocks: labkit's TTFT/E2E (client side: HTTP, SSE framing and the
    network included) against vLLM's ``vllm:time_to_first_token_seconds`` and
    ``vllm:e2e_request_latency_seconds`` (server side; the client can only be later), and labkit's
    mean ITL against vLLM's inter-token histogram (one token per chunk here, so they agree)."""
    before = prometheus.scrape(vllm_url, "vllm:")
    s = loadgen.run(vllm_url, loadspec.LoadSpec(4, 1, max_tokens=12, warmup=0), SERVED, progress=False)
    after = prometheus.scrape(vllm_url, "vllm:")
    server = vllm.server_side_means(before, after)
    assert server["n_ttft_s"] == 4 and server["n_e2e_s"] == 4 and s.completed == 4
    client_ttft, client_e2e = s.ttft.mean / 1e3, s.e2el.mean / 1e3
    d_ttft, d_e2e = client_ttft - server["ttft_s"], client_e2e - server["e2e_s"]
    print(f"\nTTFT client {client_ttft * 1e3:.1f} ms, server {server['ttft_s'] * 1e3:.1f} ms, "
          f"difference {d_ttft * 1e3:+.1f} ms; E2E client {client_e2e * 1e3:.1f} ms, server "
          f"{server['e2e_s'] * 1e3:.1f} ms, difference {d_e2e * 1e3:+.1f} ms (4 requests)")
    assert -0.005 <= d_ttft < 0.5 and -0.005 <= d_e2e < 0.5
    # ITL: labkit's per-token gaps against vLLM's own (its newer histogram name, else the older one)
    name = prometheus.metric_name(after, "itl")
    assert name, "vLLM exported no inter-token latency histogram"
    itl = prometheus.histogram_delta(before, after, name)
    print(f"ITL client {s.itl.mean:.1f} ms over {s.itl.n} gaps, server "
          f"{itl['mean'] * 1e3:.1f} ms over {itl['count']:.0f} ({name})")
    assert itl["count"] == 4 * 11 >= s.itl.n and abs(s.itl.mean / 1e3 - itl["mean"]) < 0.01
    assert itl["buckets"][float("inf")] == itl["count"]  # the +Inf bucket holds every gap


def test_vllm_errors_and_completions(vllm_url):
    with pytest.raises(streaming.ServerError, match="'gpt-4o' is not served.*smollm2"):
        openai_api.check_openai_server(vllm_url, "gpt-4o")
    r = streaming.measure(openai_api.openai_backend(vllm_url, "gpt-4o"), "hi", 4)
    assert r.status == "http_error" and r.http_status == 404 and "gpt-4o" in (r.error or "")
    r = streaming.measure(openai_api.openai_backend(vllm_url, models.SERVED_NAME, endpoint="completions",
                                                   ignore_eos=True), "Once upon a time", 6)
    assert r.status == "ok" and r.output_tokens == 6 and r.text
