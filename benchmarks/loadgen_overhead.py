"""How much does labkit's load generator itself cost? (chapter 02)

Runs labkit's fake streaming server in its own process on 127.0.0.1 doing zero work, and measures:

1. ingest: aggregate tokens/s the load generator parses and times (SSE, one token per chunk, JSON
   per chunk) at several concurrencies, next to a bare ``httpx`` client that only reads the bytes
   (the floor: what the same machine delivers with no parsing at all). Both send the same request
   body (:func:`labkit.serving.openai_api.request_body`, usage in every chunk included), so both
   receive the same bytes per stream (printed), and both are warmed up by one request first;
2. added latency: TTFT against a server that answers instantly (all of it is overhead: client,
   loopback, server), and ITL against a server that sends a token every 20 ms exactly (the jitter
   above 20 ms is overhead), at P50 and P99.

Both sides share this machine's cores, so the figures are an upper bound on the client's cost.
All traffic stays on loopback; every run is bounded in requests.

    .venv/bin/python benchmarks/loadgen_overhead.py [--quick]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time
from pathlib import Path

import httpx

from labkit.engines.process import Server, free_port, running, start
from labkit.serving import loadgen
from labkit.serving.loadspec import ClientSpec, LoadSpec
from labkit.serving.openai_api import request_body

ROOT = Path(__file__).resolve().parent.parent


def fake_process(step_ms: float) -> Server:
    """labkit's fake server in a process of its own, started, guarded and stopped like every lab server
    (it dies with this one, however this one ends)."""
    port = free_port()
    cmd = [sys.executable, "-m", "labkit.engines.fakeserver", "--port", str(port), "--step-ms", str(step_ms)]
    return start(cmd, port, engine="fake", model="fake", dtype="none", name="fake server", ready_timeout_s=60)


PROMPT = "x"  # the same prompt for both clients: the same usage figures, the same bytes
FAKE = ClientSpec(model="fake")  # labkit's client for the fake server (one warm-up, LoadSpec's default)


def body(tokens: int) -> dict:
    """The request labkit's load generator sends for ``PROMPT`` (the bare reader sends it too)."""
    return request_body("fake", PROMPT, tokens)


async def bare_ingest(url: str, n: int, c: int, tokens: int) -> tuple[float, int]:
    """Bytes-only client, warmed by one request: tokens/s (``tokens`` per stream) and bytes per stream."""
    sizes: list[int] = []
    async with httpx.AsyncClient(timeout=60) as client:
        queue = list(range(n))

        async def one() -> None:
            size = 0
            async with client.stream("POST", f"{url}/v1/chat/completions", json=body(tokens)) as r:
                async for data in r.aiter_bytes():
                    size += len(data)
            sizes.append(size)

        async def worker() -> None:
            while queue:
                queue.pop()
                await one()

        await one()  # warm-up, as labkit's run(warmup=1)
        t0 = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(c)))
        rate = n * tokens / (time.perf_counter() - t0)
    return rate, max(sizes)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="fewer requests (about 10 s)")
    ap.add_argument("--repeats", type=int, default=5, help="alternating labkit/bare rounds per level")
    ap.add_argument("--out", default=str(ROOT / "build" / "bench" / "loadgen_overhead.json"))
    a = ap.parse_args()
    tokens = 128 if a.quick else 256
    levels = (1, 8, 32)
    result: dict = {"ingest": [], "latency": []}

    with running(fake_process, step_ms=0.0) as srv:
        url = srv.url
        for c in levels:
            n = max(8, 2 * c) if a.quick else max(16, 4 * c)
            ours, bares, ok = [], [], 0
            for r in range(a.repeats):  # alternate who goes first; medians over the rounds
                for who in ("labkit", "bare") if r % 2 == 0 else ("bare", "labkit"):
                    if who == "bare":
                        bare, size = asyncio.run(bare_ingest(url, n, c, tokens))
                        bares.append(bare)
                        continue
                    s = loadgen.run(url, LoadSpec(n, c, max_tokens=tokens, prompts=[PROMPT]), FAKE,
                                    progress=False)
                    ours.append(s.output_throughput)
                    ok += s.completed
            row = {"concurrency": c, "requests": n, "tokens_per_request": tokens, "bytes_per_stream": size,
                   "repeats": a.repeats, "labkit_tok_s": statistics.median(ours),
                   "bare_httpx_tok_s": statistics.median(bares),
                   "ratio": statistics.median(x / y for x, y in zip(ours, bares, strict=True)), "ok": ok}
            result["ingest"].append(row)
            print(f"ingest  c={c:<3} labkit {row['labkit_tok_s']:8.0f} tok/s   bare httpx "
                  f"{row['bare_httpx_tok_s']:8.0f} tok/s   ratio {row['ratio']:.2f}  (median of {a.repeats} "
                  f"rounds of {n} requests x {tokens} tokens, {size} B per stream for both, {ok} ok)",
                  flush=True)
        for c in levels:
            n = max(8, 2 * c) if a.quick else max(20, 4 * c)
            s = loadgen.run(url, LoadSpec(n, c, max_tokens=2, prompts=[PROMPT]), FAKE, progress=False)
            result["latency"].append({"what": "TTFT, instant server", "concurrency": c, "n": s.ttft.n,
                                      "p50_ms": s.ttft.p50, "p99_ms": s.ttft.p99})

    step = 20.0
    with running(fake_process, step_ms=step) as srv:
        for c in levels:
            n = max(4, c) if a.quick else max(8, 2 * c)
            s = loadgen.run(srv.url, LoadSpec(n, c, max_tokens=16, prompts=[PROMPT]), FAKE, progress=False)
            result["latency"].append({"what": f"ITL - {step:g} ms, paced server", "concurrency": c,
                                      "n": s.itl.n, "p50_ms": s.itl.p50 - step,
                                      "p99_ms": s.itl.p99 - step})
    for r in result["latency"]:
        print(f"latency c={r['concurrency']:<3} {r['what']:<28} P50 {r['p50_ms']:6.2f} ms   "
              f"P99 {r['p99_ms']:6.2f} ms   over {r['n']}")
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(json.dumps(result, indent=1))
    print(f"wrote {a.out}")


if __name__ == "__main__":
    main()
