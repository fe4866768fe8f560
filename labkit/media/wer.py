"""Word error rate for speech recognition (chapter 07, "Beyond LLMs").

WER = (substitutions + deletions + insertions) / words in the reference, after both texts are
normalised the same way (lower case, punctuation dropped, hyphens split words). The edit-distance
alignment is jiwer's (a maintained package); this module only fixes the normalisation so that
"Cheaply." and "cheaply" count as the same word.
"""

from __future__ import annotations

import re

import jiwer

_PUNCT = re.compile(r"[^\w\s']")


def normalize(text: str) -> str:
    """Lower case, hyphens and other punctuation replaced by spaces (apostrophes kept), single spaces."""
    return " ".join(_PUNCT.sub(" ", text.lower()).split())


def wer_details(reference: str, hypothesis: str) -> dict[str, float | int]:
    """Alignment counts of ``hypothesis`` against ``reference`` (both normalised):
    ``{"wer", "substitutions", "deletions", "insertions", "hits", "reference_words"}``."""
    ref, hyp = normalize(reference), normalize(hypothesis)
    if not ref:
        raise ValueError("the reference text is empty after normalisation; WER needs at least one word")
    if not hyp:  # jiwer refuses empty strings; every reference word is then deleted
        n = len(ref.split())
        return {
            "wer": 1.0,
            "substitutions": 0,
            "deletions": n,
            "insertions": 0,
            "hits": 0,
            "reference_words": n,
        }
    out = jiwer.process_words(ref, hyp)
    return {
        "wer": float(out.wer),
        "substitutions": out.substitutions,
        "deletions": out.deletions,
        "insertions": out.insertions,
        "hits": out.hits,
        "reference_words": out.hits + out.substitutions + out.deletions,
    }


def wer(reference: str, hypothesis: str) -> float:
    """Word error rate of ``hypothesis`` against ``reference`` (0 = perfect; can exceed 1)."""
    return float(wer_details(reference, hypothesis)["wer"])
