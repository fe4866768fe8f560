"""Prefix caching vs prefilling everything, side by side in one run (chapter 06).

1. local: the bundled model's own KV cache (transformers ``DynamicCache``). For each shared
   prefix length, a miss prefills system prompt + question; a hit copies the stored prefix cache
   and prefills the question only. Runs interleaved; reports median TTFT and miss/hit ratio, and
   the largest difference of the next-token logits between the two;
2. vLLM (CPU build, prefix caching on, its default): requests sharing a prefix vs requests of the
   same length with distinct prefixes, alternating, through labkit's load generator; reports TTFT
   of each, the ratio, and the hit rate of each kind from the server's ``/metrics`` counters.

vLLM starts in a background thread while part 1 runs (it takes 30-60 s on 2 cores). Skipped with
a message where vLLM is not installed (``make serve-setup``).

    .venv/bin/python benchmarks/prefix_cache.py [--quick] [--no-vllm] [--json out.json]
"""

from __future__ import annotations

import argparse
import concurrent.futures
import contextlib
import json
import time

import torch

from labkit import models
from labkit.engines import vllm
from labkit.engines.server import ENGINES
from labkit.experiments import vllm_prefix as prefix
from labkit.llm import prefix_cache as pc
from labkit.settings import set_threads


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="fewer repeats and requests (< 60 s)")
    ap.add_argument("--no-vllm", action="store_true", help="local part only")
    ap.add_argument("--json", help="write the results here")
    a = ap.parse_args()
    t0 = time.perf_counter()
    set_threads(1)
    stack = contextlib.ExitStack()
    use_vllm = not a.no_vllm and vllm.vllm_available()
    starting = (concurrent.futures.ThreadPoolExecutor(1).submit(stack.enter_context, ENGINES["vllm"].serve())
                if use_vllm else None)

    from labkit.models import load_llm

    model, tok = load_llm(dtype="float32", device="cpu")
    sizes = (64, 256, 512) if a.quick else (64, 256, 512, 1024)
    text = prefix.shared_text(tok, sizes[-1])
    shared = tok(text, return_tensors="pt", add_special_tokens=False)["input_ids"]
    question = tok("\n\nCustomer: my parcel is two weeks late, what now?\nAnswer:", return_tensors="pt",
                   add_special_tokens=False)["input_ids"]
    with torch.no_grad():
        model(shared[:, :16])  # warm-up
    rows = pc.ttft_sweep(model, shared[:, :sizes[-1]], question, sizes, repeats=2 if a.quick else 5)
    print(f"local, SmolLM2-135M fp32 on 1 CPU thread, question {question.shape[1]} tokens (median TTFT)")
    print(f"{'shared':>7} {'miss ms':>9} {'hit ms':>8} {'miss/hit':>9} {'max |dlogit|':>13}")
    for r in rows:
        print(f"{r['shared']:>7} {r['miss_s'] * 1e3:>9.0f} {r['hit_s'] * 1e3:>8.0f} {r['speedup']:>8.1f}x "
              f"{r['max_abs_diff']:>13.1e}")
    out: dict = {"local": rows}
    if starting is not None:
        url = starting.result().url
        try:
            v = prefix.hit_vs_miss(url, models.SERVED_NAME, tok, shared_tokens=384, n=2 if a.quick else 4)
        finally:
            stack.close()
        print(f"\nvLLM CPU, prefix caching on, {v['shared_tokens']}-token shared prefix, "
              "one request at a time")
        print(f"  miss TTFT {v['miss_ttft_s'] * 1e3:.0f} ms (hit rate {v['miss_rate']:.0%}), "
              f"hit TTFT {v['hit_ttft_s'] * 1e3:.0f} ms (hit rate {v['hit_rate']:.0%}): "
              f"miss/hit {1 / v['ratio']:.1f}x   counters {v['metric_names']}")
        out["vllm"] = {k: v[k] for k in ("hit_ttft_s", "miss_ttft_s", "ratio", "hit_rate", "miss_rate",
                                         "shared_tokens", "metric_names", "ttft_s")}
        if not a.quick:  # the same requests with prefix caching switched off: shared prefixes stop helping
            with ENGINES["vllm"].serve(extra=["--no-enable-prefix-caching"]) as off_server:
                off = prefix.hit_vs_miss(off_server.url, models.SERVED_NAME, tok, shared_tokens=384, n=4)
            print(f"vLLM CPU, prefix caching off: shared-prefix TTFT {off['hit_ttft_s'] * 1e3:.0f} ms, "
                  f"distinct {off['miss_ttft_s'] * 1e3:.0f} ms (shared/distinct {off['ratio']:.2f}); "
                  f"on vs off for the shared prefix: {v['hit_ttft_s'] * 1e3:.0f} vs "
                  f"{off['hit_ttft_s'] * 1e3:.0f} ms "
                  f"({off['hit_ttft_s'] / v['hit_ttft_s']:.1f}x); counters {off['metric_names']}")
            out["vllm_off"] = {k: off[k] for k in ("hit_ttft_s", "miss_ttft_s", "ratio", "ttft_s")}
    else:
        print("\nvLLM part skipped: " + ("--no-vllm" if a.no_vllm else vllm.unavailable_reason()))
    print(f"\ntotal {time.perf_counter() - t0:.0f} s")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
