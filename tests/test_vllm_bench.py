"""vLLM's own serving benchmark driven from labkit (chapter 02, labkit.experiments.vllm_bench): its options,
the prompt file, the long-lived session (against a stand-in ``vllm`` package, so no vLLM is needed) and
the result read back. One slow test parses the options with the real
``vllm bench serve`` parser where the vLLM venv exists."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from typing import Any

import pytest

from labkit.engines import vllm
from labkit.experiments import vllm_bench as vb

ARGS: dict[str, Any] = dict(base_url="http://127.0.0.1:8000/", model="/models/smollm2", served_name="smollm2",
            dataset="/tmp/p.json", num_prompts=12, max_tokens=32, concurrency=2)


def _opt(args: list[str], name: str) -> str:
    return args[args.index(name) + 1]


def test_options_match_labkits_closed_loop(tmp_path):
    args = vb.bench_serve_args(**ARGS, result_file=tmp_path / "r.json")
    assert _opt(args, "--backend") == "openai-chat" and _opt(args, "--endpoint") == "/v1/chat/completions"
    assert _opt(args, "--base-url") == "http://127.0.0.1:8000"  # no double slash before the endpoint
    assert _opt(args, "--served-model-name") == "smollm2" and _opt(args, "--tokenizer") == "/models/smollm2"
    assert _opt(args, "--num-prompts") == "12" and _opt(args, "--sharegpt-output-len") == "32"
    assert _opt(args, "--max-concurrency") == "2" and _opt(args, "--request-rate") == "inf"
    assert _opt(args, "--temperature") == "0" and _opt(args, "--num-warmups") == "1"
    assert {"--ignore-eos", "--disable-shuffle", "--save-result"} <= set(args)
    assert vb.result_path(args) == tmp_path / "r.json"
    comp = vb.bench_serve_args(**ARGS, result_file=tmp_path / "r.json", endpoint="completions")
    assert _opt(comp, "--backend") == "openai" and _opt(comp, "--endpoint") == "/v1/completions"
    with pytest.raises(ValueError, match="endpoint"):
        vb.bench_serve_args(**ARGS, result_file="r.json", endpoint="responses")
    with pytest.raises(ValueError, match="--result-dir"):
        vb.result_path(["--seed", "0"])


def test_sharegpt_file_keeps_order_and_text(tmp_path):
    prompts = ["What is 2+2?", 'Quote "this"\nand a new line.', "Ünïcode"]
    rows = json.loads(vb.write_sharegpt_dataset(prompts, tmp_path / "d" / "p.json").read_text())
    assert [r["conversations"][0]["value"] for r in rows] == prompts
    assert all(r["conversations"][0]["from"] == "human" and len(r["conversations"]) == 2 for r in rows)


FAKE_SERVE = '''
import json, sys
from pathlib import Path
def add_cli_args(parser):
    parser.add_argument("--result-dir")
    parser.add_argument("--result-filename")
    parser.add_argument("--seed")
def main(args):
    if args.seed == "fail":
        print("boom: no server", file=sys.stderr)
        sys.exit(3)
    if args.seed != "nothing":
        Path(args.result_dir, args.result_filename).write_text(json.dumps(
            {"median_ttft_ms": 10.0, "median_tpot_ms": 2.0, "rest": args.rest}))
'''
FAKE_PARSER = '''
import argparse
class FlexibleArgumentParser(argparse.ArgumentParser):
    def parse_args(self, args=None, namespace=None):
        ns, rest = self.parse_known_args(args, namespace)
        ns.rest = rest
        return ns
'''


@pytest.fixture
def fake_vllm(tmp_path, monkeypatch):
    """A stand-in ``vllm`` package with the two modules the shim imports, first on PYTHONPATH."""
    root = tmp_path / "site"
    for sub, text in (("vllm/__init__.py", ""), ("vllm/benchmarks/__init__.py", ""),
                      ("vllm/benchmarks/serve.py", FAKE_SERVE), ("vllm/utils/__init__.py", ""),
                      ("vllm/utils/argparse_utils.py", FAKE_PARSER)):
        (root / sub).parent.mkdir(parents=True, exist_ok=True)
        (root / sub).write_text(textwrap.dedent(text))
    monkeypatch.setenv("PYTHONPATH", str(root))
    return root


def test_the_shim_patches_nothing():
    assert "add_cli_args" in vb.SHIM and "importlib" not in vb.SHIM
    assert "add_cli_args" in vb.DRIVER and "importlib" not in vb.DRIVER


def test_session_imports_once_and_runs_many(tmp_path, fake_vllm):
    log = tmp_path / "session.log"
    args = lambda seed: ["--seed", seed, "--result-dir", str(tmp_path), "--result-filename", f"{seed}.json"]
    with vb.BenchSession(python=sys.executable, log_path=log, timeout_s=60) as session:
        for i in range(2):
            r = session.run(args(str(i)))
            assert r["median_tpot_ms"] == 2.0 and r["wall_s"] > 0
        with pytest.raises(RuntimeError, match="(?s)@@done 1 SystemExit: 3.*boom: no server"):
            session.run(args("fail"))
        (tmp_path / "nothing.json").write_text("{}")  # a stale result from an earlier run must not be read
        with pytest.raises(RuntimeError, match="absent"):  # ran, but saved nothing
            session.run(args("nothing"))
        assert session.run(args("3"))["median_ttft_ms"] == 10.0  # still serving after the failures
        proc = session.proc
    assert proc is not None and proc.returncode == 0  # closing stdin ended the driver
    assert log.read_text().count("@@done") == 5


def test_session_reports_a_driver_that_dies(tmp_path, fake_vllm):
    (fake_vllm / "vllm" / "benchmarks" / "serve.py").write_text("raise ImportError('no vllm here')\n")
    with pytest.raises(RuntimeError, match="(?s)exited.*no vllm here"):
        with vb.BenchSession(python=sys.executable, timeout_s=60):
            pass


@pytest.mark.slow
def test_real_vllm_parser_accepts_the_options(tmp_path):
    """The options labkit builds are ones ``vllm bench serve`` knows (parsed, not run: about 15 s)."""
    if not vllm.vllm_available():
        pytest.skip(vllm.unavailable_reason())
    args = vb.bench_serve_args(**ARGS, result_file=tmp_path / "r.json")
    code = vb.SHIM.replace("main(parser.parse_args(sys.argv[1:]))",
                           "a = parser.parse_args(sys.argv[1:]); print(a.dataset_name, "
                           "a.sharegpt_output_len, a.max_concurrency, a.ignore_eos, a.disable_shuffle, "
                           "a.save_result)")
    assert code != vb.SHIM
    r = subprocess.run([str(vllm.vllm_python()), "-c", code, *args], capture_output=True, text=True,
                       timeout=300, env=vb.bench_env())
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.split()[-6:] == ["sharegpt", "32", "2", "True", "True", "True"]
