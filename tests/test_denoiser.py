"""labkit.media.denoiser: FLOPs, bytes and timing of one UNet call (chapter 07, "diffusion is
compute-bound")."""

import numpy as np
import pytest

from labkit.media import denoiser, diffusion


def test_sdxl_unet_from_its_config_has_sdxls_parameter_count():
    # SDXL base's UNet is published at 2,567,463,684 parameters; built on meta, nothing is allocated
    unet = denoiser.sdxl_unet()
    assert sum(p.numel() for p in unet.parameters()) == 2_567_463_684
    assert next(unet.parameters()).device.type == "meta"


@pytest.fixture(scope="module")
def unet():
    pipe, _ = diffusion.load_pipeline("digits-sdxl")
    return pipe.unet


def test_counts_scale_with_the_batch_and_weights_do_not(unet):
    one, four = denoiser.step_counts(unet, 2), denoiser.step_counts(unet, 8)
    assert one["flops"] > 0 and four["flops"] == pytest.approx(4 * one["flops"], rel=0.01)
    assert four["weight_bytes"] == one["weight_bytes"] == 4 * one["params"]  # fp32 weights, read once
    assert four["activation_bytes"] == pytest.approx(4 * one["activation_bytes"], rel=0.01)
    assert four["intensity"] > one["intensity"]  # the same weights serve more samples
    assert one["intensity"] == pytest.approx(one["flops"] / (one["weight_bytes"] + one["activation_bytes"]))


def test_inputs_follow_the_config(unet):
    x = denoiser.unet_inputs(unet, 3, latent=4)
    assert tuple(x["sample"].shape) == (3, unet.config.in_channels, 4, 4)
    assert x["encoder_hidden_states"].shape[-1] == unet.config.cross_attention_dim
    pooled = unet.config.projection_class_embeddings_input_dim - 6 * unet.config.addition_time_embed_dim
    assert tuple(x["added_cond_kwargs"]["text_embeds"].shape) == (3, pooled)
    assert tuple(unet(**x).sample.shape) == (3, unet.config.out_channels, 4, 4)


def test_call_seconds_times_every_batch_with_the_lab_timer(unet, monkeypatch):
    seen = []
    real = denoiser.microbench.interleaved_times

    def spy(fns, device, repeats, **kw):
        seen.append((sorted(fns), device, repeats))
        return real(fns, device, repeats=repeats, **kw)

    monkeypatch.setattr(denoiser.microbench, "interleaved_times", spy)
    out = denoiser.call_seconds(unet, (2, 4), "cpu", repeats=2)
    assert seen == [(["2", "4"], "cpu", 2)]
    assert set(out) == {2, 4} and all(len(t) == 2 and np.all(t > 0) for t in out.values())
