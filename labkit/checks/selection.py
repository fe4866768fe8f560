"""Chapter 02b's own checks (selection): is the lab's code right on this machine? Each is evaluated on
the figures ``notebooks/02b_choosing_a_model.ipynb`` records, and each names the unit test
(``tests/test_lab_checks_selection.py``) that runs a broken implementation through it and sees it fail.

The chapter's claims (fine-tuning specializes a model, a fine-tuned and quantized model beats the general
one, a distilled student reproduces its teacher's distributions and is faster, the smallest model
meeting the bar, domain evals over benchmarks) are empirical outcomes, judged by the ledger,
``data/claims/02b_selection.toml``; none is a check here.
"""

from __future__ import annotations

from . import Values, check

BROKEN = "tests/test_lab_checks_selection.py::"


@check("selection", "the shared-prefix decoder answers as transformers' generate does on whole prompts "
       "(labkit.llm.shared_decode)", needs=("shared_decode_mismatches",),
       broken=BROKEN + "test_shared_decoder_with_positions_restarting_per_segment_fails",
       # positions that restart at 0 in every segment: the rotary embedding puts the question at the
       # invoice's first positions, and the answers change
       fails_on={"shared_decode_mismatches": 7}, holds_on={"shared_decode_mismatches": 0})
def shared_decode_matches_generate(v: Values) -> tuple[bool, str]:
    x = v["shared_decode_mismatches"]
    # exact: both run the same fp32 model greedily on the same tokens; padding is masked out in both
    return x == 0, f"{x} answer(s) differ from generate's"


@check("selection", "the merged LoRA model gives the adapter model's logits (labkit.llm.finetune.merge)",
       needs=("merge_max_logit_diff",), broken=BROKEN + "test_merge_without_the_lora_scale_fails",
       # a merge that adds B·A without its alpha / r scale: half the update folded in
       fails_on={"merge_max_logit_diff": 0.6},
       holds_on={"merge_max_logit_diff": 2e-5})  # fp32 rounding of W + B·A·alpha/r
def lora_merge_matches_adapter(v: Values) -> tuple[bool, str]:
    x = v["merge_max_logit_diff"]
    # 1e-2: fp32 rounding of the merged weights moves logits (up to about 20) by about 1e-5; an
    # adapter folded in wrongly moves them by as much as the training did, orders of magnitude more
    return x < 1e-2, f"max |logit difference| {x:.1e} on held-out prompts"


@check("selection", "no invoice is in two of the train, dev and held-out splits (settings are chosen, and "
       "scores measured, on unseen invoices)", needs=("eval_splits_disjoint",),
       broken=BROKEN + "test_loader_that_ignores_the_split_fails",
       # a loader that returns every item whatever split is asked: the held-out set is the training set
       fails_on={"eval_splits_disjoint": False}, holds_on={"eval_splits_disjoint": True})
def eval_splits_disjoint(v: Values) -> tuple[bool, str]:
    ok = bool(v["eval_splits_disjoint"])
    return ok, "no invoice text in two splits" if ok else "an invoice appears in two splits"


@check("selection", "the distilled student is its teacher's kept layers: embeddings, head, final norm and "
       "every layer distillation did not train are bit for bit the teacher's (labkit.llm.distill)",
       needs=("student_frozen_max_diff",), broken=BROKEN + "test_student_cut_from_the_wrong_end_fails",
       # a student whose layers are not the teacher's it claims, or a distillation that moved frozen ones
       fails_on={"student_frozen_max_diff": 0.31},
       holds_on={"student_frozen_max_diff": 0.0})
def student_keeps_teacher(v: Values) -> tuple[bool, str]:
    x = v["student_frozen_max_diff"]
    # exact: these tensors are copied, never computed, so any difference is a wrong copy or a leak
    return x == 0, f"max |difference| {x:.1e} from the teacher's tensors it should share"
