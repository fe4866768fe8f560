"""Chapter 02b's final checks (selection): rules over the figures ``notebooks/02b_choosing_a_model.ipynb``
records.

That a merged LoRA model keeps the base's architecture and parameter count, that the eval splits are
disjoint and that the scorer is exact hold by construction; they are unit tests
(``tests/test_finetune.py``, ``tests/test_domain_eval.py``, ``tests/test_distill.py``). So does the
merged model's speed (the same architecture does the same work per token): its measured ratio to the
base is a ledger row, not a rule. Whether the domain and generic sets rank the variants differently is
recorded (``rankings_differ``), never asserted.
"""

from __future__ import annotations

from . import Values, rule

# the figures of a run on Intel AMX, 2 cores, 2026-12-01 (build/02b_choosing_a_model.ipynb), for holds_on
RUN = {"base_domain_score": 0.27, "tuned_domain_score": 0.47, "student_over_teacher_tps": 1.20,
       "student_share": 0.29}
SHARE = 0.2  # of the teacher's domain score the student keeps: 4 of its 14 items held out were 0.29
MARGIN = 0.10  # fine-tuned minus base, exact-match fraction: three items of the 30 held out


@rule("selection", f"LoRA fine-tuning on the training split lifts the held-out domain score by at least "
      f"{MARGIN:.0%}", needs=("base_domain_score", "tuned_domain_score"),
      # illustrative: a learning rate 50x too small leaves the adapters near zero, the model unchanged
      fails_on={"base_domain_score": 0.27, "tuned_domain_score": 0.27},
      holds_on={"base_domain_score": RUN["base_domain_score"],
                "tuned_domain_score": RUN["tuned_domain_score"]})
def finetune_beats_base(v: Values) -> tuple[bool, str]:
    b, t = v["base_domain_score"], v["tuned_domain_score"]
    return t - b >= MARGIN - 1e-9, f"{b:.0%} -> {t:.0%}"


@rule("selection", "the distilled student decodes over 1.05x faster than its teacher",
      needs=("student_over_teacher_tps",),
      # illustrative: a student that kept 29 of 30 layers (about 1.01x the work per token)
      fails_on={"student_over_teacher_tps": 1.02},
      holds_on={"student_over_teacher_tps": RUN["student_over_teacher_tps"]})
def student_faster(v: Values) -> tuple[bool, str]:
    x = v["student_over_teacher_tps"]
    return x > 1.05, f"{x:.2f}x the teacher's tokens/s"


@rule("selection", f"distillation gives the cut student back at least {SHARE:.0%} of its teacher's domain "
      "score", needs=("student_share",),
      # the first 22 of 30 layers before any distillation (student_cut_domain_score): 0 of 30 items
      fails_on={"student_share": 0.0},
      holds_on={"student_share": RUN["student_share"]})
def student_keeps_share(v: Values) -> tuple[bool, str]:
    x = v["student_share"]
    return x >= SHARE, f"{x:.0%} of the teacher's score"
