"""A long prompt arriving while answers stream, with and without chunked prefill, on vLLM or llama.cpp
(chapter 05, "Going further: a long prompt arrives", runs the same rounds on vLLM, reusing its engine
comparison's server for the 2,048 budget, or on llama.cpp where vLLM cannot run).

:func:`labkit.experiments.prefill_interference.measure` starts two servers of the engine, one whose
steps take up to 2,048 prompt tokens (more than the prompt: its prefill runs in one step) and one that
takes 64 (the prompt goes in chunks between the answers' tokens): vLLM's ``--max-num-batched-tokens``
(its V1 scheduler always chunks), llama-server's ``-b``/``-ub``; no round reuses a cached prompt (a
cache salt per round on vLLM, ``cache_prompt`` off on llama-server). Each round
streams 4 answers of 64 tokens, sends the two longest shipped prompts as one (468 tokens for the
bundled model) a second later, and keeps every token's arrival; the servers alternate round by round.
Printed per budget: the longest gap a running answer saw while the prompt prefilled (the stall), the
usual gap between tokens, and the long prompt's own TTFT, each the median of the rounds with their
values; then the stall ratio (one step ÷ chunks) per round.

Target, from the mechanism and written before the first run: in 64-token chunks the stall is at most
half of what one 468-token step gives (each chunk is a seventh of the prompt; a step's fixed cost keeps
the ratio below 7). A missed target is printed as MISS (exit status 0); errors exit non-zero. Skipped
with a message where the engine cannot run here (``make serve-setup`` for vLLM, ``make llamacpp``).

    .venv/bin/python benchmarks/chunked_prefill.py [--engine vllm|llamacpp] [--rounds 3] [--json out.json]
"""

from __future__ import annotations

from _common import finish, parser, setup

from labkit.experiments import prefill_interference
from labkit.serving.loadgen import load_prompts
from labkit.settings import set_threads
from labkit.stats import ratio_interval

TARGET = 2.0  # one-step stall ÷ chunked stall, at least
BUDGETS = (2048, 64)  # prompt tokens a step may take: more than the prompt, and a chunk


def main(argv: list[str] | None = None) -> int:
    ap = parser(__doc__, rounds=3)
    ap.add_argument("--engine", choices=("vllm", "llamacpp"), default="vllm")
    engine = ap.parse_known_args(argv)[0].engine
    a, t0 = setup(ap, engine, argv)
    if a is None:
        return 0
    threads = set_threads()
    long_prompt = " ".join(sorted((p["prompt"] for p in load_prompts("mixed")), key=len)[-2:])
    runs = prefill_interference.measure(long_prompt, batches=BUDGETS, rounds=a.rounds, threads=threads,
                                        engine=engine)
    whole, chunked = (runs[b] for b in BUDGETS)
    print(f"{engine}, {whole.long_tokens}-token prompt one second into 4 streams of 64 tokens, "
          f"{a.rounds} rounds, {threads} thread(s)")
    print(f"{'budget':>7} {'stall s':>8} {'rounds':<22} {'usual gap ms':>13} {'long TTFT s':>12}")
    for b, r in runs.items():
        print(f"{b:>7} {r.median('stall_s'):>8.2f} {' '.join(f'{x:.2f}' for x in r.stall_s):<22} "
              f"{r.median('itl_s') * 1e3:>13.0f} {r.median('long_ttft_s'):>12.2f}")
    ratio = ratio_interval(whole.stall_s, chunked.stall_s)
    verdict = "ok" if ratio["lo"] >= TARGET else "MISS"
    print(f"stall, one step ÷ chunks: {ratio['median']:.1f}x ({ratio['lo']:.1f}-{ratio['hi']:.1f} over "
          f"{ratio['n']} rounds); target >= {TARGET:g}x for the whole range: {verdict}")
    figures = {"engine": engine, "long_tokens": whole.long_tokens, "stall_ratio": ratio,
               "runs": {b: vars(r) for b, r in runs.items()}}
    return finish(t0, figures, a.json)


if __name__ == "__main__":
    raise SystemExit(main())
