"""llama.cpp's batch-1 decode against this machine's bandwidth ceiling, per weight format (chapter 04).

The shipped Q4_1 GGUF and the same model as Q4_0, Q8_0 and F16 (made by llama-quantize from it, as chapter 06
does: :func:`labkit.experiments.gguf_levels.level_files`), with 1 thread and with llama.cpp's default
thread count. :func:`labkit.experiments.llamacpp_roofline.formats_on_roofline` runs ``--rounds`` rounds; a
round measures, per thread count, the copy bandwidth with that many threads
(:func:`labkit.hardware.microbench.memory_bandwidth`, STREAM-style read + write: a 256 MiB buffer, so
a 512 MiB working set; best of 3), a read-only bandwidth (a sum over 256 MiB: decode only reads its
weights) and llama-bench's generation at batch 1 of every format (:func:`labkit.engines.llamacpp.bench`,
tg only, ``--reps`` repetitions). Bytes per token: the GGUF's tensor bytes plus the f16 KV cache at
llama-bench's mean depth (:func:`labkit.llm.gguf_bytes.gguf_bytes_per_token`). The share of the
ceiling is tok/s x bytes per token ÷ the best copy bandwidth, the median of every repetition with the
spread of those runs (:func:`labkit.stats.median_interval`); the share of the read-only bandwidth is
printed beside it.

Where the rest goes: a line through the formats, seconds per token = fixed + bytes ÷ BW_eff
(:func:`labkit.experiments.llamacpp_roofline.fixed_cost_fit`). ``fixed`` is what every token costs whatever
its bytes: per-operation dispatch and thread barriers (about 30 layers x a dozen operations) and the
arithmetic per weight, which every format does for the same 135M weights; a format with more bytes per
token spreads it thinner, so its share of the ceiling is higher. A format whose kernel does more or
less arithmetic per weight falls off the line (its miss is printed).

Target: the shipped Q4_1 at llama.cpp's default threads reaches at least 50% of the copy ceiling; the
formats that reach it are named. The caches the OS reports are printed too: a model smaller than the
last-level cache may be served partly from it. A missed target is printed as MISS (exit status 0);
errors exit non-zero. Skipped with a message where llama.cpp is not built (``make llamacpp``).

    .venv/bin/python benchmarks/llamacpp_roofline.py [--rounds 3] [--reps 3] [--gen 64] [--threads N]
        [--formats Q4_0,Q8_0,F16] [--json out.json]
"""

from __future__ import annotations

from _common import finish, parser, setup

from labkit.experiments.gguf_levels import level_files
from labkit.experiments.llamacpp_roofline import formats_on_roofline
from labkit.hardware.caches import cpu_caches

TARGET = 0.50  # batch-1 decode should reach this fraction of the DRAM bandwidth ceiling
SHIPPED = "Q4_1"


def _size(n: int) -> str:
    return f"{n / 2**20:.0f} MiB" if n >= 2**20 else f"{n / 2**10:.0f} KiB"


def main() -> int:
    ap = parser(__doc__, rounds=3, threads=True)
    ap.add_argument("--reps", type=int, default=3, help="llama-bench repetitions per format and round")
    ap.add_argument("--gen", type=int, default=64, help="tokens llama-bench generates per repetition")
    ap.add_argument("--formats", default="Q4_0,Q8_0,F16",
                    help="levels made from the shipped Q4_1 with llama-quantize")
    a, t0 = setup(ap, "llamacpp")
    if a is None:
        return 0
    counts = tuple(sorted({1, a.threads}))
    files = level_files(tuple(f for f in a.formats.split(",") if f and f != SHIPPED))
    r = formats_on_roofline(files, threads=counts, gen=a.gen, reps=a.reps, rounds=a.rounds)
    print(f"{'format':8s}{'threads':>8s}{'MB/token':>10s}{'tok/s':>8s}{'copy GB/s':>11s}"
          f"{'of copy ceiling (runs)':>26s}{'read GB/s':>11s}{'of read':>9s}")
    for row in r["rows"]:
        t, s = row["threads"], row["achieved"]
        runs = f"({s['lo']:.0%}-{s['hi']:.0%}, n={len(row['samples'])})"
        print(f"{row['format']:8s}{t:>8d}{row['bytes_per_token'] / 1e6:>10.1f}{row['tps']['median']:>8.1f}"
              f"{r['bandwidth'][t] / 1e9:>11.1f}{s['median']:>11.0%} {runs:>14s}"
              f"{r['read_bandwidth'][t] / 1e9:>11.1f}{row['read_achieved']:>9.0%}")
    print("caches (CPU 0, as the OS reports them): "
          + (", ".join(f"L{c['level']} {c['type']} {_size(c['bytes'])}" for c in cpu_caches()) or "none"))
    for t, fit in r["fits"].items():
        names = [x["format"] for x in r["rows"] if x["threads"] == t]
        misses = ", ".join(f"{n} {m * 1e3:+.1f} ms" for n, m in zip(names, fit["residuals_s"], strict=True))
        ours = next(x for x in r["rows"] if x["threads"] == t and x["format"] == SHIPPED)
        per_token = 1 / ours["tps"]["median"]
        streamed = ours["bytes_per_token"] / (per_token - fit["fixed_s"]) if per_token > fit["fixed_s"] else 0
        print(f"{t} thread(s): seconds per token = {fit['fixed_s'] * 1e3:.1f} ms + bytes ÷ "
              f"{fit['bw_eff'] / 1e9:.1f} GB/s (fit over {fit['n']} formats; measured - fit: {misses}): "
              f"the fixed part is {fit['fixed_s'] / per_token:.0%} of "
              f"{SHIPPED}'s {per_token * 1e3:.1f} ms per token; without it {SHIPPED} would stream at "
              f"{streamed / 1e9:.1f} GB/s, {streamed / r['bandwidth'][t]:.0%} of the copy ceiling")
    ours = next(x for x in r["rows"] if x["threads"] == a.threads and x["format"] == SHIPPED)
    reached = [f"{x['format']} ({x['threads']} thr)" for x in r["rows"] if x["achieved"]["median"] >= TARGET]
    verdict = "PASS" if ours["achieved"]["median"] >= TARGET else "MISS"
    print(f"\n{SHIPPED}, {a.threads} thread(s): {ours['achieved']['median']:.0%} of the copy ceiling "
          f"(runs {ours['achieved']['lo']:.0%}-{ours['achieved']['hi']:.0%})  {verdict} "
          f"(target >= {TARGET:.0%}); "
          f"formats at or above it: {', '.join(reached) or 'none'}")
    return finish(t0, r, a.json)


if __name__ == "__main__":
    raise SystemExit(main())
