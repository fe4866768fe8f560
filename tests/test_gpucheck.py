"""labkit.gpucheck off the GPU: the no-GPU exit, the summary, per-section error handling, and the model
and timing sections run on the CPU (the real run needs CUDA). Catalog matching is tested in
test_catalog.py, the decode loop in test_decode.py."""

import json
from typing import Any

import pytest
import torch

from labkit import gpucheck
from labkit.llm import decode, kvcache

TINY = dict(model_type="llama", vocab_size=96, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128)


def test_main_without_cuda_says_so_and_returns_2(monkeypatch, capsys):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert gpucheck.main([]) == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert err.startswith("gpu-check: no CUDA GPU visible to torch (torch ")
    assert torch.__version__ in err and "labkit doctor" in err and err.count("\n") == 1


def test_no_cuda_message_names_the_build():
    assert "built for CUDA 12.8" in gpucheck.no_cuda_message("2.11.0+cu128", "12.8")
    assert "CPU-only build" in gpucheck.no_cuda_message("2.11.0+cpu", None)


def test_fraction_of_the_datasheet():
    assert gpucheck.fraction(2.0, 4.0) == " = 0.50 of the datasheet's 4"
    assert gpucheck.fraction(2.0, None) == ""


def test_summary_table_and_exit_code():
    results = [gpucheck.Result("peaks", "ok", 12.34, "4210 GB/s,\n  bf16 700 TFLOPS"),
               gpucheck.Result("diffusion", "skip", 0.0, "diffusers not installed: No module named 'x'"),
               gpucheck.Result("model", "FAIL", 3.0, "OutOfMemoryError: " + "x" * 200)]
    lines = gpucheck.format_summary(results, width=60).splitlines()
    assert lines[0].split() == ["section", "status", "seconds", "result"]
    assert lines[1].split() == ["peaks", "ok", "12.3", "4210", "GB/s,", "bf16", "700", "TFLOPS"]
    assert lines[2].startswith("diffusion  skip")
    start = lines[0].index("result")
    cut = lines[3][start:]
    assert cut.startswith("OutOfMemoryError: xxx") and cut.endswith("...") and len(cut) == 60
    assert gpucheck.exit_code(results) == 1
    assert gpucheck.exit_code(results[:2]) == 0


def test_a_failing_section_is_reported_and_the_next_still_runs(monkeypatch, capsys):
    ran: list[Any] = []

    def ok(ctx):
        ran.append(("ok", ctx.dtype, ctx.accelerator.name))
        return "fine"

    def broken(ctx):
        ran.append("broken")
        raise RuntimeError("CUDA error: out of memory")

    def absent(ctx):
        raise gpucheck.Skipped("diffusers not installed: No module named 'diffusers'")

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda i=0: "NVIDIA H200")
    monkeypatch.setattr(gpucheck, "dtype_with_note", lambda device: ("bfloat16", "compute dtype bfloat16"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(gpucheck, "SECTIONS", {"a": ("A", ok), "b": ("B", broken), "c": ("C", absent),
                                               "d": ("D", ok)})
    assert gpucheck.main([]) == 1
    out = capsys.readouterr().out
    assert ran == [("ok", "bfloat16", "H200"), "broken", ("ok", "bfloat16", "H200")]
    assert "RuntimeError: CUDA error: out of memory" in out and "Traceback" in out
    assert "FAIL b: RuntimeError" in out and "SKIP diffusers not installed" in out
    summary = out.split("== summary ==")[1].splitlines()[2:]
    assert [row.split()[:2] for row in summary] == [["a", "ok"], ["b", "FAIL"], ["c", "skip"], ["d", "ok"]]

    monkeypatch.setattr(gpucheck, "SECTIONS", {"a": ("A", ok), "c": ("C", absent)})
    assert gpucheck.main([]) == 0  # skipped sections are not failures
    assert gpucheck.main(["--only", "c"]) == 0


def test_only_rejects_unknown_sections(capsys):
    assert gpucheck._parse(["--only", "peaks, timing"]).only == ["peaks", "timing"]
    assert gpucheck._parse([]).only == list(gpucheck.SECTIONS)
    with pytest.raises(SystemExit):
        gpucheck._parse(["--only", "peaks,gpu"])
    assert "unknown section" in capsys.readouterr().err


def test_model_section_on_the_cpu_prints_the_roofline_figures(tmp_path, capsys):
    path = tmp_path / "config.json"
    path.write_text(json.dumps(TINY))
    ctx = gpucheck.Context(config=str(path), tokens=4, prefill=16, device="cpu", dtype="float32",
                           bandwidth=10e9, tflops={"float32": 0.5})  # peaks given: section 2 does not run
    summary = gpucheck.section_model(ctx)
    out = capsys.readouterr().out
    kv = kvcache.kv_cache_bytes_for_config(TINY, 32 + decode.DECODE_WARMUP + 4, 4)
    assert f"KV cache      {kv / 1e6:.1f} MB at {32 + decode.DECODE_WARMUP + 4} tokens" in out
    assert f"the cache object holds {kv / 1e6:.1f} MB" in out
    assert "decode        4 greedy tokens at batch 1 after a 32-token prompt" in out
    assert "prefill       16 tokens in" in out and "bandwidth" not in out.split("\n")[0]
    assert summary.startswith("decode ") and "ceiling; prefill" in summary and summary.endswith("of peak")


def test_timing_section_on_the_cpu(capsys):
    ctx = gpucheck.Context(device="cpu", dtype="float32")
    summary = gpucheck.section_timing(ctx, n=64, k=2)
    out = capsys.readouterr().out
    assert out.startswith("no sync ") and "synchronized " in out
    ratio = float(summary.split("read ")[1].split(" x")[0])
    assert ratio > 0 and f"timer read {ratio:.3f} x" in out


def test_the_model_section_skips_without_transformers(monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "transformers" else real(name, *a))
    with pytest.raises(gpucheck.Skipped, match="transformers not installed"):
        gpucheck.section_model(gpucheck.Context(device="cpu"))
