"""What one denoiser step costs, counted and timed (chapter 07, "diffusion is compute-bound").

A diffusion step is one UNet call over the image latents (two samples per image with
classifier-free guidance). :func:`step_counts` counts its FLOPs (torch's ``FlopCounterMode``), the
bytes of its weights and the bytes of the activations its layers write (each written once and
read at least once: ``2 x`` the outputs of every leaf module), so its arithmetic intensity is
``flops / (weights + activations)`` FLOPs per byte. It works on the ``meta`` device too, where no
memory is allocated: :func:`sdxl_unet` builds SDXL base's 2.6 B-parameter UNet that way from its
published config, so the lab can count a 1024x1024 step without downloading 5 GB.
:func:`call_seconds` times UNet calls at several batch sizes, interleaved (a compute-bound call
takes twice as long for twice the batch; a memory-bound one hardly longer).

Units: FLOPs, bytes, seconds.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from ..hardware import microbench

# stabilityai/stable-diffusion-xl-base-1.0, unet/config.json (the fields that set its shape).
SDXL_UNET: dict[str, Any] = dict(
    sample_size=128, in_channels=4, out_channels=4, layers_per_block=2, norm_num_groups=32,
    down_block_types=["DownBlock2D", "CrossAttnDownBlock2D", "CrossAttnDownBlock2D"],
    up_block_types=["CrossAttnUpBlock2D", "CrossAttnUpBlock2D", "UpBlock2D"],
    block_out_channels=[320, 640, 1280], attention_head_dim=[5, 10, 20], cross_attention_dim=2048,
    transformer_layers_per_block=[1, 2, 10], addition_embed_type="text_time", addition_time_embed_dim=256,
    projection_class_embeddings_input_dim=2816, use_linear_projection=True,
)
# Parameters of SDXL base's other parts (its model card's components; fp16 safetensors sizes / 2):
# CLIP ViT-L/14 text encoder, OpenCLIP ViT-bigG/14 text encoder, the VAE.
SDXL_OTHER_PARAMS = {"text_encoder": 123.1e6, "text_encoder_2": 694.7e6, "vae": 83.7e6}
TEXT_TOKENS = 77  # CLIP's prompt length


def sdxl_unet(device: str = "meta", dtype: str = "float16") -> Any:
    """SDXL base's UNet with random weights (on ``meta`` by default: shapes only, no memory)."""
    import torch
    from diffusers import UNet2DConditionModel

    with torch.device(device):
        # nn.Module's own .to: diffusers' wraps it only to warn that modules to keep in float32 may be
        # cast, and lists none for this UNet ("should be kept in float32: []" on chapter 07's page)
        return torch.nn.Module.to(UNet2DConditionModel(**SDXL_UNET), getattr(torch, dtype)).eval()


def unet_inputs(unet: Any, batch: int, latent: int | None = None, seed: int = 0) -> dict[str, Any]:
    """Random inputs of one UNet call for ``batch`` samples of ``latent`` x ``latent`` latents
    (the config's ``sample_size`` by default), on the UNet's device and in its dtype, for an SDXL-style
    UNet (text and time conditioning)."""
    import torch

    cfg, p = unet.config, next(unet.parameters())
    side = latent or cfg.sample_size
    pooled = cfg.projection_class_embeddings_input_dim - 6 * cfg.addition_time_embed_dim
    gen = torch.Generator("cpu").manual_seed(seed)

    def rand(*shape: int) -> Any:
        t = torch.randn(*shape, generator=gen) if p.device.type != "meta" else torch.empty(*shape)
        return t.to(device=p.device, dtype=p.dtype)

    return {"sample": rand(batch, cfg.in_channels, side, side),
            "timestep": torch.full((batch,), 500.0, device=p.device),
            "encoder_hidden_states": rand(batch, TEXT_TOKENS, cfg.cross_attention_dim),
            "added_cond_kwargs": {"text_embeds": rand(batch, pooled), "time_ids": rand(batch, 6)}}


def step_counts(unet: Any, batch: int, latent: int | None = None) -> dict[str, float]:
    """One UNet call over ``batch`` samples, counted: ``flops``, ``weight_bytes``, ``activation_bytes``
    (2 x the bytes every leaf module outputs), ``intensity`` (FLOPs per byte of both) and ``params``."""
    import torch
    from torch.utils.flop_counter import FlopCounterMode

    written = [0]

    def hook(module: Any, args: Any, out: Any) -> None:
        for t in out if isinstance(out, tuple) else (out,):
            if isinstance(t, torch.Tensor):
                written[0] += t.numel() * t.element_size()

    leaves = [m for m in unet.modules() if not list(m.children())]
    handles = [m.register_forward_hook(hook) for m in leaves]
    try:
        with FlopCounterMode(display=False) as counter, torch.no_grad():
            unet(**unet_inputs(unet, batch, latent))
    finally:
        for h in handles:
            h.remove()
    params = sum(t.numel() for t in unet.parameters())
    weights = sum(t.numel() * t.element_size() for t in unet.parameters())
    flops = float(counter.get_total_flops())
    activations = 2.0 * written[0]
    return {"flops": flops, "weight_bytes": float(weights), "activation_bytes": activations,
            "intensity": flops / (weights + activations), "params": float(params)}


def call_seconds(unet: Any, batches: tuple[int, ...], device: str = "cpu", repeats: int = 5,
                 latent: int | None = None) -> dict[int, np.ndarray]:
    """Seconds of one UNet call at each batch size, ``repeats`` runs each, the sizes interleaved
    (:func:`labkit.hardware.microbench.interleaved_times`) so background load hits them alike."""
    import torch

    inputs = {b: unet_inputs(unet, b, latent) for b in batches}

    def call(b: int) -> Callable[[], None]:
        def run() -> None:
            with torch.no_grad():
                unet(**inputs[b])
        return run

    times = microbench.interleaved_times({str(b): call(b) for b in batches}, device, repeats=repeats)
    return {b: times[str(b)] for b in batches}
