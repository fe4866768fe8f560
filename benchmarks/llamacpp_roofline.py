"""llama.cpp's batch-1 decode against this machine's bandwidth ceiling (chapter 04).

:func:`labkit.engines.llamacpp_roofline.decode_on_roofline` on the bundled GGUF, with 1 thread and
with llama.cpp's default thread count, ``--rounds`` rounds each. A round measures, in turn, the copy
bandwidth with that many threads (:func:`labkit.hardware.microbench.memory_bandwidth`, STREAM-style
read + write: a 256 MiB buffer, so a 512 MiB working set), the same copy with a working set the size
of the weights (what a cache that big could serve) and llama-bench's generation at batch 1
(:func:`labkit.engines.llamacpp.bench`, tg only). Bytes per token: the GGUF's tensor bytes plus the
f16 KV cache at llama-bench's mean depth (:func:`labkit.llm.gguf_bytes.gguf_bytes_per_token`);
ceiling = bandwidth / bytes per token. Background load only slows a run, so each row keeps its
fastest round and best bandwidth; the median round is printed beside it.

Target: at llama.cpp's default threads, decode reaches at least 50% of the DRAM ceiling. The caches
the OS reports are printed too: a model smaller than the last-level cache may be served partly from
it and then beat a DRAM ceiling. A missed target is printed as MISS (exit status 0); errors exit
non-zero. Skipped with a message where llama.cpp is not built (``make llamacpp``).

    .venv/bin/python benchmarks/llamacpp_roofline.py [--rounds 3] [--gen 64] [--threads N] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

from labkit.engines import llamacpp
from labkit.engines.llamacpp_roofline import decode_on_roofline, describe, format_table
from labkit.hardware.caches import cpu_caches

TARGET = 0.50  # batch-1 decode should reach this fraction of the DRAM bandwidth ceiling


def _size(n: int) -> str:
    return f"{n / 2**20:.0f} MiB" if n >= 2**20 else f"{n / 2**10:.0f} KiB"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3, help="rounds per thread count")
    ap.add_argument("--gen", type=int, default=64, help="tokens llama-bench generates per repetition")
    ap.add_argument("--threads", type=int, default=None, help="default: llama.cpp's own")
    ap.add_argument("--json", help="write the figures here")
    a = ap.parse_args()
    if not llamacpp.llamacpp_available():
        print(f"llama.cpp not built, skipped: {llamacpp.unavailable_reason()}")
        return 0
    t0 = time.perf_counter()
    threads = a.threads or llamacpp.default_threads()
    counts = tuple(sorted({1, threads}))
    r = decode_on_roofline(threads=counts, gen=a.gen, reps=3, rounds={t: a.rounds for t in counts})
    print(format_table(r))
    print("caches (CPU 0, as the OS reports them): "
          + (", ".join(f"L{c['level']} {c['type']} {_size(c['bytes'])}" for c in cpu_caches()) or "none"))
    print(describe(r, counts[0]))
    row = next(x for x in r["rows"] if x["threads"] == threads)
    median_tps = statistics.median(row["tps_rounds"])
    median_share = median_tps * r["bytes"]["total"] / row["bandwidth"]
    verdict = "PASS" if row["achieved"] >= TARGET else "MISS"
    print(f"\n{threads} thread(s): llama-bench {row['tps']:.1f} tok/s (fastest of {len(row['tps_rounds'])} "
          f"rounds; median {median_tps:.1f}) x {r['bytes']['total'] / 1e6:.1f} MB per token = "
          f"{row['tps'] * r['bytes']['total'] / 1e9:.1f} GB/s, against a ceiling of "
          f"{row['ceiling']:.0f} tok/s from the copy's {row['bandwidth'] / 1e9:.1f} GB/s: "
          f"{row['achieved']:.0%} (median round {median_share:.0%})  {verdict} (target >= {TARGET:.0%})")
    print(f"total {time.perf_counter() - t0:.0f} s")
    if a.json:
        Path(a.json).write_text(json.dumps(r, indent=1, default=float))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
