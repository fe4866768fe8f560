"""labkit bench --dataset vs GuideLLM on the same prompts file and the same llama-server (chapter 02).

One llama-server (the bundled GGUF, one slot per request in flight) is measured by both clients in
turn, ``--rounds`` times each, labkit, GuideLLM, GuideLLM, labkit, ... (adjacent runs form a pair; the
order flips every pair, so a drift of the shared machine hits both alike):

* labkit: ``labkit bench --dataset FILE -c C --ignore-eos`` (the command line, in this process);
* GuideLLM: ``guidellm run`` from its own venv (``make guidellm-setup``: ``.venv-guidellm``), the
  concurrent profile with C streams, the same file, the same request count, the bundled tokenizer.

Same requests on both: a JSONL file of the shipped prompts (``prompt`` and ``output_tokens_count``
per line, what both read), each asking exactly ``--max-tokens`` tokens; one untimed pass over every
prompt comes first. Reported per figure (median TTFT, median ITL, output tokens/s): each client's
median over its runs, and the median and range of the per-pair ratios labkit ÷ GuideLLM. No target:
the ratios are the finding. Each run's prompt and output token totals are printed, to show the
requests matched (labkit's from the server's usage figures, GuideLLM's from its own count). Skipped
with a message where llama.cpp is not built or GuideLLM is not installed.

    .venv/bin/python benchmarks/guidellm_side_by_side.py [--requests 8] [--max-tokens 32]
        [--concurrency 4] [--rounds 4] [--json out.json]
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import statistics
import subprocess
import time
from pathlib import Path

from _common import finish, parser, setup

from labkit.cli import main as labkit_main
from labkit.engines import llamacpp, process
from labkit.models import llm_dir
from labkit.serving import loadgen
from labkit.stats import ratio_interval

ROOT = Path(__file__).resolve().parent.parent
GUIDELLM = ROOT / ".venv-guidellm" / "bin" / "guidellm"
# (figure, labkit summary key, GuideLLM metric): each client's own median over the run's requests
FIGURES = (("median TTFT (ms)", "median_ttft_ms", "time_to_first_token_ms"),
           ("median ITL (ms)", "median_itl_ms", "inter_token_latency_ms"))


def write_prompts(path: Path, n: int, max_tokens: int) -> None:
    """The first ``n`` shipped prompts as JSONL at ``path``, each asking ``max_tokens`` tokens."""
    prompts = [p["prompt"] for p in loadgen.load_prompts()][:n]
    lines = (json.dumps({"prompt": p, "output_tokens_count": max_tokens}) + "\n" for p in prompts)
    path.write_text("".join(lines))


def labkit_run(url: str, data: Path, n: int, c: int, max_tokens: int, out: Path) -> dict[str, float]:
    with contextlib.redirect_stdout(io.StringIO()):  # its report is in out/c<C>.json
        code = labkit_main(["bench", "--base-url", url, "--dataset", str(data), "-n", str(n), "-c", str(c),
                            "--max-tokens", str(max_tokens), "--ignore-eos", "--warmup", "0", "--no-progress",
                            "--out", str(out)])
    if code != 0:
        raise RuntimeError(f"labkit bench exited with {code}")
    s = json.loads((out / f"c{c}.json").read_text())
    return {"median_ttft_ms": s["median_ttft_ms"], "median_itl_ms": s["median_itl_ms"],
            "output_tokens_per_s": s["output_throughput"], "completed": s["completed"],
            "prompt_tokens": s["total_input_tokens"], "output_tokens": s["total_output_tokens"]}


def guidellm_run(url: str, model: str, data: Path, n: int, c: int, out: Path) -> dict[str, float]:
    out_json = out / "guidellm.json"
    cmd = [str(GUIDELLM), "run", "--backend", f"kind=openai_http,target={url},model={model}",
           "--profile", f"kind=concurrent,streams={c}", "--constraint", f"kind=max_requests,count={n}",
           "--data", json.dumps({"kind": "json_file", "path": str(data), "load_kwargs": {"split": "train"}}),
           "--tokenizer", f"kind=hf_auto,model={llm_dir('float32')}",
           "--output", f"kind=json,path={out_json}", "--disable-console"]
    done = subprocess.run(cmd, capture_output=True, text=True, env=os.environ | {"HF_HUB_OFFLINE": "1"})
    if done.returncode != 0:
        raise RuntimeError(f"guidellm exited with {done.returncode}: {done.stderr[-2000:]}")
    bench = json.loads(out_json.read_text())["benchmarks"][-1]
    m = bench["metrics"]
    figures = {key: m[metric]["successful"]["median"] for _, key, metric in FIGURES}
    out_tokens = m["output_token_count"]["successful"]["total_sum"]
    # output tokens/s: all of them over the run's duration, as labkit's summary takes it
    return figures | {"output_tokens_per_s": out_tokens / bench["duration"],
                      "completed": m["request_totals"]["successful"], "output_tokens": out_tokens,
                      "prompt_tokens": m["prompt_token_count"]["successful"]["total_sum"]}


def main() -> int:
    ap = parser(__doc__, rounds=4, threads=True, rounds_help="runs per client (pairs of adjacent runs)")
    ap.add_argument("--requests", type=int, default=8, help="requests per run (at most 30: the shipped set)")
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--concurrency", type=int, default=4)
    ap.add_argument("--out", default=str(ROOT / "build" / "bench" / "guidellm_side_by_side"))
    a, t0 = setup(ap, "llamacpp")
    if a is None:
        return 0
    if not GUIDELLM.exists():
        print(f"GuideLLM is not installed in {GUIDELLM.parent.parent} (make guidellm-setup); skipped")
        return 0
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    data = out / "prompts.jsonl"
    write_prompts(data, a.requests, a.max_tokens)
    runs: dict[str, list[dict[str, float]]] = {"labkit": [], "guidellm": []}
    server = llamacpp.start_llamacpp(threads=a.threads, parallel=a.concurrency)
    try:
        print(f"llama-server ({server.dtype}, {a.threads} threads, {a.concurrency} slots) ready in "
              f"{server.startup_s:.1f} s; {a.requests} prompts x {a.max_tokens} tokens, {a.concurrency} in "
              f"flight, {a.rounds} runs per client")
        labkit_run(server.url, data, a.requests, a.concurrency, 2, out / "warm")  # untimed: every prompt once
        for k in range(a.rounds):
            for who in ("labkit", "guidellm") if k % 2 == 0 else ("guidellm", "labkit"):
                t = time.perf_counter()
                if who == "labkit":
                    r = labkit_run(server.url, data, a.requests, a.concurrency, a.max_tokens,
                                   out / f"labkit{k}")
                else:
                    r = guidellm_run(server.url, server.model, data, a.requests, a.concurrency, out)
                runs[who].append(r)
                print(f"  {who:8s} run {len(runs[who])}: TTFT {r['median_ttft_ms']:7.1f} ms  ITL "
                      f"{r['median_itl_ms']:6.2f} ms  {r['output_tokens_per_s']:6.1f} tok/s  "
                      f"completed {r['completed']:.0f}, {r['prompt_tokens']:.0f} prompt and "
                      f"{r['output_tokens']:.0f} output tokens  ({time.perf_counter() - t:.0f} s)",
                      flush=True)
    finally:
        process.stop(server)
    print(f"\n{'figure':22s} {'GuideLLM':>9s} {'labkit':>8s} {'labkit/GuideLLM: pairs':>23s} "
          f"{'(range)':>13s}")
    rows = []
    for name, key in [(n, k) for n, k, _ in FIGURES] + [("output tokens/s", "output_tokens_per_s")]:
        ref = statistics.median(r[key] for r in runs["guidellm"])
        ours = statistics.median(r[key] for r in runs["labkit"])
        pair = ratio_interval([r[key] for r in runs["labkit"]], [r[key] for r in runs["guidellm"]])
        print(f"{name:22s} {ref:9.2f} {ours:8.2f} {pair['median']:23.3f} {pair['lo']:6.3f}-{pair['hi']:.3f}")
        rows.append({"figure": name, "guidellm_median_of_runs": ref, "labkit_median_of_runs": ours,
                     "pairs": pair})
    return finish(t0, {"rows": rows, "runs": runs}, a.json)


if __name__ == "__main__":
    raise SystemExit(main())
