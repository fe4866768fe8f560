"""Chapter 01's own checks (concepts): is the lab's code right on this machine? Each is evaluated on the
figures ``notebooks/01_key_concepts.ipynb`` records, and each names the unit test
(``tests/test_lab_checks_concepts.py``) that runs a broken implementation through it and sees it fail.

The chapter's claims (sizes in names, token counts, bytes per parameter, the memory rules of thumb,
datasheet figures, that open weights run offline) are judged by the ledger,
``data/claims/01_concepts.toml``. The offline check here is only about the sandbox the claim is shown
in: whether the model then generated is the ledger's row ``open_weights_offline``.
"""

from __future__ import annotations

from . import Values, check

BROKEN = "tests/test_lab_checks_concepts.py::"


@check("concepts", "the offline sandbox is sound: in the sandboxed child a connect to a listening local "
       "port and a host-name look-up raised, while a plain child's connect to the same port succeeded",
       needs=("offline_connect_refused", "offline_lookup_refused", "offline_control_connected"),
       broken=BROKEN + "test_sandbox_that_forgets_connect_fails",
       # a hook that forgets socket.connect: the sandboxed child reaches the port
       fails_on={"offline_connect_refused": False, "offline_lookup_refused": True,
                 "offline_control_connected": True},
       holds_on={"offline_connect_refused": True, "offline_lookup_refused": True,
                 "offline_control_connected": True})
def runs_offline(v: Values) -> tuple[bool, str]:
    parts = {"connect refused": v["offline_connect_refused"], "look-up refused": v["offline_lookup_refused"],
             "plain child connected": v["offline_control_connected"]}
    return all(parts.values()), ", ".join(f"{k}: {'yes' if ok else 'NO'}" for k, ok in parts.items())


@check("concepts", "the parameters counted from the config matrix by matrix (labkit.llm.architecture, "
       "which the sizes of Qwen3-4B and Llama-3-8B rest on) equal the loaded model's tensors",
       needs=("params_from_config", "params_from_tensors"),
       broken=BROKEN + "test_count_that_forgets_the_tied_head_fails",
       # a count that ignores tie_word_embeddings: SmolLM2's 49,152 x 576 head counted a second time
       fails_on={"params_from_config": 162_826_560, "params_from_tensors": 134_515_008},
       holds_on={"params_from_config": 134_515_008, "params_from_tensors": 134_515_008})
def config_count_matches(v: Values) -> tuple[bool, str]:
    c, t = v["params_from_config"], v["params_from_tensors"]
    return c == t, f"{c:,} from the config, {t:,} in the tensors ({c - t:+,})"


@check("concepts", "the lab's FLOP rule (labkit.hardware.roofline.forward_flops, 2 x parameters x tokens, "
       "which chapters 04-08 use) is what PyTorch's FlopCounterMode counts for a short prompt, within 10%",
       needs=("counted_over_rule_flops",),
       broken=BROKEN + "test_flop_rule_without_the_factor_two_fails",
       # the rule written as parameters x tokens (a multiply-add counted as one FLOP): counted is 2x it
       fails_on={"counted_over_rule_flops": 2.0},
       holds_on={"counted_over_rule_flops": 0.9997})  # the embedding lookup does no matmul; attention adds
def flop_rule_matches_counter(v: Values) -> tuple[bool, str]:
    x = v["counted_over_rule_flops"]
    # 10%: the rule leaves out attention's score matmuls (a few % at 33 tokens) and counts the embedding
    # lookup, which does none (the head, tied to it, does); a slip in the rule is 2x, not 10%
    return 0.9 <= x <= 1.1, f"FlopCounterMode counted {x:.3f}x the rule's FLOPs"
