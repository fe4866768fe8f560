"""A separate draft model in a real engine (chapter 06b, "Going further: a draft model of its own").

llama-server decodes a *target* model and, started with ``-md``, drafts with a second model that has its
own weights and its own KV cache, ``k`` tokens at a time (``--spec-type draft-simple --spec-draft-n-max
k``). Two pairs: the tutorial's, a smaller model of the same family (Qwen2.5-Coder 0.5B drafting for
1.5B, both Q4_K_M: :data:`labkit.models.DRAFT_PAIR`, from ``make draft-models``), and the lab's own
model drafting for itself (the default: the bundled Q4_1 GGUF for the same weights in F32, turned
back into floats by ``llama-quantize``). :func:`measure` keeps three servers up at once (the target
alone, the target with its draft, the draft alone) and asks each, in turn, for greedy answers to the
same chat prompts, round after round in rotating order so a drift of the machine hits all three alike.
Speeds are llama.cpp's own decode timings (``timings.predicted_n / predicted_ms``: the prompt's prefill
excluded); the draft counts are the server's (``draft_n``, ``draft_n_accepted``). :class:`DraftRounds`
holds the result.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from ..engines import llamacpp, process
from ..models import gguf_path
from ..stats import median_interval, wilson
from .gguf_levels import level_files

SERVERS = ("target", "target + draft", "draft")


@dataclass
class DraftRounds:
    """Chapter 06b's draft-model run. ``k``: tokens drafted per step; ``tps``: server -> decode
    tokens/s per round (all prompts' tokens ÷ their decode time); ``drafted``/``accepted``: draft
    tokens proposed and kept, and ``emitted`` the tokens written with the draft, over every round;
    ``same``/``compared``: answers (one per prompt and round) whose greedy text with the draft
    equals the target's alone."""

    k: int
    tps: dict[str, list[float]] = field(default_factory=lambda: {s: [] for s in SERVERS})
    drafted: int = 0
    accepted: int = 0
    emitted: int = 0
    same: int = 0
    compared: int = 0

    def ratio(self, num: str, den: str) -> dict[str, float]:
        """``num``'s tokens/s ÷ ``den``'s, round by round: :func:`labkit.stats.median_interval`."""
        return median_interval([a / b for a, b in zip(self.tps[num], self.tps[den], strict=True)])

    @property
    def speedup(self) -> dict[str, float]:
        """The target with its draft ÷ the target alone, per round (above 1: the draft pays)."""
        return self.ratio("target + draft", "target")

    @property
    def passes(self) -> int:
        """Target passes with the draft: each writes its accepted drafts plus one token of its own,
        so passes = emitted - accepted (about: an answer's first token, from the prompt's pass,
        counts as a pass too)."""
        return self.emitted - self.accepted

    @property
    def tokens_per_pass(self) -> float:
        """Tokens written per target pass with the draft (:attr:`passes`)."""
        return self.emitted / self.passes

    def pass_cost(self) -> float:
        """What one target pass over the drafts cost, in single target steps (computed from the
        medians: a pass's time at the drafted speed, less the draft steps in it)."""
        med = {s: median_interval(v)["median"] for s, v in self.tps.items()}
        pass_s = self.tokens_per_pass / med["target + draft"]
        return (pass_s - self.drafted / self.passes / med["draft"]) * med["target"]

    def if_pass_cost(self, steps: float = 1.0) -> float:
        """The speed-up these counts and the draft's measured cost would give had a target pass over
        the drafts cost ``steps`` single steps (about 1 on a GPU at batch 1, chapter 04)."""
        draft_cost = self.ratio("target", "draft")["median"]  # a draft step, in target steps
        return self.tokens_per_pass / (self.drafted / self.passes * draft_cost + steps)

    @property
    def acceptance(self) -> dict[str, float]:
        """Share of drafted tokens the target kept, with a Wilson 95% interval (the tokens of one
        answer are not independent draws, so the interval is, if anything, too narrow)."""
        return wilson(self.accepted, self.drafted)


def target_file() -> Path:
    """The F32 GGUF of the bundled model (made once with ``llama-quantize``, then reused)."""
    return level_files(("F32",))["F32"]


def _ask(url: str, prompt: str, max_tokens: int) -> dict[str, Any]:
    r = httpx.post(f"{url}/v1/chat/completions", timeout=120.0, json={
        "messages": [{"role": "user", "content": prompt}], "max_tokens": max_tokens, "temperature": 0.0})
    r.raise_for_status()
    body = r.json()
    t = body.get("timings") or {}
    if not t.get("predicted_ms"):
        raise RuntimeError(f"llama-server at {url} returned no decode timings: {str(body)[:300]}")
    return {"text": body["choices"][0]["message"]["content"], "tokens": int(t["predicted_n"]),
            "ms": float(t["predicted_ms"]), "drafted": int(t.get("draft_n") or 0),
            "accepted": int(t.get("draft_n_accepted") or 0)}


def measure(prompts: Sequence[str], k: int = 4, rounds: int = 4, max_tokens: int = 32,
            threads: int | None = None, target: str | Path | None = None,
            draft: str | Path | None = None) -> DraftRounds:
    """Greedy answers of ``max_tokens`` at most to each of ``prompts`` from the three servers of the
    module doc, ``rounds`` times (the order rotates by one server each round). ``target`` and ``draft``:
    GGUF files sharing a tokenizer (default: the bundled model in F32, and its Q4_1). ``RuntimeError``
    where llama.cpp is not built, or where the server drafted nothing (a build without ``draft-simple``)."""
    if not llamacpp.llamacpp_available():
        raise RuntimeError(llamacpp.unavailable_reason())
    target = Path(target) if target is not None else target_file()
    draft = Path(draft) if draft is not None else gguf_path()
    drafting = ["-md", str(draft), "--spec-type", "draft-simple", "--spec-draft-n-max", str(k),
                "-td", str(threads or llamacpp.llamacpp_threads())]
    args = {"target": (target, []), "draft": (draft, []), "target + draft": (target, drafting)}
    out = DraftRounds(k)
    with contextlib.ExitStack() as stack:
        servers = {}
        for name in SERVERS:
            gguf, extra = args[name]
            srv = llamacpp.start_llamacpp(gguf, threads=threads, parallel=1, ctx_per_slot=1024, extra=extra)
            stack.callback(process.stop, srv)
            servers[name] = srv
        for r in range(rounds):
            texts: dict[str, list[str]] = {}
            for name in SERVERS[r % 3:] + SERVERS[:r % 3]:
                answers = [_ask(servers[name].url, p, max_tokens) for p in prompts]
                out.tps[name].append(1e3 * sum(a["tokens"] for a in answers) / sum(a["ms"] for a in answers))
                texts[name] = [a["text"] for a in answers]
                if name == "target + draft":
                    out.drafted += sum(a["drafted"] for a in answers)
                    out.accepted += sum(a["accepted"] for a in answers)
                    out.emitted += sum(a["tokens"] for a in answers)
            out.same += sum(a == b for a, b in zip(texts["target"], texts["target + draft"], strict=True))
            out.compared += len(prompts)
    if out.drafted == 0:
        raise RuntimeError("llama-server proposed no draft tokens: this build did not speculate with -md")
    return out
