"""Speculative decoding side by side (chapter 06): plain greedy vs labkit's prompt lookup and early-exit
drafters vs transformers' own ``generate(prompt_lookup_num_tokens=...)``, ``generate(assistant_model=...)``
and ``generate(assistant_early_exit=...)``, on a copy-heavy prompt and an open question, same model,
same run, repetitions interleaved so background load hits every method alike.

Reported per method: median wall seconds for the same number of new tokens, speedup against its own
baseline (labkit's methods against labkit's plain loop, transformers' against ``generate`` greedy),
and, for labkit's methods, tokens per target pass and draft acceptance. Every method's output is
compared with greedy decoding (speculation must not change it).

The assistant model here is the same SmolLM2 (the only one bundled): a valid demonstration of the API,
not a speedup: its drafts cost as much as the verification they save.

``--vllm`` also starts vLLM's CPU server twice (plain, then with ``--speculative-config`` n-gram, about
a minute each) and compares its decode speed and acceptance on the copy prompt (``--vllm-only``: just
that; ``--iomp``: with the Intel OpenMP library vLLM's CPU worker asks for preloaded).

    .venv/bin/python benchmarks/speculative.py [--quick] [--vllm] [--vllm-only] [--iomp]
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np
import torch

from labkit.llm.speculative import (
    TASKS,
    EarlyExitDrafter,
    PromptLookupDrafter,
    speculative_generate,
)
from labkit.models import chat_ids, load_llm
from labkit.settings import set_threads


def methods(model, eos: int | None, ee_layers: int, quick: bool) -> dict:
    """name -> (baseline name, fn(ids, n) -> (tokens, stats or None)); every method stops at ``eos``."""

    def ours(drafter_fn, k):
        return lambda ids, n: speculative_generate(model, ids, drafter_fn(), k=k, max_new_tokens=n,
                                                   eos_token_id=eos)

    def hf(**kw):
        def run(ids, n):
            x = torch.tensor([ids], device=model.device)
            out = model.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=n, do_sample=False,
                                 **kw)
            return out[0, len(ids):].tolist(), None
        return run

    m = {
        "labkit plain greedy": ("labkit plain greedy", ours(lambda: None, 0)),
        "labkit prompt lookup k=4": ("labkit plain greedy", ours(PromptLookupDrafter, 4)),
        "labkit prompt lookup k=8": ("labkit plain greedy", ours(PromptLookupDrafter, 8)),
        f"labkit early exit L={ee_layers} k=2": ("labkit plain greedy",
                                                 ours(lambda: EarlyExitDrafter(model, ee_layers), 2)),
        "hf generate greedy": ("hf generate greedy", hf()),
        "hf prompt_lookup_num_tokens=4": ("hf generate greedy", hf(prompt_lookup_num_tokens=4)),
        "hf prompt_lookup_num_tokens=10": ("hf generate greedy", hf(prompt_lookup_num_tokens=10)),
        "hf assistant_model=(same model)": ("hf generate greedy", hf(assistant_model=model)),
    }
    if not quick:  # transformers' LayerSkip path is slow here (tens of seconds per run)
        m[f"hf assistant_early_exit={ee_layers}"] = ("hf generate greedy", hf(assistant_early_exit=ee_layers))
    return m


def bench_task(model, tok, task: str, new: int, repeats: int, ee_layers: int, quick: bool) -> None:
    ids = chat_ids(tok, TASKS[task])
    ms = methods(model, tok.eos_token_id, ee_layers, quick)
    times: dict[str, list[float]] = {name: [] for name in ms}
    outs, stats = {}, {}
    speculative_generate(model, ids, None, max_new_tokens=2)  # warm-up
    for _ in range(repeats):
        for name, (_, fn) in ms.items():
            t0 = time.perf_counter()
            outs[name], st = fn(ids, new)
            times[name].append(time.perf_counter() - t0)
            stats[name] = st
    greedy = outs["labkit plain greedy"]
    print(f"\n== {task} prompt ({len(ids)} tokens), {new} new tokens, median of {repeats} ==")
    print(f"{'method':40s} {'wall s':>7s} {'speedup':>8s} {'tok/pass':>8s} {'accept':>7s}  same as greedy")
    for name, (base, _) in ms.items():
        wall = float(np.median(times[name]))
        ratio = float(np.median(times[base])) / wall
        st = stats[name]
        tpp = f"{st.tokens_per_pass:8.2f}" if st else f"{'':8s}"
        acc = f"{st.acceptance_rate:7.2f}" if st and st.drafted else f"{'':7s}"
        print(f"{name:40s} {wall:7.2f} {ratio:7.2f}x {tpp} {acc}  {outs[name] == greedy}")


def bench_vllm(n_requests: int = 3, max_tokens: int = 64, iomp: bool = False) -> None:
    import os

    import httpx

    from labkit.engines.process import stop
    from labkit.engines.prometheus import scrape
    from labkit.engines.vllm import start_vllm, vllm_available

    if not vllm_available():
        print("\nvLLM: not installed (make serve-setup); skipped")
        return
    if iomp:  # vLLM's CPU worker warns that speculation is slow without Intel OpenMP preloaded
        from labkit.engines.vllm import VLLM_VENV

        lib = VLLM_VENV / "lib" / "libiomp5.so"
        if lib.exists():
            os.environ["LD_PRELOAD"] = str(lib)  # inherited by both server processes, not by this one
            print(f"\nLD_PRELOAD={lib}")
        else:
            print(f"\n{lib} not found: running without Intel OpenMP")
    spec = json.dumps({"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 4})
    print(f"\n== vLLM CPU server, copy prompt, temperature 0, {max_tokens} tokens, {n_requests} requests ==")
    rates = {}
    for label, extra in (("plain", []), ("ngram k=4", ["--speculative-config", spec])):
        try:
            server = start_vllm(extra=extra)
        except RuntimeError as e:
            print(f"{label}: failed to start: {str(e)[-600:]}")
            continue
        try:
            body = {"model": server.model, "messages": [{"role": "user", "content": TASKS["copy"]}],
                    "max_tokens": max_tokens, "temperature": 0}
            httpx.post(f"{server.url}/v1/chat/completions", json=body, timeout=300)  # warm-up
            before = scrape(server.url, "vllm:")
            t0, tokens = time.perf_counter(), 0
            for _ in range(n_requests):
                r = httpx.post(f"{server.url}/v1/chat/completions", json=body, timeout=300).json()
                tokens += r["usage"]["completion_tokens"]
            rates[label] = tokens / (time.perf_counter() - t0)
            after = scrape(server.url, "vllm:")
            drafted = after.get("vllm:spec_decode_num_draft_tokens_total", 0) - \
                before.get("vllm:spec_decode_num_draft_tokens_total", 0)
            accepted = after.get("vllm:spec_decode_num_accepted_tokens_total", 0) - \
                before.get("vllm:spec_decode_num_accepted_tokens_total", 0)
            acc = f", {accepted:.0f}/{drafted:.0f} drafts accepted" if drafted else ""
            print(f"{label:10s} started in {server.startup_s:5.1f} s; {rates[label]:6.1f} tok/s{acc}")
        finally:
            stop(server)
    if len(rates) == 2:
        print(f"n-gram speculation speedup on vLLM CPU: {rates['ngram k=4'] / rates['plain']:.2f}x")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="1 repetition, 24 tokens, no slow LayerSkip path")
    ap.add_argument("--vllm", action="store_true", help="also vLLM's CPU server, n-gram on/off")
    ap.add_argument("--vllm-only", action="store_true", help="only the vLLM comparison")
    ap.add_argument("--iomp", action="store_true", help="vLLM with Intel OpenMP preloaded (LD_PRELOAD)")
    ap.add_argument("--tokens", type=int, default=None)
    args = ap.parse_args()
    if args.vllm_only:
        bench_vllm(iomp=args.iomp)
        return
    threads = set_threads()
    model, tok = load_llm()
    new = args.tokens or (24 if args.quick else 48)
    repeats = 1 if args.quick else 3
    ee_layers = model.config.num_hidden_layers * 3 // 4
    print(f"{threads} thread(s), {model.device}, {model.dtype}, {model.config.num_hidden_layers} layers")
    for task in ("copy", "open"):
        bench_task(model, tok, task, new, repeats, ee_layers, args.quick)
    if args.vllm:
        bench_vllm(iomp=args.iomp)


if __name__ == "__main__":
    main()
