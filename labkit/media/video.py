"""Video generation arithmetic: tokens per clip, attention cost, denoiser passes (chapter 07).

A video diffusion transformer (DiT) denoises a whole clip at once. Its VAE compresses the clip in
time and space; the transformer cuts the latents into patches, and every patch is one token that
attends to every other token of the clip. So tokens grow with frames x height x width, the
attention's FLOPs with the square of that, and every denoising step with guidance runs the
transformer twice (with and without the prompt), as for an image.

The named configuration is an **assumption**, read from the Wan2.1 repository (Wan-Video/Wan2.1,
``wan/configs/wan_t2v_14B.py`` and ``shared_config.py``; the same numbers in
ml-explore/mlx-examples ``video/Wan2.1``): a causal VAE with 4x temporal and 8x spatial
compression (the first frame is kept on its own, so 81 frames become 21 latent frames), patches
of 1x2x2 latents, 40 layers of width 5120 with a 13,824-wide FFN, 512 text tokens for
cross-attention; its ``generate.py`` defaults to 81 frames (5 s at 16 fps) at 1280x720, 50
steps, guidance 5. HunyuanVideo uses the same 4x/8x VAE and 1x2x2 patches.

FLOPs count a multiply-add as 2. Per layer and token: self-attention projections 4 d^2,
cross-attention query/output 2 d^2 (its keys/values on the text tokens), the FFN 2 d x ffn;
attention itself 2 x 2 N d for QK^T and PV over N tokens (N^2 in total). Norms, modulation and
the patch embedding are left out (under 1% at these sizes). Bytes for intensity: weights read once
plus each layer's activations written and read once (an estimate: no N x N matrix is stored, as
with a fused attention kernel). Units: tokens, FLOPs, bytes.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class VideoDiT:
    """A video DiT's shape and its VAE's compression (see the module docstring for the source)."""

    name: str
    dim: int
    layers: int
    ffn: int
    text_tokens: int
    vae_temporal: int  # frames per latent frame (after the first)
    vae_spatial: int  # pixels per latent pixel, each side
    patch: tuple[int, int, int]  # latent frames x height x width per token
    source: str


WAN21_14B = VideoDiT("Wan2.1-T2V-14B (assumed shape)", dim=5120, layers=40, ffn=13824, text_tokens=512,
                     vae_temporal=4, vae_spatial=8, patch=(1, 2, 2),
                     source="Wan-Video/Wan2.1 wan/configs/wan_t2v_14B.py: vae_stride (4, 8, 8), "
                            "patch_size (1, 2, 2), dim 5120, ffn_dim 13824, 40 layers, text_len 512")
WAN_720P = dict(frames=81, height=720, width=1280)  # generate.py's default clip: 5 s at 16 fps
WAN_480P = dict(frames=81, height=480, width=832)
# SDXL's widest attention at 1024x1024: 64x64 positions (128x128 latents after one downsample)
SDXL_ATTENTION_TOKENS_1024 = (1024 // 8 // 2) ** 2


def latent_frames(frames: int, temporal: int) -> int:
    """Latent frames a causal VAE makes of ``frames`` (the first alone, then ``temporal`` per latent);
    ``ValueError`` unless ``frames`` is 1 + a multiple of ``temporal`` (e.g. 81 for 4x)."""
    if frames < 1 or (frames - 1) % temporal:
        raise ValueError(f"a causal VAE with {temporal}x temporal compression takes 1 + {temporal}k frames "
                         f"(e.g. {temporal * 20 + 1}), got {frames}")
    return 1 + (frames - 1) // temporal


def tokens(cfg: VideoDiT, frames: int, height: int, width: int) -> int:
    """Tokens one pass of ``cfg`` sees for a clip (``frames=1``: one image) of ``height`` x ``width``
    pixels; ``ValueError`` when a side is not a multiple of the VAE stride times the patch."""
    pt, ph, pw = cfg.patch
    for side, p in ((height, ph), (width, pw)):
        if side <= 0 or side % (cfg.vae_spatial * p):
            raise ValueError(f"{cfg.name}: height and width must be multiples of {cfg.vae_spatial * p} "
                             f"pixels (VAE {cfg.vae_spatial}x, patch {p}), got {height}x{width}")
    t = latent_frames(frames, cfg.vae_temporal)
    if t % pt:
        raise ValueError(f"{t} latent frames do not split into temporal patches of {pt}")
    return (t // pt) * (height // cfg.vae_spatial // ph) * (width // cfg.vae_spatial // pw)


def params(cfg: VideoDiT) -> int:
    """Transformer weights counted from the shape: per layer 8 d^2 (self- and cross-attention) plus the
    FFN's 2 d x ffn (biases, norms and embeddings left out). Wan2.1-14B: 14.05 B (published: 14 B)."""
    return cfg.layers * (8 * cfg.dim**2 + 2 * cfg.dim * cfg.ffn)


def pass_flops(cfg: VideoDiT, n_tokens: int) -> dict[str, float]:
    """FLOPs of one transformer pass over ``n_tokens``: ``linear`` (projections and FFN on every token,
    cross-attention keys/values on the text), ``self_attention`` (4 N^2 d), ``cross_attention``
    (4 N text d), ``attention`` (both) and ``total``."""
    d, n, text, layers = cfg.dim, n_tokens, cfg.text_tokens, cfg.layers
    linear = layers * (2 * n * (6 * d * d + 2 * d * cfg.ffn) + 2 * text * 2 * d * d)
    self_attn, cross = layers * 4 * n * n * d, layers * 4 * n * text * d
    return {"linear": float(linear), "self_attention": float(self_attn), "cross_attention": float(cross),
            "attention": float(self_attn + cross), "total": float(linear + self_attn + cross)}


def pass_bytes(cfg: VideoDiT, n_tokens: int, bytes_per_value: int = 2) -> dict[str, float]:
    """Bytes one pass moves (estimate): ``weights`` read once; ``activations``: per layer and token about
    12 d + 2 ffn values (q, k, v, attention outputs, projections, norms, residuals, FFN hidden and its
    activation) written and read once; ``total``."""
    w = params(cfg) * bytes_per_value
    act = 2 * cfg.layers * n_tokens * (12 * cfg.dim + 2 * cfg.ffn) * bytes_per_value
    return {"weights": float(w), "activations": float(act), "total": float(w + act)}


def denoiser_passes(steps: int, guided: bool) -> int:
    """Transformer passes for one clip: ``steps`` x 2 with classifier-free guidance, x 1 without."""
    if steps < 1:
        raise ValueError(f"steps must be at least 1, got {steps}")
    return steps * (2 if guided else 1)


def clip_row(cfg: VideoDiT, frames: int, height: int, width: int, steps: int = 50,
             guided: bool = True) -> dict[str, float | int | str]:
    """One table row: ``tokens``, ``latent_frames``, per-pass ``flops``/``attention_share``/
    ``intensity`` (FLOPs/byte, bf16), ``passes``, ``clip_flops`` (all passes), and ``attention_vs_frame``:
    the clip's self-attention FLOPs over one frame's of the same size through the same model
    (``(tokens / frame tokens)^2``)."""
    n = tokens(cfg, frames, height, width)
    f, b = pass_flops(cfg, n), pass_bytes(cfg, n)
    frame = pass_flops(cfg, tokens(cfg, 1, height, width))
    passes = denoiser_passes(steps, guided)
    return dict(name=cfg.name, frames=frames, height=height, width=width, tokens=n,
                latent_frames=latent_frames(frames, cfg.vae_temporal), flops=f["total"],
                attention_share=f["attention"] / f["total"], intensity=f["total"] / b["total"],
                passes=passes, clip_flops=passes * f["total"],
                attention_vs_frame=f["self_attention"] / frame["self_attention"])
