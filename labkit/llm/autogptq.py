"""The tutorial's AutoGPTQ example (chapter 06, "Quantization"), for CUDA machines; on any other
machine :func:`labkit.llm.gptq.gptq_quantize_model` runs the same algorithm.
"""

from __future__ import annotations

import torch


def autogptq_quantize(model_name: str = "Qwen/Qwen2.5-1.5B", out_dir: str = "./qwen-1.5b-gptq-4bit",
                      bits: int = 4, group_size: int = 128, examples: list[str] | None = None) -> str:
    """The tutorial's AutoGPTQ example (full profile, CUDA only): quantize ``model_name`` to
    ``bits`` with ``group_size`` on ``examples`` and save it to ``out_dir``; returns ``out_dir``.

    Raises ``RuntimeError`` saying why where it cannot run: auto-gptq (last release 0.7.1) refuses
    to quantize without CUDA; its maintained successor gptqmodel needs torch >= 2.14.1, newer than
    the lab's pinned torch 2.13; transformers' own GPTQ integration needs one of those two as its
    backend. On CPU, :func:`gptq_quantize_model` runs the same algorithm."""
    if not torch.cuda.is_available():
        raise RuntimeError(
            "AutoGPTQ needs a CUDA GPU: auto-gptq 0.7.1 refuses to quantize without one, and this "
            "machine has none (torch.cuda.is_available() is False). Its maintained successor "
            "gptqmodel needs torch >= 2.14.1 (the lab pins 2.13), and transformers' GPTQ integration "
            "needs one of the two as its backend. labkit.llm.gptq.gptq_quantize_model runs the same "
            "algorithm on any device.")
    try:
        from auto_gptq import AutoGPTQForCausalLM, BaseQuantizeConfig
    except ImportError as e:
        raise RuntimeError(
            "auto-gptq is not installed: on a CUDA machine `pip install auto-gptq optimum` (it is "
            "built for transformers 4.x and may not import with the lab's transformers 5; gptqmodel "
            f"is its maintained successor) ({e})") from e
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_name)
    config = BaseQuantizeConfig(bits=bits, group_size=group_size)
    model = AutoGPTQForCausalLM.from_pretrained(model_name, config)
    texts = examples or ["Inference engineering optimizes AI model serving."]
    model.quantize([tokenizer(t, return_tensors="pt") for t in texts])
    model.save_quantized(out_dir)
    return out_dir
