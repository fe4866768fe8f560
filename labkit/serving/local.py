"""A transformers model in this process as a streaming backend, each token stamped after a device
sync (chapters 02 to 05 and 07)."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

from ..hardware.machine import synchronize
from .records import RequestRecord, fail, new_record


def generate_timed(model: Any, tokenizer: Any, prompt: str, max_tokens: int = 32,
                   chat: bool = True, ignore_eos: bool = False) -> RequestRecord:
    """Greedy-generate up to ``max_tokens`` for ``prompt`` and time every token (a request record).

    The clock starts before tokenization (a server's TTFT includes it too); a streamer receives
    each new token and stamps ``time.perf_counter()`` after :func:`labkit.hardware.machine.synchronize`,
    so on CUDA/MPS the time is when the token exists, not when its kernel was queued. Batch 1:
    every chunk is exactly one token (``token_source`` "streamer"). ``ignore_eos`` forces exactly
    ``max_tokens`` tokens (``min_new_tokens``)."""
    import torch
    from transformers.generation.streamers import BaseStreamer

    device = str(model.device)
    rec = new_record("transformers")
    times: list[float] = []
    ids: list[int] = []

    class Stamp(BaseStreamer):
        prompt_seen = False

        def put(self, value: Any) -> None:
            if not self.prompt_seen:  # generate() first pushes the prompt
                self.prompt_seen = True
                return
            synchronize(device)
            times.append(time.perf_counter())
            ids.extend(value.reshape(-1).tolist())

        def end(self) -> None:
            pass

    if chat and getattr(tokenizer, "chat_template", None):
        enc = tokenizer.apply_chat_template([{"role": "user", "content": prompt}], add_generation_prompt=True,
                                            return_tensors="pt", return_dict=True)
    else:
        enc = tokenizer(prompt, return_tensors="pt")
    enc = {k: v.to(device) for k, v in enc.items()}
    extra = {"min_new_tokens": max_tokens} if ignore_eos else {}
    try:
        with torch.inference_mode():
            model.generate(**enc, max_new_tokens=max_tokens, do_sample=False, streamer=Stamp(),
                           pad_token_id=tokenizer.eos_token_id if tokenizer.pad_token_id is None
                           else tokenizer.pad_token_id, **extra)
    except Exception as e:  # noqa: BLE001 - recorded, not lost: the record says what failed
        rec.t_end = time.perf_counter()
        return fail(rec, "error", f"{type(e).__name__}: {e}")
    rec.t_end = time.perf_counter()
    rec.chunks = [(t - rec.t_sent, 1) for t in times]
    rec.output_tokens, rec.token_source = len(ids), "streamer"
    rec.prompt_tokens = int(enc["input_ids"].shape[-1])
    rec.text = tokenizer.decode(ids, skip_special_tokens=True)
    rec.status = "ok"
    return rec


@dataclass(frozen=True)
class TransformersBackend:
    """:func:`generate_timed` behind the :class:`~labkit.serving.streaming.Backend` interface (chapter
    02): one request at a time (an in-process model has no batching scheduler, so ``max_concurrency``
    is 1); ``chat`` applies the tokenizer's chat template, ``ignore_eos`` generates every token asked."""

    model: Any
    tokenizer: Any
    chat: bool = True
    ignore_eos: bool = False
    max_concurrency: int | None = 1

    @property
    def name(self) -> str:
        return f"transformers {getattr(self.model, 'name_or_path', '')}"

    @contextlib.asynccontextmanager
    async def session(self) -> AsyncIterator[None]:
        yield None

    async def send(self, session: Any, prompt: str, max_tokens: int) -> RequestRecord:
        return await asyncio.to_thread(generate_timed, self.model, self.tokenizer, prompt, max_tokens,
                                       self.chat, self.ignore_eos)

    def check(self) -> None:
        """Nothing to reach: the model is in this process."""


def transformers_backend(model: Any, tokenizer: Any, chat: bool = True,
                         ignore_eos: bool = False) -> TransformersBackend:
    """The :class:`TransformersBackend` of ``model`` and ``tokenizer``."""
    return TransformersBackend(model, tokenizer, chat, ignore_eos)
