"""GPTQ, as in Frantar et al. 2022 ("GPTQ: Accurate Post-Training Quantization for Generative
Pre-trained Transformers"), written out (chapter 06, "Quantization").

Round-to-nearest treats every weight alone. GPTQ quantizes a layer's weight one input column at
a time and pushes each column's rounding error onto the columns not yet quantized, weighted by the
inverse Hessian of the layer's reconstruction loss ``||W X - Q X||²``, whose Hessian is
``H = 2 X Xᵀ`` over calibration activations ``X`` (collected with forward hooks). Steps, as in the
paper: dampen H (``damp`` × its mean diagonal, the paper's 0.01; raised tenfold while the Cholesky
factorization still fails, the damping used kept per layer), take the upper Cholesky factor of H⁻¹,
quantize column by column with error feedback inside blocks of ``block_size`` columns and one lazy
matrix update per block; optional act-order (columns by decreasing H diagonal, with static group scales so
the storage format stays RTN's). Storage: the same packed INT4 / INT8 tensors as
:mod:`labkit.llm.quantize`.

:func:`gptq_quantize_model` is the paper's sequential variant: decoder layer by decoder layer, each
layer calibrated on the outputs of the already-quantized layers before it, and each layer called with
the keyword arguments (attention mask, position embeddings) the model passes to that layer, so models
mixing sliding-window and full attention get each layer's own mask. ``H`` has rank at most the number
of calibration tokens, so a layer is fully determined only when the calibration has at least as many
tokens as its widest input (:func:`hessian_rank`). Results are cached as
safetensors under :func:`labkit.settings.cache_dir` keyed by model, settings and calibration tokens.
The tutorial's AutoGPTQ example, for CUDA machines: :mod:`labkit.llm.autogptq`.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import nn
from tqdm.auto import tqdm

from ..settings import cache_dir
from .quantize import (
    dequantize_weight,
    expand_scales,
    group_scales,
    pack_int4,
    quantizable_linears,
    quantize_weight,
    round_to_grid,
)


def _upper_cholesky_of_inverse(h: torch.Tensor) -> torch.Tensor:
    """Upper-triangular U with ``H⁻¹ = Uᵀ U``: what the paper's code gets from
    ``cholesky(cholesky_inverse(cholesky(H)), upper=True)``, with one Cholesky instead of three
    O(n³) steps. With J the order-reversing permutation and ``J H J = L Lᵀ``: ``U = J L⁻¹ J``."""
    low = torch.linalg.cholesky(h.flip(0, 1))
    eye = torch.eye(h.shape[0], device=h.device, dtype=h.dtype)
    return torch.linalg.solve_triangular(low, eye, upper=False).flip(0, 1)


def damped_cholesky(h: torch.Tensor, damp: float = 0.01, tries: int = 6) -> tuple[torch.Tensor, float]:
    """:func:`_upper_cholesky_of_inverse` of ``h + d·mean(diag h)·I`` for the first ``d`` of ``damp``,
    ``10·damp``, ``100·damp``... (``tries`` values) whose Cholesky factorization succeeds; returns the
    factor and the ``d`` used. ``torch.linalg.LinAlgError`` when none does."""
    eye = torch.eye(h.shape[0], device=h.device, dtype=h.dtype) * torch.mean(torch.diag(h))
    for i in range(tries):
        d = damp * 10 ** i
        try:
            u = _upper_cholesky_of_inverse(h + d * eye)
        except torch.linalg.LinAlgError:
            continue
        if bool(torch.isfinite(u).all()):
            return u, d
    raise torch.linalg.LinAlgError(f"H is not positive definite even damped by {damp * 10 ** (tries - 1):g}")


def hessian_rank(h: torch.Tensor) -> int:
    """Numerical rank of a symmetric Hessian ``h`` (eigenvalues above ``n · eps · largest``, as
    :func:`torch.linalg.matrix_rank` counts them), in float64."""
    ev = torch.linalg.eigvalsh(h.double())
    return int((ev > ev.abs().max() * h.shape[0] * torch.finfo(torch.float32).eps).sum())


def gptq_quantize_weight(w: torch.Tensor, h: torch.Tensor, bits: int = 4, group_size: int | None = 128,
                         damp: float = 0.01, block_size: int = 32, act_order: bool = False,
                         info: dict | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Quantize ``w`` ``(out, in)`` given the Hessian ``h`` ``(in, in)`` of its inputs.

    Returns ``(qweight, scales, dequantized float32 weight)`` in :func:`labkit.llm.quantize.quantize_weight`'s
    format (INT8: per-channel, ``group_size`` ignored; INT4: packed, per group). Works on the
    transposed weight so that each column is a contiguous vector. ``info``, when given, receives
    ``"damp"``: the damping :func:`damped_cholesky` needed (``damp`` or a tenfold multiple)."""
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
    hinv, used = damped_cholesky(h, damp)
    if info is not None:
        info["damp"] = used
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
def hessian_error(e: torch.Tensor, h: torch.Tensor) -> torch.Tensor:
    """Per output row, ``e_r H e_rᵀ`` for a weight difference ``e`` ``(out, in)`` and the Hessian ``h``
    of the layer's calibration inputs (``2/n Σ x xᵀ``): twice the mean squared output error
    ``||e x||²`` over those inputs, the objective GPTQ minimizes, without running them again."""
    return ((e.float() @ h.float()) * e.float()).sum(1)


def hessian_of(x: torch.Tensor) -> torch.Tensor:
    """GPTQ's Hessian ``2/n Σ x xᵀ`` of a layer's inputs ``x`` ``(n tokens, in)``, float32."""
    return 2 * x.float().t() @ x.float() / x.shape[0]


@torch.no_grad()
def layer_error(w: torch.Tensor, wq: torch.Tensor, x: torch.Tensor) -> float:
    """Relative reconstruction error ``||W X - Q X|| / ||W X||`` (Frobenius) of a layer on inputs
    ``x`` ``(tokens, in)``."""
    ref = x.float() @ w.float().t()
    return float(torch.linalg.norm(ref - x.float() @ wq.float().t()) / torch.linalg.norm(ref))


def calibration_windows(tok: Any, text: str, n_windows: int = 8, window: int = 128) -> torch.Tensor:
    """The first ``n_windows`` × ``window`` tokens of ``text`` as a ``(n_windows, window)`` batch."""
    ids = tok(text, return_tensors="pt").input_ids[0]
    if ids.numel() < n_windows * window:
        raise ValueError(f"the calibration text has {ids.numel()} tokens; {n_windows}x{window} needed")
    return ids[: n_windows * window].view(n_windows, window)


class _Stop(Exception):
    pass


def layer_inputs(model: nn.Module, layers: nn.ModuleList, ids: torch.Tensor
                 ) -> tuple[list[torch.Tensor], list[list[dict]]]:
    """What the decoder ``layers`` receive for each row of ``ids``: the first layer's hidden states
    (one tensor per row) and ``kwargs[i][row]``, the keyword arguments (attention mask, position
    embeddings, ...) layer ``i`` itself is called with, captured by forward pre-hooks on every layer
    (a model alternating sliding-window and full attention hands each layer its own mask). The
    model runs up to the last layer's call, unquantized."""
    first: list[torch.Tensor] = []
    kwargs: list[list[dict]] = [[] for _ in layers]

    def grab(i: int) -> Callable[..., None]:
        def hook(_m: Any, args: Any, kw: Any) -> None:
            kw = dict(kw)
            x = args[0] if args else kw.pop("hidden_states")
            if i == 0:
                first.append(x)
            kwargs[i].append(kw)
            if i == len(layers) - 1:
                raise _Stop
        return hook

    hooks = [layer.register_forward_pre_hook(grab(i), with_kwargs=True) for i, layer in enumerate(layers)]
    try:
        for row in ids:
            try:
                model(row[None].to(model.device), use_cache=False)
            except _Stop:
                pass
    finally:
        for h in hooks:
            h.remove()
    return first, kwargs


def _hessian_hook(h: torch.Tensor, last: dict) -> Callable[..., None]:
    """A forward hook keeping ``h`` the running mean of ``2 x xᵀ`` over every input token seen;
    ``last`` (shared by a layer's hooks) lets q/k/v reuse the ``x xᵀ`` of the same input tensor."""
    seen = [0]

    def hook(_m: Any, args: Any, _out: Any) -> None:
        if last.get("x") is not args[0]:
            x = args[0].detach().reshape(-1, args[0].shape[-1]).float()
            last.update(x=args[0], xx=x.t() @ x)
        n_old, n_new = seen[0], args[0].numel() // args[0].shape[-1]
        h.mul_(n_old / (n_old + n_new)).add_(last["xx"], alpha=2 / (n_old + n_new))
        seen[0] = n_old + n_new

    return hook


def _cache_file(model: nn.Module, ids: torch.Tensor, settings: dict) -> Path:
    name = str(getattr(model.config, "_name_or_path", "model"))
    key = hashlib.sha256(repr((name, sorted(settings.items()), "gptq-v4")).encode()
                         + ids.cpu().numpy().tobytes()).hexdigest()[:16]
    return cache_dir() / "gptq" / f"{Path(name).name}-{key}.safetensors"


@torch.no_grad()
def gptq_quantize_model(model: nn.Module, calib_ids: torch.Tensor, bits: int = 4,
                        group_size: int | None = 128, damp: float = 0.01, act_order: bool = False,
                        cache: bool = True, progress: bool = True, report: dict | None = None,
                        rank_layers: tuple[int, ...] = (), timing: dict | None = None
                        ) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """GPTQ every quantizable linear layer of a decoder-only ``model`` on ``calib_ids``
    ``(windows, tokens)``, sequentially: layer i is calibrated on what the already-quantized layers
    0..i-1 output, called with its own captured keyword arguments (:func:`layer_inputs`). Linear
    layers fed the same input (q/k/v, gate/up) share one Hessian and are quantized as one stacked
    matrix (GPTQ treats rows independently, so this changes nothing but speed). ``model``'s linear
    weights are set to their dequantized values in place (pass a copy to keep the original); returns
    ``{layer name: (qweight, scales)}`` for :func:`labkit.llm.quantize.quantize_model`. ``report``,
    when given, receives per layer ``"damp"`` (damping used), ``"inputs"`` (input width) and
    ``"calib_err_gptq"``, ``"calib_err_rtn"`` (``||(W - Q) X|| / ||W X||`` on its own calibration
    inputs, GPTQ vs RTN on the same grid: :func:`hessian_error`), ``"rank"`` (:func:`hessian_rank`)
    for the decoder layers in ``rank_layers`` (about 0.6 s for 1536 inputs on 2 cores), and
    ``"tokens"`` (calibration tokens per Hessian). Cached on disk (with the report) when ``cache``.
    ``timing``, when given, receives ``"cached"`` (loaded from the disk cache), ``"seconds"`` and
    ``"threads"`` of the run that computed it (a cached result's cold cost, kept with it)."""
    t0 = time.perf_counter()
    from safetensors import safe_open
    from safetensors.torch import load_file, save_file

    settings = dict(bits=bits, group_size=group_size, damp=damp, act_order=act_order, ranks=rank_layers,
                    dtype=str(next(model.parameters()).dtype), layers=len(model.model.layers),
                    timed=True)  # caches written before the cold cost was kept hold no "timing": not reused
    names = dict((id(m), n) for n, m in quantizable_linears(model))
    path = _cache_file(model, calib_ids, settings)
    if cache and path.exists():
        saved = load_file(str(path))
        cached = {n: (saved[f"{n}.qweight"], saved[f"{n}.scales"]) for n in names.values()}
        for n, (qw, sc) in cached.items():
            lin = model.get_submodule(n)
            lin.weight.copy_(dequantize_weight(qw, sc, bits, lin.in_features, group_size, lin.weight.dtype))
        with safe_open(str(path), "pt") as f:
            meta = f.metadata() or {}
        if report is not None:
            report.update(json.loads(meta.get("report", "{}")))
        if timing is not None:
            timing.update(json.loads(meta.get("timing", "{}")), cached=True)
        return cached

    layers = model.model.layers
    inputs, layer_kwargs = layer_inputs(model, layers, calib_ids)
    out: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}
    rep: dict = {"tokens": int(calib_ids.numel())}
    it = layers
    if progress:
        it = tqdm(layers, desc=f"GPTQ INT{bits}", leave=False)
    for i, layer in enumerate(it):
        linears = [m for m in layer.modules() if isinstance(m, nn.Linear) and id(m) in names]
        hess = {id(m): torch.zeros(m.in_features, m.in_features, device=m.weight.device) for m in linears}
        last: dict = {}
        hooks = [m.register_forward_hook(_hessian_hook(hess[id(m)], last)) for m in linears]
        for x, kw in zip(inputs, layer_kwargs[i], strict=True):
            layer(x, **kw)
        for hk in hooks:
            hk.remove()
        last.clear()
        for grp in _shared_input_groups(linears, hess):
            h, info = hess[id(grp[0])], dict[str, float]()
            w = torch.cat([m.weight for m in grp])
            qw, sc, deq = gptq_quantize_weight(w, h, bits, group_size, damp, act_order=act_order, info=info)
            row, rank = 0, (hessian_rank(h) if i in rank_layers else None)
            rtn = dequantize_weight(*quantize_weight(w, bits, group_size), bits, w.shape[1], group_size)
            errs = {k: hessian_error(w.float() - q, h) for k, q in (("gptq", deq), ("rtn", rtn))}
            scale = hessian_error(w.float(), h)
            for m in grp:
                r = m.out_features
                out[names[id(m)]] = (qw[row:row + r].contiguous(), sc[row:row + r].contiguous())
                m.weight.copy_(deq[row:row + r].to(m.weight.dtype))
                ref = float(scale[row:row + r].sum())
                rep[names[id(m)]] = {"damp": info["damp"], "inputs": m.in_features,
                                     **{f"calib_err_{k}": (float(e[row:row + r].sum()) / ref) ** 0.5
                                        for k, e in errs.items()},
                                     **({} if rank is None else {"rank": rank})}
                row += r
        del hess
        inputs = [_hidden(layer(x, **kw)) for x, kw in zip(inputs, layer_kwargs[i], strict=True)]
    if report is not None:
        report.update(rep)
    took = {"seconds": time.perf_counter() - t0, "threads": torch.get_num_threads()}
    if timing is not None:
        timing.update(took, cached=False)
    if cache:
        path.parent.mkdir(parents=True, exist_ok=True)
        tensors = {f"{n}.{part}": t.cpu().contiguous() for n, (qw, sc) in out.items()
                   for part, t in (("qweight", qw), ("scales", sc))}
        save_file(tensors, str(path.with_suffix(".tmp")),
                  metadata={"report": json.dumps(rep), "timing": json.dumps(took)})
        path.with_suffix(".tmp").rename(path)
    return out


def _hidden(y: Any) -> torch.Tensor:
    return y[0] if isinstance(y, tuple) else y


def _shared_input_groups(linears: list[nn.Linear], hess: dict[int, torch.Tensor]) -> list[list[nn.Linear]]:
    """``linears`` grouped by identical Hessians (same input: q/k/v, gate/up)."""
    groups: list[list[nn.Linear]] = []
    for m in linears:
        for grp in groups:
            if torch.equal(hess[id(grp[0])], hess[id(m)]):
                grp.append(m)
                break
        else:
            groups.append([m])
    return groups
