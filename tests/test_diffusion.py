"""labkit.media.diffusion / labkit.media.digits: UNet-evaluation accounting, the CFG cutoff, the
pipeline loader and the shipped digits pipeline (chapter 07)."""

import json
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from labkit.media import diffusion, digits


@pytest.mark.parametrize(
    ("steps", "guidance", "fraction", "expected"),
    [
        (50, 7.5, 1.0, 100),
        (50, 7.5, 0.8, 90),
        (50, 7.5, 0.6, 80),
        (50, 1.0, 0.8, 50),
        (4, 0.0, 1.0, 4),
        (25, 5.0, 0.0, 25),
        (10, 5.0, 0.84, 18),
    ],
)
def test_unet_evaluations(steps, guidance, fraction, expected):
    assert diffusion.unet_evaluations(steps, guidance, fraction) == expected


def test_cutoff_at_80_percent_is_ninety_percent_of_full_cfg():
    for steps in (10, 25, 30, 50):
        assert diffusion.unet_evaluations(steps, 5, 0.8) == pytest.approx(
            0.9 * diffusion.unet_evaluations(steps, 5)
        )
    with pytest.raises(ValueError):
        diffusion.unet_evaluations(0, 5)


def test_unknown_names_get_a_clear_error():
    with pytest.raises(ValueError, match="digits-sdxl"):
        diffusion.pipeline_source("sdxl")
    assert diffusion.pipeline_source("stabilityai/sdxl-turbo") == ("stabilityai/sdxl-turbo", False)


class FakePipe:
    """Stands in for StableDiffusionXLPipeline.from_pretrained to check what the loader asks for."""

    calls: list = []

    def __init__(self, force_upcast=True):
        self.vae = SimpleNamespace(config=SimpleNamespace(force_upcast=force_upcast))
        self.sliced = False

    @classmethod
    def from_pretrained(cls, source, **kwargs):
        cls.calls.append((source, kwargs))
        return cls()

    def to(self, device):
        self.device = device
        return self

    def enable_attention_slicing(self):
        self.sliced = True

    def set_progress_bar_config(self, **kwargs):
        pass


@pytest.mark.parametrize(
    ("device", "dtype", "variant"),
    [("cuda", torch.float16, "fp16"), ("mps", torch.float16, "fp16"), ("cpu", torch.float32, None)],
)
def test_loader_picks_dtype_and_variant_per_device(monkeypatch, device, dtype, variant):
    import diffusers

    import labkit.hardware

    monkeypatch.setattr(diffusers, "StableDiffusionXLPipeline", FakePipe)
    monkeypatch.setattr(diffusion, "resolve_device", lambda pref: pref)
    monkeypatch.setattr(labkit.hardware.machine, "synchronize", lambda dev: None)
    FakePipe.calls = []
    pipe, info = diffusion.load_pipeline(
        "stabilityai/stable-diffusion-xl-base-1.0", device=device, attention_slicing=True
    )
    source, kwargs = FakePipe.calls[0]
    assert source == "stabilityai/stable-diffusion-xl-base-1.0"
    assert kwargs["dtype"] == dtype and kwargs.get("variant") == variant and kwargs["use_safetensors"]
    assert pipe.device == device and info["device"] == device
    assert pipe.sliced == (device == "mps")  # slicing is an MPS memory option only
    if device != "cpu":
        assert any("upcast" in n for n in info["notes"])


@pytest.fixture(scope="module")
def pipe():
    torch.set_num_threads(1)
    p, info = diffusion.load_pipeline("digits-sdxl", device="cpu")
    assert info["dtype"] == "float32"
    return p


def test_shipped_pipeline_is_small_safetensors_only():
    files = [f for f in digits.DIGITS_DIR.rglob("*") if f.is_file()]
    assert sum(f.stat().st_size for f in files) < 12e6
    assert not [f for f in files if f.suffix in (".bin", ".pkl", ".pt", ".pth", ".ckpt")]
    index = json.loads((digits.DIGITS_DIR / "model_index.json").read_text())
    assert index["_class_name"] == "StableDiffusionXLPipeline"


@pytest.mark.slow
@pytest.mark.parametrize("fraction", [1.0, 0.8, 0.5])
def test_counted_evaluations_match_the_formula_with_a_batch(pipe, fraction):
    prompts = [digits.prompt(d) for d in (3, 7, 1)]
    r = diffusion.generate(pipe, prompts, steps=10, guidance_scale=5.0, cfg_fraction=fraction)
    assert (
        r["unet_evals_per_image"]
        == r["expected_evals_per_image"]
        == diffusion.unet_evaluations(10, 5.0, fraction)
    )
    assert r["unet_calls"] == 10  # CFG halves are batched into one call per step
    assert len(r["images"]) == 3 and r["images"][0].size == (digits.SIZE, digits.SIZE)
    assert pipe.guidance_scale == (0.0 if fraction < 1 else 5.0)


@pytest.mark.slow
def test_same_seed_same_images(pipe):
    a = diffusion.generate(pipe, [digits.prompt(2)], steps=4, guidance_scale=3.0, seed=1)["images"]
    b = diffusion.generate(pipe, [digits.prompt(2)], steps=4, guidance_scale=3.0, seed=1)["images"]
    assert np.array_equal(np.asarray(a[0]), np.asarray(b[0]))


def test_classifier_reads_real_digits():
    x, y = digits.load_digits()
    assert x.shape == (1797, digits.SIZE, digits.SIZE) and x.min() >= -1 and x.max() <= 1
    pil_like = (x[:200] + 1) / 2  # the [0, 1] range a pipeline returns
    assert digits.accuracy(pil_like[:, None], y[:200]) > 0.95
    with pytest.raises(ValueError):
        digits.accuracy(pil_like[:3, None], [1, 2])
    assert digits.prompt(7) == "a handwritten digit seven"


def test_load_time_comes_from_the_lab_timer(monkeypatch):
    import diffusers


    calls = []
    monkeypatch.setattr(diffusers, "StableDiffusionXLPipeline", FakePipe)
    monkeypatch.setattr(diffusion, "resolve_device", lambda pref: pref)
    def timed(fn, device="cpu"):
        calls.append(device)
        return fn(), 1.25

    monkeypatch.setattr(diffusion, "timed", timed)
    pipe, info = diffusion.load_pipeline("stabilityai/sdxl-turbo", device="cuda")
    assert calls == ["cuda"] and info["load_s"] == 1.25 and pipe.device == "cuda"


def test_digits_batch_takes_the_median_of_the_timed_runs_and_scores_them(monkeypatch):
    x, y = digits.load_digits()
    pick = [int(np.flatnonzero(y == d)[0]) for d in range(10)] * 2  # a real image of each digit, twice
    seconds = iter([9.0, 3.0, 1.0, 2.0])  # the first run is the untimed warm-up
    asked_for = []

    def fake_generate(pipe, prompts, steps, guidance):
        asked_for.append((prompts, steps, guidance))
        return {"images": (x[pick][:, None] + 1) / 2, "seconds": next(seconds), "unet_evals_per_image": 2.0}

    monkeypatch.setattr(diffusion, "generate", fake_generate)
    r = diffusion.digits_batch(None, per_digit=2, steps=7, guidance=3.0, repeats=3)
    assert r["seconds"] == 2.0 and r["asked"] == list(range(10)) * 2 and len(asked_for) == 4
    assert asked_for[0] == ([digits.prompt(d) for d in range(10)] * 2, 7, 3.0)
    assert r["accuracy"] > 0.9 and not r["blank"] and r["unet_evals_per_image"] == 2.0
    assert r["judge_accuracy"] is None or 0.9 < r["judge_accuracy"] <= 1.0

    seconds = iter([1.0, 1.0])
    monkeypatch.setattr(diffusion, "generate", lambda *a: {"images": np.zeros((10, 1, 16, 16)),
                                                           "seconds": next(seconds)})
    assert diffusion.digits_batch(None, per_digit=1, repeats=1)["blank"]  # all one value: fp16 overflow?


@pytest.mark.slow
def test_digits_batch_on_the_shipped_pipeline(pipe):
    r = diffusion.digits_batch(pipe, per_digit=1, steps=2, guidance=5.0, repeats=1)
    assert len(r["images"]) == 10 and r["seconds"] > 0 and r["expected_evals_per_image"] == 4
    assert r["unet_evals_per_image"] == 4 and 0.0 <= r["accuracy"] <= 1.0
