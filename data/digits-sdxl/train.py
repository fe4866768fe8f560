"""Train the tiny SDXL-architecture pipeline in this folder on scikit-learn's bundled digits.

Chapter 07 only runs inference; this script made the weights (one CPU thread, several minutes):

    OMP_NUM_THREADS=1 .venv/bin/python data/digits-sdxl/train.py

What it builds is an ordinary SDXL pipeline, just small: two CLIP text encoders (the second with a
projection, giving SDXL's pooled embedding), a byte-level BPE CLIP tokenizer made in code for the
prompt words, an AutoencoderKL (16x16x3 pixels <-> 8x8x4 latents), a UNet2DConditionModel with
cross-attention and SDXL's ``text_time`` conditioning, and the SDXL Euler scheduler. It trains

1. a digit classifier (the judge chapter 07 scores images with),
2. the VAE (reconstruction + a small KL term), then sets ``scaling_factor`` to 1/std of the latents,
3. the UNet and both text encoders together on the epsilon-prediction loss with a DDPM schedule
   (``clip_sample=False``), dropping the prompt 15% of the time (zeroed embeddings, which is what
   the pipeline feeds as the unconditional half when ``force_zeros_for_empty_prompt`` is set) so
   that classifier-free guidance has an unconditional model to push against.

Everything is saved with ``save_pretrained`` (safetensors) so ``StableDiffusionXLPipeline.from_pretrained``
loads it unchanged; ``train_log.json`` records losses, accuracies and times.
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import sys
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent.parent))

from labkit import digits  # noqa: E402

TIME_IDS = [digits.SIZE, digits.SIZE, 0, 0, digits.SIZE, digits.SIZE]  # original size, crop, target size


def bytes_to_unicode() -> dict[int, str]:
    """GPT-2/CLIP byte-level alphabet: every byte maps to a printable unicode character."""
    bs = (
        list(range(ord("!"), ord("~") + 1))
        + list(range(ord("¡"), ord("¬") + 1))
        + list(range(ord("®"), ord("ÿ") + 1))
    )
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, (chr(c) for c in cs), strict=True))


def build_tokenizer():
    """A CLIP tokenizer whose BPE merges spell every prompt word as one token. Built
    deterministically (no BPE training, whose tie-breaking differs between runs)."""
    from transformers import CLIPTokenizer

    alphabet = list(bytes_to_unicode().values())
    vocab: dict[str, int] = {}
    for tok in ["<|startoftext|>", "<|endoftext|>"] + alphabet + [c + "</w>" for c in alphabet]:
        vocab.setdefault(tok, len(vocab))
    words = sorted(
        {w for t in digits.TEMPLATES for w in t.replace("{word}", "").replace("{num}", "").split()}
        | set(digits.WORDS)
    )
    merges: list[tuple[str, str]] = []
    for w in words:  # merge left to right: ("s","e"), ("se","v"), ..., ("seve","n</w>")
        pieces = list(w[:-1]) + [w[-1] + "</w>"]
        left = pieces[0]
        for right in pieces[1:]:
            if (left, right) not in merges:
                merges.append((left, right))
            left = left + right
            vocab.setdefault(left, len(vocab))
    return CLIPTokenizer(vocab=vocab, merges=merges, model_max_length=77)


def build(tok):
    """Untrained components: (text_encoder, text_encoder_2, vae, unet)."""
    from diffusers import AutoencoderKL, UNet2DConditionModel
    from transformers import CLIPTextConfig, CLIPTextModel, CLIPTextModelWithProjection

    ids = dict(bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
    te_cfg = dict(
        vocab_size=len(tok),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        max_position_embeddings=77,
        hidden_act="quick_gelu",
        **ids,
    )
    te = CLIPTextModel(CLIPTextConfig(**te_cfg))
    te2 = CLIPTextModelWithProjection(CLIPTextConfig(**te_cfg, projection_dim=32))
    vae = AutoencoderKL(
        in_channels=3,
        out_channels=3,
        latent_channels=4,
        sample_size=digits.SIZE,
        down_block_types=("DownEncoderBlock2D",) * 2,
        up_block_types=("UpDecoderBlock2D",) * 2,
        block_out_channels=(32, 64),
        layers_per_block=1,
        norm_num_groups=16,
        force_upcast=False,
    )
    unet = UNet2DConditionModel(
        sample_size=digits.SIZE // 2,
        in_channels=4,
        out_channels=4,
        layers_per_block=1,
        down_block_types=("DownBlock2D", "CrossAttnDownBlock2D"),
        up_block_types=("CrossAttnUpBlock2D", "UpBlock2D"),
        block_out_channels=(32, 64),
        attention_head_dim=(2, 4),
        norm_num_groups=16,
        cross_attention_dim=te.config.hidden_size + te2.config.hidden_size,
        use_linear_projection=True,
        transformer_layers_per_block=1,
        addition_embed_type="text_time",
        addition_time_embed_dim=8,
        projection_class_embeddings_input_dim=te2.config.projection_dim + 8 * len(TIME_IDS),
    )
    return te, te2, vae, unet


def encode(prompts: list[str], tok, te, te2) -> tuple[torch.Tensor, torch.Tensor]:
    """SDXL text conditioning exactly as the pipeline computes it: penultimate hidden states of both
    encoders concatenated (prompt_embeds) and encoder 2's projected pooled output (pooled)."""
    ids = tok(
        prompts, padding="max_length", max_length=tok.model_max_length, truncation=True, return_tensors="pt"
    ).input_ids
    o1 = te(ids, output_hidden_states=True)
    o2 = te2(ids, output_hidden_states=True)
    return torch.cat([o1.hidden_states[-2], o2.hidden_states[-2]], dim=-1), o2.text_embeds


def progress(tag: str, step: int, steps: int, losses: list[float], t0: float) -> None:
    if step % 200 == 0 or step == steps - 1:
        print(
            f"{tag} {step:5d} loss {np.mean(losses[-200:]):.4f} ({time.perf_counter() - t0:.0f} s)",
            flush=True,
        )


def train_classifier(x: np.ndarray, y: np.ndarray, seed: int, out: Path, log: dict) -> None:
    torch.manual_seed(seed)
    perm = np.random.default_rng(seed).permutation(len(x))
    test, train = perm[:360], perm[360:]
    xt, yt = torch.from_numpy(x[:, None]), torch.from_numpy(y)
    model = digits.classifier()
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=1e-4)
    t0 = time.perf_counter()
    for _ in range(800):
        idx = torch.from_numpy(np.random.choice(train, 64))
        xb = xt[idx] + 0.1 * torch.randn_like(xt[idx])  # a little noise: generated digits are not clean scans
        loss = F.cross_entropy(model(xb), yt[idx])
        opt.zero_grad()
        loss.backward()
        opt.step()
    model.eval()
    with torch.no_grad():
        acc = (model(xt[test]).argmax(1) == yt[test]).float().mean().item()
    from safetensors.torch import save_file

    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(out / digits.CLASSIFIER_FILE))
    log["classifier"] = {
        "held_out_accuracy": acc,
        "held_out_images": len(test),
        "seconds": time.perf_counter() - t0,
    }
    print(f"classifier: held-out accuracy {acc:.3f} ({time.perf_counter() - t0:.0f} s)", flush=True)


def train_vae(vae, x: torch.Tensor, steps: int, log: dict) -> None:
    opt = torch.optim.AdamW(vae.parameters(), lr=2e-3)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, steps)
    t0, losses = time.perf_counter(), []
    vae.train()
    for step in range(steps):
        xb = x[torch.randint(0, len(x), (64,))]
        post = vae.encode(xb).latent_dist
        rec = vae.decode(post.sample()).sample
        kl = post.kl().mean() / xb[0].numel()
        loss = F.mse_loss(rec, xb) + 1e-3 * kl
        opt.zero_grad()
        loss.backward()
        opt.step()
        sched.step()
        losses.append(loss.item())
        progress("vae", step, steps, losses, t0)
    vae.eval()
    log["vae"] = {
        "steps": steps,
        "final_loss": float(np.mean(losses[-100:])),
        "seconds": time.perf_counter() - t0,
    }


def train_unet(unet, te, te2, tok, latent_mean, latent_std, labels, steps: int, seed: int, log: dict) -> None:
    from diffusers import DDPMScheduler

    noise_sched = DDPMScheduler(
        num_train_timesteps=1000,
        beta_start=0.00085,
        beta_end=0.012,
        beta_schedule="scaled_linear",
        clip_sample=False,
        prediction_type="epsilon",
    )
    params = list(unet.parameters()) + list(te.parameters()) + list(te2.parameters())
    opt = torch.optim.AdamW(params, lr=1e-3, weight_decay=1e-4)
    warm = max(1, min(100, steps // 10))  # linear warm-up, then cosine decay to zero
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: min(1.0, (s + 1) / warm) * 0.5 * (1 + np.cos(np.pi * min(1.0, s / steps)))
    )
    rng = random.Random(seed)
    all_prompts = [digits.prompt(d, t) for d in range(10) for t in range(len(digits.TEMPLATES))]
    index = {p: i for i, p in enumerate(all_prompts)}
    time_ids = torch.tensor([TIME_IDS], dtype=torch.float32)
    t0, losses = time.perf_counter(), []
    unet.train(), te.train(), te2.train()
    for step in range(steps):
        idx = torch.randint(0, len(labels), (128,))
        # Every distinct prompt goes through the text encoders once per step (40 of them), then is gathered.
        emb, pooled = encode(all_prompts, tok, te, te2)
        chosen = [index[digits.prompt(int(labels[i]), rng.randrange(len(digits.TEMPLATES)))] for i in idx]
        emb, pooled = emb[chosen], pooled[chosen]
        keep = (torch.rand(len(idx)) > 0.15).float()  # prompt dropout for classifier-free guidance
        emb, pooled = emb * keep[:, None, None], pooled * keep[:, None]
        lat = latent_mean[idx] + latent_std[idx] * torch.randn_like(latent_mean[idx])
        noise = torch.randn_like(lat)
        t = torch.randint(0, noise_sched.config.num_train_timesteps, (len(idx),))
        noisy = noise_sched.add_noise(lat, noise, t)
        pred = unet(
            noisy,
            t,
            encoder_hidden_states=emb,
            added_cond_kwargs={"text_embeds": pooled, "time_ids": time_ids.expand(len(idx), -1)},
        ).sample
        loss = F.mse_loss(pred, noise)
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        sched.step()
        losses.append(loss.item())
        progress("unet", step, steps, losses, t0)
    unet.eval(), te.eval(), te2.eval()
    log["unet"] = {
        "steps": steps,
        "batch": 128,
        "final_loss": float(np.mean(losses[-200:])),
        "seconds": time.perf_counter() - t0,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path, default=HERE)
    ap.add_argument("--vae-steps", type=int, default=800)
    ap.add_argument("--unet-steps", type=int, default=2500)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(args.seed)
    np.random.seed(args.seed)
    from diffusers import EulerDiscreteScheduler, StableDiffusionXLPipeline

    t_start = time.perf_counter()
    log: dict = {"seed": args.seed, "threads": 1, "torch": torch.__version__}
    x, y = digits.load_digits()
    args.out.mkdir(parents=True, exist_ok=True)
    train_classifier(x, y, args.seed, args.out, log)

    tok = build_tokenizer()
    te, te2, vae, unet = build(tok)
    pix = torch.from_numpy(x)[:, None].expand(-1, 3, -1, -1).contiguous()
    train_vae(vae, pix, args.vae_steps, log)
    with torch.no_grad():
        post = vae.encode(pix).latent_dist
        mean, std = post.mean, post.std
        scale = 1.0 / post.sample().std().item()
    vae.register_to_config(scaling_factor=scale)
    log["vae"]["scaling_factor"] = scale

    train_unet(unet, te, te2, tok, mean * scale, std * scale, y, args.unet_steps, args.seed, log)

    scheduler = EulerDiscreteScheduler(
        num_train_timesteps=1000,
        beta_start=0.00085,
        beta_end=0.012,
        beta_schedule="scaled_linear",
        timestep_spacing="leading",
        steps_offset=1,
        prediction_type="epsilon",
    )
    pipe = StableDiffusionXLPipeline(
        vae=vae,
        text_encoder=te,
        text_encoder_2=te2,
        tokenizer=tok,
        tokenizer_2=tok,
        unet=unet,
        scheduler=scheduler,
        add_watermarker=False,
    )
    for sub in ("vae", "unet", "text_encoder", "text_encoder_2", "tokenizer", "tokenizer_2", "scheduler"):
        shutil.rmtree(args.out / sub, ignore_errors=True)
    pipe.save_pretrained(args.out, safe_serialization=True)
    counts = {
        n: sum(p.numel() for p in m.parameters())
        for n, m in [("unet", unet), ("vae", vae), ("text_encoder", te), ("text_encoder_2", te2)]
    }
    log["parameters"] = counts
    log["total_seconds"] = time.perf_counter() - t_start
    (args.out / "train_log.json").write_text(json.dumps(log, indent=2) + "\n")
    print(json.dumps(log, indent=2))


if __name__ == "__main__":
    main()
