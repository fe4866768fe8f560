"""Chapter 08's monitoring: vLLM /metrics parsing (current and older metric names) from a canned
server, the background Sampler, NVML present/absent, histogram quantiles against hand-computed
answers, request timelines, the dashboard, the live view and ``labkit monitor``'s exit status."""

import argparse
import http.server
import io
import math
import socket
import sys
import threading
import time
import types
from pathlib import Path
from typing import cast

import numpy as np
import pytest

from labkit import models
from labkit.cli import add_monitor_arguments
from labkit.engines import prometheus
from labkit.engines.server import ENGINES
from labkit.hardware import machine
from labkit.production import monitor, server_gauges
from labkit.serving.metrics import summarize
from labkit.serving.records import RequestRecord

INF = math.inf

# vLLM v1 (as 0.32 exposes it): two engines, labels model_name + engine, KV usage as a fraction.
NEW = """\
# HELP python_gc_objects_collected_total Objects collected during gc
# TYPE python_gc_objects_collected_total counter
python_gc_objects_collected_total{generation="0"} 1234.0
# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="smollm2"} 2.0
vllm:num_requests_running{engine="1",model_name="smollm2"} 1.0
# HELP vllm:num_requests_waiting Number of requests waiting to be processed.
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="smollm2"} 4.0
vllm:num_requests_waiting{engine="1",model_name="smollm2"} 0.0
# HELP vllm:kv_cache_usage_perc KV-Cache usage. 1 means 100 percent usage.
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine="0",model_name="smollm2"} 0.25
vllm:kv_cache_usage_perc{engine="1",model_name="smollm2"} 0.35
# HELP vllm:prompt_tokens_total Number of prefill tokens processed.
# TYPE vllm:prompt_tokens_total counter
vllm:prompt_tokens_total{engine="0",model_name="smollm2"} 1000.0
vllm:prompt_tokens_total{engine="1",model_name="smollm2"} 234.0
# HELP vllm:prompt_tokens_created Number of prefill tokens processed.
# TYPE vllm:prompt_tokens_created gauge
vllm:prompt_tokens_created{engine="0",model_name="smollm2"} 1.7e+09
# HELP vllm:generation_tokens_total Number of generation tokens processed.
# TYPE vllm:generation_tokens_total counter
vllm:generation_tokens_total{engine="0",model_name="smollm2"} 5678.0
# HELP vllm:request_success_total Count of successfully processed requests.
# TYPE vllm:request_success_total counter
vllm:request_success_total{engine="0",finished_reason="stop",model_name="smollm2"} 5.0
vllm:request_success_total{engine="1",finished_reason="stop",model_name="smollm2"} 2.0
vllm:request_success_total{engine="0",finished_reason="length",model_name="smollm2"} 3.0
vllm:request_success_total{engine="0",finished_reason="abort",model_name="smollm2"} 0.0
# HELP vllm:time_to_first_token_seconds Histogram of time to first token in seconds.
# TYPE vllm:time_to_first_token_seconds histogram
{ttft}
"""

# Before vLLM v1: one engine, no engine label, the KV gauge called gpu_cache_usage_perc.
OLD = """\
# HELP vllm:num_requests_running Number of requests currently running on GPU.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{model_name="smollm2"} 1.0
# HELP vllm:num_requests_waiting Number of requests waiting to be processed.
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{model_name="smollm2"} 0.0
# HELP vllm:gpu_cache_usage_perc GPU KV-cache usage. 1 means 100 percent usage.
# TYPE vllm:gpu_cache_usage_perc gauge
vllm:gpu_cache_usage_perc{model_name="smollm2"} 0.5
# HELP vllm:cpu_cache_usage_perc CPU KV-cache usage. 1 means 100 percent usage.
# TYPE vllm:cpu_cache_usage_perc gauge
vllm:cpu_cache_usage_perc{model_name="smollm2"} 0.0
# HELP vllm:request_success_total Count of successfully processed requests.
# TYPE vllm:request_success_total counter
vllm:request_success_total{finished_reason="stop",model_name="smollm2"} 3.0
# HELP vllm:time_to_first_token_seconds Histogram of time to first token in seconds.
# TYPE vllm:time_to_first_token_seconds histogram
vllm:time_to_first_token_seconds_sum{model_name="smollm2"} 0.6
vllm:time_to_first_token_seconds_bucket{le="0.1",model_name="smollm2"} 1.0
vllm:time_to_first_token_seconds_bucket{le="0.5",model_name="smollm2"} 3.0
vllm:time_to_first_token_seconds_bucket{le="+Inf",model_name="smollm2"} 3.0
vllm:time_to_first_token_seconds_count{model_name="smollm2"} 3.0
"""


# llama-server's /metrics as this lab's build (llama-cpp-python 0.3.36's llama.cpp, `--metrics`) served it,
# captured verbatim with 2 slots: during a load (one request of 24 tokens finished, two decoding, three
# queued) and once all six had finished.
DATA = Path(__file__).parent / "data"
LLAMACPP_DURING = (DATA / "llamacpp_metrics_during.txt").read_text()
LLAMACPP_AFTER = (DATA / "llamacpp_metrics_after.txt").read_text()


def llamacpp_text(extra: str = "") -> str:
    """The captured text during the load, plus ``extra`` lines."""
    return LLAMACPP_DURING + extra


def ttft_lines(buckets: dict[float, float], engines=("0",), total_s: float = 4.2) -> str:
    """Histogram lines, the counts split evenly over ``engines`` (labels summed back by the parser)."""
    out = []
    for e in engines:
        lab = f'engine="{e}",model_name="smollm2"'
        out += [f"vllm:time_to_first_token_seconds_sum{{{lab}}} {total_s / len(engines)}"]
        out += [f'vllm:time_to_first_token_seconds_bucket{{engine="{e}",le="{"+Inf" if le == INF else le}",'
                f'model_name="smollm2"}} {c / len(engines)}' for le, c in buckets.items()]
        out += [f"vllm:time_to_first_token_seconds_count{{{lab}}} {buckets[INF] / len(engines)}"]
    return "\n".join(out)


A = {0.01: 0.0, 0.05: 2.0, 0.1: 6.0, 0.5: 9.0, 1.0: 10.0, INF: 10.0}
B = {0.01: 0.0, 0.05: 2.0, 0.1: 10.0, 0.5: 13.0, 1.0: 14.0, INF: 14.0}  # A + 4 requests in (0.05, 0.1]


def new_text(buckets=A, stop=(5.0, 2.0)) -> str:
    text = NEW.replace("{ttft}", ttft_lines(buckets, engines=("0", "1")))
    return text.replace('finished_reason="stop",model_name="smollm2"} 5.0',
                        f'finished_reason="stop",model_name="smollm2"}} {stop[0]}').replace(
        'engine="1",finished_reason="stop",model_name="smollm2"} 2.0',
        f'engine="1",finished_reason="stop",model_name="smollm2"}} {stop[1]}')


class CannedServer(http.server.ThreadingHTTPServer):
    bodies: list[str]
    hits: int


class Canned(http.server.BaseHTTPRequestHandler):
    def do_GET(self):  # noqa: N802 - http.server's name
        srv = cast(CannedServer, self.server)
        if self.path != "/metrics":
            self.send_error(404)
            return
        body = srv.bodies[min(srv.hits, len(srv.bodies) - 1)].encode()
        srv.hits += 1
        self.send_response(200)
        self.send_header("Content-Type", "text/plain; version=0.0.4")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


@pytest.fixture
def serve():
    """``serve(*bodies)``: a /metrics server on 127.0.0.1 answering the bodies in turn (the last
    one from then on); returns its base URL and the server (``.hits``, ``.bodies``)."""
    started = []

    def start(*bodies):
        srv = CannedServer(("127.0.0.1", 0), Canned)
        srv.bodies, srv.hits, srv.daemon_threads = list(bodies), 0, True
        threading.Thread(target=srv.serve_forever, args=(0.05,), daemon=True).start()
        started.append(srv)
        return f"http://127.0.0.1:{srv.server_address[1]}", srv

    yield start
    for srv in started:
        srv.shutdown()
        srv.server_close()


def closed_url() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return f"http://127.0.0.1:{port}"


def test_server_sample_current_vllm(serve):
    url, _ = serve(new_text())
    s = server_gauges.server_sample(url + "/v1")  # the OpenAI base URL works too
    assert "error" not in s
    assert s["running"] == 3 and s["waiting"] == 4  # summed over the two engines
    assert s["kv_usage_pct"] == pytest.approx(30.0) and s["kv_metric"] == "vllm:kv_cache_usage_perc"
    assert s["prompt_tokens_total"] == 1234 and s["generation_tokens_total"] == 5678
    finished = [s[f"finished_{k}"] for k in ("stop", "length", "abort", "total")]
    assert finished == [7, 3, 0, 10]  # by finished_reason, summed over engines; a zero count is kept
    assert s["ttft_buckets"] == A and list(s["ttft_buckets"]) == sorted(A)
    assert s["ttft_count"] == 10 and s["ttft_sum"] == pytest.approx(4.2)
    assert s["t_perf"] <= time.perf_counter()


def test_server_sample_older_vllm(serve):
    url, _ = serve(OLD)
    s = server_gauges.server_sample(url)
    assert s["kv_usage_pct"] == pytest.approx(50.0) and s["kv_metric"] == "vllm:gpu_cache_usage_perc"
    assert s["running"] == 1 and s["waiting"] == 0 and s["finished_total"] == 3
    assert s["ttft_buckets"] == {0.1: 1.0, 0.5: 3.0, INF: 3.0}
    assert math.isnan(s["prompt_tokens_total"])  # absent, not zero


def test_server_sample_llamacpp_real_text(serve):
    url, _ = serve(LLAMACPP_DURING)
    s = server_gauges.server_sample(url)
    assert "error" not in s and s["engine"] == "llamacpp"
    assert s["running"] == 2 and s["waiting"] == 3  # requests_processing, requests_deferred
    assert s["prompt_tokens_total"] == 23 + 2  # computed + reused from the cache, as vLLM counts them
    assert s["generation_tokens_total"] == 24 and s["prompt_tokens_cached_total"] == 2
    assert s["busy_slots_per_decode"] == pytest.approx(1.28571) and s["decode_calls_total"] == 35
    assert s["generation_seconds_total"] == pytest.approx(0.495531)
    # what llama-server does not export: no TTFT histogram, no finished count, no KV gauge in this build
    assert s["ttft_buckets"] == {} and math.isnan(s["ttft_count"]) and math.isnan(s["kv_usage_pct"])
    assert s["kv_metric"] is None and "finished_total" not in s
    assert set(server_gauges.LLAMACPP_LACKS) >= {"ttft_buckets", "finished_total", "kv_usage_pct"}
    every = list(server_gauges.FIGURE_WORDS.values())
    assert server_gauges.missing_figures([s, {"error": "no answer"}]) == every


def test_missing_figures_names_only_what_a_sample_lacks():
    vllm_like = {"ttft_count": 3.0, "finished_total": 3.0, "kv_usage_pct": float("nan")}
    assert server_gauges.missing_figures([vllm_like]) == ["a KV-cache gauge"]
    assert server_gauges.missing_figures([]) == list(server_gauges.FIGURE_WORDS.values())


def test_llamacpp_names_are_the_builds():
    present = set(prometheus.samples(LLAMACPP_DURING, "llamacpp:"))
    names = set(server_gauges.LLAMACPP.values()) | set(server_gauges.LLAMACPP_EXTRA.values())
    assert names - present == {"llamacpp:kv_cache_usage_ratio"}  # older builds only
    assert server_gauges.parse_metrics(NEW.replace("{ttft}", ttft_lines(A)))["engine"] == "vllm"


def test_older_llamacpp_kv_gauge(serve):
    url, _ = serve(llamacpp_text(extra="llamacpp:kv_cache_usage_ratio 0.25\n"))
    s = server_gauges.server_sample(url)
    assert s["kv_usage_pct"] == pytest.approx(25.0) and s["kv_metric"] == "llamacpp:kv_cache_usage_ratio"


def test_live_and_dashboard_on_llamacpp(serve):
    url, _ = serve(LLAMACPP_DURING, LLAMACPP_AFTER)
    out = io.StringIO()
    assert monitor.live(url, interval_s=0.02, count=1, out=out) == 1
    head, row = out.getvalue().splitlines()
    assert head.split()[-5:] == ["running", "waiting", "kv%", "done", "ttft50ms"]
    assert row.split()[-5:] == ["0.0", "0.0", "-", "-", "-"]  # no KV gauge, finished count or TTFT
    with monitor.Sampler(0.01, base_url=url) as sm:
        time.sleep(0.05)
    d = monitor.dashboard(sm.samples, REQS)
    assert d["waiting"]["max"] == 0 and math.isnan(d["kv_usage_pct"]["mean"])
    assert monitor.watch_list(d)["queue depth"]


def test_server_sample_errors_are_samples(serve):
    s = server_gauges.server_sample(closed_url(), timeout_s=1.0)
    assert "ConnectError" in s["error"] and "running" not in s
    url, _ = serve("<html><title>not a metrics page</title></html>\n")
    assert "ValueError" in server_gauges.server_sample(url)["error"]
    with pytest.raises(ValueError, match="scheme"):
        server_gauges.server_sample("localhost:8000")


def test_sampler_collects_and_stops_promptly(serve):
    url, srv = serve(new_text())
    t0 = time.perf_counter()
    with monitor.Sampler(0.02, base_url=url) as sm:
        while len(sm.samples) < 4 and time.perf_counter() - t0 < 5:
            time.sleep(0.01)
        t = time.perf_counter()
    assert t - t0 < 2.0  # four samples at 0.02 s take ~0.1 s, even on a busy machine well under 2 s
    assert time.perf_counter() - t < 1.0 and not sm._thread.is_alive()  # stop() returns promptly
    got = sm.samples
    assert len(got) >= 5 and srv.hits == len(got)  # one scrape per sample, the last at stop
    assert all(s["running"] == 3 and "cpu_pct" in s and "ram_used_bytes" in s for s in got)
    assert np.all(np.diff([s["t_perf"] for s in got]) > 0)
    sm.stop()  # a second stop is harmless
    with monitor.Sampler(0.01) as host_only:
        time.sleep(0.05)
    assert host_only.samples and not any("running" in s or "error" in s for s in host_only.samples)
    with pytest.raises(ValueError, match="interval_s"):
        monitor.Sampler(0)


def test_sampler_survives_a_server_that_goes_away(serve):
    url, srv = serve(new_text())
    with monitor.Sampler(0.02, base_url=url) as sm:
        while len(sm.samples) < 2:
            time.sleep(0.01)
        srv.shutdown()
        srv.server_close()
        n = len(sm.samples)
        deadline = time.perf_counter() + 5
        while len(sm.samples) < n + 3 and time.perf_counter() < deadline:
            time.sleep(0.02)
    got = sm.samples
    assert got[0]["running"] == 3 and "error" in got[-1] and "cpu_pct" in got[-1]
    assert len(got) >= n + 3  # it kept sampling and kept what it had


def fake_nvml(power_fails_on=1, init_fails=False):
    class NVMLError(Exception):
        pass

    def check(h, what):
        if h == power_fails_on and what == "power":
            raise NVMLError("Not Supported")

    def init():
        if init_fails:
            raise NVMLError("Driver Not Loaded")

    mem = [types.SimpleNamespace(used=4 * 2**30, total=16 * 2**30),
           types.SimpleNamespace(used=2**30, total=8 * 2**30)]
    return types.SimpleNamespace(
        NVMLError=NVMLError, nvmlInit=init, nvmlDeviceGetCount=lambda: 2,
        nvmlDeviceGetHandleByIndex=lambda i: i,
        nvmlDeviceGetUtilizationRates=lambda h: types.SimpleNamespace(gpu=[37, 0][h], memory=5),
        nvmlDeviceGetMemoryInfo=lambda h: mem[h],
        nvmlDeviceGetPowerUsage=lambda h: check(h, "power") or 123456)


def test_host_sample_with_fake_nvml(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", fake_nvml())
    monkeypatch.setattr(machine, "_NVML", [])
    s = monitor.host_sample()
    assert s["gpu0_util_pct"] == 37 and s["gpu1_util_pct"] == 0  # 0 % is a reading, kept
    assert s["gpu0_mem_used_bytes"] == 4 * 2**30 and s["gpu0_mem_total_bytes"] == 16 * 2**30
    assert s["gpu0_power_w"] == pytest.approx(123.456)  # NVML reports milliwatts
    assert "gpu1_power_w" not in s and s["gpu1_mem_total_bytes"] == 8 * 2**30
    assert 0 <= s["cpu_pct"] <= 100 and 0 < s["ram_used_bytes"] and 0 < s["ram_pct"] <= 100


def test_nvidia_smi_snapshot_reads_each_gpu_once_initialised(monkeypatch):
    inits = []
    nv = fake_nvml()
    nv.nvmlInit = lambda: inits.append(1)
    nv.nvmlDeviceGetName = lambda h: b"NVIDIA H100"  # older nvidia-ml-py returns bytes
    monkeypatch.setitem(sys.modules, "pynvml", nv)
    monkeypatch.setattr(machine, "_NVML", [])
    g0, g1 = machine.nvidia_smi_snapshot()
    assert (g0["index"], g0["name"], g0["gpu_util_pct"], g0["mem_util_pct"]) == (0, "NVIDIA H100", 37, 5)
    assert g0["memory_used_bytes"] == 4 * 2**30 and g0["power_w"] == pytest.approx(123.456)
    assert "power_w" not in g1 and "driver" not in g0  # what NVML cannot read is left out
    assert len(machine.nvidia_smi_snapshot()) == 2 and inits == [1]  # initialised once, kept open


def test_importing_the_monitor_does_no_work():
    import subprocess

    code = ("import psutil\n"
            "def fail(*a, **k): raise SystemExit('psutil called at import time')\n"
            "psutil.cpu_percent = psutil.virtual_memory = fail\n"
            "import labkit.production.monitor")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr


@pytest.mark.parametrize("module", [None, fake_nvml(init_fails=True)], ids=["no-library", "no-driver"])
def test_host_sample_without_nvml(monkeypatch, module):
    monkeypatch.setitem(sys.modules, "pynvml", module)  # None: `import pynvml` raises ImportError
    monkeypatch.setattr(machine, "_NVML", [])
    s = monitor.host_sample()
    assert not [k for k in s if k.startswith("gpu")] and {"time", "t_perf", "cpu_pct", "ram_pct"} <= set(s)
    assert machine._NVML == [None]  # tried once, not on every sample


H = {0.1: 2.0, 0.5: 6.0, 1.0: 9.0, INF: 10.0}


@pytest.mark.parametrize("q, want", [
    (0.5, 0.1 + 0.4 * 3 / 4),  # rank 5 in (0.1, 0.5]: 3 of its 4
    (0.1, 0.1 * 1 / 2),  # rank 1 in the first bucket, which starts at 0
    (0.9, 1.0),  # rank 9: the top of (0.5, 1.0]
    (0.99, 1.0),  # rank 9.9 in +Inf: the highest finite bound
    (0.0, 0.0),
    (0.7, 0.5 + 0.5 * 1 / 3),
])
def test_histogram_quantile_known_answers(q, want):
    assert prometheus.histogram_quantile(H, q) == pytest.approx(want)
    assert prometheus.histogram_quantile(dict(reversed(H.items())), q) == pytest.approx(want)  # order-free


def test_histogram_quantile_edges():
    assert math.isnan(prometheus.histogram_quantile({}, 0.5))
    assert math.isnan(prometheus.histogram_quantile({0.1: 0.0, INF: 0.0}, 0.5))
    empty_first = {0.1: 0.0, 0.2: 0.0, 0.4: 4.0, INF: 4.0}
    assert prometheus.histogram_quantile(empty_first, 0.25) == pytest.approx(0.25)
    with pytest.raises(ValueError, match="Inf"):
        prometheus.histogram_quantile({0.1: 1.0, 0.5: 2.0}, 0.5)
    with pytest.raises(ValueError, match="q must be"):
        prometheus.histogram_quantile(H, 99)


def test_histogram_delta_isolates_a_load_test():
    d = prometheus.bucket_delta(A, B)
    assert d == {0.01: 0, 0.05: 0, 0.1: 4, 0.5: 4, 1.0: 4, INF: 4}
    assert prometheus.histogram_quantile(d, 0.5) == pytest.approx(0.05 + 0.05 * 2 / 4)
    with pytest.raises(ValueError, match="restart"):
        prometheus.bucket_delta(B, A)


def rec(t_sent, t_end, status="ok", code=200, ttft=0.1, n=4, prompt=10):
    chunks: list[tuple[float, int | None]] = [(ttft + 0.05 * i, 1) for i in range(n)] if status == "ok" \
        else []
    return RequestRecord(status=status, http_status=code, t_sent=t_sent, t_end=t_end, chunks=chunks,
                         output_tokens=n if status == "ok" else None, prompt_tokens=prompt)


SAMPLES = [{"time": 1e9 + i / 2, "t_perf": 100.0 + i / 2, "cpu_pct": 10.0 * i, "ram_pct": 40.0,
            "ram_used_bytes": 2.0**33, "gpu0_util_pct": 50.0 + i, "gpu0_mem_used_bytes": 2.0**32,
            "running": float(i % 3), "waiting": float(i), "kv_usage_pct": 5.0 * i} for i in range(7)]
REQS = [rec(100.2, 100.9, prompt=10), rec(100.7, 101.6, ttft=0.3, n=8, prompt=30),
        rec(101.1, 102.0, status="http_error", code=503), rec(102.5, 103.4, ttft=0.2, prompt=20),
        RequestRecord(status="not_sent", t_sent=103.0, t_end=103.0),
        rec(101.2, 101.5, status="timeout", code=200)]  # answered 200, then went silent


def test_timeline_bins_requests_and_aligns_samples():
    tl = monitor.timeline(SAMPLES, REQS, bin_s=1.0)
    assert np.allclose(tl["t"], np.arange(7) / 2) and np.allclose(tl["cpu_pct"], 10 * np.arange(7))
    assert np.allclose(tl["gpu0_util_pct"], 50 + np.arange(7)) and np.allclose(tl["waiting"], np.arange(7))
    assert np.allclose(tl["bin_t"], [0, 1, 2, 3])
    assert tl["sent_per_s"].tolist() == [2, 2, 1, 0]  # not_sent is not a send
    assert tl["done_per_s"].tolist() == [1, 1, 0, 1]  # ok completions at 0.9, 1.6, 3.4
    assert tl["failed_per_s"].tolist() == [0, 1, 1, 0]  # timeout at 1.5, 503 at 2.0
    assert tl["code_200"].tolist() == [1, 1, 0, 1] and tl["code_503"].tolist() == [0, 0, 1, 0]
    assert tl["code_timeout"].tolist() == [0, 1, 0, 0]
    assert np.allclose(tl["req_t"], [0.9, 1.6, 3.4])
    assert np.allclose(tl["req_ttft_s"], [0.1, 0.3, 0.2]) and np.allclose(tl["req_e2e_s"], [0.25, 0.65, 0.35])
    half = monitor.timeline(SAMPLES, REQS, bin_s=0.5)
    assert half["sent_per_s"].tolist() == [2, 2, 4, 0, 0, 2, 0] and len(half["bin_t"]) == 7
    host_only = monitor.timeline(SAMPLES)
    assert np.all(np.isnan(monitor.timeline([{"t_perf": 1.0}])["running"])) and host_only["req_t"].size == 0


def test_timeline_bad_input():
    with pytest.raises(ValueError, match="bin_s"):
        monitor.timeline(SAMPLES, REQS, bin_s=0)
    with pytest.raises(ValueError, match="samples or request records"):
        monitor.timeline([], [])


def test_plot_timeline_three_panels():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig = monitor.plot_timeline(monitor.timeline(SAMPLES, REQS))
    axes = fig.get_axes()
    assert len(axes) == 4  # three panels and the % axis of the last
    assert axes[0].get_shared_x_axes().joined(axes[0], axes[2])
    assert len(axes[1].lines) == 2 and axes[3].get_ylim() == (0, 105)
    plt.close(fig)


def test_dashboard_covers_the_watch_list():
    d = monitor.dashboard(SAMPLES, REQS)
    s = summarize([r for r in REQS if r.status != "not_sent"])
    assert d["requests"] == 5 and d["codes"] == {"200": 3, "503": 1, "timeout": 1}
    assert d["code_classes"] == {"2xx": 3, "5xx": 1, "no_answer": 1}
    assert d["ttft_ms"] == {"p50": s.ttft.p50, "p90": s.ttft.p90, "p99": s.ttft.p99}
    assert d["ttft_ms"]["p50"] == pytest.approx(200.0) and d["e2e_ms"]["p50"] == pytest.approx(350.0)
    assert d["tpot_ms"]["p50"] == pytest.approx(50.0) and d["tps"] == pytest.approx(20.0)
    assert d["waiting"] == {"mean": 3.0, "max": 6.0} and d["kv_usage_pct"]["max"] == 30.0
    assert d["gpu0_util_pct"]["max"] == 56.0 and d["gpu0_mem_used_bytes"]["mean"] == 2.0**32
    assert d["prompt_tokens"]["n"] == 3 and d["prompt_tokens"]["p50"] == 20.0  # ok requests only
    assert d["output_tokens"]["p50"] == 4.0 and d["output_tokens"]["p99"] == pytest.approx(7.92)
    text = monitor.format_dashboard(d)
    assert "503 x1" in text and "5xx x1" in text and "ttft_ms" in text and "ram_used_gib" in text
    assert "waiting" in text and "TPS 20.0" in text


def test_watch_list_says_which_items_a_run_can_fill():
    full = monitor.watch_list(monitor.dashboard(SAMPLES, REQS))
    assert list(full) == list(monitor.WATCH_LIST)
    assert [k for k, v in full.items() if not v] == ["replica count"]        # one server, not a fleet
    host = monitor.watch_list(monitor.dashboard([{"t_perf": 0.0, "cpu_pct": 10.0}], []))
    assert not any(host[k] for k in ("request volume", "status codes", "TTFT", "GPU utilization", "VRAM",
                                     "queue depth"))


def test_dashboard_without_requests_or_server():
    d = monitor.dashboard([{"t_perf": 0.0, "cpu_pct": 10.0}], [])
    assert d["requests"] == 0 and d["codes"] == {} and math.isnan(d["running"]["max"])
    text = monitor.format_dashboard(d)
    assert "requests 0, by status: none" in text and "not exported" in text   # no server: its gauges


class Lines(io.StringIO):
    """An output that raises KeyboardInterrupt (Ctrl-C) once ``limit`` lines were written."""

    def __init__(self, limit):
        super().__init__()
        self.limit = limit

    def write(self, text):
        if self.getvalue().count("\n") >= self.limit:
            raise KeyboardInterrupt
        return super().write(text)


def test_live_prints_header_and_rows(serve):
    url, _ = serve(new_text(A, stop=(5.0, 2.0)), new_text(B, stop=(7.0, 4.0)))
    out = io.StringIO()
    assert monitor.live(url, interval_s=0.02, count=2, out=out) == 2
    head, row1, row2 = out.getvalue().splitlines()
    assert head.startswith("# time")
    assert head.split()[-5:] == ["running", "waiting", "kv%", "done", "ttft50ms"]
    assert row1.split()[-5:] == ["3.0", "4.0", "30.0", "4.0", "75.0"]  # 4 finished, P50 of their TTFTs
    assert row2.split()[-2:] == ["0.0", "-"] and time.strptime(row2.split()[0], "%H:%M:%S")


def test_live_host_only_and_ctrl_c():
    out = Lines(limit=2)
    assert monitor.live(None, interval_s=0.01, count=None, out=out) == 1  # Ctrl-C on the 2nd row
    head, row = out.getvalue().splitlines()
    assert "cpu%" in head and "running" not in head and len(row.split()) == len(head.split()) - 1


def parse(*argv):
    p = argparse.ArgumentParser(prog="labkit monitor")
    add_monitor_arguments(p)
    return p.parse_args(argv)


def test_monitor_main_exit_status(serve, capsys):
    bad = closed_url()
    assert monitor.monitor_main(parse("--url", bad, "--count", "1")) == 2
    err = capsys.readouterr()
    assert "cannot read the server's metrics" in err.err and bad in err.err and err.out == ""
    assert monitor.monitor_main(parse("--url", "localhost:8000")) == 2
    assert "scheme" in capsys.readouterr().err
    assert monitor.monitor_main(parse("--interval", "0")) == 2
    url, _ = serve(new_text())
    assert monitor.monitor_main(parse("--url", url, "--count", "1", "--interval", "0.01")) == 0
    assert len(capsys.readouterr().out.splitlines()) == 2


def test_labkit_monitor_command_is_wired(capsys):
    from labkit.cli import main

    assert main(["monitor", "--count", "1", "--interval", "0.1"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("#") and "cpu%" in out[0] and len(out) == 2
    assert main(["monitor", "--url", "http://127.0.0.1:9", "--count", "1"]) == 2


def test_server_vs_client_counts():
    ok_tokens = sum(r.output_tokens for r in REQS if r.status == "ok")
    samples = [s | {"generation_tokens_total": 100.0 + ok_tokens * (i == 6)} for i, s in enumerate(SAMPLES)]
    samples.insert(3, {"t_perf": 101.4, "error": "ReadTimeout"})  # a failed scrape is skipped
    c = monitor.server_vs_client(samples, REQS)
    assert c == {"server_tokens": ok_tokens, "client_tokens": ok_tokens, "ratio": 1.0, "max_running": 2.0,
                 "max_waiting": 6.0}
    short = monitor.server_vs_client(samples[:-1], REQS)  # the last scrape came before the counter grew
    assert short["ratio"] == 0.0
    none = monitor.server_vs_client([{"t_perf": 0.0, "cpu_pct": 1.0}], [])
    assert math.isnan(none["server_tokens"]) and math.isnan(none["ratio"]) and math.isnan(none["max_waiting"])


@pytest.mark.slow  # starts llama.cpp on the bundled GGUF
def test_watched_run_on_a_real_llama_server():
    """The mapping against the build's live /metrics: 2 slots, 6 requests 3 at a time."""
    from labkit.engines import llamacpp
    from labkit.serving.loadspec import LoadSpec

    if not llamacpp.llamacpp_available():
        if llamacpp.llamacpp_required():
            pytest.fail(f"CI must build llama.cpp: {llamacpp.unavailable_reason()}")
        pytest.skip(llamacpp.unavailable_reason())
    with ENGINES["llamacpp"].serve(threads=1, parallel=2) as server:
        spec = LoadSpec(n_requests=6, concurrency=3, max_tokens=8, warmup=0, prompts=["Count to three."])
        samples, run = monitor.watched_run(server.url, models.SERVED_NAME, spec, interval_s=0.05)
    assert run.completed == 6 and all(s.get("engine") == "llamacpp" for s in samples if "error" not in s)
    c = monitor.server_vs_client(samples, run.requests)
    assert c["client_tokens"] == 48 and c["ratio"] == 1.0 and c["max_running"] >= 1
    d = monitor.dashboard(samples, run.requests)
    assert monitor.watch_list(d)["queue depth"] and math.isnan(d["kv_usage_pct"]["mean"])
