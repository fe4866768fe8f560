"""``labkit`` console command: ``labkit doctor``, ``labkit provision``, ``labkit run CHAPTER``."""

from __future__ import annotations

import argparse
import json
import sys


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



def add_bench_arguments(p: argparse.ArgumentParser) -> None:
    """The options of ``labkit bench`` (see ``labkit bench --help``)."""
    p.add_argument("--base-url", help="OpenAI-compatible server, e.g. http://127.0.0.1:8000 "
                   "(or the Ollama host with --backend ollama-*)")
    p.add_argument("--vllm", action="store_true", help="start the bundled model with vLLM for the run")
    p.add_argument("--backend", default="openai-chat",
                   choices=["openai-chat", "openai-completions", "ollama-generate", "ollama-chat"])
    p.add_argument("--model", help="served model name (default: the only one the server lists)")
    p.add_argument("-n", "--requests", type=int, default=16, help="requests per concurrency level")
    p.add_argument("-c", "--concurrency", type=int, nargs="+", default=[1],
                   help="closed loop: requests in flight; several values run a sweep")
    p.add_argument("--rate", type=float, help="open loop: requests per second (Poisson by default)")
    p.add_argument("--burstiness", type=float, default=1.0, help="gamma shape of arrival gaps (1 = Poisson)")
    p.add_argument("--max-concurrency", type=int, help="open loop: cap on requests in flight")
    p.add_argument("--max-tokens", type=int, default=32)
    p.add_argument("--ignore-eos", action="store_true", help="generate exactly --max-tokens (vLLM, SGLang)")
    p.add_argument("--synthetic", nargs=2, type=int, metavar=("INPUT", "OUTPUT"),
                   help="synthetic prompts of about INPUT tokens asking OUTPUT tokens")
    p.add_argument("--range-ratio", type=float, default=0.0, help="spread of synthetic lengths, 0..1")
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--timeout", type=float, default=120.0, help="seconds per request")
    p.add_argument("--max-duration", type=float, help="stop sending after this many seconds")
    p.add_argument("--slo-ttft-ms", type=float)
    p.add_argument("--slo-tpot-ms", type=float)
    p.add_argument("--slo-e2el-ms", type=float)
    p.add_argument("--out", default="build/bench", help="folder for LABEL.jsonl and LABEL.json")
    p.add_argument("--no-progress", action="store_true")


def _bench(a: argparse.Namespace) -> int:
    """``labkit bench``: run, print a report per level and the knee table; 1 on any error."""
    import contextlib

    from .serving.loadgen import knee_table, run, sweep, synthetic_requests
    from .serving.metrics import format_report, format_rows
    from .serving.streaming import Backend, ServerError, ollama_backend

    slo = {k: v for k, v in (("ttft_ms", a.slo_ttft_ms), ("tpot_ms", a.slo_tpot_ms),
                             ("e2el_ms", a.slo_e2el_ms)) if v is not None} or None
    prompts = None
    if a.synthetic:
        prompts = synthetic_requests(a.requests, a.synthetic[0], a.synthetic[1], a.range_ratio)
    if not (a.base_url or a.vllm):
        print("error: pass --base-url URL (any OpenAI-compatible server, or Ollama with --backend "
              "ollama-generate) or --vllm to start the bundled model", file=sys.stderr)
        return 1
    with contextlib.ExitStack() as stack:
        try:
            url = a.base_url
            if a.vllm:
                from .serving.vllm import SERVED_NAME, vllm_server

                print("starting vLLM (bundled model) ...", flush=True)
                url = stack.enter_context(vllm_server())
                a.model = a.model or SERVED_NAME
            target: str | Backend = url
            if a.backend.startswith("ollama"):
                if not a.model:
                    print("error: --model is required with an Ollama backend", file=sys.stderr)
                    return 1
                target = ollama_backend(a.model, host=url, endpoint=a.backend.split("-")[1],
                                        timeout_s=a.timeout)
            common = dict(model=a.model, max_tokens=a.max_tokens, prompts=prompts, slo=slo, out=a.out,
                          progress=not a.no_progress, max_duration_s=a.max_duration, timeout_s=a.timeout,
                          endpoint=a.backend.split("-")[1], ignore_eos=a.ignore_eos)
            if a.rate is not None:
                runs = [run(target, a.requests, a.max_concurrency, rate=a.rate, burstiness=a.burstiness,
                            warmup=a.warmup, **common)]
            else:
                runs = sweep(target, a.concurrency, n_requests=a.requests, warmup=a.warmup, **common)
        except (ServerError, ValueError, RuntimeError, FileNotFoundError) as e:
            print(f"error: {e}", file=sys.stderr)
            return 1
    for s in runs:
        print(format_report(s, title=f"== {s['label']} ({s['backend']})"))
        print(f"files        {s.get('jsonl')}  {s.get('summary_json')}\n")
    if len(runs) > 1:
        print(format_rows(knee_table(runs)))
    return 0 if all(s["accounted"] for s in runs) else 1


def _gpu_check(args: argparse.Namespace) -> int:
    from .hardware.gpucheck import main as gpu_check

    return gpu_check(args.rest)


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
    r.add_argument("chapter", help="short name, e.g. setup, concepts, metrics")
    r.add_argument("--timeout", type=int, default=1800, help="seconds per cell")
    r.set_defaults(fn=_run)
    g = sub.add_parser("gpu-check", help="check the CUDA paths on a machine with an NVIDIA GPU (no download)")
    g.add_argument("rest", nargs=argparse.REMAINDER,
                   help="options for labkit.hardware.gpucheck (see --help there)")
    g.set_defaults(fn=_gpu_check)
    b = sub.add_parser("bench", help="load-test a streaming LLM server: TTFT/TPOT/ITL (chapter 02)")
    add_bench_arguments(b)
    b.set_defaults(fn=_bench)
    args = parser.parse_args(argv)
    try:
        return args.fn(args)
    except (ValueError, RuntimeError) as e:  # bad settings or an unavailable device: say what to do
        print(f"error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
