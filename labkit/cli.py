"""``labkit`` console command: ``labkit doctor``, ``labkit provision``, ``labkit run CHAPTER``."""

from __future__ import annotations

import argparse
import json
import sys


def _doctor(args: argparse.Namespace) -> int:
    from . import hardware
    from .profile import profile, set_threads

    set_threads()
    info = hardware.detect()
    if args.json:
        print(json.dumps(info, indent=2))
        return 0
    from .capability import capability, format_capability

    p = profile()
    print(hardware.format_report(info))
    print(format_capability(capability(info["device"])))
    if info["device"] != "cpu":
        print(format_capability(capability("cpu")))
    print(f"profile       {p.name} (LLM {p.llm}, Whisper {p.whisper}, diffusion {p.diffusion})")
    if args.measure:
        from . import microbench

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


def _bench(args: argparse.Namespace) -> int:
    from .loadgen import bench_cli

    return bench_cli(args)


def _gpu_check(args: argparse.Namespace) -> int:
    from .gpucheck import main as gpu_check

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
    g.add_argument("rest", nargs=argparse.REMAINDER, help="options for labkit.gpucheck (see --help there)")
    g.set_defaults(fn=_gpu_check)
    from .loadgen import add_bench_arguments

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
