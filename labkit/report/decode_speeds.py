"""The bundled model's decode speed as each chapter measured it (the report's front page, for
every chapter): one table, so a reader sees that 18, 50 and 100 tokens/s on one machine are one
model timed in different ways.

Each row names a recorded figure and what differs in its measurement: the engine (PyTorch's kernels or
llama.cpp's fused quantized ones), the weights (the machine's 16- or 32-bit format, or a 4-bit GGUF
file), and what the clock covers (the model step alone, a server's own clock, or the client's, across
HTTP and streaming). Threads and token counts come from each figure's own note, as recorded.
"""

from __future__ import annotations

from html import escape
from typing import Any

from .verdicts import fmt_value

#: (chapter, key, engine, weights, what the clock covers), in chapter order.
SPEEDS: tuple[tuple[str, str, str, str, str], ...] = (
    ("metrics", "llamacpp_bench_gen_tps", "llama.cpp (llama-bench)", "Q4_1 GGUF",
     "the model step alone: no server, no HTTP"),
    ("metrics", "llamacpp_unstreamed_tps", "llama.cpp (llama-server)", "Q4_1 GGUF",
     "the server's own decode clock, answer sent whole"),
    ("metrics", "llamacpp_client_tps", "llama.cpp (llama-server)", "Q4_1 GGUF",
     "1/TPOT at the client: streaming and HTTP included"),
    ("metrics", "per_slot_tok_s_c2", "vLLM (CPU build)", "the server's dtype",
     "each request's share with 2 in flight, at the client"),
    ("selection", "tps_base", "PyTorch (transformers)", "the machine's dtype (chapter 00)",
     "batch-1 greedy decode on the chapter's torch threads"),
    ("hardware", "llamacpp_decode_tps", "llama.cpp (llama-bench)", "Q4_1 GGUF",
     "the model step alone, on the thread count its note gives"),
    ("optimization", "gguf_q4_1_gen_tps", "llama.cpp (llama-bench)", "Q4_1 GGUF",
     "the model step alone, as the GGUF levels' baseline"),
    ("optimization", "gguf_f16_gen_tps", "llama.cpp (llama-bench)", "F16 GGUF (twice Q4_1's bytes and more)",
     "the model step alone"),
    ("beyond", "tts_decode_tps", "PyTorch (transformers)", "the machine's dtype (chapter 00)",
     "batch-1 decode of 32 tokens, as a speech model's token rate"),
)

WHY = ("Why one model decodes at several speeds on one machine: llama.cpp runs its own fused kernels on "
       "4-bit blocks (Q4_1: 5 bits per weight with its scales, under a third of 16-bit weights' bytes), "
       "where PyTorch's kernels read the machine's 16- or 32-bit weights (chapters 04 and 05 measure both "
       "against the bytes they read); a server's clock adds sampling and scheduling, a client's adds "
       "streaming and HTTP (chapter 02); the thread count and the number of tokens timed differ between "
       "chapters (each note says them); two rows with the same setup were timed at different moments of a "
       "shared machine, and differ by how much its speed drifted between them. Chapters 04 and 06 also "
       "time PyTorch's decode, recorded as ratios between formats rather than as rates.")


def decode_speed_rows(results: dict[str, dict[str, Any] | None]) -> list[dict[str, str]]:
    """The rows of :data:`SPEEDS` whose figure a chapter recorded in ``results`` (chapter -> results
    dict), each with ``chapter``, ``value`` (as the report prints it), ``engine``, ``weights``,
    ``clock`` and the figure's own ``note``."""
    rows = []
    for chapter, key, engine, weights, clock in SPEEDS:
        entry = ((results.get(chapter) or {}).get("values") or {}).get(key)
        if not entry or entry.get("value") is None:
            continue
        value = fmt_value(entry["value"], entry.get("unit", ""))
        rows.append({"chapter": chapter, "key": key, "value": value, "engine": engine, "weights": weights,
                     "clock": clock, "note": entry.get("note", "")})
    return rows


def decode_speed_section(results: dict[str, dict[str, Any] | None]) -> str:
    """The front page's HTML section: the table of :func:`decode_speed_rows` and why the figures differ;
    empty when no chapter recorded any of them."""
    rows = decode_speed_rows(results)
    if not rows:
        return ""
    body = "\n".join(f'<tr><td>{escape(r["chapter"])}</td><td class="v">{escape(r["value"])}</td>'
                     f'<td>{escape(r["engine"])}</td><td>{escape(r["weights"])}</td><td>{escape(r["clock"])}</td>'
                     f'<td class="small"><code>{escape(r["key"])}</code>: {escape(r["note"])}</td></tr>'
                     for r in rows)
    return (f'<h2 id="decode-speeds">The bundled model\'s decode speed, chapter by chapter</h2>\n'
            f'<p class="small">{escape(WHY)}</p>\n<table><tr><th>chapter</th><th>tokens/s</th><th>engine</th>'
            f'<th>weights</th><th>what the clock covers</th><th>as recorded</th></tr>\n{body}\n</table>')
