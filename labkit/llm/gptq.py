"""GPTQ, as in Frantar et al. 2022 ("GPTQ: Accurate Post-Training Quantization for Generative
Pre-trained Transformers"), written out (chapter 06, "Quantization").

Round-to-nearest treats every weight alone. GPTQ quantizes a layer's weight one input column at
a time and pushes each column's rounding error onto the columns not yet quantized, weighted by the
inverse Hessian of the layer's reconstruction loss ``||W X - Q X||²``, whose Hessian is
``H = 2 X Xᵀ`` over calibration activations ``X`` (collected with forward hooks). Steps, as in the
paper: dampen H (``damp`` × its mean diagonal), take the upper Cholesky factor of H⁻¹, quantize
column by column with error feedback inside blocks of ``block_size`` columns and one lazy matrix
update per block; optional act-order (columns by decreasing H diagonal, with static group scales so
the storage format stays RTN's). Storage: the same packed INT4 / INT8 tensors as
:mod:`labkit.llm.quantize`.

:func:`gptq_quantize_model` is the paper's sequential variant: decoder layer by decoder layer, each
layer calibrated on the outputs of the already-quantized layers before it. Results are cached as
safetensors under :func:`labkit.settings.cache_dir` keyed by model, settings and calibration tokens.
:func:`autogptq_quantize` is the tutorial's AutoGPTQ example, for CUDA machines.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import torch
from torch import nn

from .quantize import (
    dequantize_weight,
    expand_scales,
    group_scales,
    pack_int4,
    quantizable_linears,
    round_to_grid,
)


def _upper_cholesky_of_inverse(h: torch.Tensor) -> torch.Tensor:
    """Upper-triangular U with ``H⁻¹ = Uᵀ U``: what the paper's code gets from
    ``cholesky(cholesky_inverse(cholesky(H)), upper=True)``, with one Cholesky instead of three
    O(n³) steps. With J the order-reversing permutation and ``J H J = L Lᵀ``: ``U = J L⁻¹ J``."""
    rev = torch.arange(h.shape[0] - 1, -1, -1, device=h.device)
    low = torch.linalg.cholesky(h[rev][:, rev])
    eye = torch.eye(h.shape[0], device=h.device, dtype=h.dtype)
    return torch.linalg.solve_triangular(low, eye, upper=False)[rev][:, rev]


def gptq_quantize_weight(w: torch.Tensor, h: torch.Tensor, bits: int = 4, group_size: int | None = 128,
                         damp: float = 0.01, block_size: int = 32, act_order: bool = False
                         ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Quantize ``w`` ``(out, in)`` given the Hessian ``h`` ``(in, in)`` of its inputs.

    Returns ``(qweight, scales, dequantized float32 weight)`` in :func:`labkit.llm.quantize.quantize_weight`'s
    format (INT8: per-channel, ``group_size`` ignored; INT4: packed, per group). Works on the
    transposed weight so that each column is a contiguous vector."""
    wt = w.detach().float().t().contiguous()  # (in, out): row j is input column j
    h = h.detach().float().clone()
    k, n = wt.shape
    g = k if bits == 8 or not group_size else group_size
    m = float(2 ** (bits - 1) - 1)
    dead = torch.diag(h) == 0
    h[dead, dead] = 1
    wt[dead] = 0
    static = act_order or g == k  # scales fixed up front from the unchanged weight
    scales = group_scales(wt.t(), bits, g) if static else torch.empty(n, -(-k // g), dtype=torch.float16,
                                                                       device=wt.device)
    perm = torch.argsort(torch.diag(h), descending=True) if act_order else torch.arange(k, device=wt.device)
    wt, h = wt[perm], h[perm][:, perm]
    h += damp * torch.mean(torch.diag(h)) * torch.eye(k, device=h.device)
    hinv = _upper_cholesky_of_inverse(h)
    if not (static or g % block_size == 0 or block_size % g == 0):
        block_size = g  # a lazy group scale must see its whole group up to date
    cols, diag = perm.tolist(), torch.diag(hinv)
    qt = torch.empty_like(wt)  # dequantized values, permuted order
    scale_t = scales.float().t().contiguous()  # (groups, out)
    for i1 in range(0, k, block_size):
        i2 = min(i1 + block_size, k)
        w1, hinv1 = wt[i1:i2].clone(), hinv[i1:i2, i1:i2]
        err1 = torch.empty_like(w1)  # w - q for now; divided by the diagonal after the block
        w_rows, q_rows, e_rows, h_rows = w1.unbind(0), qt[i1:i2].unbind(0), err1.unbind(0), hinv1.unbind(0)
        inv_d = (1 / diag[i1:i2]).tolist()
        for i in range(i2 - i1):
            col = cols[i1 + i]
            if not static and col % g == 0:  # scale from the group's weights as updated so far
                src = torch.cat([w1[i:], wt[i2:]])[:g]
                scales[:, col // g] = group_scales(src.t(), bits, None)[:, 0]
                scale_t[col // g] = scales[:, col // g].float()
            s, q = scale_t[col // g], q_rows[i]
            torch.div(w_rows[i], s, out=q).round_().clamp_(-m, m).mul_(s)
            torch.sub(w_rows[i], q, out=e_rows[i])
            w1[i + 1:].addr_(h_rows[i][i + 1:], e_rows[i], alpha=-inv_d[i])
        err1.mul_(1 / diag[i1:i2, None])
        wt[i2:].addmm_(hinv[i1:i2, i2:].t(), err1, alpha=-1)
    deq = qt[torch.argsort(perm)].t().contiguous()
    codes = round_to_grid(deq, expand_scales(scales, k, g), bits)
    return (pack_int4(codes) if bits == 4 else codes), scales, deq


@torch.no_grad()
def layer_error(w: torch.Tensor, wq: torch.Tensor, x: torch.Tensor) -> float:
    """Relative reconstruction error ``||W X - Q X|| / ||W X||`` (Frobenius) of a layer on inputs
    ``x`` ``(tokens, in)``."""
    ref = x.float() @ w.float().t()
    return float(torch.linalg.norm(ref - x.float() @ wq.float().t()) / torch.linalg.norm(ref))


def calibration_windows(tok, text: str, n_windows: int = 8, window: int = 128) -> torch.Tensor:
    """The first ``n_windows`` × ``window`` tokens of ``text`` as a ``(n_windows, window)`` batch."""
    ids = tok(text, return_tensors="pt").input_ids[0]
    if ids.numel() < n_windows * window:
        raise ValueError(f"the calibration text has {ids.numel()} tokens; {n_windows}x{window} needed")
    return ids[: n_windows * window].view(n_windows, window)


class _Stop(Exception):
    pass


def _layer_inputs(model: nn.Module, layers: nn.ModuleList, ids: torch.Tensor) -> list[tuple]:
    """``(hidden_states, kwargs)`` that the first decoder layer receives for each row of ``ids``."""
    seen: list[tuple] = []

    def grab(_m, args, kwargs):
        seen.append((args[0] if args else kwargs.pop("hidden_states"), kwargs))
        raise _Stop

    hook = layers[0].register_forward_pre_hook(grab, with_kwargs=True)
    try:
        for row in ids:
            try:
                model(row[None].to(model.device), use_cache=False)
            except _Stop:
                pass
    finally:
        hook.remove()
    return seen


def _hessian_hook(h: torch.Tensor, last: dict):
    """A forward hook keeping ``h`` the running mean of ``2 x xᵀ`` over every input token seen;
    ``last`` (shared by a layer's hooks) lets q/k/v reuse the ``x xᵀ`` of the same input tensor."""
    seen = [0]

    def hook(_m, args, _out):
        if last.get("x") is not args[0]:
            x = args[0].detach().reshape(-1, args[0].shape[-1]).float()
            last.update(x=args[0], xx=x.t() @ x)
        n_old, n_new = seen[0], args[0].numel() // args[0].shape[-1]
        h.mul_(n_old / (n_old + n_new)).add_(last["xx"], alpha=2 / (n_old + n_new))
        seen[0] = n_old + n_new

    return hook


def _cache_file(model: nn.Module, ids: torch.Tensor, settings: dict) -> Path:
    from ..settings import cache_dir

    name = str(getattr(model.config, "_name_or_path", "model"))
    key = hashlib.sha256(repr((name, sorted(settings.items()), "gptq-v2")).encode()
                         + ids.cpu().numpy().tobytes()).hexdigest()[:16]
    return cache_dir() / "gptq" / f"{Path(name).name}-{key}.safetensors"


@torch.no_grad()
def gptq_quantize_model(model: nn.Module, calib_ids: torch.Tensor, bits: int = 4,
                        group_size: int | None = 128, damp: float = 0.01, act_order: bool = False,
                        cache: bool = True, progress: bool = True
                        ) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """GPTQ every quantizable linear layer of a decoder-only ``model`` on ``calib_ids``
    ``(windows, tokens)``, sequentially: layer i is calibrated on what the already-quantized layers
    0..i-1 output. Linear layers fed the same input (q/k/v, gate/up) share one Hessian and are
    quantized as one stacked matrix (GPTQ treats rows independently, so this changes nothing but
    speed). ``model``'s linear weights are set to their dequantized values in place (pass a copy to
    keep the original); returns ``{layer name: (qweight, scales)}`` for
    :func:`labkit.llm.quantize.quantize_model`. Cached on disk when ``cache``."""
    from safetensors.torch import load_file, save_file

    settings = dict(bits=bits, group_size=group_size, damp=damp, act_order=act_order,
                    dtype=str(next(model.parameters()).dtype), layers=len(model.model.layers))
    names = dict((id(m), n) for n, m in quantizable_linears(model))
    path = _cache_file(model, calib_ids, settings)
    if cache and path.exists():
        saved = load_file(str(path))
        cached = {n: (saved[f"{n}.qweight"], saved[f"{n}.scales"]) for n in names.values()}
        for n, (qw, sc) in cached.items():
            lin = model.get_submodule(n)
            lin.weight.copy_(dequantize_weight(qw, sc, bits, lin.in_features, group_size, lin.weight.dtype))
        return cached

    layers = model.model.layers
    inputs = _layer_inputs(model, layers, calib_ids)
    out: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}
    it = layers
    if progress:
        from tqdm.auto import tqdm
        it = tqdm(layers, desc=f"GPTQ INT{bits}", leave=False)
    for layer in it:
        linears = [m for m in layer.modules() if isinstance(m, nn.Linear) and id(m) in names]
        hess = {id(m): torch.zeros(m.in_features, m.in_features, device=m.weight.device) for m in linears}
        last: dict = {}
        hooks = [m.register_forward_hook(_hessian_hook(hess[id(m)], last)) for m in linears]
        for x, kw in inputs:
            layer(x, **kw)
        for hk in hooks:
            hk.remove()
        last.clear()
        groups: list[list[nn.Linear]] = []
        for m in linears:  # same input -> same Hessian (q/k/v, gate/up)
            for grp in groups:
                if torch.equal(hess[id(grp[0])], hess[id(m)]):
                    grp.append(m)
                    break
            else:
                groups.append([m])
        for grp in groups:
            w = torch.cat([m.weight for m in grp])
            qw, sc, deq = gptq_quantize_weight(w, hess[id(grp[0])], bits, group_size, damp,
                                               act_order=act_order)
            row = 0
            for m in grp:
                r = m.out_features
                out[names[id(m)]] = (qw[row:row + r].contiguous(), sc[row:row + r].contiguous())
                m.weight.copy_(deq[row:row + r].to(m.weight.dtype))
                row += r
        del hess
        new_inputs = []
        for x, kw in inputs:
            y = layer(x, **kw)
            new_inputs.append((y[0] if isinstance(y, tuple) else y, kw))
        inputs = new_inputs
    if cache:
        path.parent.mkdir(parents=True, exist_ok=True)
        tensors = {f"{n}.{part}": t.cpu().contiguous() for n, (qw, sc) in out.items()
                   for part, t in (("qweight", qw), ("scales", sc))}
        save_file(tensors, str(path.with_suffix(".tmp")))
        path.with_suffix(".tmp").rename(path)
    return out


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
