"""`labkit bench` as a new user types it (chapter 02): every bad option or environment value is one
line on stderr that says what to do, exit status 2, no traceback, and nothing is sent first."""

import os
import subprocess
import sys
from typing import Any

import pytest

from labkit import settings
from labkit.cli import main


def bench(capsys, *args):
    code: Any
    try:
        code = main(["bench", *args, "--no-progress"])
    except SystemExit as e:  # argparse's usage errors
        code = e.code
    err = capsys.readouterr().err
    return code, err


@pytest.mark.parametrize(("args", "says"), [
    (["--base-url", "localhost:8000"], "needs a scheme: use http://localhost:8000"),
    (["--base-url", "127.0.0.1:8000/v1"], "use http://127.0.0.1:8000/v1"),
    (["--base-url", "http:///v1"], "has no host: use e.g. http://127.0.0.1:8000"),
    (["-n", "0"], "-n/--requests: a whole number >= 1 is needed, got '0'"),
    (["-n", "abc"], "a whole number >= 1 is needed, got 'abc'"),
    (["--max-tokens", "-5"], "--max-tokens: a whole number >= 1 is needed, got '-5'"),
    (["-c", "1", "0"], "-c/--concurrency: a whole number >= 1"),
    (["--rate", "0"], "--rate: a number > 0 is needed"),
    (["--rate", "nan"], "--rate: a number > 0 is needed"),
    (["--burstiness", "-1"], "--burstiness: a number > 0"),
    (["--timeout", "0"], "--timeout: a number > 0"),
    (["--total-timeout", "-3"], "--total-timeout: a number > 0"),
    (["--max-duration", "0"], "--max-duration: a number > 0"),
    (["--warmup", "-1"], "--warmup: a whole number >= 0"),
    (["--slo-ttft-ms", "0"], "--slo-ttft-ms: a number > 0"),
    (["--synthetic", "0", "16"], "--synthetic: a whole number >= 1"),
    (["--range-ratio", "1.5"], "--range-ratio must be in [0, 1)"),
    (["--max-concurrency", "4"], "--max-concurrency caps an open loop: pass --rate too"),
    (["--backend", "ollama-chat"], "--model is required with an Ollama backend"),
    (["--backend", "vllm"], "invalid choice: 'vllm'"),
])
def test_bad_options_are_one_line_exit_2_before_any_request(srv, capsys, tmp_path, args, says):
    base = [] if "--base-url" in args else ["--base-url", srv.url]
    before = srv.requests
    code, err = bench(capsys, *base, *args, "--out", str(tmp_path))
    assert code == 2 and says in err, err
    assert err.startswith("error: ") and err.count("\n") == 1 and "Traceback" not in err
    assert srv.requests == before


def test_unwritable_out_is_reported_before_the_run(srv, capsys, tmp_path):
    (tmp_path / "a-file").write_text("x")
    before = srv.requests
    code, err = bench(capsys, "--base-url", srv.url, "--out", str(tmp_path / "a-file" / "results"))
    assert code == 2 and "is not a folder this user can write" in err and "pass --out" in err
    assert err.count("\n") == 1 and srv.requests == before


def test_no_target_says_what_to_pass(capsys, monkeypatch, tmp_path):
    monkeypatch.delenv("LABKIT_BASE_URL", raising=False)
    code, err = bench(capsys, "--out", str(tmp_path))
    assert code == 2 and "--base-url URL" in err and "LABKIT_BASE_URL" in err and "--vllm" in err


@pytest.mark.parametrize(("var", "value", "says"), [
    ("LABKIT_BASE_URL", "localhost:8000", "LABKIT_BASE_URL='localhost:8000' needs a scheme"),
    ("LABKIT_BASE_URL", "http://", "LABKIT_BASE_URL='http://' has no host"),
    ("LABKIT_PROFILE", "huge", "unknown LABKIT_PROFILE='huge'"),
    ("LABKIT_CACHE", "FILE", "LABKIT_CACHE="),
])
def test_bad_environment_values_name_the_variable(capsys, monkeypatch, tmp_path, var, value, says):
    if value == "FILE":
        value = str(tmp_path / "a-file")
        (tmp_path / "a-file").write_text("x")
    monkeypatch.setenv(var, value)
    import labkit.engines.vllm as vllm

    monkeypatch.setattr(vllm, "start_vllm", lambda **kw: pytest.fail("vLLM must not start"))
    monkeypatch.setattr(vllm, "vllm_available", lambda: True)
    args = ["--vllm"] if var != "LABKIT_BASE_URL" else []
    code, err = bench(capsys, *args, "--out", str(tmp_path / "out"))
    assert code == 2 and says in err and err.count("\n") == 1, err


def test_settings_validate_every_variable(monkeypatch, tmp_path):
    monkeypatch.setenv("LABKIT_THREADS", "abc")
    with pytest.raises(ValueError, match="LABKIT_THREADS='abc' is not a whole number"):
        settings.default_threads()
    monkeypatch.setenv("LABKIT_CACHE", str(tmp_path / "cache"))
    assert settings.cache_dir() == tmp_path / "cache" and (tmp_path / "cache").is_dir()
    monkeypatch.setenv("LABKIT_MODEL", "  ")
    assert settings.served_model() is None


def test_a_real_process_prints_one_line_and_exits_2(tmp_path):
    """No traceback from the console command itself (the first complaint in the issue)."""
    env = dict(os.environ, LABKIT_BASE_URL="")
    p = subprocess.run([sys.executable, "-m", "labkit.cli", "bench", "--base-url", "localhost:8000",
                        "--out", str(tmp_path)], capture_output=True, text=True, env=env, timeout=60)
    assert p.returncode == 2 and p.stdout == ""
    assert p.stderr.strip().splitlines() == [p.stderr.strip()] and "http://localhost:8000" in p.stderr


def test_one_engine_at_a_time(capsys, tmp_path):
    code, err = bench(capsys, "--vllm", "--llamacpp", "--out", str(tmp_path))
    assert code == 2 and "not allowed with argument" in err and err.count("\n") == 1


def test_llamacpp_not_built_says_how_to_build(capsys, monkeypatch, tmp_path):
    from labkit.engines import llamacpp

    monkeypatch.delenv("LABKIT_BASE_URL", raising=False)
    monkeypatch.setattr(llamacpp, "llamacpp_available", lambda: False)
    monkeypatch.setattr(llamacpp, "start_llamacpp", lambda **kw: pytest.fail("nothing must start"))
    code, err = bench(capsys, "--llamacpp", "--out", str(tmp_path))
    assert code == 2 and "make llamacpp" in err and err.count("\n") == 1
