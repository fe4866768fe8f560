"""``labkit`` console command for every chapter: ``doctor`` (chapter 00), ``provision``, ``run CHAPTER``,
``bench`` (chapter 02's load generator), ``gpu-check`` (chapters 00, 04 and 07 on a CUDA GPU) and
``monitor`` (chapter 08's live view of this machine and a vLLM server) and ``report`` (every
chapter: the tutorial's claims checked here).

Each subcommand imports what it runs inside its own function, so ``labkit --help`` and a mistyped
option answer at once, without loading numpy, httpx or torch."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any, NoReturn


def _doctor(args: argparse.Namespace) -> int:
    from .hardware import machine
    from .settings import profile, set_threads

    set_threads()
    info = machine.detect()
    if args.json:
        print(json.dumps(info, indent=2))
        return 0
    from .hardware.capability import capability, format_capability

    p = profile()
    print(machine.format_report(info))
    print(format_capability(capability(info["device"])))
    if info["device"] != "cpu":
        print(format_capability(capability("cpu")))
    print(f"profile       {p.name} (LLM {p.llm}, Whisper {p.whisper}, diffusion {p.diffusion})")
    from .engines import llamacpp_build, process, vllm

    print(f"engines       vLLM: {'ready' if vllm.vllm_available() else vllm.unavailable_reason()}")
    built = llamacpp_build.build_info()
    print("              llama.cpp: " + (f"{built['version']} built in {llamacpp_build.build_dir()} "
                                         f"({built['build_s']:.0f} s)" if llamacpp_build.available()
                                         else llamacpp_build.unavailable_reason()))
    servers = process.lab_servers()
    print(process.format_lab_servers(servers) or "lab servers   none running")
    if args.measure:
        from .hardware import microbench

        dev = info["device"]
        bw = microbench.memory_bandwidth(dev)
        moved = bw["bytes"] / 1e6
        print(f"bandwidth     {bw['gbps']:.1f} GB/s measured ({moved:.0f} MB read + written per copy)")
        for dtype in microbench.matmul_dtypes(dev):
            r = microbench.matmul_tflops(dev, dtype=dtype)
            print(f"matmul {dtype:<8} {r['tflops']:.3f} TFLOPS measured (n={r['n']})")
    return 0


def _provision(args: argparse.Namespace) -> int:
    from .models import ProvisionError, provision

    try:
        for name, path in provision().items():
            print(f"{name:<24} {path}")
    except ProvisionError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    return 0


def _run(args: argparse.Namespace) -> int:
    from .chapters import run_chapter

    return run_chapter(args.chapter, timeout=args.timeout)


def _number(kind: type, low: float, strict: bool = False) -> Any:
    """An argparse ``type=`` for a number >= ``low`` (> ``low`` when ``strict``), with a message
    that says what to pass."""

    def parse(text: str) -> Any:
        try:
            v = kind(text)
        except ValueError:
            v = None
        if v is None or v != v or (v <= low if strict else v < low):
            what = "a whole number" if kind is int else "a number"
            need = f"{'>' if strict else '>='} {low:g}"
            raise argparse.ArgumentTypeError(f"{what} {need} is needed, got {text!r}")
        return v

    return parse


def _url(text: str) -> str:
    from .serving.streaming import base_url_of

    try:
        return base_url_of(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def _usage_error(prog: str, message: str) -> NoReturn:
    """One line on stderr for a bad option, exit status 2 (argparse's usage-error code)."""
    print(f"error: {prog}: {message} (see `{prog} --help`)", file=sys.stderr)
    sys.exit(2)


def add_bench_arguments(p: argparse.ArgumentParser) -> None:
    """The options of ``labkit bench`` (see ``labkit bench --help``); a bad value is a one-line
    error with exit status 2."""
    pos_int, count, pos = _number(int, 1), _number(int, 0), _number(float, 0, strict=True)
    p.error = lambda message: _usage_error(p.prog, message)  # type: ignore[method-assign]
    p.add_argument("--base-url", type=_url, help="OpenAI-compatible server, e.g. http://127.0.0.1:8000 "
                   "(or the Ollama host with --backend ollama-*); default $LABKIT_BASE_URL")
    engine = p.add_mutually_exclusive_group()
    engine.add_argument("--vllm", action="store_true",
                        help="start the bundled model with vLLM for the run")
    engine.add_argument("--llamacpp", action="store_true", help="start the bundled GGUF with "
                        "llama.cpp's llama-server for the run (after make llamacpp)")
    p.add_argument("--backend", default="openai-chat",
                   choices=["openai-chat", "openai-completions", "ollama-generate", "ollama-chat"])
    p.add_argument("--model", help="served model name (default: $LABKIT_MODEL, else the only one the "
                   "server lists)")
    p.add_argument("-n", "--requests", type=pos_int, help="requests per concurrency level (default 16; with "
                   "--dataset, one per prompt of the file)")
    p.add_argument("-c", "--concurrency", type=pos_int, nargs="+", default=[1],
                   help="closed loop: requests in flight; several values run a sweep")
    p.add_argument("--rate", type=pos, help="open loop: requests per second (Poisson by default)")
    p.add_argument("--burstiness", type=pos, default=1.0, help="gamma shape of arrival gaps (1 = Poisson)")
    p.add_argument("--max-concurrency", type=pos_int, help="open loop: cap on requests in flight "
                   "(default: none)")
    p.add_argument("--max-tokens", type=pos_int, default=32)
    p.add_argument("--ignore-eos", action="store_true", help="generate exactly --max-tokens (vLLM, SGLang)")
    data = p.add_mutually_exclusive_group()
    data.add_argument("--synthetic", nargs=2, type=pos_int, metavar=("INPUT", "OUTPUT"),
                      help="synthetic prompts of about INPUT tokens asking OUTPUT tokens")
    data.add_argument("--dataset", metavar="FILE", help="prompts from a ShareGPT-style .json or a .jsonl "
                      "(what vLLM's bench serve and GuideLLM read), each sent once with the default -n")
    p.add_argument("--range-ratio", type=_number(float, 0), default=0.0,
                   help="spread of synthetic lengths, 0 <= r < 1")
    p.add_argument("--warmup", type=count, default=1)
    p.add_argument("--timeout", type=pos, default=120.0,
                   help="seconds without data from the server (read timeout between chunks)")
    p.add_argument("--total-timeout", type=pos, help="seconds for a whole request (default: no limit)")
    p.add_argument("--max-duration", type=pos, help="stop sending after this many seconds")
    p.add_argument("--slo-ttft-ms", type=pos)
    p.add_argument("--slo-tpot-ms", type=pos)
    p.add_argument("--slo-e2el-ms", type=pos)
    p.add_argument("--out", default="build/bench", help="folder for LABEL.jsonl and LABEL.json")
    p.add_argument("--no-progress", action="store_true")


def _writable(folder: str) -> None:
    """``ValueError`` unless ``folder`` can be created and written (checked before any request)."""
    import tempfile
    from pathlib import Path

    try:
        Path(folder).mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=folder):
            pass
    except OSError as e:
        raise ValueError(f"--out {folder!r} is not a folder this user can write ({e.strerror or e}): "
                         "pass --out with a writable folder") from None


def _bench(a: argparse.Namespace) -> int:
    """``labkit bench``: run, print a report per level and the knee table. Exit status 2 for bad
    input (options, environment, --out), 1 when the server fails, 130 on Ctrl-C; every request that
    finished is already in ``--out`` as JSONL."""
    import contextlib

    from . import settings
    from .serving.datasets import load_dataset
    from .serving.loadgen import knee_table, run, sweep, synthetic_requests
    from .serving.loadspec import ClientSpec, LoadSpec
    from .serving.metrics import format_report
    from .serving.ollama_api import ollama_backend
    from .serving.streaming import Backend, ServerError
    from .table import format_rows

    url: str = a.base_url or settings.base_url() or ""
    a.model = a.model or settings.served_model()
    if not (url or a.vllm or a.llamacpp):
        raise ValueError("pass --base-url URL (any OpenAI-compatible server, or Ollama with --backend "
                         "ollama-generate), set LABKIT_BASE_URL, or pass --vllm or --llamacpp to start "
                         "the bundled model")
    if a.backend.startswith("ollama") and not a.model:
        raise ValueError("--model is required with an Ollama backend (e.g. --model llama3.2)")
    if a.range_ratio >= 1:
        raise ValueError(f"--range-ratio must be in [0, 1), got {a.range_ratio}")
    if a.max_concurrency is not None and a.rate is None:
        raise ValueError("--max-concurrency caps an open loop: pass --rate too, or use -c for a closed loop")
    engine = None
    if a.vllm or a.llamacpp:
        from .engines.server import ENGINES

        settings.profile(), settings.cache_dir()  # read by the engine: fail now, not after loading
        engine = ENGINES["vllm" if a.vllm else "llamacpp"]
        if not engine.available():
            raise ValueError(engine.why_not())
    _writable(a.out)
    slo = {k: v for k, v in (("ttft_ms", a.slo_ttft_ms), ("tpot_ms", a.slo_tpot_ms),
                             ("e2el_ms", a.slo_e2el_ms)) if v is not None} or None
    prompts = None
    if a.dataset:
        prompts = load_dataset(a.dataset)
        a.requests = a.requests or len(prompts)
    a.requests = a.requests or 16
    if a.synthetic:
        prompts = synthetic_requests(a.requests, a.synthetic[0], a.synthetic[1], a.range_ratio)
    spec = LoadSpec(n_requests=a.requests, concurrency=a.max_concurrency, rate=a.rate,
                    burstiness=a.burstiness, max_tokens=a.max_tokens, prompts=prompts, warmup=a.warmup,
                    max_duration_s=a.max_duration)
    with contextlib.ExitStack() as stack:
        try:
            if engine is not None:
                print(f"starting {engine.label} on the bundled model ...", flush=True)
                slots = max([*a.concurrency, a.max_concurrency or 1])  # one slot per request in flight
                started = stack.enter_context(engine.serve(**({"parallel": slots} if a.llamacpp else {})))
                url, a.model = started.url, a.model or started.model
            target: str | Backend = url
            client: ClientSpec | None = None
            if a.backend.startswith("ollama"):
                target = ollama_backend(a.model, host=url, endpoint=a.backend.split("-")[1],
                                        timeout_s=a.timeout, total_timeout_s=a.total_timeout)
            else:
                client = ClientSpec(model=a.model, endpoint=a.backend.split("-")[1], ignore_eos=a.ignore_eos,
                                    timeout_s=a.timeout, total_timeout_s=a.total_timeout)
            progress = not a.no_progress
            if a.rate is not None:
                runs = [run(target, spec, client, slo=slo, out=a.out, progress=progress)]
            else:
                runs = sweep(target, a.concurrency, spec, client, slo=slo, out=a.out, progress=progress)
        except (ServerError, RuntimeError, FileNotFoundError) as e:
            print(f"error: {e}", file=sys.stderr)
            return 1
        except KeyboardInterrupt:
            print(f"interrupted: the requests that finished are in {a.out}/*.jsonl", file=sys.stderr)
            return 130
    for s in runs:
        print(format_report(s, title=f"== {s.label} ({s.backend})"))
        print(f"files        {s.jsonl}  {s.summary_json}\n")
    if len(runs) > 1:
        print(format_rows(knee_table(runs)))
    return 0 if all(s.accounted for s in runs) else 1


def _gpu_check(args: argparse.Namespace) -> int:
    from .gpucheck import main as gpu_check

    return gpu_check(args.rest)


def _report(args: argparse.Namespace) -> int:
    from .report.build import main as report

    return report(args.rest)


def add_monitor_arguments(p: argparse.ArgumentParser) -> None:
    """The options of ``labkit monitor``: ``--url``, ``--interval`` (s), ``--count`` (lines)."""
    p.add_argument("--url", help="a vLLM or llama-server (--metrics) whose /metrics to show too, "
                   "e.g. http://127.0.0.1:8000")
    p.add_argument("--interval", type=float, default=1.0, help="seconds between lines (default 1)")
    p.add_argument("--count", type=int, help="lines to print (default: until Ctrl-C)")


def _monitor(args: argparse.Namespace) -> int:
    from .production.monitor import monitor_main

    return monitor_main(args)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="labkit", description="Inference Engineering Lab toolkit")
    sub = parser.add_subparsers(dest="cmd", required=True)
    d = sub.add_parser("doctor", help="describe this machine (and measure it with --measure)")
    d.add_argument("--json", action="store_true", help="print the raw detection as JSON")
    d.add_argument("--measure", action="store_true", help="also measure bandwidth and matmul TFLOPS")
    d.set_defaults(fn=_doctor)
    p = sub.add_parser("provision", help="check and convert the bundled models (no network)")
    p.set_defaults(fn=_provision)
    r = sub.add_parser("run", help="execute a chapter notebook headless and print its checks")
    r.add_argument("chapter", help="short name, number or notebook, e.g. concepts, 01, 01_key_concepts")
    r.add_argument("--timeout", type=int, default=1800, help="seconds per cell")
    r.set_defaults(fn=_run)
    g = sub.add_parser("gpu-check", help="check the CUDA paths on a machine with an NVIDIA GPU (no download)")
    g.add_argument("rest", nargs=argparse.REMAINDER,
                   help="options for labkit.gpucheck (see --help there)")
    g.set_defaults(fn=_gpu_check)
    b = sub.add_parser("bench", help="load-test a streaming LLM server: TTFT/TPOT/ITL (chapter 02)")
    add_bench_arguments(b)
    b.set_defaults(fn=_bench)
    mo = sub.add_parser("monitor", help="watch this machine (and a vLLM server's /metrics) live, like "
                        "nvidia-smi dmon (chapter 08)")
    add_monitor_arguments(mo)
    mo.set_defaults(fn=_monitor)
    rp = sub.add_parser("report", help="check every claim of the tutorial on this machine; writes reports/")
    rp.add_argument("rest", nargs=argparse.REMAINDER,
                    help="options of python -m labkit.report (see --help there)")
    rp.set_defaults(fn=_report)
    args = parser.parse_args(argv)
    try:
        return args.fn(args)
    except (ValueError, RuntimeError) as e:  # bad input, settings or device: one line, what to do
        print(f"error: {' '.join(str(e).split())}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
