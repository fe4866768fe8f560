"""labkit.llm.paged_kv (chapter 06b): contiguous reservation against fixed-size KV blocks."""

import pytest

from labkit.llm.paged_kv import reservation


def test_known_answer():
    r = reservation([10, 16, 17], reserve=64, block=16, budget_tokens=640)
    assert (r["live"], r["contiguous"], r["paged"]) == (43, 192, 16 + 16 + 32)
    assert r["contiguous_live_share"] == pytest.approx(43 / 192)
    assert r["paged_live_share"] == pytest.approx(43 / 64)
    assert r["fit_contiguous"] == 10 and r["fit_paged"] == 30  # 640 tokens / (64 / 3) per sequence


def test_blocks_of_one_token_waste_nothing():
    assert reservation([3, 7, 100], reserve=128, block=1)["paged_live_share"] == 1


@pytest.mark.parametrize("lengths, reserve, block",
                         [([], 16, 16), ([0, 4], 16, 16), ([20], 16, 16), ([4], 16, 0)])
def test_bad_input_is_a_value_error(lengths, reserve, block):
    with pytest.raises(ValueError):
        reservation(lengths, reserve, block)
