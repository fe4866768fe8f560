"""Chapter 07's final checks (beyond): rules over the figures ``notebooks/07_beyond_llms.ipynb`` records.

What holds by construction is a unit test, not a rule: the CFG evaluation count and the cutoff's
0.9 (``tests/test_diffusion.py``, the formula and the counted pipeline), the batched guided call
per step (same file), the RTF arithmetic (``tests/test_asr.py``), the SDXL and Whisper shapes
(``tests/test_denoiser.py``, ``tests/test_asr.py``), the TTS ceilings (``tests/test_multimodal.py``), the
WebSocket protocol (bad frames answered and closed, a vanished client's session freed, streams queueing
for the inference slot: ``tests/test_asr_stream.py``) and the video arithmetic (``tests/test_video.py``).
"""

from __future__ import annotations

from . import Values, rule


def _digits(v: Values) -> str | None:
    if "digits_accuracy_guided" in v:
        return None
    return "the full profile draws SDXL images: no digit classifier to score them"


@rule("beyond", "Whisper transcribes the shipped passage with WER <= 0.1 (profile model, beam 5)",
      needs=("whisper_wer",),
      # the same passage stitched from 3 s chunks of tiny.en, as this chapter streams it (2026-12-01)
      fails_on={"whisper_wer": 0.492},
      holds_on={"whisper_wer": 0.051})  # base int8, beam 5, Intel AMX, 2026-12-01
def whisper_wer(v: Values) -> tuple[bool, str]:
    return v["whisper_wer"] <= 0.1, f"WER {v['whisper_wer']:.3f}"


@rule("beyond", "int8 Whisper weights cost less time than the full-precision ones here",
      needs=("whisper_int8_speedup",),
      # a CPU whose int8 GEMM is no faster than its fp32 one (no VNNI): illustrative
      fails_on={"whisper_int8_speedup": 0.95},
      holds_on={"whisper_int8_speedup": 1.33})  # base, CPU time, Intel AMX, 2026-12-01
def int8_cheaper(v: Values) -> tuple[bool, str]:
    x = v["whisper_int8_speedup"]
    return x > 1, f"full precision took {x:.2f}x the int8 time"


@rule("beyond", "chunked streaming costs more compute than one pass (each chunk pays a whole 30 s window)",
      needs=("stream_cpu_over_one_pass",),
      # chunks of 30 s, one window each, would cost what one pass costs: illustrative
      fails_on={"stream_cpu_over_one_pass": 1.1},
      holds_on={"stream_cpu_over_one_pass": 5.7})  # 8 chunks 5.27 s vs 0.92 s CPU, 2026-12-01
def stream_costs_more(v: Values) -> tuple[bool, str]:
    x = v["stream_cpu_over_one_pass"]
    return x > 1.5, f"the chunks took {x:.1f}x the CPU time of one pass"


@rule("beyond", "over a WebSocket one stream keeps pace: P99 round trip under the chunk's 2 s",
      needs=("ws_rtt_p99_ms_chunk2000_streams1",),
      # a CPU without fast int8 (no VNNI) taking over 2 s per 30 s window of tiny.en: illustrative
      fails_on={"ws_rtt_p99_ms_chunk2000_streams1": 2600.0},
      holds_on={"ws_rtt_p99_ms_chunk2000_streams1": 686.0})  # tiny.en, 1 thread, Intel AMX, 2026-12-01
def ws_keeps_pace(v: Values) -> tuple[bool, str]:
    x = v["ws_rtt_p99_ms_chunk2000_streams1"]
    return x < 2000, f"P99 {x:.0f} ms per 2 s chunk"


@rule("beyond", "streams sharing one model queue: 4 streams' P50 round trip > 1.5x one's (1 s chunks)",
      needs=("ws_queueing_4_over_1",),
      # a server giving each stream its own slot on a machine with a spare core per stream: illustrative
      fails_on={"ws_queueing_4_over_1": 1.1},
      holds_on={"ws_queueing_4_over_1": 4.5})  # tiny.en, one slot, 2 cores, 2026-12-01
def ws_streams_queue(v: Values) -> tuple[bool, str]:
    x = v["ws_queueing_4_over_1"]
    return x > 1.5, f"4 streams' P50 is {x:.1f}x one stream's"


@rule("beyond", "a denoiser step is compute-bound here: twice the batch takes well over 1.5x the time",
      needs=("unet_double_batch_time",),
      # the same UNet at batch 2 vs 4 (one image with guidance): 0.0108 vs 0.0112 s, Intel AMX, 2026-12-01
      fails_on={"unet_double_batch_time": 1.04},
      holds_on={"unet_double_batch_time": 2.4})  # batch 100 vs 200, 0.085 vs 0.203 s, 2026-12-01
def denoiser_compute_bound(v: Values) -> tuple[bool, str]:
    x = v["unet_double_batch_time"]
    return x > 1.5, f"doubling the batch took {x:.2f}x the time"


@rule("beyond", "guidance draws the asked digit more often than no guidance",
      needs=("digits_accuracy_guided", "digits_accuracy_unguided"), when=_digits,
      # a pipeline whose unconditional embedding carries the prompt (a broken cutoff): illustrative
      fails_on={"digits_accuracy_guided": 0.94, "digits_accuracy_unguided": 0.94},
      holds_on={"digits_accuracy_guided": 1.0, "digits_accuracy_unguided": 0.94})  # 2026-12-01
def guidance_helps(v: Values) -> tuple[bool, str]:
    g, u = v["digits_accuracy_guided"], v["digits_accuracy_unguided"]
    return g > u, f"{g:.0%} with guidance vs {u:.0%} without"


@rule("beyond", "switching guidance off for the last 20% of the steps keeps the accuracy (within 10 points)",
      needs=("cfg_cutoff_accuracy_drop",), when=_digits,
      # a cutoff that dropped the conditional rows instead of the unconditional ones: illustrative
      fails_on={"cfg_cutoff_accuracy_drop": 0.3, "digits_accuracy_guided": 1.0},
      holds_on={"cfg_cutoff_accuracy_drop": 0.0, "digits_accuracy_guided": 1.0})  # 100% vs 100%, 2026-12-01
def cutoff_keeps_accuracy(v: Values) -> tuple[bool, str]:
    d = v["cfg_cutoff_accuracy_drop"]
    return d <= 0.1, f"accuracy fell by {d:.0%}"


@rule("beyond", "TTS decode stays under its bandwidth ceiling (achieved <= 1.25 of the copy rate)",
      needs=("tts_achieved",),
      # a copy benchmark measured in a slow spell of a shared host: illustrative
      fails_on={"tts_achieved": 1.6},
      holds_on={"tts_achieved": 0.27})  # 9.9 vs 36.0 tokens/s, 2026-12-01
def tts_under_ceiling(v: Values) -> tuple[bool, str]:
    x = v["tts_achieved"]
    return x <= 1.25, f"decode moved {x:.0%} of the measured copy bandwidth"
