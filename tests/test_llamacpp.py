"""llama.cpp as the lab builds and runs it (labkit.engines.llamacpp_build, labkit.engines.llamacpp).

The build flags and cache key are plain unit tests. The rest needs the tools ``make llamacpp``
builds: skipped where they are not built, except under CI, where ``make test`` builds them and a
missing tool is a failure."""

from __future__ import annotations

import pytest

from labkit.engines import llamacpp, llamacpp_build, prometheus, server
from labkit.paths import data
from labkit.serving import loadgen, loadspec, openai_api


def test_flags_are_portable_on_x86_and_default_on_macos() -> None:
    linux = llamacpp_build.build_flags("Linux", "x86_64", cuda=False)
    assert "-DGGML_NATIVE=OFF" in linux and "-DGGML_AVX2=ON" in linux and "-DLLAMA_CURL=OFF" in linux
    mac = llamacpp_build.build_flags("Darwin", "arm64", cuda=False)
    assert not any("GGML_NATIVE" in f or "AVX" in f for f in mac)  # Metal: llama.cpp's own defaults
    assert "-DGGML_CUDA=ON" in llamacpp_build.build_flags("Linux", "x86_64", cuda=True)


def test_build_key_changes_with_version_and_flags() -> None:
    flags = llamacpp_build.build_flags("Linux", "x86_64", cuda=False)
    key = llamacpp_build.build_key(flags)
    assert key.startswith(llamacpp_build.VERSION + "-")
    assert key == llamacpp_build.build_key(list(reversed(flags)))  # order does not matter
    assert key != llamacpp_build.build_key(flags + ["-DGGML_CUDA=ON"])
    assert key != llamacpp_build.build_key(flags, version="0.3.35")


def test_missing_compiler_is_one_line_saying_what_to_install(monkeypatch) -> None:
    monkeypatch.setattr(llamacpp_build.shutil, "which", lambda name: None)
    monkeypatch.setattr(llamacpp_build, "_venv_tool", lambda name: None)
    msg = llamacpp_build.missing_prerequisites()
    assert "cmake" in msg and "C++ compiler" in msg and "\n" not in msg
    assert llamacpp_build.main([]) == 0 or llamacpp_build.available()  # the lab goes on without it


def test_bad_thread_count_says_what_to_set(monkeypatch) -> None:
    monkeypatch.setenv("LABKIT_LLAMACPP_THREADS", "two")
    with pytest.raises(ValueError, match="LABKIT_LLAMACPP_THREADS"):
        llamacpp.llamacpp_threads()


def test_gguf_type_of_the_bundled_model() -> None:
    from labkit.models import gguf_path

    assert llamacpp.gguf_type(gguf_path()) == "Q4_1"


def test_measured_server_rejects_unknown_engine() -> None:
    with pytest.raises(ValueError, match="llamacpp"), server.measured_server(engine="ollama"):
        pass


def test_bench_json_keeps_every_run() -> None:
    """llama-bench ``-o json`` rows (trimmed to the fields read) -> means, sds and per-run samples."""
    from labkit.stats import median_interval

    rows = [{"n_prompt": 128, "n_gen": 0, "avg_ts": 600.0, "stddev_ts": 10.0, "samples_ts": [590.0, 610.0]},
            {"n_prompt": 0, "n_gen": 64, "avg_ts": 45.0, "stddev_ts": 3.0, "samples_ts": [42.0, 45.0, 48.0]}]
    b = llamacpp.parse_bench(rows)
    assert b["prompt_tps"] == 600.0 and b["prompt_tps_sd"] == 10.0
    assert b["prompt_tps_samples"] == [590.0, 610.0]
    assert b["gen_tps"] == 45.0 and b["gen_tps_sd"] == 3.0 and b["gen_tps_samples"] == [42.0, 45.0, 48.0]
    assert median_interval(b["gen_tps_samples"])["median"] == 45.0
    old = llamacpp.parse_bench([{"n_gen": 16, "avg_ts": 30.0, "stddev_ts": 0.0}])  # no samples_ts
    assert old == {"gen_tps": 30.0, "gen_tps_sd": 0.0, "gen_tps_samples": [30.0]}


@pytest.mark.slow  # starts llama.cpp on the bundled GGUF
def test_server_streams_the_openai_api_under_its_alias(tools) -> None:
    with server.measured_server(engine="llamacpp", llamacpp_args={"parallel": 2}) as t:
        assert t.kind == "llamacpp" and t.dtype == "Q4_1" and t.startup_s is not None
        names = openai_api.check_openai_server(t.url)
        assert names == ["smollm2"], names
        s = loadgen.run(t.url, loadspec.LoadSpec(4, 2, max_tokens=8), loadspec.ClientSpec(model="smollm2",
                        ignore_eos=True), progress=False)
        assert s.completed == 4 and all(r.output_tokens == 8 for r in s.requests)
        m = prometheus.scrape(t.url, "llamacpp:")
        assert m["llamacpp:tokens_predicted_total"] >= 32, m


@pytest.mark.slow  # starts llama.cpp on the bundled GGUF
def test_bench_reports_both_phases(tools) -> None:
    b = llamacpp.bench(prompt=32, gen=16, reps=1)
    assert b["type"] == "Q4_1" and b["gen_tps"] > 0 and b["prompt_tps"] > b["gen_tps"]
    assert len(b["gen_tps_samples"]) == 1 and len(b["prompt_tps_samples"]) == 1


@pytest.mark.slow  # starts llama.cpp on the bundled GGUF
def test_quantize_to_q8_and_perplexity(tools, tmp_path) -> None:
    from labkit.models import gguf_path

    q8 = llamacpp.quantize(gguf_path(), tmp_path / "q8.gguf", "Q8_0")
    assert llamacpp.gguf_type(q8) == "Q8_0"
    assert q8.stat().st_size > gguf_path().stat().st_size  # 8.5 bits per weight vs Q4_1's 5
    p = llamacpp.perplexity(gguf_path(), data("texts", "heldout.txt"), ctx=128, chunks=2)
    assert p["chunks"] == 2 and 1 < p["ppl"] < 1000 and p["ppl_se"] > 0


@pytest.mark.slow  # starts llama.cpp on the bundled GGUF
def test_bench_cli_starts_and_stops_llama_server(tools, tmp_path) -> None:
    """``labkit bench --llamacpp`` as a reader types it: the server starts, serves, and is gone after."""
    import subprocess
    import sys

    from labkit.engines import process

    r = subprocess.run([sys.executable, "-m", "labkit.cli", "bench", "--llamacpp", "-n", "4", "-c", "2",
                        "--max-tokens", "8", "--ignore-eos", "--no-progress", "--out", str(tmp_path)],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    import json

    assert "starting llama.cpp" in r.stdout
    summary = json.loads((tmp_path / "c2.json").read_text())
    assert summary["completed"] == 4 and summary["output_throughput"] > 0, summary
    assert not [s for s in process.lab_servers() if s["engine"] == "llamacpp" and s["orphan"]]
