"""What a load run sends and how it paces it (:class:`LoadSpec`), and how it reaches an
OpenAI-compatible server (:class:`ClientSpec`): the two halves of a :func:`labkit.serving.loadgen.run`
call (chapter 02; chapters 05, 06 and 08 run the load generator too). Times are seconds, rates
requests per second, lengths tokens.

Both check their values when made, so a bad setting fails before anything is sent, with a
``ValueError`` naming the setting and what it must be::

    from labkit.serving.loadgen import run
    from labkit.serving.loadspec import ClientSpec, LoadSpec
    s = run("http://127.0.0.1:8000", LoadSpec(n_requests=8, concurrency=4, max_tokens=16),
            ClientSpec(model="smollm2", ignore_eos=True))
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Required, TypedDict


class Prompt(TypedDict, total=False):
    """One prompt of a prompt set (``data/prompts/*.jsonl``, :func:`labkit.serving.loadgen.load_prompts`)
    or of a generated workload: ``prompt`` the text sent; ``id`` its name in the set (the record's
    ``prompt_id``); ``kind`` short, medium or long (the shipped set); ``max_tokens`` the tokens to
    ask for (default: the run's); ``input_tokens`` the prompt length aimed at (synthetic prompts)."""

    prompt: Required[str]
    id: str | int
    kind: str
    max_tokens: int
    input_tokens: int


def default_requests(concurrency: int) -> int:
    """Requests a run sends when :attr:`LoadSpec.n_requests` is not given: ``max(8, 2 × concurrency)``,
    so every slot is refilled at least once and a percentile is over at least 8 requests."""
    return max(8, 2 * concurrency)


def _whole(name: str, value: int | None, low: int) -> None:
    if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < low):
        raise ValueError(f"{name} must be a whole number >= {low}, got {value!r}")


def _positive(name: str, value: float | None) -> None:
    if value is not None and (isinstance(value, bool) or not isinstance(value, int | float)
                              or not math.isfinite(value) or value <= 0):
        raise ValueError(f"{name} must be a positive number, got {value!r}")


@dataclass(frozen=True)
class LoadSpec:
    """What to send and how to pace it.

    * ``n_requests``: requests to send after the warm-up (default :func:`default_requests` of the
      concurrency); ``max_tokens``: tokens each asks for, unless its prompt says otherwise;
      ``prompts``: strings or :class:`Prompt` dicts, drawn in a seeded random order (default the
      shipped set); ``warmup``: requests sent first, one at a time, left out of the figures.
    * Pacing. Closed loop (``rate`` None): ``concurrency`` requests in flight at all times
      (default 1). Open loop: arrivals at ``rate`` requests/s with gamma gaps of shape
      ``burstiness`` (1 = Poisson; lower is burstier), ``concurrency`` then an optional cap on
      requests in flight (default none). ``seed`` fixes prompt order and arrival times.
    * ``max_duration_s``: requests not sent by then are recorded ``not_sent``.
    """

    n_requests: int | None = None
    concurrency: int | None = None
    rate: float | None = None
    burstiness: float = 1.0
    max_tokens: int = 32
    prompts: Sequence[str | Prompt] | None = None
    warmup: int = 1
    max_duration_s: float | None = None
    seed: int = 0

    def __post_init__(self) -> None:
        for name, low in (("n_requests", 1), ("concurrency", 1), ("max_tokens", 1), ("warmup", 0),
                          ("seed", 0)):
            _whole(name, getattr(self, name), low)
        for name in ("rate", "burstiness", "max_duration_s"):
            _positive(name, getattr(self, name))
        if self.prompts is not None and not self.prompts:
            raise ValueError("prompts is an empty list: pass at least one prompt, or None for the "
                             "shipped set")

    @property
    def closed(self) -> bool:
        """Whether this is a closed loop (no ``rate``)."""
        return self.rate is None

    @property
    def in_flight(self) -> int | None:
        """The concurrency the run holds: ``concurrency`` (1 when unset) in a closed loop, the cap
        (None: no cap) in an open one."""
        return (self.concurrency or 1) if self.closed else self.concurrency

    @property
    def requests(self) -> int:
        """The number of requests the run sends (``n_requests`` or its default)."""
        return self.n_requests or default_requests(self.concurrency or 1)


@dataclass(frozen=True)
class ClientSpec:
    """How to reach an OpenAI-compatible server given by URL (a :class:`~labkit.serving.streaming.Backend`
    target carries its own): ``model`` (default: the only one it serves), ``endpoint`` "chat" or
    "completions", ``ignore_eos`` (exactly ``max_tokens`` tokens per request: vLLM, SGLang),
    ``timeout_s`` (the longest wait for the next bytes, s), ``total_timeout_s`` (optional bound on
    a whole request, s), ``tokenizer`` (a transformers tokenizer to count tokens when the server
    sends no usage figures). See :func:`labkit.serving.openai_api.openai_backend`."""

    model: str | None = None
    endpoint: str = "chat"
    ignore_eos: bool = False
    timeout_s: float = 120.0
    total_timeout_s: float | None = None
    tokenizer: Any = None

    def __post_init__(self) -> None:
        if self.endpoint not in ("chat", "completions"):
            raise ValueError(f"endpoint must be 'chat' or 'completions', got {self.endpoint!r}")
        for name in ("timeout_s", "total_timeout_s"):
            _positive(name, getattr(self, name))
