"""A small mixture-of-experts (MoE) layer with a top-k router (chapter 03, "How LLMs work").

Each token's hidden vector goes through a router (one linear layer giving a score per expert);
the ``top_k`` best-scoring experts (SwiGLU MLPs) process it and their outputs are mixed with
the router's softmax weights, renormalised over the chosen ones (Qwen3-MoE style). Optional
shared experts (DeepSeek style) process every token. Weights use the layout of transformers'
``Qwen3MoeSparseMoeBlock`` (router ``(E, d)``, ``gate_up_proj`` ``(E, 2f, d)``, ``down_proj``
``(E, d, f)``), which the tests compare against.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from .architecture import _moe_layout, param_count, text_config

MoE = dict[str, torch.Tensor]


def init_moe(d_model: int, d_expert: int, n_experts: int, n_shared: int = 0, seed: int = 0) -> MoE:
    """Random MoE weights (std 0.02 like a fresh transformer; the router is untrained, so it
    spreads tokens roughly evenly, which is what load-balancing losses train real routers toward)."""
    g = torch.Generator().manual_seed(seed)
    rand = lambda *shape: torch.randn(*shape, generator=g) * 0.02
    p = {
        "router": rand(n_experts, d_model),
        "gate_up_proj": rand(n_experts, 2 * d_expert, d_model),
        "down_proj": rand(n_experts, d_model, d_expert),
    }
    if n_shared:
        p["shared_gate_up_proj"] = rand(2 * n_shared * d_expert, d_model)
        p["shared_down_proj"] = rand(d_model, n_shared * d_expert)
    return p


def route(x: torch.Tensor, router: torch.Tensor, top_k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Top-k routing of ``x`` ``(N, d)``: ``(weights (N, k), expert ids (N, k))``; the weights are
    the router's softmax probabilities of the chosen experts, renormalised to sum to 1."""
    probs = F.softmax(F.linear(x, router), dim=-1, dtype=torch.float)
    weights, ids = torch.topk(probs, top_k, dim=-1)
    return (weights / weights.sum(-1, keepdim=True)).to(x.dtype), ids


def _swiglu(x: torch.Tensor, gate_up: torch.Tensor, down: torch.Tensor) -> torch.Tensor:
    gate, up = F.linear(x, gate_up).chunk(2, dim=-1)
    return F.linear(F.silu(gate) * up, down)


def moe_forward(p: MoE, x: torch.Tensor, top_k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Apply the MoE layer to ``x`` ``(N, d)``. Returns ``(output (N, d), expert ids (N, top_k))``.
    Each expert runs once, on the tokens routed to it (as serving engines batch them)."""
    weights, ids = route(x, p["router"], top_k)
    out = torch.zeros_like(x)
    for e in ids.unique().tolist():
        token, slot = torch.where(ids == e)
        y = _swiglu(x[token], p["gate_up_proj"][e], p["down_proj"][e])
        out.index_add_(0, token, y * weights[token, slot, None])
    if "shared_gate_up_proj" in p:
        out = out + _swiglu(x, p["shared_gate_up_proj"], p["shared_down_proj"])
    return out, ids


def moe_params(p: MoE, top_k: int) -> dict[str, int]:
    """``{"total", "active"}`` parameters of the layer: all experts, and what one token uses
    (router + shared experts + ``top_k`` routed experts)."""
    n_experts = p["router"].shape[0]
    per_expert = (p["gate_up_proj"].numel() + p["down_proj"].numel()) // n_experts
    always = sum(v.numel() for k, v in p.items() if k not in ("gate_up_proj", "down_proj"))
    return {"total": always + n_experts * per_expert, "active": always + top_k * per_expert}


def router_share(config: dict[str, Any]) -> dict[str, float]:
    """A real MoE model's routers, from its config (chapter 03): ``params`` (one ``experts x hidden``
    matrix per MoE layer, plus DeepSeek-V3's per-expert bias) and their share of the parameters one
    token uses (``of_active``) and of all (``of_total``)."""
    c = text_config(config)
    n_routed, _, _, _, moe_layers = _moe_layout(c)
    per_layer = n_routed * c["hidden_size"] + (n_routed if c.get("topk_method") == "noaux_tc" else 0)
    params, counts = len(moe_layers) * per_layer, param_count(config)
    return {"params": params, "of_active": params / counts["active"], "of_total": params / counts["total"]}


def experts_used_fraction(ids: torch.Tensor, n_experts: int) -> float:
    """Fraction of the ``n_experts`` experts that at least one of the routed tokens ``ids`` used."""
    return ids.unique().numel() / n_experts


def expected_used_fraction(n_experts: int, top_k: int, n_tokens: int) -> float:
    """Fraction of experts a batch of ``n_tokens`` touches if each token picks ``top_k`` distinct
    experts uniformly at random: ``1 - (1 - k/E) ** n``."""
    return 1.0 - (1.0 - top_k / n_experts) ** n_tokens


def to_router_width(states: torch.Tensor, d_model: int, seed: int = 0) -> torch.Tensor:
    """Real hidden states ``(N, h)`` (any model's) brought to a router of width ``d_model``: each row
    RMS-normalised (a router sees the layer's normed input) and mapped by a fixed random Gaussian
    projection, which keeps the directions the rows share (chapter 03)."""
    x = states.float()
    x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6)
    g = torch.Generator().manual_seed(seed)
    return x @ (torch.randn(x.shape[1], d_model, generator=g) / x.shape[1] ** 0.5)


def usage_by_batch(router: torch.Tensor, pool: torch.Tensor, top_k: int, batches: list[int],
                   draws: int = 8, seed: int = 0) -> dict[int, float]:
    """Mean fraction of the router's experts one step of ``b`` tokens uses, for each ``b`` in
    ``batches``: ``draws`` steps per size, each ``b`` rows of ``pool`` ``(N, d)`` drawn without
    replacement (``b <= N``), as ``b`` concurrent requests would bring them (chapter 03)."""
    if max(batches) > pool.shape[0]:
        raise ValueError(f"a step of {max(batches)} tokens needs at least that many rows; "
                         f"pool has {pool.shape[0]}")
    g = torch.Generator().manual_seed(seed)
    n_experts = router.shape[0]
    out = {}
    for b in batches:
        used = [experts_used_fraction(route(pool[torch.randperm(pool.shape[0], generator=g)[:b]], router,
                                            top_k)[1], n_experts) for _ in range(draws)]
        out[b] = sum(used) / draws
    return out


def usage_sentence(name: str, used: dict[int, float], balanced: dict[int, float], b: int) -> str:
    """What a step of ``b`` tokens read of ``name``'s experts, against a balanced router (chapter 03)."""
    share = used[b]
    verdict = ("nearly all of them" if share >= 0.95 else "most of them" if share >= 0.5
               else "a minority of them")
    return (f"{name}-like layer, real hidden states: one token reads {used[1]:.1%} of the experts; a step of "
            f"{b} tokens reads {share:.0%}, {verdict} (a perfectly balanced router: {balanced[b]:.0%}).")
