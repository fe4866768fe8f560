"""Which differences between engines come from the weight format and which from the engine
(chapter 05, "The inference software stack").

Decoding one stream reads every weight once per token, so the format sets a floor on TPOT (its bytes
at the measured bandwidth); how far above that floor an engine lands is the engine's doing.
:func:`attribution` splits one engine's batch-1 advantage over another into those two factors, and
:func:`step_anatomy` splits a decode step into the part every stream in it shares (weights read once,
per-step work: what batching spreads) and the part each stream adds. :func:`attribution_lines` says
it in words, from the numbers.
"""

from __future__ import annotations

from .engine_runs import EngineRun


def step_anatomy(tpot_1_ms: float, tpot_n_ms: float, n: int) -> dict[str, float]:
    """A decode step's time as ``fixed + streams x per_stream`` through TPOT at 1 and at ``n`` streams
    in flight (ms): ``per_stream_ms``, ``fixed_ms`` (shared by every stream in a step: weights read
    once, the engine's per-step work) and ``fixed_share`` of a lone step (what batching can
    spread; the throughput gain at ``n`` it predicts is ``n x tpot_1 / tpot_n``)."""
    if n < 2 or tpot_1_ms <= 0 or tpot_n_ms <= 0:
        raise ValueError(f"need n >= 2 and positive TPOTs, got n={n}, {tpot_1_ms}, {tpot_n_ms}")
    per_stream = (tpot_n_ms - tpot_1_ms) / (n - 1)
    fixed = tpot_1_ms - per_stream
    return {"per_stream_ms": per_stream, "fixed_ms": fixed, "fixed_share": fixed / tpot_1_ms}


def attribution(slow: EngineRun, fast: EngineRun, bandwidth_bytes_per_s: float) -> dict[str, float]:
    """Why ``fast`` decodes one stream faster (or slower) than ``slow`` (chapter 05). ``tpot_ratio``:
    slow's median TPOT at 1 in flight ÷ fast's; ``bytes_ratio``: slow's weight bytes per token ÷
    fast's, what the weight format alone predicts if both engines turn the same share of the
    bandwidth into tokens; ``engine_factor = tpot_ratio ÷ bytes_ratio``, the rest, the engine's
    doing. Per engine (``slow_``/``fast_``): ``floor_ms`` (its weight bytes at
    ``bandwidth_bytes_per_s``: the shortest TPOT its format allows), ``bandwidth_share`` (floor ÷
    TPOT), ``c8_over_c1`` (aggregate tokens/s at 8 vs 1 in flight: the weights are read once per
    step either way, so this gain is the engine's) and :func:`step_anatomy`'s figures."""
    out: dict[str, float] = {}
    for label, e in (("slow", slow), ("fast", fast)):
        if e.weight_bytes is None or 1 not in e.runs:
            raise ValueError(f"{e.name}: needs its weight bytes and a run at 1 in flight")
        t1 = e.runs[1].tpot.median
        out[f"{label}_floor_ms"] = e.weight_bytes / bandwidth_bytes_per_s * 1e3
        out[f"{label}_bandwidth_share"] = out[f"{label}_floor_ms"] / t1
        if 8 in e.runs:
            out[f"{label}_c8_over_c1"] = e.runs[8].output_throughput / e.runs[1].output_throughput
            out |= {f"{label}_{k}": v for k, v in step_anatomy(t1, e.runs[8].tpot.median, 8).items()}
    out["tpot_ratio"] = slow.runs[1].tpot.median / fast.runs[1].tpot.median
    out["bytes_ratio"] = slow.weight_bytes / fast.weight_bytes  # type: ignore[operator]
    out["engine_factor"] = out["tpot_ratio"] / out["bytes_ratio"]
    return out


def attribution_lines(slow: EngineRun, fast: EngineRun, a: dict[str, float]) -> list[str]:
    """:func:`attribution`'s numbers in sentences (chapter 05 prints them)."""
    assert slow.weight_bytes is not None and fast.weight_bytes is not None
    ratio, bytes_x, eng = a["tpot_ratio"], a["bytes_ratio"], a["engine_factor"]
    mb_slow, mb_fast = slow.weight_bytes / 1e6, fast.weight_bytes / 1e6
    t_slow, t_fast = slow.runs[1].tpot.median, fast.runs[1].tpot.median
    lines = [f"weight format: {slow.name} reads {mb_slow:.0f} MB of {slow.weights} per token, {fast.name} "
             f"{mb_fast:.0f} MB of {fast.weights} ({bytes_x:.2f}x fewer bytes); at the measured bandwidth "
             f"no TPOT can be shorter than {a['slow_floor_ms']:.1f} and {a['fast_floor_ms']:.1f} ms",
             f"measured at one in flight: TPOT {t_slow:.1f} and {t_fast:.1f} ms, "
             f"{1 / a['slow_bandwidth_share']:.1f}x and {1 / a['fast_bandwidth_share']:.1f}x those floors; "
             f"{fast.name} is {ratio:.2f}x faster = {bytes_x:.2f}x from the format x {eng:.2f}x from the "
             "engine (its kernels, unpacking 4-bit blocks included, and its per-step work)"]
    f_slow, f_fast = slow.runs[1].ttft.median, fast.runs[1].ttft.median
    lines.append(f"first token at one in flight: {slow.name} {f_slow:.0f} ms, {fast.name} {f_fast:.0f} ms; "
                 "a prompt's tokens share each pass over the weights, so there the kernels' arithmetic "
                 "counts more than the bytes")
    if "slow_c8_over_c1" in a and "fast_c8_over_c1" in a:
        parts = []
        for label, e in (("slow", slow), ("fast", fast)):
            fixed, per, share = (a[f"{label}_{k}"] for k in ("fixed_ms", "per_stream_ms", "fixed_share"))
            hidden = " (under its weight reads: they overlap the arithmetic)" \
                if fixed < a[f"{label}_floor_ms"] else ""
            per_words = f"{per:.1f} ms" if per >= 0.05 else "about 0 ms"  # noise can make it negative
            parts.append(f"{e.name} {max(fixed, 0):.1f} ms per step{hidden} + {per_words} per stream, "
                         f"{min(max(share, 0), 1):.0%} of a lone step shared")
        lines.append("batching, the engine's alone (the bytes per step do not change with the streams): "
                     "TPOT at 1 and 8 in flight splits a step into a shared and a per-stream part: "
                     + "; ".join(parts))
        lines.append(f"so from 1 to 8 in flight {slow.name} served {a['slow_c8_over_c1']:.1f}x the tokens/s "
                     f"and {fast.name} {a['fast_c8_over_c1']:.1f}x (prefill included)")
    return lines
