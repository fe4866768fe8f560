"""labkit.media.wer: normalisation and word error rate (chapter 07)."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from labkit.media.wer import normalize, wer, wer_details


def levenshtein(a: list[str], b: list[str]) -> int:
    """Plain dynamic-programming edit distance over words: an independent cross-check of jiwer."""
    prev = list(range(len(b) + 1))
    for i, x in enumerate(a, 1):
        cur = [i]
        for j, y in enumerate(b, 1):
            cur.append(min(prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (x != y)))
        prev = cur
    return prev[-1]


def test_normalize_drops_case_and_punctuation_and_splits_hyphens():
    assert normalize("The quick, brown FOX-jumps.  Don't!") == "the quick brown fox jumps don't"


def test_counts_each_kind_of_error():
    d = wer_details("the cat sat on the mat", "the cat sat on a mat today")
    assert (d["substitutions"], d["deletions"], d["insertions"]) == (1, 0, 1)
    assert d["reference_words"] == 6
    assert d["wer"] == pytest.approx(2 / 6)
    assert wer("Cheaply.", "cheaply") == 0.0
    assert wer("one two three", "one three") == pytest.approx(1 / 3)


def test_empty_hypothesis_deletes_everything_and_empty_reference_is_refused():
    assert wer("three words here", "") == 1.0
    assert wer("three words here", " ... ") == 1.0
    with pytest.raises(ValueError, match="reference"):
        wer("?!", "something")


words = st.lists(st.sampled_from(["a", "b", "c", "dog", "fox"]), max_size=8)


@settings(max_examples=60, deadline=None)
@given(words.filter(bool), words)
def test_wer_is_edit_distance_over_reference_length(ref, hyp):
    expected = levenshtein(ref, hyp) / len(ref)
    assert wer(" ".join(ref), " ".join(hyp)) == pytest.approx(expected)
