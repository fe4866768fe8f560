"""Chapter 07's own checks (beyond): is the lab's code right on this machine? Each is evaluated on the
figures ``notebooks/07_beyond_llms.ipynb`` records, and each names the unit test
(``tests/test_lab_checks_beyond.py``) that runs a broken implementation through it and sees it fail.

The chapter's claims (Whisper's size and speed, int8's saving, the 200 ms round trip, the 30-50 steps,
compute-bound denoising, the CFG cutoff's saving and its cost in quality, what guidance does, SDXL's
12 GB, the TTS token rate, what embedding models do) are judged by the ledger,
``data/claims/07_beyond.toml``. What holds by construction is a unit test: the CFG formula and the
batched guided call (``tests/test_diffusion.py``), the RTF arithmetic (``tests/test_asr.py``), the SDXL
and Whisper shapes (``tests/test_denoiser.py``, ``tests/test_asr.py``), the TTS ceilings
(``tests/test_multimodal.py``), the WebSocket protocol (``tests/test_asr_stream.py``) and the video
arithmetic (``tests/test_video.py``); the embedder's loading and pooling (``tests/test_embedding.py``).
"""

from __future__ import annotations

from . import Values, check, studied

BROKEN = "tests/test_lab_checks_beyond.py::"


@check("beyond", "the chapter's wer gives jiwer's word error rate on every transcript it scores",
       needs=("page_wer_gap",), broken=BROKEN + "test_a_wer_that_counts_a_substitution_twice_fails",
       # a substitution priced as a deletion plus an insertion: a sentence with one wrong word of 9 reads 2/9
       fails_on={"page_wer_gap": 0.111}, holds_on={"page_wer_gap": 0.0})
def page_wer(v: Values) -> tuple[bool, str]:
    x = v["page_wer_gap"]
    return x <= 1e-12, f"largest difference {x:.1e}"


@check("beyond", "the chapter's cfg gives the guided noise estimate diffusers computes from the UNet's two "
       "halves", needs=("page_cfg_gap",),
       broken=BROKEN + "test_a_cfg_that_starts_from_the_prompts_half_fails",
       # starting from the conditional estimate instead of the unconditional one: off by the gap between them
       fails_on={"page_cfg_gap": 4.78}, holds_on={"page_cfg_gap": 0.0})
def page_cfg(v: Values) -> tuple[bool, str]:
    x = v["page_cfg_gap"]
    return x <= 1e-5, f"largest difference {x:.1e}"


@check("beyond", "the speech pipeline is wired right: the profile's Whisper (beam 5) transcribes the "
       "shipped passage with a word error rate of at most 0.1",
       needs=("whisper_wer",), broken=BROKEN + "test_audio_at_the_wrong_sample_rate_fails",
       # whisper base, the passage decoded at 8 kHz and handed over as 16 kHz samples (what the broken
       # test measures): the model hears speech at twice its speed and writes something else
       fails_on={"whisper_wer": 2.88},
       holds_on={"whisper_wer": 0.051})  # measured: base int8, beam 5
def whisper_wer(v: Values) -> tuple[bool, str]:
    # 0.1: the clean synthetic voice gives whisper base 0.05-0.07 (beam 5 or 1); a pipeline that feeds
    # the model the wrong rate, range or channel gives 0.5 and more
    return v["whisper_wer"] <= 0.1, f"WER {v['whisper_wer']:.3f}"


@check("beyond", "the WebSocket server transcribes what it was sent: its partials for the passage's "
       "first 4 s (2 s chunks) match the same chunks transcribed in-process (WER between them <= 0.1)",
       needs=("ws_vs_in_process_wer",), broken=BROKEN + "test_a_server_reading_big_endian_samples_fails",
       when=studied,
       # a server that decodes the pcm_s16le frames as big-endian samples: noise in, words out of nowhere
       fails_on={"ws_vs_in_process_wer": 1.0, "study": True},
       holds_on={"ws_vs_in_process_wer": 0.0, "study": True})  # measured: tiny.en, the same words
def ws_matches_in_process(v: Values) -> tuple[bool, str]:
    x = v["ws_vs_in_process_wer"]
    # the frames carry int16 samples, within 1/32767 of the float ones: the words should be the same;
    # 0.1 allows one near-tie word in the clip's dozen to flip
    return x <= 0.1, f"WER of the server's text against the in-process text {x:.3f}"


@check("beyond", "the digit judge the chapter scores images with reads the 360 real digits its training "
       "held out at >= 95% accuracy", needs=("digits_judge_accuracy",),
       broken=BROKEN + "test_a_judge_fed_unscaled_pixels_fails",
       # the same judge fed images in [0, 1] instead of the [-1, 1] it was trained on (what the broken
       # test measures)
       fails_on={"digits_judge_accuracy": 0.30},
       holds_on={"digits_judge_accuracy": 0.986})  # data/digits-sdxl/train_log.json: 0.986
def digits_judge(v: Values) -> tuple[bool, str]:
    x = v["digits_judge_accuracy"]
    # the shipped weights scored 0.986 when trained; a judge this reliable makes "accuracy" mean what
    # was drawn, while a broken input path reads 0.3 or less
    return x >= 0.95, f"{x:.1%} of the held-out real digits read correctly"


@check("beyond", "the UNet ran as many evaluations per image as the cost model says (2 per guided step, "
       "1 after the CFG cutoff), in every guided, unguided and cut-off run of the chapter",
       needs=("cfg_evals_off_formula",), broken=BROKEN + "test_a_cutoff_one_step_late_fails",
       # a cutoff callback that fires one step late, as diffusers' SDXLCFGCutoffCallback does (what the
       # broken test counts): one guided step too many
       fails_on={"cfg_evals_off_formula": 1.0},
       holds_on={"cfg_evals_off_formula": 0.0})
def cfg_counts_match(v: Values) -> tuple[bool, str]:
    x = v["cfg_evals_off_formula"]
    return x == 0, f"counted evaluations differ from the formula by up to {x:g} per image"


@check("beyond", "the embedding code pools each text over its own tokens: the 30 shipped prompts embedded "
       "as one padded batch give the vectors they get one at a time (largest difference under 1e-4)",
       needs=("embedding_batch_vs_single_max_diff",), broken=BROKEN + "test_pooling_over_the_padding_fails",
       # mean pooling over every position of the batch, padding included (what the broken test measures):
       # a short text's vector then depends on the longest text it was batched with
       fails_on={"embedding_batch_vs_single_max_diff": 0.05},
       holds_on={"embedding_batch_vs_single_max_diff": 1e-6})
def embedding_batch_matches_single(v: Values) -> tuple[bool, str]:
    x = v["embedding_batch_vs_single_max_diff"]
    # fp32 with other matrix shapes moves a unit vector's entries by ~1e-7; a pool that counts the
    # padding moves a short text's by hundredths
    return x < 1e-4, f"largest difference between batched and one-at-a-time vectors {x:.1e}"
