"""Chapter 07's own checks (labkit/checks/beyond.py) against broken implementations: each test runs a
small mutation of the chapter's real code path (the audio handed over at the wrong rate, a server that
misreads its frames, a judge fed the wrong pixel range, a CFG cutoff one step late), computes the figure
as the notebook does, and sees the check fail; the unbroken code path holds it."""

import json

import numpy as np
import pytest
from mutation import mutated

from labkit.checks import outcome
from labkit.media import asr, asr_stream, diffusion, digits
from labkit.media.wer import wer

TEXTS = json.loads((asr.AUDIO_DIR / "texts.json").read_text())



@pytest.mark.slow
def test_audio_at_the_wrong_sample_rate_fails():
    """The passage decoded at 8 kHz and handed to Whisper as 16 kHz samples (the rate the model
    assumes): the figure the notebook records, WER against the passage's text."""
    from faster_whisper import decode_audio

    model, _ = asr.load_whisper("base", cpu_threads=1)
    path = str(asr.AUDIO_DIR / "passage.wav")
    wrong = asr.transcribe(model, decode_audio(path, sampling_rate=8000), beam_size=1)["text"]
    right = asr.transcribe(model, asr.load_audio("passage.wav"), beam_size=1)["text"]
    assert outcome("beyond", "whisper_wer", {"whisper_wer": wer(TEXTS["passage"], wrong)}).held is False
    assert outcome("beyond", "whisper_wer", {"whisper_wer": wer(TEXTS["passage"], right)}).held is True


def _ws_vs_in_process(model) -> float:
    """The notebook's figure: the server's partials (2 s chunks, one stream) against the same chunks
    transcribed in-process, for the passage's first 4 s."""
    clip = asr.load_audio("passage.wav")[: 4 * asr.SAMPLE_RATE]
    same = " ".join(c["text"] for c in asr.stream(model, clip, chunk_s=2.0))
    with asr_stream.StreamingASRServer(asr_stream.whisper_transcriber(model)) as server:
        runs = asr_stream.run_sync(asr_stream.run_streams, server.url, clip, 2.0, 1, realtime=False)
    return wer(same, " ".join(r["text"] for r in runs[0]))


@pytest.mark.slow
def test_a_server_reading_big_endian_samples_fails(monkeypatch):
    model, _ = asr.load_whisper("tiny.en", cpu_threads=1)
    assert outcome("beyond", "ws_matches_in_process",
                   {"ws_vs_in_process_wer": _ws_vs_in_process(model), "study": True}).held is True
    monkeypatch.setattr(asr_stream, "check_frame",
                        mutated(asr_stream.check_frame, ('np.frombuffer(message, dtype="<i2")',
                                                         'np.frombuffer(message, dtype=">i2")')))
    broken = _ws_vs_in_process(model)
    broken_values = {"ws_vs_in_process_wer": broken, "study": True}
    assert outcome("beyond", "ws_matches_in_process", broken_values).held is False


def _judge_accuracy() -> float:
    """The notebook's figure: the shipped judge on the real digits data/digits-sdxl/train.py held out,
    given as a pipeline gives images (values in [0, 1])."""
    x, y = digits.load_digits()
    log = json.loads((digits.DIGITS_DIR / "train_log.json").read_text())
    held = np.random.default_rng(log["seed"]).permutation(len(x))[: log["classifier"]["held_out_images"]]
    return digits.accuracy((x[held, None] + 1) / 2, y[held], digits.load_classifier())


def test_a_judge_fed_unscaled_pixels_fails(monkeypatch):
    assert outcome("beyond", "digits_judge", {"digits_judge_accuracy": _judge_accuracy()}).held is True
    monkeypatch.setattr(digits, "to_array", mutated(digits.to_array, ("return arr * 2 - 1", "return arr")))
    broken = _judge_accuracy()
    assert outcome("beyond", "digits_judge", {"digits_judge_accuracy": broken}).held is False


def _off_formula(pipe) -> float:
    """The notebook's figure over a guided, an unguided and a cut-off run: the largest difference
    between the UNet evaluations counted per image and the formula's."""
    prompts = [digits.prompt(d) for d in (3, 7)]
    runs = [diffusion.generate(pipe, prompts, steps=10, guidance_scale=g, cfg_fraction=f)
            for g, f in ((5.0, 1.0), (1.0, 1.0), (5.0, 0.8))]
    return max(abs(r["unet_evals_per_image"] - r["expected_evals_per_image"]) for r in runs)


@pytest.mark.slow
def test_a_cutoff_one_step_late_fails(monkeypatch):
    import torch

    torch.set_num_threads(1)
    pipe, _ = diffusion.load_pipeline("digits-sdxl", device="cpu")
    assert outcome("beyond", "cfg_counts_match", {"cfg_evals_off_formula": _off_formula(pipe)}).held is True
    late = mutated(diffusion.cfg_cutoff, ("step_index == cutoff - 1", "step_index == cutoff"))
    monkeypatch.setattr(diffusion, "cfg_cutoff", late)
    broken = _off_formula(pipe)
    assert outcome("beyond", "cfg_counts_match", {"cfg_evals_off_formula": broken}).held is False


def _batch_vs_single() -> float:
    """The notebook's figure, on every fifth shipped prompt (short and long ones): one padded batch against
    one text at a time."""
    import torch

    from labkit.llm import embedding
    from labkit.serving.loadgen import load_prompts

    encoder, tok = embedding.load_embedder()
    docs = [item["prompt"] for item in load_prompts("mixed")][::5]
    single = torch.cat([embedding.embed(encoder, tok, [d]) for d in docs])
    return (embedding.embed(encoder, tok, docs) - single).abs().max().item()


def test_pooling_over_the_padding_fails(monkeypatch):
    from labkit.llm import embedding

    assert outcome("beyond", "embedding_batch_matches_single",
                   {"embedding_batch_vs_single_max_diff": _batch_vs_single()}).held is True
    # every position of the batch counts, padding included
    pool_all = ("m = mask.unsqueeze(-1)", "m = torch.ones_like(mask).unsqueeze(-1)")
    monkeypatch.setattr(embedding, "mean_pool", mutated(embedding.mean_pool, pool_all))
    broken = _batch_vs_single()
    assert outcome("beyond", "embedding_batch_matches_single",
                   {"embedding_batch_vs_single_max_diff": broken}).held is False


def _page_wer(reference, hypothesis, substitution=1):
    """The chapter's wer (notebooks/07_beyond_llms.ipynb); ``substitution=2`` prices a substitution as a
    deletion plus an insertion, the slip of an edit distance written from memory."""
    from labkit.media.wer import normalize

    ref, hyp = normalize(reference).split(), normalize(hypothesis).split()
    d = list(range(len(hyp) + 1))
    for i, r in enumerate(ref, 1):
        diag, d[0] = d[0], i
        for j, h in enumerate(hyp, 1):
            diag, d[j] = d[j], min(d[j] + 1, d[j - 1] + 1, diag + substitution * (r != h))
    return d[-1] / len(ref)


def test_a_wer_that_counts_a_substitution_twice_fails():
    pairs = [("The quick brown fox jumps over the lazy dog.", "the quick brown fox jumped over the lazy dog"),
             ("Inference engineering makes models cheaper.", "inference engineering makes models cheaper"),
             ("one two three", "one three four five"), ("a b c", "")]
    gap = {s: max(abs(_page_wer(r, h, s) - wer(r, h)) for r, h in pairs) for s in (1, 2)}
    assert gap[2] == pytest.approx(1 / 9)
    assert outcome("beyond", "page_wer", {"page_wer_gap": gap[2]}).held is False
    assert outcome("beyond", "page_wer", {"page_wer_gap": gap[1]}).held is True


def test_a_cfg_that_starts_from_the_prompts_half_fails():
    import torch

    def guided(uncond, cond, g, start_from_prompt=False):  # the chapter's cfg; the slip starts from cond
        return (cond if start_from_prompt else uncond) + g * (cond - uncond)

    gen = torch.Generator().manual_seed(0)
    uncond, cond = torch.randn(2, 1, 4, 8, 8, generator=gen)
    diffusers_estimate = uncond + 5.0 * (cond - uncond)  # what the SDXL pipeline hands scheduler.step
    gap = {s: (guided(uncond, cond, 5.0, s) - diffusers_estimate).abs().max().item() for s in (False, True)}
    assert outcome("beyond", "page_cfg", {"page_cfg_gap": gap[True]}).held is False
    assert outcome("beyond", "page_cfg", {"page_cfg_gap": gap[False]}).held is True
