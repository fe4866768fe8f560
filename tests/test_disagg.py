"""Prefill and decode together or apart (labkit.production.disagg, chapter 05): token times worked out by
hand for one and two requests, the stall each layout lets a long prompt cause, and the bookkeeping."""

import pytest

from labkit.production import disagg
from labkit.production.batchsim import StepCost

COST = StepCost(prefill_s_per_token=0.01, decode_base_s=0.1, decode_per_seq_s=0.0)


def _req(arrival, prompt, out):
    return {"arrival_s": arrival, "input_tokens": prompt, "output_tokens": out}


def test_a_lone_request_on_a_colocated_engine():
    times, busy = disagg.simulate([_req(0.0, 50, 3)], COST, disagg.Layout("c", colocated=1))
    # the prompt's step (0.5 s) brings the first token, then two decode steps of 0.1 s
    assert times[0] == pytest.approx([0.5, 0.6, 0.7])
    assert busy["colocated"] == pytest.approx(0.7)


def test_a_lone_request_through_the_pools_pays_the_transfer_once():
    lay = disagg.Layout("d", prefill=1, decode=1, transfer_s_per_token=0.001)
    times, busy = disagg.simulate([_req(0.0, 50, 3)], COST, lay)
    # prefill 0.5 s (first token), KV over the link 0.05 s, then two decode steps
    assert times[0] == pytest.approx([0.5, 0.65, 0.75])
    assert busy == pytest.approx({"prefill": 0.5, "decode": 0.2})


def _stall(layout):
    # an answer streams from t = 0.1; a 300-token prompt arrives at 0.35 on the same fleet
    reqs = [_req(0.0, 10, 20), _req(0.35, 300, 2)]
    times, busy = disagg.simulate(reqs, COST, layout)
    s = disagg.summarize(reqs, times, busy, layout)
    first = times[0]
    return max(b - a for a, b in zip(first, first[1:], strict=False)), s


def test_a_long_prompt_stalls_a_colocated_answer_less_in_chunks_and_not_at_all_apart():
    whole, _ = _stall(disagg.Layout("whole", colocated=1, budget=2048))
    chunked, _ = _stall(disagg.Layout("chunks", colocated=1, budget=50))
    apart, s = _stall(disagg.Layout("apart", prefill=1, decode=1))
    assert whole == pytest.approx(300 * 0.01 + 0.1)  # the whole prompt in one step with the answer's token
    assert chunked == pytest.approx(50 * 0.01 + 0.1)  # one 50-token chunk per step
    assert apart == pytest.approx(0.1)  # the decode engine never prefills
    assert s["ttft_p99_s"] > 0 and 0 < s["busy_decode"] <= 1


def test_every_request_gets_all_its_tokens_under_load_in_every_layout():
    reqs = disagg.prompt_mix(120, rate=3.0, short=20, long=200, long_share=0.3, output_tokens=8, seed=1)
    layouts = [disagg.Layout("c", colocated=2), disagg.Layout("k", colocated=2, budget=32),
               disagg.Layout("d", prefill=1, decode=1, transfer_s_per_token=0.0005)]
    for lay in layouts:
        times, busy = disagg.simulate(reqs, COST, lay)
        assert [len(t) for t in times] == [8] * 120
        assert all(t[0] >= q["arrival_s"] for t, q in zip(times, reqs, strict=True))
        s = disagg.summarize(reqs, times, busy, lay)
        assert all(0 < v <= 1 for k, v in s.items() if k.startswith("busy_")), s


def test_the_mix_and_the_capacity():
    reqs = disagg.prompt_mix(1000, rate=2.0, short=10, long=100, long_share=0.25, output_tokens=4, seed=0)
    assert reqs[0]["arrival_s"] == 0.0
    assert 0.2 < sum(q["input_tokens"] == 100 for q in reqs) / 1000 < 0.3
    # one engine, 4 slots: 10-token prompt 0.1 s + 4 tokens x 0.1 s / 4 slots = 0.2 s a request
    assert disagg.capacity_rps(COST, 10, 4, engines=1, slots=4) == pytest.approx(5.0)


@pytest.mark.parametrize("kw", [dict(colocated=1, prefill=1, decode=1), dict(prefill=1), dict(),
                                dict(colocated=1, slots=0),
                                dict(prefill=1, decode=1, transfer_s_per_token=-1)])
def test_a_layout_that_is_not_one_of_the_two_is_refused(kw):
    with pytest.raises(ValueError):
        disagg.Layout("bad", **kw)
