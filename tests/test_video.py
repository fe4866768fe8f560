"""labkit.media.video: tokens per clip, FLOPs per pass and denoiser passes against hand-computed values
(chapter 07)."""

from typing import Any, cast

import pytest

from labkit.media import video

WAN = video.WAN21_14B


def test_latent_frames_keep_the_first_frame_alone():
    assert video.latent_frames(81, 4) == 21  # 1 + 80 / 4
    assert video.latent_frames(129, 4) == 33  # HunyuanVideo's default clip
    assert video.latent_frames(1, 4) == 1  # an image
    with pytest.raises(ValueError, match="1 \\+ 4k"):
        video.latent_frames(80, 4)


def test_tokens_per_clip_for_wan_720p_and_480p():
    assert video.tokens(WAN, **video.WAN_720P) == 21 * (720 // 16) * (1280 // 16) == 75_600
    assert video.tokens(WAN, **video.WAN_480P) == 21 * 30 * 52 == 32_760
    assert video.tokens(WAN, 1, 720, 1280) == 3_600  # one frame of the same size
    assert video.SDXL_ATTENTION_TOKENS_1024 == 4_096
    with pytest.raises(ValueError, match="multiples of 16"):
        video.tokens(WAN, 81, 721, 1280)


def test_params_of_the_assumed_shape_are_about_14b():
    assert video.params(WAN) == 40 * (8 * 5120**2 + 2 * 5120 * 13824) == 14_050_918_400


def test_pass_flops_on_a_tiny_shape_by_hand():
    tiny = video.VideoDiT("tiny", dim=4, layers=1, ffn=8, text_tokens=2, vae_temporal=4, vae_spatial=8,
                          patch=(1, 2, 2), source="test")
    f = video.pass_flops(tiny, 3)
    # linear: 2*3*(6*16 + 2*4*8) = 960 on the tokens + 2*2*2*16 = 128 for the text keys/values
    assert f["linear"] == 1088 and f["self_attention"] == 4 * 9 * 4 == 144
    assert f["cross_attention"] == 4 * 3 * 2 * 4 == 96 and f["total"] == 1088 + 144 + 96
    b = video.pass_bytes(tiny, 3)
    assert b["weights"] == 2 * (8 * 16 + 2 * 4 * 8) and b["activations"] == 2 * 3 * (12 * 4 + 16) * 2


def test_denoiser_passes_double_with_guidance():
    assert video.denoiser_passes(50, True) == 100 and video.denoiser_passes(50, False) == 50
    with pytest.raises(ValueError):
        video.denoiser_passes(0, True)


def test_a_720p_clip_is_attention_bound_and_far_above_an_h100s_ridge():
    row: dict[str, Any] = video.clip_row(WAN, **cast(dict[str, Any], video.WAN_720P))
    assert row["attention_vs_frame"] == pytest.approx(21**2)  # 21x the tokens, 441x the self-attention
    assert row["passes"] == 100 and row["clip_flops"] == pytest.approx(100 * row["flops"])
    # by hand: linear 2*75600*(6*5120^2 + 2*5120*13824)*40 + text, attention 4*75600*(75600+512)*5120*40
    linear = 40 * (2 * 75600 * (6 * 5120**2 + 2 * 5120 * 13824) + 2 * 512 * 2 * 5120**2)
    attention = 40 * 4 * 75600 * (75600 + 512) * 5120
    assert row["flops"] == pytest.approx(linear + attention)
    assert row["flops"] == pytest.approx(6.52e15, rel=0.01) and 0.7 < row["attention_share"] < 0.75
    assert row["intensity"] > 10 * 295  # H100 SXM's bf16 ridge is about 295 FLOPs/byte
