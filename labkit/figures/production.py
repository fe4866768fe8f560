"""Chapter 08's figures for the report, read from the page's variables once the chapter has run
(its closing cell calls :func:`labkit.figures.keep`)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from ..engines import llamacpp, vllm
from ..production import coldstart
from ..results import record, unmeasured
from ..settings import STUDY_SKIPPED
from ..stats import median_interval
from . import take


def keep(page: Mapping[str, Any]) -> None:
    """Record chapter 08's figures from ``page``, the notebook's variables at its end."""

    # Removing a replica: the streams it is serving
    if take(page, "drains")[0] is None:  # vLLM's CPU build is not installed here
        for key in ("drain_streams", "drain_streams_cut", "no_drain_streams_cut"):
            unmeasured("production", key, vllm.unavailable_reason())

    # Cost: an API per token or replicas per hour
    (BATCH, cold_start_s, cold_vllm, conts, gains, held_s, measured_gain, padded_gain, rounds,
     sim_errors, sim_gain, target, ttft_again, work) = take(page, (
        "BATCH cold_start_s cold_vllm conts gains held_s measured_gain padded_gain rounds "
        "sim_errors sim_gain target ttft_again work "))
    measured_runs = [run for r in rounds for run in (r.continuous, r.static) if run]  # every request
    page_batching_gap_s, mine = take(page, "page_batching_gap_s mine")
    record("production", "page_batching_gap_s", page_batching_gap_s, "s",
           f"largest |end time| difference between the chapter's continuous_batching and batchsim's "
           f"continuous policy, {len(mine)} requests queued at 0 s")
    record("production", "continuous_over_static_measured", measured_gain, "x",
           f"{target.engine}: output tokens/s, median of "
           f"{len(conts)} rounds, each continuous run vs its round's static gating, {len(work)} requests, "
           f"{BATCH} at a time", spread=(gains["lo"], gains["hi"], gains["n"]))
    record("production", "continuous_over_static_lo", gains["lo"], "x", "the round with the smallest gain")
    record("production", "continuous_over_static_simulated", sim_gain, "x",
           "batchsim, each round's own step costs, static as a gate; median round")
    record("production", "continuous_over_static_padded_sim", padded_gain, "x",
           "batchsim, static batches padded to their longest")
    record("production", "sim_error_pct", 100 * sim_errors["median"], "%",
           "simulated vs measured continuous throughput, each round "
           "against its own calibration at 1, 4 and 8 in flight; median round",
           spread=(100 * sim_errors["lo"], 100 * sim_errors["hi"], sim_errors["n"]))
    record("production", "sim_ratio_error_pct", 100 * (sim_gain / measured_gain - 1), "%",
           "simulated vs measured "
           "continuous/static ratio, each the median of the rounds (static simulated as the gate)")
    record("production", "batching_requests_unaccounted",
           sum(len(work) - s.completed + sum(x.status == "ok" and x.output_tokens
           != x.max_tokens for x in s.requests) for s in measured_runs),
           "requests", f"missing, failed or short, {len(measured_runs)} runs")
    record("production", "vllm_cold_start_s", cold_start_s, "s",
           f"{target.engine}: process start to first token")
    record("production", "cold_start_over_warm_ttft", cold_start_s / ttft_again, "x",
           "process start to first token vs a warm TTFT")
    record("production", "cold_start_over_request_s", cold_start_s / held_s, "x",
           f"process start to first token vs the {held_s:.1f} s "
           f"a request of the batching mix held its slot at {BATCH} in flight")
    if cold_vllm:
        build_s = cold_vllm["model_init_s"] + cold_vllm["engine_init_s"]  # NaN where the log lacks a phase
        record("production", "vllm_weights_and_engine_share",
               (cold_vllm["weights_s"] + build_s) / target.startup_s, "x",
               "vLLM's logged weight load, model and engine init (KV cache, warm-up) / its start")
        record("production", "vllm_weights_s", cold_vllm["weights_s"], "s", "vLLM's log: loading the weights")
        record("production", "vllm_engine_build_s", build_s, "s",
               "vLLM's log: model init and engine init (KV cache, profiling, warm-up)")
        record("production", "vllm_named_parts_logged", bool(cold_vllm["weights_s"] > 0 and build_s > 0), "",
               "both in vLLM's log, each taking time")
    else:
        unmeasured("production", "vllm_named_parts_logged",
                   f"no vLLM start was measured here ({target.engine}): vLLM's log names the parts")
    batch_eff, curve, prices, watched = take(page, "batch_eff curve prices watched")
    record("production", "cpu_cost_per_mtok_over_api_open_small",
           prices["gpus"]["cpu-2vcpu"]["per_gpu_hour"] / (curve[BATCH] * 3600 / 1e6)
           / prices["api"]["api-open-small"]["output_per_mtok"],
           "x", "this machine fully used at 8 vs the small open-model tier")
    record("production", "batch8_over_batch1_tokens_per_dollar", batch_eff, "x",
           "measured curve: tokens/s at 8 in flight vs 1")
    record("production", "monitor_watch_items", sum(watched.values()), "items",
           f"of the {len(watched)} the tutorial lists, from one run")
    record("production", "monitor_watch_missing",
           ", ".join(k for k, ok in watched.items() if not ok) or "none", "",
           f"items of the {len(watched)} the tutorial lists with no figure in one run")
    (H100, HERE, budget, crossings, day_slo, engine_s, engine_src, in_tok, manifest, matched, naive,
     out_tok, replica_cold_s) = take(page, (
        "H100 HERE budget crossings day_slo engine_s engine_src in_tok manifest matched naive out_tok "
        "replica_cold_s "))
    record("production", "gpu_cold_start_s", replica_cold_s["bf16"], "s",
           "GPU replica of Qwen3-4B, bf16, typical assumptions "
           "(node, image pull, weights, graph capture) + this machine's engine start",
           spread=(coldstart.budget_total(budget["bf16"], "low"),
                   coldstart.budget_total(budget["bf16"], "high"), 1))
    record("production", "gpu_cold_start_engine_s", engine_s, "s", f"measured: {engine_src}")
    record("production", "gpu_cold_start_outside_engine_share", 1 - engine_s / replica_cold_s["bf16"], "x",
           "node, image, weights and capture / the whole typical cold start")
    for key, r in (("naive", naive), ("manifest", manifest)):
        note = f"day of traffic, seed 0, {key} autoscaler, {replica_cold_s['bf16']:.0f} s cold starts"
        record("production", f"hpa_{key}_late", r["late"], "requests", note)
        record("production", f"hpa_{key}_dropped", r["dropped"], "requests", note)
        record("production", f"hpa_{key}_hurt", r["late"] + r["dropped"], "requests", note)
        record("production", f"hpa_{key}_gpu_hours", r["gpu_hours"], "replica-hours", note)
    record("production", "hpa_manifest_over_naive_hurt",
           np.divide(manifest["late"] + manifest["dropped"], naive["late"] + naive["dropped"]), "x",
           "late or dropped, the manifest's autoscaler ÷ queue depth alone, the same day")
    record("production", "hpa_manifest_p99_over_slo", manifest["p99_latency_s"] / day_slo, "x",
           f"P99 latency / the SLO of {day_slo:.0f} s")
    record("production", "hpa_manifest_over_naive_gpu_hours", manifest["gpu_hours"] / naive["gpu_hours"], "x",
           "replica-hours, the same two")
    L4 = take(page, "L4")[0]
    for case, key in ((HERE, "cpu"), (H100, "h100"), (L4, "l4")):
        tier = matched[case][0]
        record("production", f"{key}_matched_crossover_req_per_day", crossings[(case, tier)], "req/day",
               f"{case} vs {tier}, {in_tok:.0f} prompt + {out_tok:.0f} output tokens, prompts counted both "
               f"sides")

    # Batching policies when requests arrive spread out
    lo_rate, rates = take(page, "lo_rate rates")
    record("production", "static_over_dynamic_p99_low_rate", lo_rate["static"] / lo_rate["dynamic"], "x",
           f"batchsim at {rates[0]} req/s")

    # The same weights in two formats
    formats, starts = take(page, "formats starts")
    if formats:  # the small profile's safetensors and GGUF files
        st, gg = formats
        record("production", "safetensors_bytes", st["bytes"], "B", "the float32 safetensors file")
        record("production", "gguf_bytes", gg["bytes"], "B", gg["format"])
        record("production", "gguf_over_safetensors_bytes", gg["bytes"] / st["bytes"], "x", "file sizes")
        record("production", "safetensors_load_s", st["load_s"], "s",
               "memory-mapped, every page touched, in this process, one run")
        record("production", "gguf_load_s", gg["load_s"], "s",
               "every block decoded to floats (gguf-py), in this process, one run")
    else:
        unmeasured("production", "gguf_over_safetensors_bytes",
                   "only the small profile's bundled model ships as both safetensors and GGUF")
    if starts:
        pull = coldstart.pull_ratio(starts["Q4_1"], starts["F32"], "start_runs")
        for name, s in starts.items():
            mid = median_interval(s["start_runs"])["median"]
            record("production", f"llamacpp_{name.lower()}_start_s", mid, "s",
                   f"llama-server on the {name} GGUF, process start to 'model loaded' (its log's clock), "
                   f"median of {len(s['start_runs'])} rounds")
        record("production", "gguf_q4_over_f32_pull_and_start", pull["median"], "x",
               "llama-server on the same weights, Q4_1 GGUF vs F32 GGUF: download at "
               f"{coldstart.pull_bps() / 1e6:.0f} MB/s (a typical registry pull, cited) plus start to "
               f"'model loaded', median of {int(pull['n'])} rounds in alternating order, band their range",
               spread=(pull["lo"], pull["hi"], int(pull["n"])))
    else:
        unmeasured("production", "gguf_q4_over_f32_pull_and_start",
                   "needs the small profile's bundled GGUF and llama.cpp (make llamacpp)")

    # The autoscaler, one change at a time, for two request lengths
    if not take(page, "STUDY")[0]:
        unmeasured("production", "hpa_worst_tuning_step", STUDY_SKIPPED)
    else:
        DAY_SEEDS, HOLD_S, day_step = take(page, "DAY_SEEDS HOLD_S day_step")
        names = dict.fromkeys(b for _, b in day_step)  # the ladder's steps 2-4, in order
        steps = dict(zip(names, ("behaviour", "running", "queue_second"), strict=True))
        for (case, name), v in day_step.items():
            record("production", f"hpa_step_{steps[name]}_{case}", v["value"], "x",
                   f"late or dropped after / before one change ({name}), requests holding a slot "
                   f"{HOLD_S[case]:g} s, means over {v['n']} days, 95% bootstrap over days",
                   spread=(v["lo"], v["hi"], v["n"]))
        worst = max(day_step, key=lambda k: day_step[k]["value"])
        record("production", "hpa_worst_tuning_step", day_step[worst]["value"], "x",
               f"the largest of the {len(day_step)} one-change ratios ({worst[1]}, {worst[0]} requests of "
               f"{HOLD_S[worst[0]]:g} s); interval: the largest low end and the largest high end",
               spread=(
                   max(v["lo"] for v in day_step.values()), max(v["hi"] for v in day_step.values()),
                   len(DAY_SEEDS)))

    # Which replica: round-robin, least-loaded or prefix-aware (simulated)
    lb_runs = take(page, "lb_runs")[0]
    for policy, runs in lb_runs.items():
        key = policy.replace("-", "_")
        record("production", f"lb_{key}_hit_rate", float(np.median([r.hit_rate for r in runs])), "fraction",
               f"{policy} routing: requests whose prefix was cached where they ran, median of {len(runs)} "
               "seeds "
               "(simulated, assumed workload)")
        record("production", f"lb_{key}_ttft_p99_s", float(np.median([r.ttft_p99_s for r in runs])), "s",
               f"{policy} routing: P99 TTFT, median of {len(runs)} seeds (simulated, measured costs)",
               spread=(min(r.ttft_p99_s for r in runs), max(r.ttft_p99_s for r in runs), len(runs)))

    # Does a replica's cache keep what the simulation's keeps? (measured on vLLM, Going further)
    lb_replays, lb_cache_rows, studied = take(page, "lb_replays lb_cache_rows STUDY")
    if not lb_replays:
        unmeasured("production", "lb_vllm_whole_small_pool",
                   "vLLM is not installed here (make serve-setup)" if studied else STUDY_SKIPPED)
    for row, size in zip(lb_cache_rows, ("small", "large"), strict=False):
        r = lb_replays[row["KV blocks"]]
        how = (f"{len(r.hits)} requests one at a time, 8 groups' {r.prefix_tokens}-token prefixes, "
               f"a pool of {row['KV blocks']} blocks of {r.block_size} tokens")
        record("production", f"lb_vllm_whole_{size}_pool", r.whole, "fraction",
               f"vLLM: requests that found their whole prefix cached, {how}")
        record("production", f"lb_vllm_any_{size}_pool", r.some, "fraction",
               f"vLLM: requests that found some of their prefix cached, {how}")
        for col, cap, what in (("simulated, whole requests fit", row["requests fit"], "whole"),
                               ("simulated, prefixes only", row["prefixes fit"], "any")):
            record("production", f"lb_sim_{what}_{size}_pool", row[col], "fraction",
                   f"simulated: the routing simulation's cache of {cap} whole prefixes on the same stream")

    # A burst, over twenty seeds
    hurt, int4_cut, warm_cut = take(page, "hurt int4_cut warm_cut")
    for k, v, name in (("warm_pool", warm_cut, "manifest + warm pool of 1"),
                       ("int4", int4_cut, "manifest, int4 weights")):
        cuts = np.subtract(hurt["manifest"], hurt[name])  # warm_pool_cut_mean, warm_pool_seeds(_loaded, _cut)
        record("production", f"{k}_cut_mean", v["cut_mean"], "requests",
               "late or dropped in the burst, mean cut over seeds (paired traces; "
               "the spread is the smallest and largest cut on a seed)",
               spread=(cuts.min(), cuts.max(), cuts.size))
        record("production", f"{k}_cut_share", v["cut_mean"] / np.mean(hurt["manifest"]), "fraction",
               "mean cut ÷ mean late or dropped without the change, same seeds")
        record("production", f"{k}_seeds", v["seeds"], "seeds", "burst scenario")
        record("production", f"{k}_seeds_loaded", v["loaded"], "seeds",
               "seeds where the plain autoscaler had late or dropped requests")
        record("production", f"{k}_seeds_cut", v["cut"], "seeds", "seeds where the change had fewer")

    n_burst, burst_share, SEEDS = take(page, "n_burst burst_share SEEDS")
    record("production", "burst_hurt_share", burst_share["manifest"], "fraction",
           f"late or dropped ÷ the burst's {n_burst:,.0f} requests a seed, the manifest's autoscaler, "
           f"mean over {len(SEEDS)} seeds")
    record("production", "warm_pool_burst_sized_hurt_share", burst_share["manifest + warm pool of 8"],
           "fraction", "the same with a warm pool of 8 replicas, the burst's size")

    # The same dashboard from llama.cpp's server
    lc_counts, lc_spec, lc_watched = take(page, "lc_counts lc_spec lc_watched")
    if lc_counts:
        record("production", "llamacpp_monitored", True, "",
               f"llama-server, 2 slots, {lc_spec.requests} requests {lc_spec.concurrency} at a time")
        record("production", "llamacpp_monitor_watch_items", sum(lc_watched.values()), "items",
               f"of {len(lc_watched)}, llama-server")
        record("production", "llamacpp_server_over_client_tokens", lc_counts["ratio"], "x",
               "rise of llamacpp:tokens_predicted_total over the run ÷ output tokens the client received")
        record("production", "llamacpp_max_waiting", lc_counts["max_waiting"], "requests",
               "llamacpp:requests_deferred, highest sample")
        record("production", "llamacpp_monitor_watch_missing",
               ", ".join(k for k, ok in lc_watched.items() if not ok) or "none", "",
               f"items of {len(lc_watched)} with no figure, llama-server")
    else:
        record("production", "llamacpp_monitored", False, "", llamacpp.unavailable_reason())
        unmeasured("production", "llamacpp_monitor_watch_missing",
                   f"llama.cpp is not built here: {llamacpp.unavailable_reason()}")

    # The crossover against a first estimate
    here, naive_here = take(page, "here naive_here")
    record("production", "api_dedicated_crossover_req_per_day", here, "req/day",
           "this machine (measured curve, 2-vCPU VM) vs api-large")
    record("production", "api_crossover_over_naive", here / naive_here, "x",
           "crossover vs one replica's bill = the API bill (api-large)")

    # What moves the crossover: prompt length and utilization
    PROMPTS, sens = take(page, "PROMPTS sens")
    for case, key in ((HERE, "cpu"), (H100, "h100")):
        at70 = {r["input_tokens"]: r["crossover_rpd"] for r in sens[case] if r["utilization"] == 0.7}
        record("production", f"{key}_matched_crossover_{PROMPTS[-1]}_prompt_req_per_day", at70[PROMPTS[-1]],
               "req/day",
               f"{case} vs {matched[case][0]}, {PROMPTS[-1]} prompt tokens, 70% utilization target")

    # The saving at scale
    TIERS, saving_100m, scale = take(page, "TIERS saving_100m scale")
    saving = {t: 100 * (1 - 1 / scale[(100, t)]) for t in TIERS}  # against each API tier, at 100M tokens/day
    for m in (1, 10, 100):
        record("production", f"api_large_over_h100_{m}m", scale[(m, "api-large")], "x",
               f"monthly bills at {m}M output tokens/day")
    record("production", "api_small_over_h100_100m", scale[(100, "api-small")], "x",
           "monthly bills at 100M output tokens/day")
    record("production", "h100_saving_vs_api_large_100m_pct", saving_100m, "%",
           "1 - H100 bill / frontier API bill, 100M tokens/day")
    record("production", "h100_saving_vs_api_small_100m_pct", 100 * (1 - 1 / scale[(100, "api-small")]), "%",
           "vs the mini tier")
    record("production", "h100_saving_vs_api_open_small_100m_pct", saving["api-open-small"], "%",
           "vs the small open-model tier")
    record("production", "h100_saving_worst_tier_100m_pct", min(saving.values()), "%",
           f"the smallest over {', '.join(TIERS)}")
    record("production", "api_open_small_over_h100_100m", scale[(100, "api-open-small")], "x",
           "monthly bills at 100M output tokens/day, prompts counted")

    # Containers and deploy artifacts
    probe = take(page, "probe")[0]
    record("production", "startup_probe_covers_high", probe["covers_high"], "bool",
           f"manifest's {probe['budget_s']:.0f} s vs {probe['high_s']:.0f} s in the container at the high "
           f"ends")
