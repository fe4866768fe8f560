"""Attention's peak memory (labkit.llm.attention_memory, chapter 03's "Going further"): the probe sees
a known allocation and not a free call; the written-out attention holds its scores, the fused kernel
does not; the two agree."""

from pathlib import Path

import pytest
import torch

from labkit.llm import attention_memory as am

linux = pytest.mark.skipif(not Path("/proc/self/clear_refs").exists(), reason="needs Linux's /proc")


@linux
def test_the_probe_sees_an_allocation_and_not_a_free_call():
    big = am.peak_extra_bytes(lambda: torch.ones(50_000_000))          # 200 MB, touched
    assert 190e6 < big < 260e6
    assert am.peak_extra_bytes(lambda: None) < 20e6


@linux
def test_written_out_attention_holds_its_scores_and_the_fused_kernel_does_not():
    rows = am.sweep((1024, 2048), heads=9, head_dim=32, repeats=1)   # scores over 32 MB: mapped
    for r in rows:
        assert r["written_out_bytes"] >= r["score_bytes"] == 9 * r["n"] ** 2 * 4
        assert r["fused_bytes"] < r["score_bytes"] / 4
        assert r["max_abs_diff"] < 1e-4 and r["written_out_s"] > 0 and r["fused_s"] > 0
    assert rows[1]["written_out_bytes"] > 2 ** 1.7 * rows[0]["written_out_bytes"]   # grows as n^2
    assert am.score_bytes(2, 8, torch.bfloat16) == 2 * 64 * 2


def test_no_proc_says_what_to_do(monkeypatch, tmp_path):
    monkeypatch.setattr(am, "PROC", tmp_path)
    with pytest.raises(am.MemoryProbeUnavailable, match="Linux or a GPU"):
        am.peak_extra_bytes(lambda: None)
