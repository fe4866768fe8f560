"""Checks the lab report computes itself (every chapter's ``fn:`` rows in ``data/claims/``).

Two kinds, each a function returning ``{"value", "unit", "note"}``:

* the tutorial's code snippets run against the installed libraries (chapters 00 and 07): does
  ``get_device_properties(0).total_mem`` exist, does ``enable_xformers_memory_efficient_attention()``
  run here;
* expectations for claims only a GPU can measure (chapter 07's "an hour of audio in under 4 s"),
  from datasheets (:mod:`labkit.hardware.catalog`) and the model's published shape.

External figures are inputs with their source; everything else is arithmetic on them.
"""

from __future__ import annotations

import ast
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..hardware.catalog import ACCELERATORS
from ..llm.architecture import SHIPPED, load_config, text_config
from ..media.asr import WHISPER_LARGE_V3

TOKENS_PER_WINDOW = 100  # assumption: speech at ~150 words/minute is ~75 words, ~100 tokens per 30 s


def whisper_window_flops(shape: dict[str, float] = WHISPER_LARGE_V3,
                         tokens: int = TOKENS_PER_WINDOW) -> dict[str, float]:
    """FLOPs of one 30 s window through Whisper: ``encoder`` (2 x weights x positions, plus attention
    scores and mixing 4 x positions² x d per layer), ``decoder`` (2 x weights per token, cross-attention
    to every position, LM head) and ``total``. Weights per layer: 4d² attention + 2 x d x ffn MLP
    (the decoder adds 4d² of cross-attention)."""
    d, ffn, t = shape["d_model"], shape["ffn"], shape["positions"]
    enc_layer, dec_layer = 4 * d * d + 2 * d * ffn, 8 * d * d + 2 * d * ffn
    encoder = shape["encoder_layers"] * (2 * enc_layer * t + 4 * t * t * d)
    per_token = shape["decoder_layers"] * (2 * dec_layer + 4 * t * d) + 2 * d * shape["vocab"]
    decoder = tokens * per_token
    return {"encoder": encoder, "decoder": decoder, "total": encoder + decoder}


def whisper_hour_seconds(accelerator: str = "H100 SXM", dtype: str = "bf16", hour_s: float = 3600.0) -> dict:
    """Seconds to transcribe an hour of audio with Whisper large-v3 at ``accelerator``'s dense peak
    (the compute roof: batched windows are compute-bound), and the share of that peak the tutorial's
    "under 4 s" needs."""
    acc = ACCELERATORS[accelerator]
    windows = hour_s / WHISPER_LARGE_V3["window_s"]
    flops = windows * whisper_window_flops()["total"]
    seconds = flops / (acc.tflops[dtype] * 1e12)
    return {"value": seconds, "unit": "s",
            "note": f"{windows:.0f} windows x {flops / windows / 1e12:.2f} TFLOP (Whisper large-v3, "
                    f"~{TOKENS_PER_WINDOW} tokens each) at the {accelerator} {dtype} peak of "
                    f"{acc.tflops[dtype]:.0f} TFLOPS: {seconds:.2f} s; under 4 s needs "
                    f"{seconds / 4:.0%} of that peak"}


def _declared_fields(stub: Path, cls: str) -> set[str] | None:
    """Attribute names class ``cls`` declares in a type stub (``None`` when the stub or class is absent)."""
    try:
        tree = ast.parse(stub.read_text())
    except (OSError, SyntaxError):
        return None
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and node.name == cls:
            return {s.target.id for s in node.body
                    if isinstance(s, ast.AnnAssign) and isinstance(s.target, ast.Name)}
    return None


def torch_total_mem() -> dict[str, Any]:
    """Whether ``torch.cuda.get_device_properties(0).total_mem`` (the tutorial's chapter 00 snippet)
    exists: on a CUDA machine the real object is asked; elsewhere the fields torch declares for it
    in its type stub (``torch/_C/__init__.pyi``), the same on every build."""
    import torch

    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        has, how = hasattr(props, "total_mem"), f"asked {props.name}'s properties"
    else:
        stub = Path(torch.__file__).parent / "_C" / "__init__.pyi"
        fields = _declared_fields(stub, "_CudaDeviceProperties")
        if fields is None:
            return {"value": None, "unit": "", "note": f"{stub} declares no CUDA device properties"}
        has = "total_mem" in fields
        how = (f"torch {torch.__version__} declares {', '.join(f for f in sorted(fields) if 'mem' in f)} "
               "for CUDA device properties")
    return {"value": has, "unit": "", "note": how}


def xformers_snippet() -> dict[str, Any]:
    """Runs what the tutorial's ``pipe.enable_xformers_memory_efficient_attention()`` (chapter 07)
    does to each attention layer, on a tiny diffusers ``Attention``: ``True`` when it runs here,
    else ``False`` with the exception it raises."""
    from diffusers.models.attention_processor import Attention

    layer = Attention(query_dim=8, heads=1, dim_head=8)
    try:
        layer.set_use_memory_efficient_attention_xformers(True)
    except Exception as e:  # noqa: BLE001 - any failure is the answer
        return {"value": False, "unit": "", "note": f"{type(e).__name__}: {' '.join(str(e).split())}"}
    return {"value": True, "unit": "", "note": "xformers is installed and a CUDA GPU answers"}


# The tutorial's own early-2026 GitHub star counts ("Inference Engines: vLLM vs SGLang vs TensorRT-LLM").
TUTORIAL_STARS = {"vLLM": 50_000, "SGLang": 15_000, "TensorRT-LLM": 12_000}


def star_ratio() -> dict[str, Any]:
    """The tutorial's "roughly double" (chapter 05) re-done from its own star counts: vLLM's stars over
    the larger of the other two engines' (the ratio closest to double)."""
    others = {k: v for k, v in TUTORIAL_STARS.items() if k != "vLLM"}
    ratios = {k: TUTORIAL_STARS["vLLM"] / v for k, v in others.items()}
    closest = min(ratios.values())
    vllm = TUTORIAL_STARS["vLLM"] / 1e3
    return {"value": closest, "unit": "x",
            "note": "; ".join(f"vLLM / {k}: {vllm:.0f}K / {v / 1e3:.0f}K = {ratios[k]:.2f}x"
                              for k, v in others.items())}


def linear_bias_share() -> dict[str, Any]:
    """Share of the lab's LLM configs (the shipped ``data/configs`` and the bundled model's) whose
    attention or MLP linear layers add a bias, as ``y = Wx + b`` has them (chapter 03). A config without
    the flag uses its architecture's default, no bias (Llama, Qwen3 and DeepSeek-V3 alike)."""
    names = [*SHIPPED, "smollm2-135m"]
    flags = ("attention_bias", "mlp_bias", "qkv_bias")
    with_bias = [n for n in names if any(text_config(load_config(n)).get(f) for f in flags)]
    listed = f": {', '.join(with_bias)}" if with_bias else ""
    return {"value": len(with_bias) / len(names), "unit": "fraction",
            "note": f"{len(with_bias)} of {len(names)} configs ({', '.join(names)}) add a bias to their "
                    f"linear layers{listed}"}


def h100_bandwidth_tbs() -> dict[str, Any]:
    """The H100 SXM's memory bandwidth in TB/s as the lab's datasheet catalog holds it (chapter 04)."""
    acc = ACCELERATORS["H100 SXM"]
    return {"value": acc.bandwidth_bytes_per_s / 1e12, "unit": "TB/s", "note": f"catalog: {acc.source}"}


COMPUTED: dict[str, Callable[[], dict[str, Any]]] = {
    "h100_bandwidth_tbs": h100_bandwidth_tbs,
    "star_ratio": star_ratio,
    "linear_bias_share": linear_bias_share,
    "torch_total_mem": torch_total_mem,
    "xformers_snippet": xformers_snippet,
    "whisper_hour_h100_s": whisper_hour_seconds,
}


def compute(name: str) -> dict[str, Any]:
    """Run the computed check ``name``; a failure becomes ``value None`` with the error as the note,
    so one broken check cannot stop the report. ``KeyError`` for an unknown name."""
    if name not in COMPUTED:
        raise KeyError(f"no computed check {name!r}; known: {', '.join(COMPUTED)}")
    try:
        return COMPUTED[name]()
    except Exception as e:  # noqa: BLE001 - reported in the row instead
        return {"value": None, "unit": "", "note": f"could not compute: {type(e).__name__}: {e}"}
