"""Explore a model's architecture from its ``config.json`` (chapter 03, "How LLMs work").

:func:`load_config` reads a config: the public configs shipped in ``data/configs``
(``Qwen3-4B``, ``Llama-3-8B``, ``DeepSeek-V3``, ``Qwen3-235B-A22B``), the bundled model's own
(``smollm2-135m``), a local file or folder, or a hub repository (``Qwen/Qwen3-4B``, online only).
:func:`param_count` counts parameters from the config alone, weight matrix by weight matrix,
for dense llama-style models (Llama, Qwen2/3, Mistral), Qwen3-MoE / Mixtral-style mixtures of
experts and DeepSeek-V3 (multi-head latent attention, shared + routed experts).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from ..models import LOCAL_LLMS, llm_dir
from ..paths import DATA, data
from ..settings import profile

CONFIG_DIR = DATA / "configs"
# Shipped copies and the hub repository each was copied from (see data/configs/README.md).
SHIPPED: dict[str, str] = {
    "Qwen3-4B": "Qwen/Qwen3-4B",
    "Llama-3-8B": "meta-llama/Meta-Llama-3-8B",
    "DeepSeek-V3": "deepseek-ai/DeepSeek-V3",
    "Qwen3-235B-A22B": "Qwen/Qwen3-235B-A22B",
}


def load_config(name: str | None = None) -> dict[str, Any]:
    """A model's config as a dict.

    ``name``: a shipped name (see ``SHIPPED``), a bundled model (``smollm2-135m``), a path to a
    ``config.json`` or to a folder holding one, or a hub repository such as ``Qwen/Qwen3-4B``
    (downloads ``config.json`` only: needs a network). ``None``: the active profile's LLM.
    Multimodal configs that nest the language model under ``text_config`` are returned whole.
    """
    name = name or profile().llm
    if name in SHIPPED:
        return json.loads(data("configs", f"{name}.json").read_text())
    if name in LOCAL_LLMS:
        return json.loads((llm_dir("float32", name) / "config.json").read_text())
    path = Path(name).expanduser()
    if path.is_dir():
        path = path / "config.json"
    if path.is_file():
        return json.loads(path.read_text())
    if "/" in name and not path.exists() and name.count("/") == 1 and not name.startswith((".", "/")):
        from huggingface_hub import hf_hub_download

        try:
            return json.loads(Path(hf_hub_download(name, "config.json")).read_text())
        except Exception as e:  # offline, gated repository, typo: say what works instead
            raise ValueError(
                f"could not fetch config.json of {name!r} from the hub ({type(e).__name__}: {e}). "
                f"Offline, use a shipped config: {sorted(SHIPPED)}, or 'smollm2-135m'."
            ) from e
    raise ValueError(
        f"unknown model {name!r}: use a shipped config {sorted(SHIPPED)}, 'smollm2-135m', a path to a "
        "config.json, or a hub repository name like 'Qwen/Qwen3-4B' (online)."
    )


def text_config(config: dict[str, Any]) -> dict[str, Any]:
    """The language-model part of a config (``text_config`` of multimodal models, else itself)."""
    return config["text_config"] if "hidden_size" not in config and "text_config" in config else config


def kv_heads(c: dict[str, Any]) -> int:
    """Key/value heads of a (text) config: ``num_key_value_heads``, else one per query head (MHA)."""
    return c.get("num_key_value_heads") or c["num_attention_heads"]


def head_dim(c: dict[str, Any]) -> int:
    """Width of one attention head: ``head_dim`` where the config sets it (Qwen3 does), else
    hidden size / heads; for DeepSeek's MLA the query/key head (no-RoPE part + RoPE part)."""
    if c.get("kv_lora_rank"):
        return c["qk_nope_head_dim"] + c["qk_rope_head_dim"]
    return c.get("head_dim") or c["hidden_size"] // c["num_attention_heads"]


def _attention_params(c: dict[str, Any]) -> int:
    h, n_heads = c["hidden_size"], c["num_attention_heads"]
    if c.get("kv_lora_rank"):  # DeepSeek multi-head latent attention
        qk_head = c["qk_nope_head_dim"] + c["qk_rope_head_dim"]
        q_rank = c.get("q_lora_rank")
        q = h * q_rank + q_rank + q_rank * n_heads * qk_head if q_rank else h * n_heads * qk_head
        kv_rank = c["kv_lora_rank"]
        kv = h * (kv_rank + c["qk_rope_head_dim"]) + kv_rank
        kv += kv_rank * n_heads * (c["qk_nope_head_dim"] + c["v_head_dim"])
        return q + kv + n_heads * c["v_head_dim"] * h
    hd = head_dim(c)
    q, kv = n_heads * hd, kv_heads(c) * hd
    params = h * q + 2 * h * kv + q * h
    if c.get("attention_bias") or c.get("model_type") in {"qwen2", "qwen2_moe"}:
        params += q + 2 * kv  # q/k/v biases (Qwen2 always has them)
    if c.get("model_type", "").startswith("qwen3"):
        params += 2 * hd  # per-head RMSNorm on queries and keys
    return params


def _moe_layout(c: dict[str, Any]) -> tuple[int, int, int, int, set[int]]:
    """(routed experts, experts per token, shared-expert hidden width, expert hidden width,
    indices of MoE layers); no experts -> (0, 0, 0, 0, empty set)."""
    n_layers = c["num_hidden_layers"]
    n_routed = c.get("n_routed_experts") or c.get("num_experts") or c.get("num_local_experts") or 0
    if not n_routed:
        return 0, 0, 0, 0, set()
    expert_width = c.get("moe_intermediate_size") or c["intermediate_size"]
    if "first_k_dense_replace" in c:  # DeepSeek
        freq = c.get("moe_layer_freq", 1)
        moe = {i for i in range(c["first_k_dense_replace"], n_layers) if i % freq == 0}
    else:  # Qwen-MoE, Mixtral
        step = c.get("decoder_sparse_step", 1) or 1
        only_mlp = set(c.get("mlp_only_layers") or [])
        moe = {i for i in range(n_layers) if i not in only_mlp and (i + 1) % step == 0}
    shared = (c.get("n_shared_experts") or 0) * expert_width + (c.get("shared_expert_intermediate_size") or 0)
    return n_routed, c["num_experts_per_tok"], shared, expert_width, moe


def param_count(config: dict[str, Any]) -> dict[str, int]:
    """Parameters of a decoder-only transformer computed from its config.

    Returns ``{"total": int, "active": int}``: all weights, and those one token uses (shared
    weights plus ``num_experts_per_tok`` routed experts per MoE layer; embeddings included,
    as model cards count them). Dense models have ``active == total``. Multi-token-prediction
    modules (DeepSeek-V3's ``num_nextn_predict_layers``) are not counted, as in the 671 B figure.
    """
    c = text_config(config)
    h, n_layers = c["hidden_size"], c["num_hidden_layers"]
    mlp = lambda width: 3 * h * width  # SwiGLU: gate, up, down
    n_routed, top_k, shared, expert_width, moe_layers = _moe_layout(c)
    per_layer_fixed = _attention_params(c) + 2 * h  # attention + two RMSNorms
    total = active = 0
    for i in range(n_layers):
        total += per_layer_fixed
        active += per_layer_fixed
        if i in moe_layers:
            router = n_routed * h + (n_routed if c.get("topk_method") == "noaux_tc" else 0)
            shared_p = mlp(shared) + (h if c.get("shared_expert_intermediate_size") else 0)
            total += router + shared_p + n_routed * mlp(expert_width)
            active += router + shared_p + top_k * mlp(expert_width)
        else:
            total += mlp(c["intermediate_size"])
            active += mlp(c["intermediate_size"])
    embeddings = embedding_params(c)["total"]
    return {"total": total + embeddings, "active": active + embeddings}


def embedding_params(config: dict[str, Any]) -> dict[str, int]:
    """Parameters outside the decoder layers: ``matrix`` (one vocab x hidden matrix), ``matrices``
    (the input embedding and the LM head; one matrix when ``tie_word_embeddings``) and ``total``
    (``matrices`` plus the final norm's ``hidden_size`` weights)."""
    c = text_config(config)
    one = c["vocab_size"] * c["hidden_size"]
    matrices = one * (1 if c.get("tie_word_embeddings", False) else 2)
    return {"matrix": one, "matrices": matrices, "total": matrices + c["hidden_size"]}


def summary(config: dict[str, Any]) -> dict[str, Any]:
    """The fields the tutorial prints (architecture, hidden size, layers, heads, vocabulary) plus
    KV heads, head dim, experts and the parameter counts, as one flat dict."""
    c = text_config(config)
    n_routed, top_k, *_ = _moe_layout(c)
    counts = param_count(config)
    return {
        "architecture": (config.get("architectures") or [c.get("model_type")])[0],
        "hidden_size": c["hidden_size"],
        "layers": c["num_hidden_layers"],
        "heads": c["num_attention_heads"],
        "kv_heads": kv_heads(c),
        "head_dim": head_dim(c),
        "vocab_size": c["vocab_size"],
        "experts": n_routed,
        "experts_per_token": top_k,
        "params_total": counts["total"],
        "params_active": counts["active"],
    }


# The published sizes (total, active) in billions of parameters that chapter 03 compares its counts with.
PUBLISHED_B: dict[str, tuple[float, float]] = {
    "Qwen3-4B": (4.0, 4.0), "Llama-3-8B": (8.03, 8.03), "DeepSeek-V3": (671, 37),
    "Qwen3-235B-A22B": (235, 22), "smollm2-135m": (0.135, 0.135)}


def config_row(name: str, config: dict[str, Any] | None = None) -> dict[str, Any]:
    """One table row describing a model's config (chapter 03): the fields a reader looks up first
    (architecture class, width, depth, heads, KV heads, vocabulary, experts) and the parameter count
    derived from them, in billions, beside the published size when :data:`PUBLISHED_B` has it."""
    s = summary(config if config is not None else load_config(name))
    pub = PUBLISHED_B.get(name)
    total, active = s["params_total"] / 1e9, s["params_active"] / 1e9
    return {"model": name, "class": s["architecture"], "layers": s["layers"], "hidden": s["hidden_size"],
            "heads": f"{s['heads']}/{s['kv_heads']}", "vocab": s["vocab_size"],
            "experts": f"{s['experts_per_token']}/{s['experts']}" if s["experts"] else "-",
            "params B": f"{total:.3g}" + (f" ({active:.3g} active)" if active < total else ""),
            "published B": "-" if pub is None
            else f"{pub[0]:g}" + (f"/{pub[1]:g}" if pub[1] != pub[0] else ""),
            "off by": "-" if pub is None else f"{max(abs(total / pub[0] - 1), abs(active / pub[1] - 1)):.1%}"}


def attention_crossover_tokens(config: dict[str, Any]) -> float:
    """Context length (tokens) at which one decode step's attention work (scores and the weighted
    sum: 4 x heads x head dim FLOPs per cached token per layer) equals its weight work (2 FLOPs per
    parameter a token passes through, the LM head included, the input lookup not); below it the
    weights dominate a step (chapter 03). Multi-head latent attention is counted as plain heads."""
    c = text_config(config)
    emb = embedding_params(config)
    weight_flops = 2 * (param_count(config)["active"] - emb["matrices"] + emb["matrix"])
    attention_per_token = 4 * c["num_attention_heads"] * head_dim(c) * c["num_hidden_layers"]
    return weight_flops / attention_per_token
