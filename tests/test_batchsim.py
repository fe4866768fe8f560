"""Static, dynamic and continuous batching of one engine, simulated with simpy
(labkit.production.batchsim, chapter 08): hand-computed cases, policy ordering, fitting, determinism."""

import matplotlib
import numpy as np
import pytest

from labkit.production import batchsim as bs

matplotlib.use("Agg")

UNIT = bs.StepCost(prefill_s_per_token=0.0, decode_base_s=1.0, decode_per_seq_s=0.0)  # 1 s per step


def reqs(outputs, arrivals=None, inputs=None):
    arrivals = arrivals or [0.0] * len(outputs)
    inputs = inputs or [0] * len(outputs)
    return [{"id": i, "arrival_s": a, "input_tokens": n_in, "output_tokens": o}
            for i, (a, n_in, o) in enumerate(zip(arrivals, inputs, outputs, strict=True))]


def ends(result):
    return [r["end_s"] for r in result["requests"]]


def test_step_cost_is_a_line_in_the_batch_size():
    c = bs.StepCost(0.001, 0.05, 0.01)
    assert c.decode_step_s(1) == pytest.approx(0.06)
    assert c.decode_step_s(8) == pytest.approx(0.13)


def test_two_requests_static_waits_for_the_longest_continuous_frees_at_once():
    static = bs.simulate_batching("static", reqs([3, 5]), UNIT, max_batch=2)
    assert static["makespan_s"] == 5 and ends(static) == [5, 5]
    assert [r["first_token_s"] for r in static["requests"]] == [5, 5]    # non-streaming: all at batch end
    assert static["throughput_tok_s"] == pytest.approx(8 / 5)
    cont = bs.simulate_batching("continuous", reqs([3, 5]), UNIT, max_batch=2)
    assert cont["makespan_s"] == 5 and ends(cont) == [3, 5]
    assert [r["first_token_s"] for r in cont["requests"]] == [1, 1]       # end of the prefill step
    assert cont["p50_ttft_s"] == 1 and static["p50_ttft_s"] == 5


def test_three_requests_batch_two_continuous_finishes_earlier():
    static = bs.simulate_batching("static", reqs([5, 1, 1]), UNIT, max_batch=2)
    assert ends(static) == [5, 5, 6] and static["makespan_s"] == 6
    assert static["mean_batch"] == pytest.approx((2 * 5 + 1 * 1) / 6)    # finished requests keep their slot
    cont = bs.simulate_batching("continuous", reqs([5, 1, 1]), UNIT, max_batch=2)
    assert ends(cont) == [5, 1, 2] and cont["makespan_s"] == 5
    assert cont["mean_batch"] == pytest.approx((2 + 2 + 1 + 1 + 1) / 5)
    assert cont["throughput_tok_s"] > static["throughput_tok_s"]
    assert static["busy_fraction"] == cont["busy_fraction"] == 1.0


def test_prefill_is_charged_per_prompt_token():
    cost = bs.StepCost(prefill_s_per_token=0.01, decode_base_s=1.0, decode_per_seq_s=0.5)
    r = reqs([2, 2], inputs=[10, 30])
    static = bs.simulate_batching("static", r, cost, max_batch=2)
    assert static["makespan_s"] == pytest.approx(0.4 + 2 * 2.0)
    cont = bs.simulate_batching("continuous", r, cost, max_batch=2)
    assert cont["makespan_s"] == pytest.approx(4.4)
    assert cont["requests"][0]["first_token_s"] == pytest.approx(2.4)     # prefill 0.4 + one step of 2


def test_dynamic_starts_on_timeout_static_waits_for_a_full_batch():
    r = reqs([2, 2, 2], arrivals=[0.0, 10.0, 100.0])
    dyn = bs.simulate_batching("dynamic", r, UNIT, max_batch=2, timeout_s=0.5)
    assert [x["start_s"] for x in dyn["requests"]] == pytest.approx([0.5, 10.5, 100.0])  # last: flushed
    assert dyn["requests"][0]["end_s"] == pytest.approx(2.5)
    static = bs.simulate_batching("static", r, UNIT, max_batch=2)
    assert [x["start_s"] for x in static["requests"]] == [10.0, 10.0, 100.0]
    assert dyn["p99_e2e_s"] < static["p99_e2e_s"]
    full = bs.simulate_batching("dynamic", reqs([2, 2], arrivals=[0.0, 0.2]), UNIT, 2, timeout_s=0.5)
    assert [x["start_s"] for x in full["requests"]] == [0.2, 0.2]        # a full batch does not wait


def test_dynamic_never_holds_a_request_past_its_timeout_while_the_engine_is_idle():
    cost = bs.StepCost(0.0005, 0.08, 0.014)
    r = bs.mixed_requests(40, rate=1.0, seed=3)
    out = bs.simulate_batching("dynamic", r, cost, max_batch=8, timeout_s=0.25)
    free_at = 0.0
    for rec in sorted(out["requests"], key=lambda x: x["start_s"]):
        # a batch starts at the latest when the engine is free and its oldest request's timeout is up
        assert rec["start_s"] <= max(free_at, rec["arrival_s"] + 0.25) + 1e-9
        free_at = max(free_at, rec["end_s"])


def test_continuous_beats_static_on_mixed_lengths():
    cost = bs.fit_step_cost([(64, 0.05), (256, 0.19)], [(1, 0.077), (8, 0.216), (16, 0.29)])
    for rate in (None, 4.0):
        r = bs.mixed_requests(64, rate=rate, seed=0)
        out = {p: bs.simulate_batching(p, r, cost, max_batch=8) for p in bs.POLICIES}
        assert out["continuous"]["throughput_tok_s"] >= out["static"]["throughput_tok_s"]
        assert out["continuous"]["p50_e2e_s"] < out["static"]["p50_e2e_s"]
        for res in out.values():
            assert res["accounted"] and res["completed"] == res["n"] == 64
            for rec in res["requests"]:
                assert rec["arrival_s"] <= rec["start_s"] <= rec["first_token_s"] <= rec["end_s"]


def test_fit_step_cost_recovers_known_lines():
    pre = [(t, 0.01 + 0.002 * t) for t in (64, 128, 256)]
    dec = [(b, 0.07 + 0.015 * b) for b in (1, 8, 16)]
    c = bs.fit_step_cost(pre, dec)
    assert c.prefill_s_per_token == pytest.approx(0.002)
    assert (c.decode_base_s, c.decode_per_seq_s) == (pytest.approx(0.07), pytest.approx(0.015))
    one = bs.fit_step_cost([(100, 0.5)], [(4, 0.2)])
    assert (one.prefill_s_per_token, one.decode_base_s, one.decode_per_seq_s) == (0.005, 0.2, 0.0)
    noisy = bs.fit_step_cost([(100, 0.5)], [(1, 0.2), (8, 0.1)])                # falling: clamped
    assert noisy.decode_per_seq_s == 0.0 and noisy.decode_base_s > 0


@pytest.mark.parametrize("pre,dec", [([], [(1, 0.1)]), ([(10, 0.1)], []), ([(0, 0.1)], [(1, 0.1)]),
                                     ([(10, -0.1)], [(1, 0.1)]), ([(10, 0.1, 3)], [(1, 0.1)])])
def test_fit_step_cost_rejects_bad_points(pre, dec):
    with pytest.raises(ValueError):
        bs.fit_step_cost(pre, dec)


def test_mixed_requests_ranges_arrivals_and_seed():
    r = bs.mixed_requests(2000, input_tokens=(10, 12), output_tokens=(1, 3), rate=5.0, seed=1)
    assert {x["input_tokens"] for x in r} == {10, 11, 12} and {x["output_tokens"] for x in r} == {1, 2, 3}
    gaps = np.diff([0.0] + [x["arrival_s"] for x in r])
    assert np.all(gaps >= 0) and np.mean(gaps) == pytest.approx(0.2, rel=0.1)
    assert all(x["arrival_s"] == 0 for x in bs.mixed_requests(5))
    assert bs.mixed_requests(20, rate=2.0, seed=7) == bs.mixed_requests(20, rate=2.0, seed=7)
    assert bs.mixed_requests(20, rate=2.0, seed=7) != bs.mixed_requests(20, rate=2.0, seed=8)
    for bad in (dict(n=0), dict(n=3, rate=0.0), dict(n=3, output_tokens=(0, 4)),
                dict(n=3, input_tokens=(9, 2))):
        with pytest.raises(ValueError):
            bs.mixed_requests(**bad)


def test_mixed_requests_draw_arrivals_from_the_shared_generator():
    from labkit.serving import arrivals

    rng = np.random.default_rng(4)
    rng.integers(32, 129, 30)                                   # the token counts come first
    rng.integers(8, 65, 30)
    gaps = arrivals.gaps(30, 2.0, seed=rng)
    assert [x["arrival_s"] for x in bs.mixed_requests(30, rate=2.0, seed=4)] == pytest.approx(np.cumsum(gaps))


def test_workload_requests_from_a_measured_workload():
    work = [{"id": "w0", "max_tokens": 5}, {"id": "w1", "max_tokens": 100}, {"id": "w2", "max_tokens": 7}]
    r = bs.workload_requests(work, {"w0": 40, "w1": 60})           # w2 unseen: the mean, 50
    assert [(x["id"], x["arrival_s"], x["input_tokens"], x["output_tokens"]) for x in r] == \
        [(0, 0.0, 40, 5), (1, 0.0, 60, 100), (2, 0.0, 50, 7)]
    timed = bs.workload_requests(work * 400, 33.0, rate=4.0, seed=2)
    t = np.array([x["arrival_s"] for x in timed])
    assert t[0] == 0 and np.all(np.diff(t) >= 0) and np.diff(t).mean() == pytest.approx(0.25, rel=0.1)
    assert {x["input_tokens"] for x in timed} == {33}
    assert timed == bs.workload_requests(work * 400, 33.0, rate=4.0, seed=2)
    assert timed != bs.workload_requests(work * 400, 33.0, rate=4.0, seed=3)
    for bad in (dict(work=[], prompt_tokens=10), dict(work=work, prompt_tokens={}),
                dict(work=work, prompt_tokens=10, rate=0)):
        with pytest.raises(ValueError):
            bs.workload_requests(**bad)


def test_simulation_is_deterministic():
    cost = bs.StepCost(0.0005, 0.08, 0.014)
    r = bs.mixed_requests(50, rate=3.0, seed=11)
    for p in bs.POLICIES:
        assert bs.simulate_batching(p, r, cost, 8) == bs.simulate_batching(p, r, cost, 8)


def test_bad_arguments_raise():
    r = reqs([2])
    with pytest.raises(ValueError, match="policy"):
        bs.simulate_batching("greedy", r, UNIT, 2)
    with pytest.raises(ValueError, match="max_batch"):
        bs.simulate_batching("static", r, UNIT, 0)
    with pytest.raises(ValueError, match="timeout_s"):
        bs.simulate_batching("dynamic", r, UNIT, 2, timeout_s=0)
    with pytest.raises(ValueError, match="empty"):
        bs.simulate_batching("continuous", [], UNIT, 2)
    with pytest.raises(ValueError, match="output_tokens"):
        bs.simulate_batching("continuous", reqs([0]), UNIT, 2)


def test_sweep_and_tradeoff_plot():
    cost = bs.StepCost(0.0005, 0.08, 0.014)
    runs = {p: [{"rate": r, **bs.simulate_batching(p, bs.mixed_requests(30, rate=r, seed=0), cost, 8, 0.1)}
                for r in (0.5, 2.0)] for p in bs.POLICIES}
    assert [r["rate"] for r in runs["static"]] == [0.5, 2.0]
    assert all(r["accounted"] for rs in runs.values() for r in rs)
    measured = [{"label": "vLLM c=8", "throughput_tok_s": 37.0, "p99_e2e_s": 2.0}]
    ax = bs.plot_tradeoff(runs, measured=measured)
    assert [t.get_text() for t in ax.get_legend().get_texts()] == list(bs.POLICIES)
    assert [t.get_text() for t in ax.texts] == ["vLLM c=8"]
    assert ax.lines[0].get_xdata().tolist() == [r["throughput_tok_s"] for r in runs["static"]]


def test_unpadded_static_drops_finished_sequences_from_the_steps():
    # a gate in front of vLLM: the batch [5, 1] still waits for 5 steps, but after the first step
    # only one sequence is decoding; the short request returns after its own step
    cost = bs.StepCost(prefill_s_per_token=0.0, decode_base_s=1.0, decode_per_seq_s=1.0)
    padded = bs.simulate_batching("static", reqs([5, 1]), cost, max_batch=2)
    gate = bs.simulate_batching("static", reqs([5, 1]), cost, max_batch=2, padded=False)
    assert padded["makespan_s"] == 5 * 3.0 and ends(padded) == [15.0, 15.0]
    assert gate["makespan_s"] == 3.0 + 4 * 2.0 and ends(gate) == [11.0, 3.0]
    # with a step cost that does not grow with the batch the two agree on the makespan
    same = [bs.simulate_batching("static", reqs([5, 1, 3]), UNIT, 2, padded=p)["makespan_s"]
            for p in (True, False)]
    assert same[0] == same[1] == 8


def test_all_queued_at_once_continuous_is_never_slower_by_construction():
    # what chapter 08 used to check on a run: with every request queued at 0 s and FIFO order it holds
    # for any step costs >= 0, so it is a property of the simulator, tested here, not a chapter claim
    rng = np.random.default_rng(0)
    for _ in range(20):
        cost = bs.StepCost(*rng.uniform(0, 0.01, 1), *rng.uniform(0, 0.1, 2))
        r = bs.mixed_requests(int(rng.integers(1, 40)), output_tokens=(1, 120), seed=int(rng.integers(1000)))
        cont = bs.simulate_batching("continuous", r, cost, 8)
        for padded in (True, False):
            static = bs.simulate_batching("static", r, cost, 8, padded=padded)
            assert static["accounted"] and static["completed"] == len(r)
            assert cont["makespan_s"] <= static["makespan_s"] + 1e-9
