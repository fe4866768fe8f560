"""Chapter 02b's figures for the report, read from the page's variables once the chapter has run
(its closing cell calls :func:`labkit.figures.keep`)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..llm import distill as di
from ..results import record, unmeasured
from ..stats import wilson
from . import take


def keep(page: Mapping[str, Any]) -> None:
    """Record chapter 02b's figures from ``page``, the notebook's variables at its end."""

    # 1 · The evals, and the plan written before looking
    disjoint = take(page, "disjoint")[0]
    record("selection", "eval_splits_disjoint", disjoint, "",
           "no invoice text in two of train, dev, held-out")

    # 2 · The base model, asked two ways
    mismatches, plain = take(page, "mismatches plain")
    record("selection", "shared_decode_mismatches", mismatches, "answers", f"of {len(plain)}: shared-prefix "
           "decoder vs transformers' generate on whole prompts, base model")
    prompting = take(page, "prompting")[0]
    record("selection", "fewshot_gain", prompting["diff"], "fraction",
           "3-shot chat prompt minus the bare prompt, "
           "base model, 180 paired held-out items; 95% bootstrap over 60 invoices",
           spread=(prompting["lo"], prompting["hi"], prompting["groups"]))

    # 3 · Fine-tuning with LoRA: same architecture, new weights
    L, lora_run, merge_diff, same_arch = take(page, "L lora_run merge_diff same_arch")
    record("selection", "lora_train_s", lora_run.seconds, "s",
           f"{lora_run.steps} steps x {L['batch']} items, all cores")
    record("selection", "lora_steps_chosen", lora_run.chosen, "steps", f"dev split, of {L['checkpoints']}")
    record("selection", "merge_max_logit_diff", merge_diff, "logits",
           "merged vs adapter model, 6 held-out prompts")
    record("selection", "merged_same_architecture", same_arch, "",
           "merged LoRA: same class, layers and parameter count")
    tuned_vs_base, tuned_vs_chat = take(page, "tuned_vs_base tuned_vs_chat")
    record("selection", "tuned_gain", tuned_vs_base["diff"], "fraction",
           "fine-tuned minus base, same bare prompt, 180 "
           "paired held-out items; 95% bootstrap over 60 invoices",
           spread=(tuned_vs_base["lo"], tuned_vs_base["hi"], 60))
    record("selection", "tuned_gain_p", tuned_vs_base["p"], "", "exact McNemar, fine-tuned vs base")
    record("selection", "tuned_gain_over_prompted", tuned_vs_chat["diff"], "fraction",
           "fine-tuned minus the base with the 3-shot chat prompt; 95% bootstrap over 60 invoices",
           spread=(tuned_vs_chat["lo"], tuned_vs_chat["hi"], 60))

    # 4 · A quantized variant
    int8_vs_tuned, int8_vs_chat = take(page, "int8_vs_tuned int8_vs_chat")
    record("selection", "int8_minus_tuned", int8_vs_tuned["diff"], "fraction",
           "INT8 minus fp32 fine-tuned, 180 paired items; 95% bootstrap over 60 invoices",
           spread=(int8_vs_tuned["lo"], int8_vs_tuned["hi"], 60))
    record("selection", "int8_gain_over_prompted", int8_vs_chat["diff"], "fraction",
           "fine-tuned INT8 minus the base "
           "with the 3-shot chat prompt, 180 paired held-out items; 95% bootstrap over 60 invoices",
           spread=(int8_vs_chat["lo"], int8_vs_chat["hi"], 60))
    record("selection", "int8_gain_over_prompted_p", int8_vs_chat["p"], "",
           "exact McNemar, INT8 fine-tuned vs 3-shot base")

    # 5 · Distillation: a shallower student taught by the fine-tuned model
    (D, KL_ITEMS, kd_run, kl, kl_after, kl_before, layers, student, teacher_vs_student, tuned) = take(
        page, "D KL_ITEMS kd_run kl kl_after kl_before layers student teacher_vs_student tuned")
    record("selection", "student_kl_after_over_before", kl["value"], "x",
           f"KL to the teacher, T = {D['temperature']}, "
           f"{KL_ITEMS} held-out items: {sum(kl_before) / KL_ITEMS:.2f} before distillation, "
           f"{sum(kl_after) / KL_ITEMS:.2f} after; 95% bootstrap over {kl['n']} invoices",
           spread=(kl["lo"], kl["hi"], kl["n"]))
    record("selection", "distill_train_s", kd_run.seconds, "s",
           f"{kd_run.steps} steps x {D['batch']} items, all cores")
    record("selection", "student_frozen_max_diff",
           di.shared_max_diff(student, tuned, layers, D["top_layers"]), "",
           "every tensor the student shares with its teacher and did not train")
    record("selection", "student_minus_teacher", teacher_vs_student["diff"], "fraction",
           "distilled minus its teacher, 180 paired items; 95% bootstrap over 60 invoices",
           spread=(teacher_vs_student["lo"], teacher_vs_student["hi"], 60))

    # 6 · Quality, speed and memory of every variant; the bar applied by code
    (PLAN, ROUNDS, chosen, interval, mb, models, n_layers, names, pair, params, scores, tps) = take(
        page, "PLAN ROUNDS chosen interval mb models n_layers names pair params scores tps")
    best = chosen or max(names, key=lambda k: interval[k]["lo"])
    record("selection", "chosen_variant", str(chosen), "",
           f"smallest variant whose interval's lower end >= {PLAN['bar']:.0%}")
    record("selection", "chosen_domain_score", interval[best]["p"], "fraction",
           f"{best}, 180 held-out items; 95% Wilson "
           "interval (the variant chosen, or the closest to the bar when none meets it)",
           spread=(interval[best]["lo"], interval[best]["hi"], interval[best]["n"]))
    for k, key in (("base", "base"), ("base, 3-shot chat", "fewshot"), ("fine-tuned", "tuned"),
                   ("fine-tuned INT8", "int8"),
                   ("distilled", "student")):
        record("selection", f"{key}_domain_score", interval[k]["p"], "fraction",
               f"{k}, 180 held-out items, exact match; " "95% Wilson interval",
               spread=(interval[k]["lo"], interval[k]["hi"], interval[k]["n"]))
        record("selection", f"{key}_domain_normalized", scores[k]["normalized"], "fraction",
               f"{k}, normalized match")
    for key, k in (("tuned_over_base_tps", "fine-tuned"), ("student_over_teacher_tps", "distilled")):
        record("selection", key, pair[k]["median"], "x", f"batch-1 decode, median of {ROUNDS} paired rounds",
               spread=(pair[k]["lo"], pair[k]["hi"], pair[k]["n"]))
    for k in models:
        record("selection", f"tps_{k.replace(' ', '_').replace('-', '_')}", tps[k], "tokens/s",
               "batch-1 decode")
    record("selection", "student_params_share", params["distilled"] / params["fine-tuned"], "x",
           f"{len(layers)} of {n_layers} layers")
    record("selection", "int8_weight_share", mb["fine-tuned INT8"] / mb["fine-tuned"], "x",
           "stored weight bytes, INT8 over fp32")

    # 7 · Domain eval vs generic set: do they rank the models the same way?
    (generic_scores, only_domain, rankings_differ, sep_domain) = take(
        page, "generic_scores only_domain rankings_differ sep_domain")
    record("selection", "rankings_differ", rankings_differ, "",
           "a pair of models each set separates (exact McNemar p < "
           "0.05) in opposite directions: 180 held-out invoice items vs 54 generic items")
    record("selection", "pairs_only_domain_separates", len(only_domain), "pairs", f"of {len(sep_domain)}")
    other, scores = take(page, "OTHER scores")
    for k, key in (("base", "base"), ("fine-tuned", "tuned"), (other, "other_family")):
        w = wilson(generic_scores[k]["correct"], generic_scores[k]["n"])
        record("selection", f"{key}_generic_score", w["p"], "fraction",
               f"{k}: 54 generic items; 95% Wilson interval", spread=(w["lo"], w["hi"], int(w["n"])))
    w = wilson(scores[other]["correct"], scores[other]["n"])
    record("selection", "other_family_domain_score", w["p"], "fraction",
           f"{other} (base model, bare prompt): 180 held-out invoice items; 95% Wilson interval",
           spread=(w["lo"], w["hi"], int(w["n"])))

    # 8 · 200 vs 30 tokens/s as the wait for an answer
    wait_ratio = take(page, "wait_ratio")[0]
    record("selection", "wait_ratio_30_over_200_tps", wait_ratio, "x",
           "decode time of one answer at 30 vs 200 tokens/s (the tutorial's rates), whatever its length")

    # Going further: seeds, a distillation ablation, and what the prompt's size does
    if not take(page, "STUDY")[0]:
        for key in ("lora_seed_gain_min", "lora_seed_gain_max", "lora_seed_score_range",
                    "distill_kl_only_minus_ce_only", "distill_both_minus_ce_only", "distill_both_seed_range",
                    "cut_first_layers_kl_over_measured", "fewshot_dev_best_k"):
            unmeasured("selection", key,
                       "Going further runs only with LABKIT_STUDY=1 (several minutes on a CPU)")
        return
    seed_gain, seed_score, versus, runs, kl_first, kl_before, KL_ITEMS, dev_k = take(
        page, "seed_gain seed_score versus runs kl_first kl_before KL_ITEMS dev_k")
    notes = "seeds 0-2, the dev-chosen steps, 180 held-out items"
    record("selection", "lora_seed_gain_min", min(seed_gain.values()), "fraction",
           f"fine-tuned minus base, {notes}")
    record("selection", "lora_seed_gain_max", max(seed_gain.values()), "fraction",
           f"fine-tuned minus base, {notes}")
    record("selection", "lora_seed_score_range", max(seed_score.values()) - min(seed_score.values()),
           "fraction", notes)
    for r, key in (("KL only", "distill_kl_only_minus_ce_only"), ("both", "distill_both_minus_ce_only")):
        c = versus[r]
        record("selection", key, c["diff"], "fraction",
               f"{r} minus CE only, 3 seeds pooled, 540 paired items; " "95% bootstrap over invoices",
               spread=(c["lo"], c["hi"], c["groups"]))
    both = [runs["both", s][0]["score"] for s in (0, 1, 2)]
    record("selection", "distill_both_seed_range", max(both) - min(both), "fraction",
           "CE + KL recipe, seeds 0-2")
    record("selection", "cut_first_layers_kl_over_measured", kl_first / (sum(kl_before) / KL_ITEMS), "x",
           f"KL to the teacher before training, first-layers cut over the measured cut, {KL_ITEMS} held-out "
           f"items")
    record("selection", "fewshot_dev_best_k", max(dev_k, key=dev_k.get), "examples",
           f"dev exact match {dev_k}")
