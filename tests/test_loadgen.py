"""The load generator against the loopback fake server: closed and open loop, accounting, JSONL that
survives a kill, mid-run errors, the `labkit bench` command (chapter 02)."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from labkit.cli import main as labkit_main
from labkit.engines.process import free_port
from labkit.serving import loadgen, plots
from labkit.serving.loadspec import ClientSpec, LoadSpec
from labkit.serving.local import transformers_backend
from labkit.serving.streaming import ServerError
from labkit.table import format_rows

FAKE_SERVER_OPTS = {"step_s": 0.002, "prefill_s": 0.01, "batch_cost_s": 0.001}  # of conftest's srv


@pytest.mark.parametrize("c", [1, 4])
def test_closed_loop_holds_concurrency_and_accounts(srv, c, tmp_path):
    s = loadgen.run(srv.url, LoadSpec(12, c, max_tokens=5, warmup=1), out=tmp_path, progress=False)
    assert srv.peak_active == c
    assert s.accounted and s.completed == 12 and s.failed == 0
    assert s.total_output_tokens == 60 and s.ttft.n == 12 and s.itl.n == 48
    assert s.mode == "closed" and s.concurrency == c
    lines = [json.loads(x) for x in open(tmp_path / f"c{c}.jsonl")]
    assert [x["phase"] for x in lines].count("warmup") == 1 and len(lines) == 13
    assert all(x["status"] == "ok" and x["ttft_s"] > 0 for x in lines)
    saved = json.load(open(tmp_path / f"c{c}.json"))
    assert saved["p99_ttft_ms"] == pytest.approx(s.ttft.p99) and "requests" not in saved
    assert len(s.requests) == 12


def test_open_loop_caps_in_flight_and_records_queueing(srv):
    srv.opts["step_s"] = 0.01
    s = loadgen.run(srv.url, LoadSpec(16, concurrency=2, rate=200.0, max_tokens=4, warmup=0), progress=False)
    assert s.mode == "open" and s.accounted and s.completed == 16
    assert srv.peak_active <= 2
    assert max(r.queue_s or 0.0 for r in s.requests) > 0.01  # arrivals waited for the cap


def test_open_loop_has_no_cap_unless_asked(srv):
    """Regression (defect 6): ``run(url, n, rate=r)`` inherited ``concurrency=1``: one request in
    flight, arrivals queued for seconds outside TTFT, an overloaded client reported as fast."""
    srv.opts["step_s"] = 0.01
    s = loadgen.run(srv.url, LoadSpec(16, rate=200.0, max_tokens=4, warmup=0), progress=False)
    assert s.completed == 16 and s.concurrency is None and srv.peak_active > 2
    assert max(r.queue_s or 0.0 for r in s.requests) < 0.05  # nobody waited for a slot
    closed = loadgen.run(srv.url, LoadSpec(2, max_tokens=2, warmup=0), progress=False)
    assert closed.concurrency == 1  # closed: 1


def test_open_loop_stops_sending_at_max_duration(srv):
    """Regression (defect 5): the open loop slept until each planned arrival before checking the
    deadline: ``run(server, 20, rate=2, max_duration_s=1)`` took 13.6 s."""
    t = time.perf_counter()
    spec = LoadSpec(20, rate=2.0, max_tokens=2, warmup=0, max_duration_s=0.5)
    s = loadgen.run(srv.url, spec, progress=False)
    assert time.perf_counter() - t < 2.0
    assert s.accounted and s.status_counts["not_sent"] >= 15
    assert s.completed + s.status_counts["not_sent"] == 20


@pytest.mark.parametrize(("make", "kwargs", "match"), [
    (LoadSpec, {"n_requests": 0}, "n_requests must be a whole number >= 1"),
    (LoadSpec, {"max_tokens": -5}, "max_tokens must be a whole number >= 1"),
    (LoadSpec, {"max_tokens": 2.5}, "max_tokens must be a whole number >= 1"),
    (LoadSpec, {"concurrency": 0}, "concurrency must be"),
    (LoadSpec, {"rate": 0.0}, "rate must be a positive number"),
    (LoadSpec, {"burstiness": float("nan")}, "burstiness must be a positive number"),
    (LoadSpec, {"max_duration_s": 0}, "max_duration_s must be"),
    (LoadSpec, {"prompts": []}, "prompts is an empty list"),
    (ClientSpec, {"timeout_s": -1.0}, "timeout_s must be"),
    (ClientSpec, {"endpoint": "generate"}, "endpoint must be 'chat' or 'completions'"),
])
def test_bad_run_settings_name_themselves(make, kwargs, match):
    with pytest.raises(ValueError, match=match):
        make(**kwargs)


def test_a_backend_target_takes_no_client_spec_and_sweep_sets_concurrency(srv):
    with pytest.raises(ValueError, match="brings its own client settings"):
        loadgen.run(transformers_backend(None, None), LoadSpec(2), ClientSpec(model="x"))
    with pytest.raises(ValueError, match="leave rate and concurrency out"):
        loadgen.sweep(srv.url, (1, 2), LoadSpec(concurrency=4))
    assert LoadSpec().requests == 8 and LoadSpec(concurrency=8).requests == 16  # max(8, 2 x c)


def test_mid_run_errors_and_deadline_are_accounted(srv):
    srv.opts["fail_every"] = 4
    s = loadgen.run(srv.url, LoadSpec(12, 3, max_tokens=3, warmup=0), progress=False)
    assert s.status_counts["http_error"] == 3 and s.completed == 9 and s.accounted
    assert all("injected" in (r.error or "") for r in s.requests if r.status == "http_error")
    srv.opts.update(fail_every=0, step_s=0.05)
    s = loadgen.run(srv.url, LoadSpec(30, 1, max_tokens=3, warmup=0, max_duration_s=0.3), progress=False)
    assert s.status_counts["not_sent"] > 0 and s.accounted
    assert s.completed + s.status_counts["not_sent"] == 30


def test_clear_errors_before_a_run(srv):
    with pytest.raises(ServerError, match="'gpt-4' is not served"):
        loadgen.run(srv.url, LoadSpec(2), ClientSpec(model="gpt-4"), progress=False)
    with pytest.raises(ServerError, match="no server answers"):
        loadgen.run(f"http://127.0.0.1:{free_port()}", LoadSpec(2), ClientSpec(model="x"), progress=False)
    with pytest.raises(ValueError, match=r"at most 1.*LoadSpec\(concurrency=1\)"):
        loadgen.run(transformers_backend(None, None), LoadSpec(2, concurrency=2))
    srv.opts["streaming"] = False
    with pytest.raises(ServerError, match="warm-up request failed.*event-stream"):
        loadgen.run(srv.url, LoadSpec(2), progress=False)


def test_synthetic_lengths_with_a_tokenizer():
    class Chars:
        def __call__(self, text, add_special_tokens=False):
            return {"input_ids": list(text.encode())}

        def decode(self, ids):
            return bytes(ids).decode(errors="ignore")

    reqs = loadgen.synthetic_requests(20, input_tokens=100, output_tokens=16, range_ratio=0.5,
                                      tokenizer=Chars(), seed=3)
    assert all(50 <= len(r["prompt"].encode()) <= 150 and 8 <= r["max_tokens"] <= 24 for r in reqs)
    assert len({r["max_tokens"] for r in reqs}) > 3
    assert len(loadgen.load_prompts()) >= 20


def test_sweep_plots_and_knee_table(srv):
    import matplotlib

    matplotlib.use("Agg")
    runs = loadgen.sweep(srv.url, (1, 2), LoadSpec(4, max_tokens=4), progress=False)
    assert [s.n_planned for s in runs] == [4, 4] and [s.warmup for s in runs] == [1, 0]
    per_level = loadgen.sweep(srv.url, (1, 2), LoadSpec(max_tokens=2, warmup=0), n_requests={2: 3},
                              progress=False)
    assert [s.n_planned for s in per_level] == [8, 3]  # default max(8, 2c) where not given
    rows = loadgen.knee_table(runs)
    assert [r["concurrency"] for r in rows] == [1, 2] and "output_tok_s" in format_rows(rows)
    cdf = plots.plot_ttft_cdf(runs)
    assert len(cdf.get_lines()) == 2 * len(runs)  # per run: its CDF and its P50/P99 dots
    assert [line.get_xdata().size for line in cdf.get_lines()[::2]] == [4, 4]  # one step per request
    assert len(plots.plot_itl_hist(runs).patches) == len(runs)  # one outline per run
    assert [t.get_text() for t in plots.plot_knee(runs).get_xticklabels()] == ["1", "2"]


def test_bench_command(srv, tmp_path, capsys):
    code = labkit_main(["bench", "--base-url", srv.url, "-n", "4", "-c", "1", "2", "--max-tokens", "3",
                        "--out", str(tmp_path), "--no-progress", "--slo-ttft-ms", "1000"])
    out = capsys.readouterr().out
    assert code == 0 and "== c1" in out and "== c2" in out and "goodput" in out
    assert (tmp_path / "c2.jsonl").exists() and (tmp_path / "c2.json").exists()
    code = labkit_main(["bench", "--base-url", f"http://127.0.0.1:{free_port()}", "--no-progress",
                        "--out", str(tmp_path)])
    assert code == 1 and "no server answers" in capsys.readouterr().err
    code = labkit_main(["bench", "--base-url", srv.url, "--backend", "ollama-generate", "--model", "fake",
                        "-n", "3", "--rate", "20", "--out", str(tmp_path), "--no-progress"])
    assert code == 0 and "rate20" in capsys.readouterr().out


def test_killed_run_keeps_what_finished(tmp_path):
    """A bench process killed mid-run leaves one valid JSON line per request it finished."""
    port = free_port()
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    cmd = [sys.executable, "-m", "labkit.engines.fakeserver", "--port", str(port), "--step-ms", "40"]
    server = subprocess.Popen(cmd, stdout=subprocess.PIPE, env=env)
    try:
        assert server.stdout is not None
        server.stdout.readline()  # "fake server on ..."
        bench = subprocess.Popen([sys.executable, "-m", "labkit.cli", "bench", "--base-url",
                                  f"http://127.0.0.1:{port}", "-n", "100", "--max-tokens", "3",
                                  "--out", str(tmp_path), "--no-progress"], env=env)
        path = tmp_path / "c1.jsonl"
        t0 = time.time()
        while time.time() - t0 < 60 and (not path.exists() or path.read_text().count("\n") < 4):
            time.sleep(0.1)
        bench.send_signal(signal.SIGKILL)
        bench.wait(10)
        lines = [json.loads(x) for x in path.read_text().splitlines()]
        assert 4 <= len(lines) < 101 and all(x["status"] == "ok" for x in lines)
        assert not (tmp_path / "c1.json").exists()  # the summary never got written
    finally:
        server.send_signal(signal.SIGTERM)
        server.wait(10)


def test_overhead_benchmark_compares_equal_traffic(srv):
    """Regression (defect 9): the bare httpx reader sent no ``stream_options`` (18,111 B against
    labkit's 28,106 B per 128-token stream) and was not warmed up. Now both send the same body."""
    import asyncio
    import importlib.util

    import httpx

    from labkit.serving import openai_api

    path = Path(__file__).resolve().parent.parent / "benchmarks" / "loadgen_overhead.py"
    spec = importlib.util.spec_from_file_location("loadgen_overhead", path)
    assert spec is not None and spec.loader is not None
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    sent = []

    def handler(request):
        sent.append(json.loads(request.content))
        return httpx.Response(200, headers={"content-type": "text/event-stream"}, content=b"data: [DONE]\n\n")

    async def labkit_request():
        async with httpx.AsyncClient(transport=httpx.MockTransport(handler)) as client:
            await openai_api.openai_backend("http://test", "fake").send(client, bench.PROMPT, 16)

    asyncio.run(labkit_request())
    assert sent == [bench.body(16)] and sent[0]["stream_options"]["continuous_usage_stats"]
    before = srv.requests
    _, size = asyncio.run(bench.bare_ingest(srv.url, 3, 1, 16))
    assert srv.requests - before == 4  # one warm-up, then the three timed
    with httpx.stream("POST", f"{srv.url}/v1/chat/completions", json=sent[0], timeout=10) as r:
        assert len(r.read()) == size  # the bytes labkit's request gets back
