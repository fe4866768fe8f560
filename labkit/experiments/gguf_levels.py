"""The tutorial's "compare quantization levels", done with llama.cpp on the bundled model (chapter 06).

The lab's only LLM weights are the shipped SmolLM2 GGUF in Q4_1, so every level is made from it
with ``llama-quantize --allow-requantize`` (:func:`labkit.engines.llamacpp.quantize`): F16 and Q8_0
hold those 4-bit values almost exactly, while Q4_K_M and Q4_0 round them a second time onto another
grid. File sizes and speeds are what these formats cost; quality differences are relative to the
Q4_1 base. Each level is measured with llama.cpp's own tools, which multiply the packed blocks
directly (fused kernels): file and tensor bytes, bits per weight (read from the header,
:mod:`labkit.llm.gguf_header`), ``llama-bench`` generation and prompt tokens/s (the same threads for
every level), ``llama-perplexity`` on held-out text (the same windows for every level) and one
question answered by ``llama-server`` at temperature 0.

Units: bytes, tokens/s, seconds; ratios are plain numbers (``x``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from ..engines import llamacpp, process
from ..engines.llamacpp_build import VERSION
from ..llm import gguf_header
from ..models import SERVED_NAME, gguf_path
from ..serving import openai_api, streaming
from ..settings import cache_dir

BASE = "Q4_1"
#: The precision steps whose decode speed-up chapter 06 compares with the tutorial's 30-50%.
STEPS = (("F16", "Q8_0"), ("Q8_0", "Q4_K_M"), ("Q8_0", "Q4_0"))


def level_files(levels: Sequence[str] = llamacpp.LEVELS, src: str | Path | None = None, base: str = BASE,
                folder: str | Path | None = None) -> dict[str, Path]:
    """``{base: src}`` (default: the bundled Q4_1 GGUF), then one file per level made from ``src`` with
    ``llama-quantize`` into ``folder`` (default: ``<lab cache>/gguf/llamacpp-<version>``, named
    ``<src name>-<level>.gguf``) and reused on later runs. Quantizing the 135M model takes about a
    second per level."""
    src = Path(src) if src is not None else gguf_path()
    if folder is None:
        folder = cache_dir() / "gguf" / f"llamacpp-{VERSION}"
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    files = {base: src}
    for level in levels:
        files[level] = llamacpp.quantize(src, folder / f"{src.stem}-{level}.gguf", level)
    return files


def answer(gguf: str | Path, question: str, max_tokens: int = 40,
           threads: int | None = None) -> dict[str, Any]:
    """``question`` answered by ``llama-server`` on ``gguf`` at temperature 0 (one slot, stopped after):
    ``text``, ``tokens`` generated, ``status`` and the server's ``startup_s``."""
    server = llamacpp.start_llamacpp(gguf, threads=threads, parallel=1, ctx_per_slot=512)
    try:
        rec = streaming.measure(openai_api.openai_backend(server.url, SERVED_NAME, temperature=0.0),
                                question, max_tokens)
    finally:
        process.stop(server)
    return {"text": rec.text, "tokens": rec.output_tokens, "status": rec.status,
            "startup_s": server.startup_s}


def measure(files: Mapping[str, Path], text_file: str | Path, question: str, threads: int | None = None,
            prompt: int = 64, gen: int = 32, reps: int = 3, ctx: int = 128, chunks: int = 4,
            max_tokens: int = 40) -> dict[str, dict[str, Any]]:
    """Every level of ``files`` (name -> GGUF) measured the same way, level -> row: ``file_bytes``,
    ``tensor_bytes``, ``params``, ``bits_per_weight``, ``types`` ({``ggml`` type: {"tensors", "params",
    "bytes"}}); llama-bench's ``gen_tps``/``prompt_tps`` (mean), ``_sd`` and ``_samples`` (one per
    round) over ``reps`` rounds (``gen`` and ``prompt`` tokens), each round running every level once in
    turn; ``ppl``/``ppl_se`` over ``chunks`` windows of ``ctx`` tokens of ``text_file``; ``answer``
    (:func:`answer`). All levels are benchmarked first, then scored, then asked."""
    threads = threads or llamacpp.llamacpp_threads()
    rows: dict[str, dict[str, Any]] = {}
    for level, path in files.items():
        s = gguf_header.summary(path)
        rows[level] = {"file_bytes": s["file_bytes"], "tensor_bytes": s["bytes"], "params": s["params"],
                       "bits_per_weight": s["bits_per_weight"],
                       "types": s["types"]}
    samples: dict[str, dict[str, list[float]]] = {level: {"gen": [], "prompt": []} for level in files}
    for _ in range(reps):  # every level once per round: a slow spell of the host hits all levels alike
        for level, path in files.items():
            b = llamacpp.bench(path, threads=threads, prompt=prompt, gen=gen, reps=1)
            for what in ("gen", "prompt"):
                samples[level][what].append(float(b[f"{what}_tps"]))
    for level, per in samples.items():
        for what, xs in per.items():
            rows[level] |= {f"{what}_tps": float(np.mean(xs)), f"{what}_tps_samples": xs,
                            f"{what}_tps_sd": float(np.std(xs, ddof=1)) if len(xs) > 1 else 0.0}
        rows[level] |= {"reps": reps, "threads": threads}
    for level, path in files.items():
        p = llamacpp.perplexity(path, text_file, ctx=ctx, chunks=chunks, threads=threads)
        rows[level] |= {"ppl": p["ppl"], "ppl_se": p["ppl_se"], "chunks": p["chunks"]}
    for level, path in files.items():
        rows[level]["answer"] = answer(path, question, max_tokens, threads)
    return rows


def ratio_band(rows: Mapping[str, Mapping[str, Any]], num: str, den: str,
               key: str = "gen_tps") -> dict[str, float]:
    """``key`` of level ``num`` over level ``den`` (e.g. Q8_0's decode tokens/s over F16's). Measured in
    the same rounds (``<key>_samples`` of one length, :func:`measure`): ``ratio`` the median of the
    per-round ratios, ``lo``/``hi`` the lowest and highest of them. Otherwise ``ratio`` of the means and a
    band of one standard deviation on each side, (mean - sd) / (mean + sd) to (mean + sd) / (mean - sd).
    ``n``: the runs behind each figure."""
    xs, ys = rows[num].get(f"{key}_samples"), rows[den].get(f"{key}_samples")
    if xs and ys and len(xs) == len(ys):
        per = [x / y for x, y in zip(xs, ys, strict=True)]
        return {"ratio": float(np.median(per)), "lo": min(per), "hi": max(per), "n": len(per)}
    a, sa = float(rows[num][key]), float(rows[num].get(f"{key}_sd", 0.0))
    b, sb = float(rows[den][key]), float(rows[den].get(f"{key}_sd", 0.0))
    hi = (a + sa) / (b - sb) if b > sb else float("inf")
    return {"ratio": a / b, "lo": (a - sa) / (b + sb), "hi": hi, "n": int(rows[num].get("reps", 1))}


def table(rows: Mapping[str, Mapping[str, Any]], base: str = BASE) -> list[dict[str, Any]]:
    """One printable row per level (for :func:`labkit.table.format_rows`): size, bits per weight,
    tokens/s (mean ± sd), perplexity and its change against ``base``."""
    out = []
    for level, r in rows.items():
        out.append({"level": level + (" (base)" if level == base else ""),
                    "file MB": r["file_bytes"] / 1e6, "bits/weight": f"{r['bits_per_weight']:.2f}",
                    "gen tok/s": f"{r['gen_tps']:.1f} ± {r['gen_tps_sd']:.1f}",
                    "prompt tok/s": f"{r['prompt_tps']:.0f} ± {r['prompt_tps_sd']:.0f}",
                    "perplexity": f"{r['ppl']:.2f}",
                    f"vs {base}": f"{r['ppl'] / rows[base]['ppl'] - 1:+.1%}" if base in rows else "-"})
    return out


def step_sentence(rows: Mapping[str, Mapping[str, Any]], num: str, den: str, steps: int = 1) -> str:
    """A change of precision (``den`` -> ``num``, ``steps`` halvings of the bits) in words from the
    numbers: how many times fewer bytes, the decode speed-up with its band (:func:`ratio_band`), where
    that falls against the tutorial's 30-50% per step (1.3-1.5x, compounded over ``steps``), and
    against the speed-up the bytes alone would give."""
    r = ratio_band(rows, num, den)
    shrink = rows[den]["file_bytes"] / rows[num]["file_bytes"]
    low, high = 1.3**steps, 1.5**steps
    over = f" over {steps} steps" if steps > 1 else ""
    span = f"the tutorial's 30-50% per step ({low:.2f}-{high:.2f}x{over})"
    if r["lo"] > high:
        where = f"above {span}"
    elif r["hi"] < low:
        where = f"below {span}"
    elif r["lo"] >= low and r["hi"] <= high:
        where = f"within {span}"
    else:
        where = f"the band straddles {span}"
    if r["hi"] < shrink:
        vs_bytes = f"short of the {shrink:.2f}x the bytes alone would give"
    elif r["lo"] > shrink:
        vs_bytes = f"beyond the {shrink:.2f}x the bytes alone would give"
    else:
        vs_bytes = f"about the {shrink:.2f}x the bytes alone would give"
    return (f"{den} -> {num}: {shrink:.2f}x fewer bytes, decode {r['ratio'] - 1:+.0%} "
            f"({r['ratio']:.2f}x, band {r['lo']:.2f}-{r['hi']:.2f}): {where}; {vs_bytes}")


def types_line(level: str, row: Mapping[str, Any]) -> str:
    """Which ``ggml`` types hold a level's weights, largest share first, with bits per weight:
    ``Q4_K_M: Q5_0 58% (5.50 bits), ...``."""
    types = sorted(row["types"].items(), key=lambda kv: -kv[1]["params"])
    parts = [f"{t} {r['params'] / row['params']:.0%} ({8 * r['bytes'] / r['params']:.2f} bits)"
             for t, r in types if r["params"] / row["params"] >= 0.005]
    return f"{level}: " + ", ".join(parts) + f"; {row['bits_per_weight']:.2f} bits per weight overall"


def fused_sentence(rows: Mapping[str, Mapping[str, Any]], labkit_int4: float, fp_name: str,
                   level: str = "Q4_0", full: str = "F16") -> str:
    """The same 4 bits with and without a fused kernel, from the numbers: labkit's INT4 (``labkit_int4``,
    its decode speed over ``fp_name``'s, measured earlier in chapter 06) beside llama.cpp's ``level``
    over ``full``."""
    r = ratio_band(rows, level, full)
    return (f"4-bit weights, decode speed over the same engine's unquantized model: labkit's INT4 "
            f"(unpack, dequantize, then a float matmul) {labkit_int4:.2f}x its {fp_name} model; llama.cpp's "
            f"{level} (the blocks multiplied directly) {r['ratio']:.2f}x its {full} model "
            f"(band {r['lo']:.2f}-{r['hi']:.2f})")


def size_sentence(rows: Mapping[str, Mapping[str, Any]], level: str = "Q4_0", full: str = "F16") -> str:
    """``full`` -> ``level`` file sizes in words, against the tutorial's 4x for 4 bits: the level's own
    blocks (its most common type) against 16 bits, and the share of weights kept in other types."""
    r, f = rows[level], rows[full]
    own, main = max(r["types"].items(), key=lambda kv: kv[1]["params"])
    bits = 8 * main["bytes"] / main["params"]
    rest = 1 - main["params"] / r["params"]
    return (f"{full} -> {level}: the file is {f['file_bytes'] / r['file_bytes']:.2f}x smaller (the "
            f"tutorial's 4x counts 4 bits against 16). Its {own} blocks cost {bits:.2f} bits per weight, "
            f"{16 / bits:.2f}x fewer than 16; the other {rest:.0%} of the weights are stored in wider types")


def _key(level: str) -> str:
    return level.lower()


def figures(rows: Mapping[str, Mapping[str, Any]], base: str = BASE, question_word: str = "Canberra"
            ) -> dict[str, tuple[float, str, str, tuple[float, float, int] | None]]:
    """What chapter 06 records from :func:`measure`, key -> ``(value, unit, note, spread)`` for
    :func:`labkit.results.record`: per level ``gguf_<level>_bits_per_weight``, ``_file_mb``,
    ``_gen_tps`` and ``_prompt_tps`` (spread: mean ± one sd), ``_ppl`` and ``_ppl_over_base``; the step
    ratios ``gguf_<num>_over_<den>_decode`` (spread: :func:`ratio_band`), the size ratios
    ``gguf_f16_over_<4-bit level>_size``, ``gguf_<4-bit level>_bytes_per_param``, and
    ``gguf_answers_naming`` (levels whose answer contains ``question_word``) of ``gguf_levels``."""
    Spread = tuple[float, float, int] | None
    out: dict[str, tuple[float, str, str, Spread]] = {}

    def put(key: str, value: float, unit: str, note: str, spread: Spread = None) -> None:
        out[key] = (float(value), unit, note, spread)

    for level, r in rows.items():
        k, n = _key(level), int(r["reps"])
        put(f"gguf_{k}_bits_per_weight", r["bits_per_weight"], "bits", f"{level}: tensor bytes x 8 / weights")
        put(f"gguf_{k}_file_mb", r["file_bytes"] / 1e6, "MB", f"{level} GGUF file")
        for what in ("gen", "prompt"):
            m, sd = r[f"{what}_tps"], r[f"{what}_tps_sd"]
            note = f"llama-bench {level}, {r['threads']} threads, mean of {n} (spread: one sd)"
            put(f"gguf_{k}_{what}_tps", m, "tok/s", note, (m - sd, m + sd, n))
        put(f"gguf_{k}_ppl", r["ppl"], "", f"llama-perplexity {level}, {r['chunks']:.0f} windows")
        if base in rows:
            put(f"gguf_{k}_ppl_over_base", r["ppl"] / rows[base]["ppl"], "x", f"{level} perplexity / {base}")
    for den, num in (*STEPS, ("F16", "Q4_0")):
        if num in rows and den in rows:
            b = ratio_band(rows, num, den)
            put(f"gguf_{_key(num)}_over_{_key(den)}_decode", b["ratio"], "x",
                f"llama-bench generation tok/s, {num} / {den}, median of paired rounds (band: their range)",
                (b["lo"], b["hi"], int(b["n"])))
    for q4 in ("Q4_0", "Q4_K_M"):
        if q4 in rows and "F16" in rows:
            put(f"gguf_f16_over_{_key(q4)}_size", rows["F16"]["file_bytes"] / rows[q4]["file_bytes"], "x",
                f"GGUF file bytes, F16 / {q4}")
        if q4 in rows:
            per_param = rows[q4]["tensor_bytes"] / rows[q4]["params"]
            put(f"gguf_{_key(q4)}_bytes_per_param", per_param, "bytes/param", f"{q4} tensor bytes / weights")
    named = sum(question_word.lower() in str(r["answer"]["text"]).lower() for r in rows.values())
    put("gguf_answers_naming", named, "levels", f"temperature-0 answers that name {question_word}")
    put("gguf_levels", len(rows), "levels", "GGUF levels measured, base included")
    return out
