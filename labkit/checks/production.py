"""Chapter 08's final checks (production): rules over the figures ``08_production.ipynb`` recorded.

Each rule compares figures whose outcome is open on any machine; what holds by construction of the
simulators (request accounting, continuous >= static with every request queued at once) is a unit
test of ``labkit.production`` (tests/test_batchsim.py, test_fleet.py, test_rollout.py), not a rule.
``fails_on`` inputs are recorded runs, or the figures the named scenario printed, cited per rule.
"""

from __future__ import annotations

from . import Values, rule

SIM_TOLERANCE = 0.35      # the simulator's continuous throughput against the measured median run
# The simulator's continuous/static ratio against the measured one: the same margin as its throughput,
# since the ratio is what the simulator's policy comparison extends to other loads. The first runs gave
# -12% (AVX2 cap, fp32, 13:31) and -20% (AMX, bf16, 14:02): its static gate is faster than vLLM's.
RATIO_TOLERANCE = 0.35


@rule("production", "continuous batching served more tokens/s than static batching on one server, "
      "in every round (each continuous run against its own round's static run)",
      needs=("continuous_over_static_lo", "continuous_over_static_measured"),
      # constructed, no failing run recorded: a server whose decode step costs grow in proportion to the
      # batch gains nothing from refilling slots, and continuous runs land within noise of static
      fails_on={"continuous_over_static_lo": 0.97, "continuous_over_static_measured": 1.03},
      holds_on={"continuous_over_static_lo": 1.95, "continuous_over_static_measured": 2.53})  # 14:02 run
def continuous_beats_static(v: Values) -> tuple[bool, str]:
    lo, med = v["continuous_over_static_lo"], v["continuous_over_static_measured"]
    return lo > 1.0, f"{med:.2f}x in the median round, {lo:.2f}x in the round with the smallest gain"


@rule("production", "the simulator predicted the measured continuous throughput within "
      f"{SIM_TOLERANCE:.0%} (median of the rounds, each against its own calibration)",
      needs=("sim_error_pct",),
      # stop 26: judged fastest calibration (of 5) against fastest continuous run (of 3), with the step at 8
      # extrapolated from 1 and 4, it missed by +43% and +40% in 2 of 6 runs (spread -23% to +43%). Per round,
      # with a step measured at 8, six rounds at 20:12 gave -8, -2, 0, -8, +9, -15% (median -5%), while the
      # 1-and-4 extrapolation gave -15, -8, -14, -11, +11, -36%. Failing input: commit 1c77856's fresh-clone
      # run, -42%, a simulator whose steps were a slow calibration's
      fails_on={"sim_error_pct": -42.0}, holds_on={"sim_error_pct": -5.0})
def simulator_calibrated(v: Values) -> tuple[bool, str]:
    e = v["sim_error_pct"]
    return abs(e) <= 100 * SIM_TOLERANCE, f"{e:+.0f}%"


@rule("production", "the simulator's continuous/static ratio matched the measured one within "
      f"{RATIO_TOLERANCE:.0%} (median of the rounds, each against its own calibration and static run)",
      needs=("continuous_over_static_simulated", "continuous_over_static_measured"),
      # the 14:02 run's simulated 2.03x against a static run landing in the host's slow mode (steps about
      # 1.5x slower, batching.step_costs), which would have measured 2.53 x 1.5 = 3.80x: -47%. Stop 27: with
      # one static run after all the rounds, a run at 21:00 gave simulated 2.03x against measured 1.44x
      # (+41%); the static run now runs in every round, after that round's continuous run
      fails_on={"continuous_over_static_simulated": 2.03, "continuous_over_static_measured": 3.80},
      # the 14:02 run (AMX, bf16): simulated 2.03x with the gate model, measured 2.53x
      holds_on={"continuous_over_static_simulated": 2.03, "continuous_over_static_measured": 2.53})
def simulator_ratio(v: Values) -> tuple[bool, str]:
    sim, meas = v["continuous_over_static_simulated"], v["continuous_over_static_measured"]
    err = sim / meas - 1
    return abs(err) <= RATIO_TOLERANCE, f"simulated {sim:.2f}x, measured {meas:.2f}x ({err:+.0%})"


def _seeds(v: Values, prefix: str) -> tuple[bool, str]:
    n, loaded, cut = v[f"{prefix}_seeds"], v[f"{prefix}_seeds_loaded"], v[f"{prefix}_seeds_cut"]
    ok = n >= 5 and loaded == n and cut == n
    return ok, (f"the autoscaler alone hurt requests on {loaded} of {n} seeds; the change cut them on {cut}"
                + (f" (mean cut {v[f'{prefix}_cut_mean']:.0f})" if f"{prefix}_cut_mean" in v else ""))


@rule("production", "a warm pool of 1 cut the late or dropped requests of a burst, on every seed",
      needs=("warm_pool_seeds", "warm_pool_seeds_loaded", "warm_pool_seeds_cut"),
      # issue 20: one day-trace run on one seed had nothing late even without the pool (0 -> 0)
      fails_on={"warm_pool_seeds": 5, "warm_pool_seeds_loaded": 3, "warm_pool_seeds_cut": 3},
      holds_on={"warm_pool_seeds": 5, "warm_pool_seeds_loaded": 5, "warm_pool_seeds_cut": 5})     # 14:02 run
def warm_pool(v: Values) -> tuple[bool, str]:
    return _seeds(v, "warm_pool")


@rule("production", "int4 weights (a shorter cold start) cut them too, on every seed",
      needs=("int4_seeds", "int4_seeds_loaded", "int4_seeds_cut"),
      # tests/test_fleet.py: one seed of five the change did not cut (280 -> 281)
      fails_on={"int4_seeds": 5, "int4_seeds_loaded": 5, "int4_seeds_cut": 4},
      holds_on={"int4_seeds": 5, "int4_seeds_loaded": 5, "int4_seeds_cut": 5})       # 14:02 run
def int4_weights(v: Values) -> tuple[bool, str]:
    return _seeds(v, "int4")


@rule("production", "a 5% canary exposed fewer requests to a bad version than blue-green (mean over seeds, "
      "95% intervals apart)",
      needs=("canary_exposed_mean", "canary_exposed_hi", "bluegreen_exposed_mean", "bluegreen_exposed_lo"),
      # tests/test_rollout.py's fast scenario (answers in 0.5 s, 0.48 requests/s, acted on at once):
      # the canary's 24.9 [22.1, 27.8] against blue-green's 21.0 [18.8, 23.1] over 24 seeds
      fails_on={"canary_exposed_mean": 24.9, "canary_exposed_hi": 27.8, "bluegreen_exposed_mean": 21.0,
                "bluegreen_exposed_lo": 18.8},
      holds_on={"canary_exposed_mean": 29.0, "canary_exposed_hi": 33.3, "bluegreen_exposed_mean": 75.0,
                "bluegreen_exposed_lo": 71.6})                                      # 14:02 run
def canary_exposes_less(v: Values) -> tuple[bool, str]:
    return v["canary_exposed_hi"] < v["bluegreen_exposed_lo"], (
        f"{v['canary_exposed_mean']:.1f} (up to {v['canary_exposed_hi']:.1f}) vs "
        f"{v['bluegreen_exposed_mean']:.1f} (from {v['bluegreen_exposed_lo']:.1f})")


def _llamacpp(v: Values) -> str | None:
    return None if v.get("llamacpp_monitored") else "llama.cpp is not built here (make llamacpp)"


@rule("production", "the monitor read llama-server's /metrics: its token counter matched the client's "
      "count, and its queue gauge showed requests waiting for a slot",
      needs=("llamacpp_server_over_client_tokens", "llamacpp_max_waiting"), when=_llamacpp,
      # the last scrape taken before llama-server added the last two requests' tokens (it adds a request's
      # tokens when it ends): 6 of 8 requests counted; illustrative (mapping the counter to
      # llamacpp:n_decode_total, decode calls, would read 96 for 144 tokens in tests/data: 0.67)
      fails_on={"llamacpp_server_over_client_tokens": 0.75, "llamacpp_max_waiting": 2.0,
                "llamacpp_monitored": True},
      holds_on={"llamacpp_server_over_client_tokens": 1.0, "llamacpp_max_waiting": 2.0,
                "llamacpp_monitored": True})  # 2 slots, 8 requests 4 at a time, 2026-12-01
def llamacpp_metrics_read(v: Values) -> tuple[bool, str]:
    ratio, waiting = v["llamacpp_server_over_client_tokens"], v["llamacpp_max_waiting"]
    return abs(ratio - 1) <= 0.02 and waiting >= 1, (f"server/client tokens {ratio:.3f}; up to {waiting:.0f} "
                                                    "requests queued")


@rule("production", "on the same simulated day, the manifest's autoscaler (running requests with queue "
      "depth second, the HPA's tolerance, sync, scrape and behaviour, the pods' grace period) left fewer "
      "requests late or dropped than scaling on queue depth alone, on no more replica-hours",
      needs=("hpa_manifest_hurt", "hpa_naive_hurt", "hpa_manifest_gpu_hours", "hpa_naive_gpu_hours"),
      # deploy/k8s before issue 21 scaled on queue depth alone: the manifest's policy was the naive one, and
      # its figures were the naive policy's (2026-12-01 trial, seed 0, 420 s cold start: 16221 late + 10566
      # dropped, 431.3 replica-hours)
      fails_on={"hpa_manifest_hurt": 26787, "hpa_naive_hurt": 26787, "hpa_manifest_gpu_hours": 431.3,
                "hpa_naive_gpu_hours": 431.3},
      # the same trial with the manifest's policy: 1684 late + 63 dropped on 144.5 replica-hours
      holds_on={"hpa_manifest_hurt": 1747, "hpa_naive_hurt": 26787, "hpa_manifest_gpu_hours": 144.5,
                "hpa_naive_gpu_hours": 431.3})
def manifest_autoscaler(v: Values) -> tuple[bool, str]:
    m, n = v["hpa_manifest_hurt"], v["hpa_naive_hurt"]
    hm, hn = v["hpa_manifest_gpu_hours"], v["hpa_naive_gpu_hours"]
    return m < n and hm <= hn, (f"late or dropped {m:.0f} vs {n:.0f} on queue depth alone; replica-hours "
                                f"{hm:.1f} vs {hn:.1f}")
