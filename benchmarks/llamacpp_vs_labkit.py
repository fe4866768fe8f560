"""labkit's client on llama-server vs llama-bench, same model and threads (chapters 02 and 05).

Each round runs, in turn: llama-bench's batch-1 generation (:func:`labkit.engines.llamacpp.bench`,
tg only: the model alone, no sampling, no detokenization, no HTTP) and labkit's load generator
against llama-server (:func:`labkit.engines.llamacpp.start_llamacpp`, one slot, the same threads):
one request at a time, ``--max-tokens`` tokens each (ignore_eos), short prompts from the shipped
set, one warm-up request per round. The server's own ``timings`` of every response (read from the
stream by labkit's client) split what the server adds from what HTTP/SSE and the client add
(:mod:`labkit.serving.decode_gap`).

Reported: labkit's 1/TPOT and output tokens / E2E as fractions of llama-bench's tokens/s (per round
ratios, their median and spread), and where the rest goes, in milliseconds per token. No target:
the ratio is the finding. llama-bench starts from an empty context while a chat request carries its
template and prompt (a few dozen tokens: under 1 MB more KV cache per token here).

    .venv/bin/python benchmarks/llamacpp_vs_labkit.py [--rounds 3] [--requests 4] [--max-tokens 64]
        [--threads N] [--json out.json]
"""

from __future__ import annotations

from _common import finish, parser, setup

from labkit.engines import llamacpp, process
from labkit.serving import loadgen
from labkit.serving.decode_gap import decode_layers, gap_sentences
from labkit.serving.loadspec import ClientSpec, LoadSpec
from labkit.serving.records import request_metrics
from labkit.stats import median_interval, ratio_interval


def main() -> int:
    ap = parser(__doc__, rounds=3, threads=True)
    ap.add_argument("--requests", type=int, default=4, help="timed requests per round")
    ap.add_argument("--max-tokens", type=int, default=64)
    a, t0 = setup(ap, "llamacpp")
    if a is None:
        return 0
    threads = a.threads
    short = [p for p in loadgen.load_prompts() if p.get("kind") == "short"]
    spec = LoadSpec(n_requests=a.requests, concurrency=1, max_tokens=a.max_tokens, prompts=short, warmup=1)
    server = llamacpp.start_llamacpp(threads=threads, parallel=1)
    client = ClientSpec(model=server.model, ignore_eos=True)
    rounds, records = [], []
    try:
        print(f"llama-server ({server.dtype}, {threads} threads, 1 slot) ready in "
              f"{server.startup_s:.1f} s; {a.rounds} rounds of llama-bench tg{a.max_tokens}, then "
              f"{a.requests} requests x {a.max_tokens} tokens")
        for r in range(a.rounds):
            b = llamacpp.bench(threads=threads, prompt=0, gen=a.max_tokens, reps=2)
            s = loadgen.run(server.url, spec, client, progress=False, check=(r == 0))
            ok = [x for x in s.requests if x.status == "ok"]
            tokens = [x.output_tokens for x in ok]
            if len(ok) != a.requests or any(n != a.max_tokens for n in tokens):
                raise RuntimeError(f"round {r + 1}: {s.status_counts}, output tokens {tokens}")
            records += ok
            e2e = median_interval([request_metrics(x)["output_tokens_per_s"] for x in ok])["median"]
            rounds.append({"bench_tps": b["gen_tps"], "client_tps": s.median_tps, "e2e_tps": e2e,
                           "ttft_ms": s.ttft.median})
            print(f"round {r + 1}: llama-bench {b['gen_tps']:6.1f} tok/s; labkit 1/TPOT "
                  f"{s.median_tps:6.1f} tok/s, tokens/E2E {e2e:6.1f}, TTFT {s.ttft.median:5.1f} ms",
                  flush=True)
    finally:
        process.stop(server)

    bench_tps = median_interval([x["bench_tps"] for x in rounds])
    per_token = ratio_interval([x["client_tps"] for x in rounds], [x["bench_tps"] for x in rounds])
    whole = ratio_interval([x["e2e_tps"] for x in rounds], [x["bench_tps"] for x in rounds])
    print(f"\nlabkit's generation speed / llama-bench's: {per_token['median']:.2f} (1/TPOT; rounds "
          f"{per_token['lo']:.2f}-{per_token['hi']:.2f}), {whole['median']:.2f} counting the wait for the "
          f"first token (rounds {whole['lo']:.2f}-{whole['hi']:.2f})")
    out: dict = {"rounds": rounds, "client_over_bench": per_token, "e2e_over_bench": whole}
    try:
        gap = decode_layers(records, bench_tps["median"])
    except ValueError as e:  # a server whose stream carries no timings
        print(f"where the rest goes: not split ({e})")
    else:
        print(f"where the rest goes ({gap['n']} requests; llama-bench: median of {len(rounds)} rounds):")
        print(gap_sentences(gap))
        out["gap"] = gap
    return finish(t0, out, a.json)


if __name__ == "__main__":
    raise SystemExit(main())
