"""Chapter 01's own checks (labkit/checks/concepts.py) against broken implementations: each test runs a
small mutated version of the chapter's code path, computes the figure the notebook records from it,
and sees the check fail; the real code path, run the same way, holds."""

import torch
from torch.utils.flop_counter import FlopCounterMode

from labkit.checks import outcome
from labkit.experiments import offline
from labkit.hardware import roofline
from labkit.llm import architecture


def _sandbox_figures(off: dict) -> dict:
    """The notebook's three figures of one offline_forward run."""
    return {"offline_connect_refused": offline.refused(off["connect"]),
            "offline_lookup_refused": offline.refused(off["lookup"]),
            "offline_control_connected": off["control_connect"] == "ok"}


def test_sandbox_that_forgets_connect_fails(monkeypatch):
    # the child's model run is stubbed: the check is about the sandbox, not the model
    monkeypatch.setattr(offline, "FORWARD", "out |= {'text': ' hi', 'new_tokens': 2, 'seconds': 0.1}\n")
    real = _sandbox_figures(offline.offline_forward(new_tokens=2))
    monkeypatch.setattr(offline, "PREAMBLE", offline.PREAMBLE.replace("'socket.connect', ", ""))
    broken = _sandbox_figures(offline.offline_forward(new_tokens=2))
    assert broken["offline_connect_refused"] is False  # the broken hook let the child reach the port
    assert outcome("concepts", "runs_offline", broken).held is False
    assert outcome("concepts", "runs_offline", real).held is True


def _counts(model) -> dict:
    return {"params_from_config": architecture.param_count(model.config.to_dict())["total"],
            "params_from_tensors": sum(p.numel() for p in model.parameters())}


def test_count_that_forgets_the_tied_head_fails(tiny_llama, monkeypatch):
    model = tiny_llama()  # tied, as SmolLM2
    real = _counts(model)
    untied = architecture.embedding_params

    def twice(config):  # the head counted as a matrix of its own whatever tie_word_embeddings says
        return untied({**architecture.text_config(config), "tie_word_embeddings": False})

    monkeypatch.setattr(architecture, "embedding_params", twice)
    assert outcome("concepts", "config_count_matches", _counts(model)).held is False
    assert outcome("concepts", "config_count_matches", real).held is True


def _counted_over_rule(model) -> float:
    """The notebook's figure: FlopCounterMode's count of one forward pass over the lab's rule."""
    ids = torch.randint(0, 256, (1, 12), generator=torch.Generator().manual_seed(0))
    with torch.inference_mode(), FlopCounterMode(display=False) as counter:
        model(ids)
    params = sum(p.numel() for p in model.parameters())
    return counter.get_total_flops() / roofline.forward_flops(params, ids.shape[1])


def test_flop_rule_without_the_factor_two_fails(tiny_llama, monkeypatch):
    model = tiny_llama()
    real = _counted_over_rule(model)
    monkeypatch.setattr(roofline, "forward_flops", lambda params, tokens: float(params * tokens))
    broken = _counted_over_rule(model)
    assert outcome("concepts", "flop_rule_matches_counter", {"counted_over_rule_flops": broken}).held is False
    assert outcome("concepts", "flop_rule_matches_counter", {"counted_over_rule_flops": real}).held is True
