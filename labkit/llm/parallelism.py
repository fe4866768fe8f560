"""How many GPUs a model needs, and how it splits across them (chapter 06b, "Parallelism").

* :func:`min_gpus_rule`: the tutorial's rule of thumb, ``params x bytes/param x 1.8 / VRAM per GPU``
  (the 1.8 stands for KV cache and runtime on top of the weights), before and after the ceiling.
* :func:`valid_tp_sizes`: tensor parallelism gives each GPU a slice of every layer's attention
  heads and MLP columns, so its size must divide the query heads and the MLP's width, and the KV
  heads must split evenly or be copied whole (vLLM replicates them when the size is a multiple of
  the KV heads). vLLM asks nothing more: 3 or 6 GPUs are valid where they divide. Sizes stay
  within one node (8 GPUs on NVLink). That is why the rule's 7 becomes 8: 7 divides none of
  DeepSeek-V3's 128 heads.
* :func:`per_gpu`: bytes each GPU holds under tensor (``tp``) and pipeline (``pp``) parallelism:
  weights, KV cache for a target context x concurrency (from :mod:`labkit.llm.kvcache`),
  activations of one prefill chunk and a fixed runtime reserve.
* :func:`plan`: the smallest valid ``tp`` (then ``pp`` across nodes) whose per-GPU bytes fit
  ``gpu_memory_utilization x`` VRAM, with the ``vllm serve`` command line it implies
  (:func:`vllm_serve_command`).

Sizes in bytes (1 GB = 1e9 bytes, as datasheets and the tutorial use).
"""

from __future__ import annotations

import math
from typing import Any

from .architecture import embedding_params, kv_heads, param_count, text_config
from .kvcache import kv_cache_bytes_for_config
from .memory import bytes_per_param

NODE_GPUS = 8  # GPUs one NVLink/NVSwitch node holds (HGX/DGX H100, H200, B200)


def min_gpus_rule(params: float, dtype: str, vram_bytes: float, overhead: float = 1.8) -> dict[str, float]:
    """The tutorial's estimate: ``exact`` = params x bytes/param x ``overhead`` / ``vram_bytes``
    and ``ceil``, the whole number of GPUs that holds it (before any parallelism constraint)."""
    exact = params * bytes_per_param(dtype) * overhead / vram_bytes
    return {"exact": exact, "ceil": math.ceil(exact - 1e-9)}


def valid_tp_sizes(config: dict[str, Any], max_size: int = NODE_GPUS) -> list[int]:
    """Tensor-parallel sizes this model accepts, up to ``max_size``, by vLLM's rule: sizes that divide
    the attention heads and the MLP's width (per expert for MoE), and whose KV heads either split
    evenly (``kv % tp == 0``) or are replicated whole (``tp % kv == 0``). Not only powers of two."""
    c = text_config(config)
    heads, kv = c["num_attention_heads"], kv_heads(c)
    moe = c.get("moe_intermediate_size") if c.get("num_experts_per_tok") else None
    width = moe or c.get("intermediate_size")
    return [t for t in range(1, max_size + 1)
            if heads % t == 0 and (kv % t == 0 or t % kv == 0) and (not width or width % t == 0)]


def round_up_tp(n_gpus: int, config: dict[str, Any], max_size: int = NODE_GPUS) -> int | None:
    """The smallest valid tensor-parallel size of at least ``n_gpus`` (``None``: none within a node)."""
    return next((t for t in valid_tp_sizes(config, max_size) if t >= n_gpus), None)


def _mlp_width(c: dict[str, Any]) -> int:
    """Hidden width of the MLP one token runs through: dense, or the chosen experts plus shared ones."""
    if c.get("num_experts_per_tok"):
        width = c.get("moe_intermediate_size") or c["intermediate_size"]
        shared = (c.get("n_shared_experts") or 0) * width + (c.get("shared_expert_intermediate_size") or 0)
        return c["num_experts_per_tok"] * width + shared
    return c["intermediate_size"]


def per_gpu(config: dict[str, Any], tp: int = 1, pp: int = 1, dtype: str = "bf16", context: int = 4096,
            concurrency: int = 1, kv_dtype_bytes: float = 2, batched_tokens: int = 8192,
            act_bytes: float = 2, runtime_bytes: float = 2e9) -> dict[str, float]:
    """Bytes on the busiest GPU with ``tp``-way tensor and ``pp``-way pipeline parallelism.

    * ``weights``: the layers of one pipeline stage (``ceil(layers / pp)``) plus one embedding or
      head matrix (all of them when ``pp == 1``), split ``tp`` ways (vocabulary split too).
    * ``kv``: KV cache for ``concurrency`` sequences of ``context`` tokens over the stage's layers;
      tensor parallelism splits the KV heads (a replicated head is stored whole on each GPU), and
      multi-head latent attention (DeepSeek) keeps its latent on every tensor-parallel GPU, as vLLM does.
    * ``activations``: one prefill chunk of ``batched_tokens`` tokens: residual stream and its
      normed copy (2 x hidden) and the MLP's gate and up outputs (2 x width / tp), ``act_bytes`` each.
    * ``runtime``: ``runtime_bytes`` (CUDA context, communication buffers, CUDA graphs: an assumption).
    """
    c = text_config(config)
    layers = c["num_hidden_layers"]
    stage_layers = math.ceil(layers / pp)
    emb = embedding_params(c)
    one_matrix, all_embeddings = emb["matrix"], emb["total"]
    layer_params = param_count(config)["total"] - all_embeddings
    embeds = all_embeddings if pp == 1 else one_matrix
    weights = (layer_params * stage_layers / layers + embeds) * bytes_per_param(dtype) / tp
    kv_total = kv_cache_bytes_for_config(config, context, kv_dtype_bytes, concurrency) * stage_layers / layers
    if c.get("kv_lora_rank"):
        kv = kv_total
    else:
        n_kv = kv_heads(c)
        kv = kv_total * max(n_kv // tp, 1) / n_kv
    act = batched_tokens * (2 * c["hidden_size"] + 2 * _mlp_width(c) / tp) * act_bytes
    total = weights + kv + act + runtime_bytes
    return {"weights": weights, "kv": kv, "activations": act, "runtime": runtime_bytes, "total": total}


def plan(config: dict[str, Any], vram_bytes: float, dtype: str = "bf16", context: int = 4096,
         concurrency: int = 1, gpu_memory_utilization: float = 0.9, node_gpus: int = NODE_GPUS,
         max_pp: int = 16, **per_gpu_kwargs: Any) -> dict[str, Any]:
    """The smallest layout that fits: valid tensor-parallel sizes within a node first, then
    pipeline stages (across nodes) at the largest valid ``tp``. Fits means :func:`per_gpu`'s
    ``total`` <= ``gpu_memory_utilization`` x ``vram_bytes``. Returns ``tp``, ``pp``, ``gpus``,
    ``per_gpu`` (the breakdown), ``budget`` (bytes), ``fits`` (False when even ``max_pp`` stages
    at the largest ``tp`` do not fit; the last layout tried is returned)."""
    budget = gpu_memory_utilization * vram_bytes
    sizes = valid_tp_sizes(config, node_gpus)
    layouts = [(t, 1) for t in sizes] + [(sizes[-1], p) for p in range(2, max_pp + 1)]
    for tp, pp in layouts:
        split = per_gpu(config, tp, pp, dtype, context, concurrency, **per_gpu_kwargs)
        if split["total"] <= budget:
            break
    return {"tp": tp, "pp": pp, "gpus": tp * pp, "per_gpu": split, "budget": budget,
            "fits": split["total"] <= budget, "context": context, "concurrency": concurrency}


def vllm_serve_command(model: str, tp: int = 1, pp: int = 1, max_model_len: int | None = None,
                       gpu_memory_utilization: float = 0.9, extra: list[str] | None = None) -> str:
    """The ``vllm serve`` line for a layout (as :func:`plan` returns it)."""
    parts = ["vllm", "serve", model, "--tensor-parallel-size", str(tp), "--pipeline-parallel-size", str(pp)]
    if max_model_len:
        parts += ["--max-model-len", str(max_model_len)]
    parts += ["--gpu-memory-utilization", f"{gpu_memory_utilization:g}", *(extra or [])]
    return " ".join(parts)
