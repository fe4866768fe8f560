"""One Prometheus parser (labkit.engines.prometheus, chapters 02, 06 and 08) on what vLLM 0.32's CPU
build really exported: three 6-token completions on a fresh server, trimmed to a few families."""

import http.server
import math
import re
import threading

import pytest

from labkit.engines import prometheus, vllm

# /metrics of vLLM 0.32 (CPU build, bundled SmolLM2) after three completions of 6 tokens each.
AFTER = """\
# HELP python_gc_objects_collected_total Objects collected during gc
# TYPE python_gc_objects_collected_total counter
python_gc_objects_collected_total{generation="0"} 14220.0
python_gc_objects_collected_total{generation="1"} 2565.0
python_gc_objects_collected_total{generation="2"} 774.0
# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="smollm2"} 0.0
# HELP vllm:kv_cache_usage_perc KV-cache usage. 1 means 100 percent usage.
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine="0",model_name="smollm2"} 0.0
# HELP vllm:request_success_total Count of successfully processed requests.
# TYPE vllm:request_success_total counter
vllm:request_success_total{engine="0",finished_reason="stop",model_name="smollm2"} 0.0
vllm:request_success_total{engine="0",finished_reason="length",model_name="smollm2"} 3.0
vllm:request_success_total{engine="0",finished_reason="abort",model_name="smollm2"} 0.0
vllm:request_success_total{engine="0",finished_reason="error",model_name="smollm2"} 0.0
vllm:request_success_total{engine="0",finished_reason="repetition",model_name="smollm2"} 0.0
# HELP vllm:request_success_created Count of successfully processed requests.
# TYPE vllm:request_success_created gauge
vllm:request_success_created{engine="0",finished_reason="stop",model_name="smollm2"} 1.7961225216950824e+09
vllm:request_success_created{engine="0",finished_reason="length",model_name="smollm2"} 1.796122521695091e+09
vllm:request_success_created{engine="0",finished_reason="abort",model_name="smollm2"} 1.7961225216950989e+09
vllm:request_success_created{engine="0",finished_reason="error",model_name="smollm2"} 1.7961225216951082e+09
# HELP vllm:inter_token_latency_seconds Histogram of inter-token latency in seconds.
# TYPE vllm:inter_token_latency_seconds histogram
vllm:inter_token_latency_seconds_bucket{engine="0",le="0.01",model_name="smollm2"} 0.0
vllm:inter_token_latency_seconds_bucket{engine="0",le="0.025",model_name="smollm2"} 0.0
vllm:inter_token_latency_seconds_bucket{engine="0",le="0.05",model_name="smollm2"} 1.0
vllm:inter_token_latency_seconds_bucket{engine="0",le="0.075",model_name="smollm2"} 10.0
vllm:inter_token_latency_seconds_bucket{engine="0",le="0.1",model_name="smollm2"} 10.0
vllm:inter_token_latency_seconds_bucket{engine="0",le="0.15",model_name="smollm2"} 13.0
vllm:inter_token_latency_seconds_bucket{engine="0",le="0.2",model_name="smollm2"} 15.0
vllm:inter_token_latency_seconds_bucket{engine="0",le="0.3",model_name="smollm2"} 15.0
vllm:inter_token_latency_seconds_bucket{engine="0",le="0.4",model_name="smollm2"} 15.0
vllm:inter_token_latency_seconds_bucket{engine="0",le="0.5",model_name="smollm2"} 15.0
vllm:inter_token_latency_seconds_bucket{engine="0",le="0.75",model_name="smollm2"} 15.0
vllm:inter_token_latency_seconds_bucket{engine="0",le="1.0",model_name="smollm2"} 15.0
vllm:inter_token_latency_seconds_bucket{engine="0",le="2.5",model_name="smollm2"} 15.0
vllm:inter_token_latency_seconds_bucket{engine="0",le="5.0",model_name="smollm2"} 15.0
vllm:inter_token_latency_seconds_bucket{engine="0",le="7.5",model_name="smollm2"} 15.0
vllm:inter_token_latency_seconds_bucket{engine="0",le="10.0",model_name="smollm2"} 15.0
vllm:inter_token_latency_seconds_bucket{engine="0",le="20.0",model_name="smollm2"} 15.0
vllm:inter_token_latency_seconds_bucket{engine="0",le="40.0",model_name="smollm2"} 15.0
vllm:inter_token_latency_seconds_bucket{engine="0",le="80.0",model_name="smollm2"} 15.0
vllm:inter_token_latency_seconds_bucket{engine="0",le="+Inf",model_name="smollm2"} 15.0
vllm:inter_token_latency_seconds_count{engine="0",model_name="smollm2"} 15.0
vllm:inter_token_latency_seconds_sum{engine="0",model_name="smollm2"} 1.3878833869998743
# HELP vllm:e2e_request_latency_seconds Histogram of e2e request latency in seconds.
# TYPE vllm:e2e_request_latency_seconds histogram
vllm:e2e_request_latency_seconds_count{engine="0",model_name="smollm2"} 3.0
vllm:e2e_request_latency_seconds_sum{engine="0",model_name="smollm2"} 1.8013114929199219
"""
# The same server before the first request: every counter and histogram at 0.
BEFORE = re.sub(r"(_total|_bucket|_count|_sum)(\{[^}]*\}) \S+", r"\1\2 0.0", AFTER)
# Before vLLM's V1 engine: the KV gauge and the inter-token histogram under their old names.
OLD = """\
# TYPE vllm:gpu_cache_usage_perc gauge
vllm:gpu_cache_usage_perc{model_name="smollm2"} 0.5
# TYPE vllm:time_per_output_token_seconds histogram
vllm:time_per_output_token_seconds_bucket{le="0.1",model_name="smollm2"} 2.0
vllm:time_per_output_token_seconds_bucket{le="+Inf",model_name="smollm2"} 4.0
vllm:time_per_output_token_seconds_count{model_name="smollm2"} 4.0
vllm:time_per_output_token_seconds_sum{model_name="smollm2"} 0.6
"""
ITL = "vllm:inter_token_latency_seconds"


def test_samples_keep_bounds_and_sum_the_other_labels():
    s = prometheus.samples(AFTER, "vllm:")
    assert not [k for k in s if k.startswith("python_")]  # the prefix filters
    assert s[f'{ITL}_bucket{{le="0.075"}}'] == 10 and s[f'{ITL}_bucket{{le="+Inf"}}'] == 15
    assert s["vllm:request_success_total"] == 3  # the five finished_reason series, summed
    assert s["vllm:num_requests_running"] == 0 and s[f"{ITL}_sum"] == pytest.approx(1.3878833869998743)
    everything = prometheus.samples(AFTER)
    assert everything["python_gc_objects_collected_total"] == 14220 + 2565 + 774
    with pytest.raises(ValueError):
        prometheus.samples("<html><title>not a metrics page</title></html>\n")


def test_labels_kept_on_request_and_gauges_averaged():
    s = prometheus.samples(AFTER, "vllm:", keep=("le", "finished_reason"))
    assert prometheus.by_label(s, "vllm:request_success_total", "finished_reason") == {
        "stop": 0, "length": 3, "abort": 0, "error": 0, "repetition": 0}
    two = AFTER.replace('vllm:kv_cache_usage_perc{engine="0",model_name="smollm2"} 0.0',
                        'vllm:kv_cache_usage_perc{engine="0",model_name="smollm2"} 0.25\n'
                        'vllm:kv_cache_usage_perc{engine="1",model_name="smollm2"} 0.75')
    assert prometheus.samples(two, average=["vllm:kv_cache_usage_perc"])["vllm:kv_cache_usage_perc"] == 0.5
    assert prometheus.samples(two)["vllm:kv_cache_usage_perc"] == 1.0  # summed unless asked


def test_histogram_delta_of_three_requests():
    before, after = prometheus.samples(BEFORE, "vllm:"), prometheus.samples(AFTER, "vllm:")
    d = prometheus.histogram_delta(before, after, ITL)
    assert d["count"] == 15 == 3 * (6 - 1)  # one gap per token after the first
    assert d["mean"] == pytest.approx(1.3878833869998743 / 15)
    assert list(d["buckets"])[:4] == [0.01, 0.025, 0.05, 0.075] and list(d["buckets"])[-1] == math.inf
    assert d["buckets"][0.05] == 1 and d["buckets"][0.075] == 10 and d["buckets"][math.inf] == 15
    # P50: rank 7.5 lies in (0.05, 0.075], which holds ranks 2..10
    p50 = prometheus.histogram_quantile(d["buckets"], 0.5)
    assert p50 == pytest.approx(0.05 + 0.025 * (7.5 - 1) / (10 - 1))
    e2e = prometheus.histogram_delta(before, after, "vllm:e2e_request_latency_seconds")
    assert e2e["count"] == 3 and e2e["buckets"] == {}  # trimmed: no buckets, sum and count still there
    with pytest.raises(ValueError, match="restarted"):
        prometheus.histogram_delta(after, before, ITL)
    absent = prometheus.histogram_delta(before, after, "vllm:no_such_seconds")
    assert absent["count"] == 0 and math.isnan(absent["mean"])


def test_server_side_means_use_the_delta():
    m = vllm.server_side_means(prometheus.samples(BEFORE, "vllm:"), prometheus.samples(AFTER, "vllm:"))
    assert m["n_e2e_s"] == 3 and m["e2e_s"] == pytest.approx(1.8013114929199219 / 3)
    assert m["n_ttft_s"] == 0 and math.isnan(m["ttft_s"])  # TTFT trimmed from AFTER: no requests, no mean


def test_metric_names_across_vllm_versions():
    new, old = prometheus.samples(AFTER), prometheus.samples(OLD)
    assert prometheus.metric_name(new, "itl") == ITL
    assert prometheus.metric_name(old, "itl") == "vllm:time_per_output_token_seconds"
    assert prometheus.metric_name(new, "kv_usage") == "vllm:kv_cache_usage_perc"
    assert prometheus.metric_name(old, "kv_usage") == "vllm:gpu_cache_usage_perc"
    assert prometheus.metric_name(old, "ttft") is None
    assert prometheus.histogram(old, "vllm:time_per_output_token_seconds")["buckets"] == {0.1: 2, math.inf: 4}


def test_scrape_a_running_server():
    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 - http.server's name
            body = AFTER.encode() if self.path == "/metrics" else b""
            self.send_response(200 if body else 404)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        s = prometheus.scrape(url + "/v1/", prefix="vllm:")  # an OpenAI base URL works too
        assert s == prometheus.samples(AFTER, "vllm:") and prometheus.scrape(url, "vllm:") == s
        with pytest.raises(ValueError, match="scheme"):
            prometheus.fetch(url.removeprefix("http://"))
    finally:
        server.shutdown()
        server.server_close()
