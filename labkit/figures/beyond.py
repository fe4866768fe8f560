"""Chapter 07's figures for the report, read from the page's variables once the chapter has run
(its closing cell calls :func:`labkit.figures.keep`)."""

from __future__ import annotations

import inspect
import json
from collections.abc import Mapping
from typing import Any

import numpy as np

from ..hardware.catalog import ACCELERATORS
from ..hardware.roofline import bandwidth_achieved
from ..media import asr, denoiser, digits, multimodal
from ..media.asr import WHISPER_LARGE_V3
from ..media.wer import wer
from ..results import record, unmeasured
from ..settings import STUDY_SKIPPED
from ..stats import median_interval
from . import take


def keep(page: Mapping[str, Any]) -> None:
    """Record chapter 07's figures from ``page``, the notebook's variables at its end."""

    # Timing it right: `transcribe()` is lazy
    lazy = take(page, "lazy")[0]
    page_wer_gap, scored = take(page, "page_wer_gap scored")
    page_cfg_gap = take(page, "page_cfg_gap")[0]
    record("beyond", "page_cfg_gap", page_cfg_gap, "",
           "largest |the chapter's cfg on the UNet's two halves - the noise estimate diffusers handed its "
           "scheduler|, first step of one guided run")
    record("beyond", "page_wer_gap", page_wer_gap, "",
           f"largest |the chapter's wer - jiwer's (labkit.media.wer)| over {len(scored)} transcripts")

    # 4 · TTS: decode speed is the real-time budget
    (best_x, bw, chunk_s, device, full_type, headline, int8_iv, int8_type, latency,
     llm_bytes, p, passage_rows, passage_s, rtf_iv, streamed, threads, tps, tps_iv) = take(page, (
        "best_x bw chunk_s device full_type headline int8_iv int8_type latency llm_bytes "
        "p passage_rows passage_s rtf_iv streamed threads tps tps_iv "))
    lat = median_interval(latency * 1e3)  # ms per chunk
    record("beyond", "whisper_rtf", rtf_iv["median"], "x",
           f"{p.whisper} {int8_type}, beam 5: processing ÷ {passage_s:.0f} s "
           f"of audio, median of {rtf_iv['n']} runs", spread=(rtf_iv["lo"], rtf_iv["hi"], rtf_iv["n"]))
    record("beyond", "whisper_snippet_figure", 1 / rtf_iv["median"], "x",
           "the snippet's 'RTF': audio ÷ processing, same runs")
    record("beyond", "snippet_rtf_is_rtf",
           bool(abs(1 / rtf_iv["median"] - rtf_iv["median"]) < 0.01 * rtf_iv["median"]), "",
           "the snippet's figure equals processing ÷ audio (within 1%)")
    record("beyond", "whisper_wer", headline["wer"], "fraction",
           f"{p.whisper} {int8_type}, beam 5, the passage")
    record("beyond", "whisper_int8_speedup", int8_iv["median"], "x",
           f"{p.whisper}: {full_type} ÷ {int8_type} time on the sentence, beam 1, median of {int8_iv['n']} "
           "paired rounds", spread=(int8_iv["lo"], int8_iv["hi"], int(int8_iv["n"])))
    record("beyond", "whisper_call_over_wall", lazy, "fraction", "transcribe() return ÷ full consumption")
    record("beyond", "whisper_best_x_realtime", best_x, "x real time",
           f"{p.whisper_fast}, one pass or batched, {threads} thread(s)")
    record("beyond", "stream_chunk_latency_ms", lat["median"], "ms",
           f"{p.whisper_fast}, {chunk_s:.0f} s chunks, median of {lat['n']} chunks",
           spread=(lat["lo"], lat["hi"], int(lat["n"])))
    record("beyond", "stream_within_target", np.mean(latency <= asr.REALTIME_TARGET_S), "fraction",
           "chunks within 200 ms")
    record("beyond", "stream_cpu_over_one_pass", sum(c["cpu_s"] for c in streamed) / passage_rows[2]["cpu_s"],
           "x", f"{len(streamed)} chunks' CPU time ÷ one pass of the passage, {p.whisper_fast}")
    record("beyond", "whisper_large_v3_params_b", asr.whisper_params(WHISPER_LARGE_V3) / 1e9, "B params",
           "counted from Whisper large-v3's published shape")
    record("beyond", "tts_decode_tps", tps, "tokens/s",
           f"{p.llm} on {device}, batch 1, 32 tokens, median of {tps_iv['n']}",
           spread=(tps_iv["lo"], tps_iv["hi"], tps_iv["n"]))
    record("beyond", "tts_achieved", bandwidth_achieved(tps, llm_bytes, bw), "fraction",
           "tokens/s x weight bytes ÷ bandwidth")
    encoder_rates, vq_strides = (2, 4, 8, 8), (4, 2, 1)  # SNAC 24 kHz
    frame_hz = 24000 / np.prod(encoder_rates)
    record("beyond", "tts_codec_tokens_per_s", sum(frame_hz / s for s in vq_strides), "tokens/s",
           "SNAC 24 kHz (Orpheus's codec): audio tokens per second of speech, its 3 levels together")
    (asked, cutoff, full_evals, g_best, is_digits, judge, prompts, runs, steps) = take(
        page, "asked cutoff full_evals g_best is_digits judge prompts runs steps")
    record("beyond", "cfg_cutoff_saving", 1 - cutoff[0.8]["unet_evals_per_image"] / full_evals, "fraction",
           f"UNet evaluations saved by CFG off for the last 20% of {steps} steps, counted")
    record("beyond", "cfg_cutoff_cpu_saving", 1 - cutoff[0.8]["cpu_s"] / cutoff[1.0]["cpu_s"], "fraction",
           "CPU time, one run each")
    if is_digits:  # each image with and without guidance (or the cutoff): a 95% bootstrap over images
        hit = {k: digits.classify(r["images"], judge) == np.array(asked)
               for k, r in (("g1", runs[1.0]), ("g", runs[g_best]), ("cut", cutoff[0.8]))}
        resample = np.random.default_rng(0).integers(0, len(asked), (2000, len(asked)))
        for key, a, b, what in (("digits_guidance_gain", "g", "g1", f"g={g_best:g} less g=1"),
                                ("cfg_cutoff_accuracy_drop", "g", "cut",
                                 "CFG throughout less CFG off for the last 20%")):
            d = hit[a].astype(float) - hit[b]
            lo, hi = np.percentile(d[resample].mean(axis=1), [2.5, 97.5])
            record("beyond", key, d.mean(), "fraction",
                   f"digit accuracy, {what}, {len(asked)} images, same seeds", spread=(lo, hi, d.size))
        record("beyond", "digits_accuracy_guided", runs[g_best]["accuracy"], "fraction",
               f"g={g_best:g}, {len(prompts)} images")
        record("beyond", "digits_accuracy_unguided", runs[1.0]["accuracy"], "fraction",
               f"g=1, {len(prompts)} images")
    else:
        for key in ("digits_guidance_gain", "cfg_cutoff_accuracy_drop"):
            unmeasured("beyond", key, "the full profile draws SDXL images: no digit judge scores them")
    log = json.loads((digits.DIGITS_DIR / "train_log.json").read_text())  # what the judge's training held out
    x_real, y_real = digits.load_digits()
    held = np.random.default_rng(log["seed"]).permutation(len(x_real))[: log["classifier"]["held_out_images"]]
    record("beyond", "digits_judge_accuracy",
           digits.accuracy((x_real[held, None] + 1) / 2, y_real[held], digits.load_classifier()), "fraction",
           f"the chapter's digit judge on the {held.size} real digits its training held out")
    claim_x, enc_tokens, passes, tts_params, vec = take(page, "claim_x enc_tokens passes tts_params vec")
    mps_ok, mps_said = asr.ctranslate2_supports("mps")
    ceilings = {r["accelerator"]: r["bf16"] for r in multimodal.tts_rows(ACCELERATORS, tts_params, ("bf16",))}
    from diffusers import StableDiffusionXLPipeline  # heavy: only where the chapter has loaded it already

    default = inspect.signature(StableDiffusionXLPipeline.__call__).parameters["num_inference_steps"].default
    record("beyond", "sdxl_default_steps", default, "steps",
           "StableDiffusionXLPipeline's default num_inference_steps")
    record("beyond", "ctranslate2_mps_supported", mps_ok, "",
           f"faster-whisper's backend asked for device 'mps': {mps_said}")
    record("beyond", "hour_in_4s_x_realtime", claim_x, "x real time", "3,600 s of audio in 4 s")
    for key, name in (("tts_ceiling_h100_bf16_tps", "H100 SXM"),
                      ("tts_ceiling_rtx3060_bf16_tps", "RTX 3060 12GB")):
        record("beyond", key, ceilings[name], "tokens/s",
               f"computed: {tts_params / 1e9:.1f} B in bf16, bandwidth ÷ weight bytes")
    record("beyond", "embedding_forward_passes", len(passes), "forward pass(es)",
           f"all-MiniLM-L6-v2 embedding one text ({vec.numel()} values)")
    record("beyond", "embedding_text_tokens", enc_tokens, "tokens", "the embedded text")
    docs, emb_diff, emb_s, plans = take(page, "docs emb_diff emb_s plans")
    record("beyond", "embedding_batch_vs_single_max_diff", emb_diff, "",
           f"{len(docs)} prompts, one padded batch vs one at a time, unit vectors")
    for name in plans:
        key = f"embedding_texts_per_s_{name.replace(' ', '_')}"
        record("beyond", key, len(docs) / emb_s[name], "texts/s",
               f"all-MiniLM-L6-v2, {len(docs)} prompts, {name}, median of 2 alternating rounds")

    # Going further: streaming over a WebSocket
    if not take(page, "STUDY")[0]:
        unmeasured("beyond", "ws_rtt_p50_best_1stream_ms", STUDY_SKIPPED)
    else:
        best, ws, ws_text = take(page, "best ws ws_text")
        for (chunk, n), s in ws.items():
            for q in ("p50", "p99"):
                record("beyond", f"ws_rtt_{q}_ms_chunk{chunk * 1000:.0f}_streams{n}", s[q], "ms",
                       f"{p.whisper_fast}, {chunk:g} s chunks, {n} stream(s), {s['n']} chunks over a "
                       "WebSocket")
        record("beyond", "ws_rtt_p50_best_1stream_ms", ws[best, 1]["p50"], "ms",
               f"{p.whisper_fast}, one stream at real-time "
               f"pace, best chunk size {best:g} s, P50 of {ws[best, 1]['n']} chunks, send -> partial")
        record("beyond", "ws_within_target_best", ws[best, 1]["within"], "fraction",
               "chunks answered within 200 ms, same runs")
        record("beyond", "ws_queueing_4_over_1", ws[1.0, 4]["p50"] / ws[1.0, 1]["p50"], "x",
               "P50 round trip, 1 s chunks, 4 streams ÷ 1")
        in_process = take(page, "in_process")[0]
        record("beyond", "ws_vs_in_process_wer", wer(in_process, ws_text[2.0, 1]), "fraction",
               f"{p.whisper_fast}: the server's partials (2 s chunks, 1 stream) against the same chunks "
               f"transcribed in-process")

    # Going further: fewer steps
    sweep = take(page, "sweep")[0]
    counted = [*runs.values(), *sweep.values(), *cutoff.values()]  # every diffusion run of the chapter
    record("beyond", "cfg_evals_off_formula",
           max(abs(r["unet_evals_per_image"] - r["expected_evals_per_image"]) for r in counted),
           "evaluations",
           f"largest |counted - formula| UNet evaluations per image over the chapter's {len(counted)} runs")

    # Going further: is a denoiser step compute-bound?
    (doubling, guided, h100_ridge, ours, ridge_here, sdxl) = take(
        page, "doubling guided h100_ridge ours ridge_here sdxl")
    record("beyond", "unet_double_batch_time", doubling["median"], "x",
           f"UNet call at batch {2 * guided} ÷ {guided}, median of {doubling['n']}",
           spread=(doubling["lo"], doubling["hi"], doubling["n"]))
    record("beyond", "unet_intensity_over_ridge", ours["intensity"] / ridge_here, "x",
           "counted FLOPs/byte ÷ measured ridge")
    record("beyond", "sdxl_step_intensity", sdxl["intensity"], "FLOPs/byte",
           "counted: SDXL UNet, guided 1024x1024 step, fp16")
    record("beyond", "sdxl_step_intensity_over_h100_ridge", sdxl["intensity"] / h100_ridge, "x", "computed")
    record("beyond", "sdxl_fp16_weights_gb",
           2 * (sdxl["params"] + sum(denoiser.SDXL_OTHER_PARAMS.values())) / 1e9, "GB",
           "UNet counted, text encoders and VAE from the model card, 2 bytes each")

    # Going further: video, the same loop over a whole clip
    h100, sdxl_step, v720 = take(page, "h100 sdxl_step v720")
    record("beyond", "video_tokens_per_clip", v720["tokens"], "tokens",
           "computed: Wan2.1-14B shape (assumed), 81 frames of 1280x720")
    record("beyond", "video_attention_vs_frame", v720["attention_vs_frame"], "x",
           "computed: self-attention FLOPs, clip ÷ one frame")
    record("beyond", "video_step_over_sdxl_step", 2 * v720["flops"] / sdxl_step, "x",
           "computed: guided step, 720p clip ÷ SDXL 1024²")
    record("beyond", "video_clip_pflop", v720["clip_flops"] / 1e15, "PFLOP",
           "computed: 50 guided steps, 100 passes, 720p clip")
    record("beyond", "video_pass_intensity_over_h100_ridge", v720["intensity"] / h100.ops_per_byte("bf16"),
           "x",
           "computed: FLOPs ÷ bytes (bf16 weights + activations) of one pass, over the H100's bf16 ridge")
