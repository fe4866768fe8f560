"""labkit.hardware.gpucheck off the GPU: the no-GPU exit, catalog matching, the summary, per-section error
handling and the decode loop's cache threading (with fakes; the real run needs CUDA)."""

from types import SimpleNamespace

import pytest
import torch

from labkit.hardware import gpucheck
from labkit.hardware.catalog import ACCELERATORS, Accelerator


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


@pytest.mark.parametrize(("gpu", "entry"), [
    ("NVIDIA H100 80GB HBM3", "H100 SXM"),
    ("NVIDIA H100 PCIe", None),  # lower clocks and bandwidth than the SXM datasheet
    ("NVIDIA H100 NVL", None),
    ("NVIDIA H200", "H200"),
    ("NVIDIA H200 NVL", None),
    ("NVIDIA GH200 480GB", None),
    ("NVIDIA B200", "B200"),
    ("NVIDIA A100-SXM4-80GB", "A100 80GB"),
    ("NVIDIA A100 80GB PCIe", "A100 80GB"),
    ("NVIDIA A100-PCIE-40GB", None),
    ("NVIDIA L4", "L4"),
    ("NVIDIA L40S", None),
    ("NVIDIA GeForce RTX 3060", "RTX 3060 12GB"),
    ("NVIDIA GeForce RTX 3060 Ti", None),
    ("NVIDIA GeForce RTX 4090", "RTX 4090"),
    ("NVIDIA GeForce RTX 4090 D", None),
    ("Tesla T4", None),
])
def test_match_accelerator_by_torch_name(gpu, entry):
    acc = gpucheck.match_accelerator(gpu)
    assert (acc.name if acc else None) == entry


def test_match_rules_name_catalog_entries_and_others_match_by_words():
    assert set(gpucheck.MATCH_RULES) <= set(ACCELERATORS)  # a renamed entry must not silently drop its rule
    l40s = Accelerator("L40S", 48e9, 864e9, {"fp16": 362.0})
    assert gpucheck.match_accelerator("NVIDIA L40S", {"L40S": l40s}) is l40s
    assert gpucheck.match_accelerator("NVIDIA L40", {"L40S": l40s}) is None


def test_datasheet_tflops_and_fraction():
    h100 = ACCELERATORS["H100 SXM"]
    assert gpucheck.datasheet_tflops(h100, "bfloat16") == h100.tflops["bf16"]
    assert gpucheck.datasheet_tflops(h100, "float32") == h100.tflops["fp32"]
    assert gpucheck.datasheet_tflops(h100, "float32", tf32=True) == h100.tflops["tf32"]
    assert gpucheck.datasheet_tflops(ACCELERATORS["B200"], "float32") is None  # no fp32 figure listed
    assert gpucheck.datasheet_tflops(None, "float16") is None
    assert gpucheck.fraction(2.0, 4.0) == " = 0.50 of the datasheet's 4"
    assert gpucheck.fraction(2.0, None) == ""


@pytest.mark.parametrize(("version", "kwarg"), [
    ("4.51.3", "torch_dtype"), ("4.55.4", "torch_dtype"), ("4.56.0", "dtype"),
    ("4.57.0.dev0", "dtype"), ("5.0.0rc1", "dtype"), ("5.24.0", "dtype"),
])
def test_dtype_kwarg_follows_transformers_version(version, kwarg):
    assert gpucheck.dtype_kwarg(version) == kwarg


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
    ran = []

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
    monkeypatch.setattr(gpucheck, "compute_dtype", lambda device: ("bfloat16", "compute dtype bfloat16"))
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


class FakeLM:
    """Logits put all weight on (last input token + 1) % vocab; the cache is the list of fed tokens."""

    vocab = 50

    def __init__(self):
        self.fed = []

    def __call__(self, ids, use_cache=True, **kw):
        return self.forward(ids, use_cache=use_cache, **kw)

    def forward(self, ids, cache=None, use_cache=True):
        cache = (cache or []) + ids[0].tolist()
        self.fed.append(ids[0].tolist())
        logits = torch.zeros(1, ids.shape[1], self.vocab)
        logits[0, -1, (int(ids[0, -1]) + 1) % self.vocab] = 1.0
        return SimpleNamespace(logits=logits, cache=cache)


class OldFakeLM(FakeLM):
    """The same, with the pre-5.x keyword and output field ``past_key_values``."""

    def forward(self, ids, past_key_values=None, use_cache=True):
        out = super().forward(ids, cache=past_key_values, use_cache=use_cache)
        return SimpleNamespace(logits=out.logits, past_key_values=out.cache)


@pytest.mark.parametrize(("cls", "name"), [(FakeLM, "cache"), (OldFakeLM, "past_key_values")])
def test_greedy_decode_threads_the_cache_and_feeds_the_argmax(cls, name):
    model = cls()
    assert gpucheck.cache_argument(model) == name
    times, cache = gpucheck.greedy_decode(model, torch.tensor([[7, 8, 9]]), tokens=4, device="cpu", warmup=2)
    assert len(times) == 4 and (times > 0).all()
    assert model.fed[0] == [7, 8, 9] and model.fed[1:] == [[10], [11], [12], [13], [14], [15]]
    assert cache == [7, 8, 9, 10, 11, 12, 13, 14, 15]  # prompt + warmup + timed tokens
