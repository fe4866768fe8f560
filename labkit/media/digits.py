"""Handwritten digits for the offline diffusion stand-in (chapter 07, "Beyond LLMs").

The small profile cannot download SDXL, so chapter 07 runs the unchanged
``StableDiffusionXLPipeline`` on a tiny SDXL-architecture pipeline trained on scikit-learn's
bundled 8x8 digits (``data/digits-sdxl``, made by ``data/digits-sdxl/train.py``). This module holds
what training and scoring share: the prompts, the image format (16x16, values in [-1, 1]) and a
small CNN that judges which digit an image shows, so "did guidance draw the digit I asked for?"
becomes a measured accuracy.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from ..paths import DATA, used

WORDS = ("zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine")
SIZE = 16  # pixels per side of the images the pipeline draws (the 8x8 digits upsampled 2x)
DIGITS_DIR = DATA / "digits-sdxl"
CLASSIFIER_FILE = "classifier.safetensors"
# Prompt templates used in training; the first is the one the chapter asks with.
TEMPLATES = ("a handwritten digit {word}", "the digit {word}", "a handwritten {num}", "number {word}")


def prompt(digit: int, template: int = 0) -> str:
    """The text prompt for ``digit`` (0-9), e.g. ``"a handwritten digit seven"``."""
    if not 0 <= digit <= 9:
        raise ValueError(f"digit must be 0-9, got {digit}")
    return TEMPLATES[template].format(word=WORDS[digit], num=digit)


def load_digits(size: int = SIZE) -> tuple[np.ndarray, np.ndarray]:
    """scikit-learn's 1,797 bundled digits as ``(images, labels)``: images float32
    ``(N, size, size)`` in [-1, 1] (background -1, ink +1: white digits on black), bilinearly
    upsampled from 8x8."""
    import torch
    import torch.nn.functional as F
    from sklearn.datasets import load_digits as sk_digits

    d = sk_digits()
    x = torch.from_numpy(d.images.astype(np.float32) / 16.0)[:, None]  # 0..1
    x = F.interpolate(x, size=(size, size), mode="bilinear", align_corners=False)[:, 0]
    return (x * 2 - 1).numpy(), d.target.astype(np.int64)


def to_array(images: Any) -> np.ndarray:
    """Pipeline output (list of PIL images, or a float array/tensor in [0, 1] shaped NHWC or NCHW)
    as float32 ``(N, SIZE, SIZE)`` grayscale in [-1, 1], the classifier's input format."""
    if isinstance(images, list | tuple):
        arr = np.stack(
            [np.asarray(im.convert("L").resize((SIZE, SIZE)), dtype=np.float32) / 255.0 for im in images]
        )
    else:
        arr = np.asarray(images, dtype=np.float32)
        if arr.ndim == 4:
            channel_axis = 1 if arr.shape[1] in (1, 3) else 3
            arr = arr.mean(axis=channel_axis)
    return arr * 2 - 1


def classifier() -> Any:
    """The judge: a 2-conv CNN on 16x16 grayscale (about 24 k parameters), untrained."""
    from torch import nn

    return nn.Sequential(
        nn.Conv2d(1, 16, 3, padding=1),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Conv2d(16, 32, 3, padding=1),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Flatten(),
        nn.Linear(32 * 4 * 4, 32),
        nn.ReLU(),
        nn.Linear(32, 10),
    )


def load_classifier(folder: str | Path = DIGITS_DIR) -> Any:
    """The trained judge from ``folder/classifier.safetensors`` (safetensors, no pickle), eval mode."""
    from safetensors.torch import load_file

    path = Path(folder) / CLASSIFIER_FILE
    if not path.exists():
        raise FileNotFoundError(f"{path} is missing; recreate it with `python data/digits-sdxl/train.py`")
    model = classifier()
    used(path)
    model.load_state_dict(load_file(path))
    return model.eval()


def classify(images: Any, model: Any = None) -> np.ndarray:
    """Predicted digit (int64 array) for each image (anything :func:`to_array` accepts)."""
    import torch

    model = model or load_classifier()
    x = torch.from_numpy(to_array(images))[:, None]
    with torch.no_grad():
        return model(x).argmax(dim=1).numpy()


def accuracy(images: Any, asked: list[int] | np.ndarray, model: Any = None) -> float:
    """Fraction of ``images`` the classifier reads as the digit that was ``asked`` for."""
    asked = np.asarray(asked)
    if len(asked) != len(images):
        raise ValueError(f"{len(images)} images but {len(asked)} asked digits")
    return float((classify(images, model) == asked).mean())
