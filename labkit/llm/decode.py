"""Timed greedy decoding with a KV cache, the one decode loop gpucheck, chapter 04 and chapter 06
time (chapter 04, "GPU hardware": batch-1 decode is memory-bound).

:func:`build_model` makes a causal LM of a shipped config with random weights directly on the
device (no download); :func:`greedy_decode` prefills a prompt, then decodes one token per step,
each step timed through :func:`labkit.hardware.microbench.time_fn` (device synchronized before the
clock is read); :func:`prefill_seconds` times one forward over a prompt. :func:`interleaved_decode`
measures several models (chapter 04: one per dtype) side by side, and :func:`step_figures` turns a
model's measured prefill and decode into roofline figures; :func:`random_model_run` does all of it
for a shipped architecture with random weights (``labkit gpu-check``'s model section).
:func:`decode_rounds` times chapter 06's weight formats in interleaved rounds and
:func:`speed_sentence` states what their speed ratio shows. Times are
seconds; tokens/s is ``1 / median step``; bytes are bytes, bandwidth bytes/s, intensities FLOPs/byte.
"""

from __future__ import annotations

import inspect
import time
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..hardware import microbench, roofline
from .architecture import text_config
from .kvcache import cache_tensor_bytes, kv_cache_bytes_for_config
from .memory import bytes_per_param, tensor_bytes

DECODE_WARMUP = 2  # untimed decode steps before the timed ones (they grow the cache too)


@dataclass
class DecodeTiming:
    """One timed greedy decode: ``step_s`` (seconds of each timed step), ``token_ids`` (the tokens
    the timed steps produced, in order), ``cache`` (the KV cache after the last step)."""

    step_s: np.ndarray
    token_ids: list[int]
    cache: Any

    @property
    def tokens_per_s(self) -> float:
        """Decode speed from the median step (tokens/s)."""
        return 1.0 / float(np.median(self.step_s))


def dtype_kwarg(transformers_version: str) -> str:
    """The ``from_config`` keyword for the weights' dtype: ``dtype`` from transformers 4.56 on,
    ``torch_dtype`` before (newer versions still accept it, with a deprecation warning)."""
    parts = [int("".join(c for c in p if c.isdigit()) or 0) for p in transformers_version.split(".")[:2]]
    return "dtype" if tuple(parts) >= (4, 56) else "torch_dtype"


def build_model(config: dict[str, Any], dtype: str, device: str) -> Any:
    """A causal LM of ``config``'s architecture with random weights, created directly on ``device``
    in ``dtype`` (a torch dtype name; no CPU initialisation, no download), in eval mode."""
    import torch
    import transformers
    from transformers import AutoConfig, AutoModelForCausalLM

    tdtype = getattr(torch, dtype)
    fields = {k: v for k, v in text_config(config).items()
              if k not in ("torch_dtype", "dtype", "transformers_version")}
    conf = AutoConfig.for_model(**fields)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(conf, **{dtype_kwarg(transformers.__version__): tdtype})
    return model.to(dtype=tdtype).eval()


def cache_argument(model: Any) -> str:
    """The name under which ``model.forward`` takes and returns the KV cache: ``cache`` in recent
    transformers, ``past_key_values`` before (now deprecated there)."""
    return "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"


def greedy_decode(model: Any, prompt_ids: Any, tokens: int, device: str = "cpu",
                  warmup: int = DECODE_WARMUP) -> DecodeTiming:
    """Prefill ``prompt_ids`` (shape 1 x P), then decode greedily one token per step with the KV
    cache: ``warmup`` untimed steps, then ``tokens`` timed ones (the cache then holds
    P + warmup + tokens positions)."""
    import torch

    name = cache_argument(model)
    produced: list[int] = []
    with torch.inference_mode():
        out = model(prompt_ids, use_cache=True)
        state = {"past": getattr(out, name), "next": out.logits[:, -1:].argmax(-1)}

        def step() -> None:
            o = model(state["next"], use_cache=True, **{name: state["past"]})
            state["past"], state["next"] = getattr(o, name), o.logits[:, -1:].argmax(-1)
            produced.append(int(state["next"][0, 0]))

        times = microbench.time_fn(step, device, warmup=warmup, repeats=tokens)
    return DecodeTiming(step_s=times, token_ids=produced[warmup:], cache=state["past"])


def prefill_seconds(model: Any, ids: Any, device: str = "cpu", repeats: int = 3) -> float:
    """Median seconds of one forward over ``ids`` (shape 1 x P, no KV cache kept), after one untimed run."""
    import torch

    with torch.inference_mode():
        times = microbench.time_fn(lambda: model(ids, use_cache=False), device, warmup=1, repeats=repeats)
    return float(np.median(times))


def interleaved_decode(models: dict[str, Any], prompt_ids: Any, prefill_ids: Any, device: str = "cpu",
                       tokens: int = 32, rounds: int = 2) -> tuple[dict[str, dict[str, Any]], list[float]]:
    """Measure several models side by side: each of ``rounds`` rounds times, model after model, a
    prefill of ``prefill_ids`` (:func:`prefill_seconds`), a greedy decode of ``tokens`` tokens after
    ``prompt_ids`` (:func:`greedy_decode`) and then the copy bandwidth, so background load on a shared
    machine hits them all alike. Returns (name -> ``{"prefill_s"``: median seconds, ``"tps"``: median
    tokens/s, ``"tps_rounds"``: each round's tokens/s, ``"context"``: tokens in the cache at the end``}``,
    every bandwidth sample in bytes/s)."""
    runs: dict[str, dict[str, list[float]]] = {name: {"prefill_s": [], "tps": []} for name in models}
    bandwidths = []
    for _ in range(rounds):
        for name, model in models.items():
            runs[name]["prefill_s"].append(prefill_seconds(model, prefill_ids, device))
            timing = greedy_decode(model, prompt_ids, tokens, device)
            if len(timing.token_ids) != tokens:
                raise RuntimeError(f"{name}: decoded {len(timing.token_ids)} tokens, asked for {tokens}")
            runs[name]["tps"].append(timing.tokens_per_s)
            bandwidths.append(microbench.memory_bandwidth(device, repeats=3)["gbps_best"] * 1e9)
    context = int(prompt_ids.shape[-1]) + DECODE_WARMUP + tokens
    return ({name: {"prefill_s": float(np.median(r["prefill_s"])), "tps": float(np.median(r["tps"])),
                    "tps_rounds": r["tps"], "context": context} for name, r in runs.items()}, bandwidths)


def step_figures(params: float, weight_bytes: float, kv_bytes: float, prefill_tokens: int,
                 prefill_s: float, tokens_per_s: float, bandwidth: float) -> dict[str, float]:
    """Roofline figures of a model's measured prefill (``prefill_tokens`` in ``prefill_s`` seconds)
    and batch-1 decode (``tokens_per_s``), the bandwidth in bytes/s: ``params``, ``weights``, ``kv``
    (bytes), ``prefill_ai`` / ``decode_ai`` (FLOPs/byte, weights + KV read once per step),
    ``prefill_flops`` / ``decode_flops`` (achieved FLOP/s, 2 x params per token), ``bytes_per_token``,
    ``ceiling`` (the tokens/s the bandwidth allows) and ``achieved`` (the fraction of it reached)."""
    bytes_per_token = roofline.forward_bytes(weight_bytes, kv_bytes)
    return {"params": params, "weights": weight_bytes, "kv": kv_bytes,
            "prefill_ai": roofline.step_intensity(params, prefill_tokens, weight_bytes, kv_bytes),
            "decode_ai": roofline.step_intensity(params, 1, weight_bytes, kv_bytes),
            "prefill_flops": roofline.forward_flops(params, prefill_tokens) / prefill_s,
            "decode_flops": roofline.forward_flops(params, 1) * tokens_per_s,
            "bytes_per_token": bytes_per_token,
            "ceiling": roofline.decode_ceiling_tokens_per_s(bandwidth, bytes_per_token),
            "achieved": roofline.bandwidth_achieved(tokens_per_s, bytes_per_token, bandwidth)}


def random_model_run(config: dict[str, Any], dtype: str, device: str, tokens: int, prefill: int,
                     bandwidth: float, prompt_tokens: int = 32, seed: int = 0) -> dict[str, Any]:
    """Build ``config``'s architecture with random weights (:func:`build_model`), decode ``tokens``
    greedy tokens at batch 1 after a random ``prompt_tokens``-token prompt and time a random
    ``prefill``-token prefill. Returns :func:`step_figures` (``bandwidth`` in bytes/s) and ``model``,
    ``build_s`` (seconds), ``decode`` (the :class:`DecodeTiming`, its cache dropped), ``prompt_tokens``,
    ``context`` (tokens in the cache at the end), ``cache_bytes`` (what the cache object held; None when this
    transformers' layout is unreadable) and ``prefill_s`` (median seconds). ``kv`` is the computed
    KV bytes of ``context`` tokens (:func:`labkit.llm.kvcache.kv_cache_bytes_for_config`)."""
    import torch

    model, build_s = microbench.timed(lambda: build_model(config, dtype, device), device)
    params = sum(p.numel() for p in model.parameters())  # tied embeddings counted once
    gen = torch.Generator(device).manual_seed(seed)
    vocab = model.config.vocab_size
    run = greedy_decode(model, torch.randint(0, vocab, (1, prompt_tokens), device=device, generator=gen),
                        tokens, device)
    try:
        cache_bytes: int | None = cache_tensor_bytes(run.cache)
    except Exception:  # noqa: BLE001 - cache layouts differ across transformers versions
        cache_bytes = None
    run.cache = None  # free it before the prefill allocates
    ids = torch.randint(0, vocab, (1, prefill), device=device, generator=gen)
    prefill_s = prefill_seconds(model, ids, device)
    context = prompt_tokens + DECODE_WARMUP + tokens
    kv = kv_cache_bytes_for_config(config, context, bytes_per_param(dtype))
    figures = step_figures(params, tensor_bytes(model), kv, prefill, prefill_s, run.tokens_per_s, bandwidth)
    return {**figures, "model": model, "build_s": build_s, "decode": run, "prompt_tokens": prompt_tokens,
            "context": context, "cache_bytes": cache_bytes, "prefill_s": prefill_s}


def decode_rounds(models: dict[str, Any], prompt_ids: Any, rounds: int = 5,
                  tokens: int = 4, min_rounds: int | None = None,
                  budget_s: float | None = None) -> dict[str, list[float]]:
    """Decode tokens/s of each model (:func:`greedy_decode`, ``tokens`` timed steps), chapter 06's
    formats side by side: measured in turn in each of ``rounds`` rounds, so a slow spell of a shared
    machine hits every model alike: name -> list.

    With ``budget_s``, rounds stop early (never before ``min_rounds``, default ``rounds``) once
    another round would end past ``budget_s`` seconds, judged from the mean round so far: a CPU
    without a fast path for one format (chapter 06's fused INT8 kernel takes over 1 s a token under
    AVX2 only) gets fewer rounds, every round still covering every model."""
    floor = rounds if min_rounds is None else max(1, min(min_rounds, rounds))
    out: dict[str, list[float]] = {k: [] for k in models}
    t0 = time.perf_counter()
    for done in range(rounds):
        projected = (time.perf_counter() - t0) * (done + 1) / done if done else 0.0  # after one more round
        if budget_s is not None and done >= floor and projected > budget_s:
            break
        for k, m in models.items():
            out[k].append(greedy_decode(m, prompt_ids, tokens, device=str(prompt_ids.device)).tokens_per_s)
    return out


def speed_sentence(what: str, base: str, r: dict[str, float]) -> str:
    """``what`` decodes faster / slower / as fast as ``base``, from the interval ``r`` of their speed
    ratio (:func:`labkit.stats.ratio_interval`): a verdict only when the whole interval is on one side
    of 1."""
    span = f"{r['median']:.2f}x (interval {r['lo']:.2f}-{r['hi']:.2f} over {r['n']} rounds)"
    if r["lo"] > 1:
        return f"{what} decodes faster than {base}: {span}"
    if r["hi"] < 1:
        return f"{what} decodes slower than {base}: {span}"
    return f"{what} and {base} decode at speeds this machine cannot tell apart: {span}"
