"""Chapter 05's own checks (labkit/checks/stack.py) against broken implementations: each test runs a
small mutated version of the chapter's code path, computes the figure the notebook records from it the
way the notebook does, and sees the check fail; the real code path, run the same way, holds."""

import numpy as np
import pytest
import torch

from labkit.checks import outcome


def test_a_compiler_that_swaps_an_op_fails():
    from labkit.llm import fusion

    def swap_tanh(gm, example_inputs):  # a backend whose generated code computes sigmoid where tanh was
        swapped = 0
        for node in gm.graph.nodes:
            if node.op == "call_function" and node.target is torch.tanh:
                node.target, swapped = torch.sigmoid, swapped + 1
        assert swapped, "the chain's graph has no tanh to swap"
        gm.recompile()
        return gm.forward

    torch._dynamo.reset()
    # torch.compile takes a callable backend as well as a name
    broken = fusion.compile_chain(numel=4096, repeats=1, backend=swap_tanh)["max_abs_diff"]  # type: ignore[arg-type]
    torch._dynamo.reset()
    right = fusion.compile_chain(numel=4096, repeats=1, backend="eager")["max_abs_diff"]
    torch._dynamo.reset()
    assert outcome("stack", "compile_same", {"compile_max_abs_diff": broken}).held is False
    assert outcome("stack", "compile_same", {"compile_max_abs_diff": right}).held is True


def _same_tensors(st_path, pt_path) -> bool:
    """The notebook's figure: the safetensors file and the pickle copy hold the same tensors."""
    from safetensors import safe_open

    with safe_open(str(st_path), framework="pt") as f:
        st_sd = {k: f.get_tensor(k) for k in f.keys()}
    pt_sd = torch.load(pt_path, weights_only=True)
    return st_sd.keys() == pt_sd.keys() and all(
        st_sd[k].dtype == pt_sd[k].dtype and torch.equal(st_sd[k], pt_sd[k]) for k in st_sd)


def test_a_stale_pickle_copy_fails(tmp_path):
    from safetensors.torch import save_file

    from labkit.llm.weight_formats import write_pickle_copy

    g = torch.Generator().manual_seed(0)
    weights = {"layer.weight": torch.randn(16, 8, generator=g), "layer.bias": torch.randn(16, generator=g)}
    save_file(weights, tmp_path / "float32.safetensors")
    save_file({k: t.bfloat16() for k, t in weights.items()}, tmp_path / "bfloat16.safetensors")
    # the broken cache: the copy under the bfloat16 name was written from the float32 file
    stale = write_pickle_copy(tmp_path / "float32.safetensors", tmp_path / "stale" / "bfloat16.pt")
    fresh = write_pickle_copy(tmp_path / "bfloat16.safetensors", tmp_path / "fresh" / "bfloat16.pt")
    broken = _same_tensors(tmp_path / "bfloat16.safetensors", stale)
    right = _same_tensors(tmp_path / "bfloat16.safetensors", fresh)
    assert outcome("stack", "pickle_copy_same", {"pickle_copy_same_tensors": broken}).held is False
    assert outcome("stack", "pickle_copy_same", {"pickle_copy_same_tensors": right}).held is True


@pytest.mark.slow  # reads the bundled GGUF and safetensors files (about 5 s)
def test_a_copy_rounded_through_bfloat16_fails():
    import gguf
    from safetensors import safe_open

    from labkit.llm.weight_formats import gguf_tensor
    from labkit.models import gguf_path, llm_dir

    t = gguf_tensor(gguf_path(), "blk.0.ffn_down.weight")
    full = gguf.quants.dequantize(t.data, t.tensor_type)
    with safe_open(str(llm_dir("float32") / "model.safetensors"), framework="pt") as f:
        copy = f.get_tensor("model.layers.0.mlp.down_proj.weight")
    broken = float(np.abs(full - copy.bfloat16().float().numpy()).max())  # a conversion through bfloat16
    right = float(np.abs(full - copy.numpy()).max())
    assert outcome("stack", "gguf_copy_exact", {"gguf_copy_max_diff": broken}).held is False
    assert outcome("stack", "gguf_copy_exact", {"gguf_copy_max_diff": right}).held is True


def _request_counts(runs) -> dict[str, int]:
    """The notebook's figures: requests planned at every level, and those answered in full."""
    return {"engine_requests_planned": sum(s.n_planned for s in runs),
            "engine_requests_full": sum(r.status == "ok" and r.output_tokens == r.max_tokens
                                        for s in runs for r in s.requests)}


def test_a_server_that_drops_or_cuts_requests_fails(srv):
    from labkit.experiments.compare import measure_server, short_prompts

    def counts() -> dict[str, int]:
        runs = measure_server(srv.url, "fake", (1, 8), {1: 3, 8: 8}, short_prompts(8), max_tokens=8)
        return _request_counts(runs.values())

    right = counts()
    srv.opts["fail_every"] = 3  # the broken server: every third request answers 500
    broken = counts()
    assert broken["engine_requests_full"] < broken["engine_requests_planned"] == 11
    assert outcome("stack", "engines_answered_all", broken).held is False
    assert outcome("stack", "engines_answered_all", right).held is True
