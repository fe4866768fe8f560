"""Image generation with Stable Diffusion XL pipelines, and what it costs (chapter 07, "Beyond LLMs").

A diffusion pipeline chains text encoders, a denoiser (the UNet) and a VAE decoder. The UNet runs
once per denoising step, twice with classifier-free guidance (CFG: one pass with the prompt, one
without, batched together), so the count of UNet evaluations is the cost model:

    evaluations per image = 2 x (steps with CFG) + 1 x (steps without)

:func:`load_pipeline` loads one ``StableDiffusionXLPipeline`` on CUDA (fp16 weights), Apple MPS or
the CPU: the tutorial's SDXL base / sdxl-turbo in the full profile, or the tiny digits-trained SDXL
pipeline shipped in ``data/digits-sdxl`` in the small one. :func:`cfg_cutoff` switches guidance
off for the last steps through diffusers' ``callback_on_step_end``; :func:`counting_unet` counts
what the UNet really evaluated; :func:`generate` times a call with device synchronisation (through
:func:`labkit.hardware.microbench.timed`, like every timed figure here); :func:`digits_batch` times
chapter 07's digit grid as one batch and scores it (``labkit gpu-check`` runs it in fp16 on CUDA).
Times are seconds.
"""

from __future__ import annotations

import importlib.util
import json
import logging
import math
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np

from ..hardware.machine import resolve_device
from ..hardware.microbench import timed
from ..models import quiet_loading
from ..paths import used
from ..settings import profile
from . import digits
from .digits import DIGITS_DIR

LOCAL = {"digits-sdxl": DIGITS_DIR}
# Two log lines an SDXL load prints here that say nothing about the run, kept off chapter 07's page by
# :func:`_known_noise_off` (logger -> the text that marks the line; every other line still shows):
# transformers falls back to its PIL image processors since torchvision is not installed (the
# pipeline's CLIP/SigLIP feature extractors serve image prompts, which the lab never sends), and
# diffusers' torchao hook misses tensor classes torchao 0.18 dropped (no checkpoint here uses them).
KNOWN_NOISE = {"transformers.utils.import_utils": "requires torchvision (not installed); falling back",
               "diffusers.quantizers.torchao.torchao_quantizer": "Unable to import `torchao` Tensor objects"}
# Tensors that carry the [unconditional, conditional] halves in StableDiffusionXLPipeline.
CFG_TENSORS = ["prompt_embeds", "add_text_embeds", "add_time_ids"]


def unet_evaluations(steps: int, guidance_scale: float, cfg_fraction: float = 1.0) -> int:
    """UNet evaluations per image: 2 per step while CFG is on (the first ``round(cfg_fraction x
    steps)`` steps, and only if ``guidance_scale > 1``), 1 per step after. Matches what
    :func:`counting_unet` measures with :func:`cfg_cutoff`."""
    if steps < 1 or not 0.0 <= cfg_fraction <= 1.0:
        raise ValueError(f"need steps >= 1 and 0 <= cfg_fraction <= 1, got {steps}, {cfg_fraction}")
    cfg_steps = cfg_step_count(steps, cfg_fraction) if guidance_scale > 1 else 0
    return 2 * cfg_steps + (steps - cfg_steps)


def cfg_step_count(steps: int, cfg_fraction: float) -> int:
    """How many of ``steps`` keep guidance when it is switched off after ``cfg_fraction`` of them."""
    return int(math.floor(steps * cfg_fraction + 0.5))


def cfg_cutoff(steps: int, cfg_fraction: float) -> Callable:
    """A ``callback_on_step_end`` that turns classifier-free guidance off after the first
    ``round(cfg_fraction x steps)`` steps: it keeps the conditional half of ``prompt_embeds``,
    ``add_text_embeds`` and ``add_time_ids`` and sets the pipeline's guidance scale to 0, so every
    later step runs the UNet once instead of twice. Pass ``callback_on_step_end_tensor_inputs=
    CFG_TENSORS`` with it. Works for any batch size (the halves are split with ``chunk(2)``).

    diffusers ships ``SDXLCFGCutoffCallback`` for this; it keeps only the last row (``[-1:]``,
    right for one prompt only) and fires at step index ``int(steps x ratio)``, one step later
    than the ratio says (chapter 07 counts the difference)."""
    cutoff = cfg_step_count(steps, cfg_fraction)

    def callback(pipe: Any, step_index: int, timestep: Any, kwargs: dict[str, Any]) -> dict[str, Any]:
        if step_index == cutoff - 1 and pipe.do_classifier_free_guidance:
            for name in CFG_TENSORS:
                kwargs[name] = kwargs[name].chunk(2)[1]
            pipe._guidance_scale = 0.0
        return kwargs

    return callback


@contextmanager
def counting_unet(pipe: Any) -> Iterator[dict[str, int]]:
    """Count UNet forward calls and the samples they processed while the block runs:
    yields ``{"calls": n, "samples": m}`` (a CFG step on a batch of 4 is 1 call, 8 samples)."""
    counts = {"calls": 0, "samples": 0}

    def hook(module: Any, args: Any, kwargs: Any) -> None:
        sample = args[0] if args else kwargs["sample"]
        counts["calls"] += 1
        counts["samples"] += int(sample.shape[0])

    handle = pipe.unet.register_forward_pre_hook(hook, with_kwargs=True)
    try:
        yield counts
    finally:
        handle.remove()


def pipeline_source(name: str) -> tuple[str, bool]:
    """``(folder or hub name, is_local)`` for a diffusion model name from the profile."""
    if name in LOCAL:
        folder = Path(LOCAL[name])
        if not (folder / "model_index.json").exists():
            raise FileNotFoundError(
                f"{folder} has no model_index.json; the shipped pipeline is missing "
                "(git checkout data/digits-sdxl, or retrain: python data/digits-sdxl/train.py)"
            )
        for f in folder.rglob("*.safetensors"):
            used(f)  # read by safetensors' own code, which Python's audit hook does not see
        return str(folder), True
    if "/" not in name:
        raise ValueError(
            f"unknown diffusion model {name!r}: use {sorted(LOCAL)} or a hub name such as "
            "'stabilityai/sdxl-turbo' (LABKIT_PROFILE=full)"
        )
    return name, False


@contextmanager
def _known_noise_off() -> Iterator[None]:
    """Drop the :data:`KNOWN_NOISE` log lines (and only those) within the ``with`` block."""
    drops = {name: (lambda r, t=text: t not in r.getMessage()) for name, text in KNOWN_NOISE.items()}
    for name, drop in drops.items():
        logging.getLogger(name).addFilter(drop)
    try:
        yield
    finally:
        for name, drop in drops.items():
            logging.getLogger(name).removeFilter(drop)


def load_pipeline(
    name: str | None = None, device: str | None = None, attention_slicing: bool = False
) -> tuple[Any, dict[str, Any]]:
    """Load a ``StableDiffusionXLPipeline`` from safetensors; return ``(pipe, info)``.

    ``name``: the profile's ``diffusion`` by default (``digits-sdxl`` or an SDXL hub repository).
    ``device``: ``auto`` (the profile's default), ``cuda``, ``mps`` or ``cpu``.

    * CUDA: fp16 weights (``variant="fp16"`` for hub models); PyTorch's scaled-dot-product
      attention is already memory-efficient, xformers is used only if installed.
    * MPS: fp16 too. The SDXL VAE overflows in fp16 (NaN -> black images); the pipeline upcasts
      it to fp32 for decoding when its config says ``force_upcast`` (SDXL base's does), so keep
      that on. ``attention_slicing`` saves memory on small Macs but is slower, and some
      PyTorch/macOS versions gave black or noisy images with it in fp16: off by default.
    * CPU: fp32 (fp16 matmuls are slow or unsupported on most CPUs).

    ``info``: ``name, source, device, dtype, load_s, notes`` (load time in seconds).
    """
    import torch

    with _known_noise_off():
        from diffusers import StableDiffusionXLPipeline
    p = profile()
    name = name or p.diffusion
    dev = resolve_device(device or p.device)
    source, local = pipeline_source(name)
    half = dev.startswith(("cuda", "mps"))
    dtype = torch.float16 if half else torch.float32
    kwargs: dict[str, Any] = dict(dtype=dtype, use_safetensors=True)
    if local:
        kwargs["add_watermarker"] = False  # the watermark is meant for 1024 px images, not 16 px digits
    elif half:
        kwargs["variant"] = "fp16"
    notes = []
    with quiet_loading(download=not local), _known_noise_off():  # no bar, no known log lines
        pipe, load_s = timed(lambda: StableDiffusionXLPipeline.from_pretrained(source, **kwargs).to(dev), dev)
    if dev.startswith("cuda") and importlib.util.find_spec("xformers") is not None:
        pipe.enable_xformers_memory_efficient_attention()
        notes.append("xformers memory-efficient attention")
    elif half:
        notes.append("PyTorch scaled-dot-product attention (memory-efficient; xformers not needed)")
    if dev.startswith("mps"):
        if attention_slicing:
            pipe.enable_attention_slicing()
            notes.append("attention slicing on: watch for black/NaN images in fp16")
        if not getattr(pipe.vae.config, "force_upcast", False) and not local:
            notes.append("VAE decodes in fp16: NaN/black images are likely, use an fp16-fixed VAE")
    if half and getattr(pipe.vae.config, "force_upcast", False):
        notes.append("VAE upcast to fp32 for decoding (fp16 overflows in the SDXL VAE)")
    pipe.set_progress_bar_config(disable=True)
    info = dict(
        name=name,
        source=source,
        device=dev,
        dtype=str(dtype).removeprefix("torch."),
        load_s=load_s,
        notes=notes,
    )
    return pipe, info


def generate(
    pipe: Any,
    prompts: list[str],
    steps: int,
    guidance_scale: float,
    cfg_fraction: float = 1.0,
    seed: int = 0,
    **kwargs: Any,
) -> dict[str, Any]:
    """Run the pipeline once on ``prompts`` (one batch) and measure it.

    ``cfg_fraction < 1`` switches guidance off after that fraction of the steps (:func:`cfg_cutoff`).
    Latent noise comes from a CPU generator seeded with ``seed``, so a run is reproducible across
    devices. Returns ``images`` (PIL), ``seconds`` (wall, device synchronised), ``cpu_s`` (CPU time
    of this process: steadier than wall time on a shared CPU), ``unet_calls``,
    ``unet_evals_per_image`` (counted), ``expected_evals_per_image`` (:func:`unet_evaluations`).
    """
    import torch

    device = str(pipe.device)
    if guidance_scale > 1 and cfg_step_count(steps, cfg_fraction) == 0:
        guidance_scale = 1.0  # guidance off from the first step: no unconditional pass at all
    elif cfg_fraction < 1.0 and guidance_scale > 1:
        kwargs.update(
            callback_on_step_end=cfg_cutoff(steps, cfg_fraction),
            callback_on_step_end_tensor_inputs=CFG_TENSORS,
        )
    generator = torch.Generator("cpu").manual_seed(seed)
    with counting_unet(pipe) as counts, torch.inference_mode():
        c0 = time.process_time()  # CPU time of this process: no device clock to synchronize
        images, seconds = timed(
            lambda: pipe(
                prompts, num_inference_steps=steps, guidance_scale=guidance_scale, generator=generator,
                **kwargs,
            ).images,
            device,
        )
        cpu_s = time.process_time() - c0
    return dict(
        images=images,
        seconds=seconds,
        cpu_s=cpu_s,
        unet_calls=counts["calls"],
        unet_evals_per_image=counts["samples"] / len(prompts),
        expected_evals_per_image=unet_evaluations(steps, guidance_scale, cfg_fraction),
    )


def digits_batch(pipe: Any, per_digit: int = 5, steps: int = 25, guidance: float = 5.0,
                 repeats: int = 3) -> dict[str, Any]:
    """Chapter 07's digit grid as one batch (``per_digit`` images of each digit 0-9) through the
    digits pipeline ``pipe``: :func:`generate` once untimed, then ``repeats`` times. Returns the last
    run's fields with ``seconds`` the median of the timed runs, and ``asked`` (the digit of each
    image), ``pixel_std`` and ``blank`` (images blank or not finite: an fp16 overflow), ``accuracy``
    (fraction the shipped classifier reads as asked; None, with ``accuracy_note``, when it cannot
    load) and ``judge_accuracy`` (the classifier's held-out accuracy on real digits, or None)."""
    asked = [d for _ in range(per_digit) for d in range(10)]
    prompts = [digits.prompt(d) for d in asked]
    runs = [generate(pipe, prompts, steps, guidance) for _ in range(1 + repeats)]
    r = dict(runs[-1], seconds=float(np.median([x["seconds"] for x in runs[1:]])), asked=asked)
    pixels = digits.to_array(r["images"])
    r["pixel_std"] = float(pixels.std())
    r["blank"] = bool(not np.isfinite(pixels).all() or r["pixel_std"] < 1e-3)
    try:
        r["accuracy"] = digits.accuracy(r["images"], asked, digits.load_classifier())
    except ImportError as e:
        r["accuracy"], r["accuracy_note"] = None, str(e)
    try:
        log = json.loads((DIGITS_DIR / "train_log.json").read_text())
        r["judge_accuracy"] = float(log["classifier"]["held_out_accuracy"])
    except (OSError, KeyError, ValueError):
        r["judge_accuracy"] = None
    return r


def image_grid(
    rows: list[list[Any]],
    row_labels: list[str] | None = None,
    col_labels: list[str] | None = None,
    scale: float = 0.6,
) -> Any:
    """A matplotlib figure showing PIL images in a grid (one list per row)."""
    import matplotlib.pyplot as plt

    n_rows, n_cols = len(rows), max(len(r) for r in rows)
    fig, axes = plt.subplots(
        n_rows, n_cols, figsize=(n_cols * scale + 1.2, n_rows * scale + 0.4), squeeze=False
    )
    for i, row in enumerate(rows):
        for j in range(n_cols):
            ax = axes[i][j]
            ax.set_xticks([])
            ax.set_yticks([])
            for s in ax.spines.values():
                s.set_visible(False)
            if j < len(row):
                ax.imshow(np.asarray(row[j]), cmap="gray")
            if j == 0 and row_labels:
                ax.set_ylabel(row_labels[i], rotation=0, ha="right", va="center", fontsize=9)
            if i == 0 and col_labels and j < len(col_labels):
                ax.set_title(col_labels[j], fontsize=9)
    fig.tight_layout()
    return fig
