"""GPU sizing and the tensor/pipeline split (labkit.llm.parallelism, chapter 06)."""

import math

import pytest

from labkit.hardware.catalog import ACCELERATORS
from labkit.llm import parallelism as par
from labkit.llm.architecture import load_config, param_count
from labkit.llm.kvcache import kv_cache_bytes_for_config
from labkit.llm.parallelism import min_gpus_rule, per_gpu, plan, round_up_tp, valid_tp_sizes

GB = 1e9


def test_tutorial_deepseek_example_rounds_to_a_valid_tp_size():
    # The tutorial: 671 B params x 1 byte (FP8) x 1.8 / 192 GB (B200) = ~6.3 -> 8 GPUs.
    r = min_gpus_rule(671e9, "fp8", 192 * GB)
    assert r["exact"] == pytest.approx(6.29, abs=0.01) and r["ceil"] == 7
    # From the shipped config's own count, too (671.03 B).
    cfg = load_config("DeepSeek-V3")
    assert min_gpus_rule(param_count(cfg)["total"], "fp8", 192 * GB)["ceil"] == 7
    # 7 divides none of the 128 heads' power-of-two splits; a node holds 8: tensor parallel size 8.
    assert 7 not in valid_tp_sizes(cfg) and round_up_tp(7, cfg) == 8
    assert round_up_tp(9, cfg) is None  # beyond one node: pipeline stages are needed


def test_rule_and_ceiling_edges():
    assert min_gpus_rule(10e9, "bf16", 36 * GB) == {"exact": 1.0, "ceil": 1}
    assert min_gpus_rule(10e9, "bf16", 35.9 * GB)["ceil"] == 2
    assert min_gpus_rule(4e9, "bf16", 80 * GB, overhead=1.0)["exact"] == pytest.approx(0.1)


@pytest.mark.parametrize("name, sizes", [
    ("Qwen3-4B", [1, 2, 4, 8]),          # 32 heads, 8 KV heads
    ("Llama-3-8B", [1, 2, 4, 8]),        # 32 / 8
    ("Qwen3-235B-A22B", [1, 2, 4, 8]),   # 64 / 4: at 8 each KV head is replicated on two GPUs
    ("smollm2-135m", [1, 3]),            # 9 heads / 3 KV heads: 3 divides both (and the MLP's 1536)
])
def test_valid_tp_sizes_of_shipped_configs(name, sizes):
    assert valid_tp_sizes(load_config(name)) == sizes


def test_valid_tp_sizes_rules():
    cfg = {"hidden_size": 1536, "num_attention_heads": 12, "num_key_value_heads": 4}
    assert valid_tp_sizes(cfg) == [1, 2, 4]            # 8 does not divide 12 heads
    cfg = {"hidden_size": 1536, "num_attention_heads": 24, "num_key_value_heads": 6}
    assert valid_tp_sizes(cfg) == [1, 2, 3, 6]         # 4 and 8 divide 24 heads but neither split nor copy 6
    assert valid_tp_sizes({**cfg, "intermediate_size": 1000}) == [1, 2]  # 3 and 6 do not divide the MLP
    assert valid_tp_sizes(load_config("Qwen3-4B"), max_size=16) == [1, 2, 4, 8, 16]  # 16 copies 8 KV heads


def test_per_gpu_split_against_direct_computation():
    cfg = load_config("Qwen3-4B")
    one = per_gpu(cfg, 1, 1, "bf16", context=8192, concurrency=4, runtime_bytes=0)
    assert one["weights"] == pytest.approx(param_count(cfg)["total"] * 2)
    assert one["kv"] == pytest.approx(kv_cache_bytes_for_config(cfg, 8192, 2, 4))
    two = per_gpu(cfg, 2, 1, "bf16", context=8192, concurrency=4, runtime_bytes=0)
    assert two["weights"] == pytest.approx(one["weights"] / 2)
    assert two["kv"] == pytest.approx(one["kv"] / 2)   # 8 KV heads -> 4 per GPU
    assert two["activations"] < one["activations"]     # the MLP's width is split, the residual is not
    # 16-way on 8 KV heads: each GPU stores one whole head, not half of one.
    assert per_gpu(cfg, 16, 1, context=8192, concurrency=4)["kv"] == pytest.approx(one["kv"] / 8)
    # Pipeline stages split the layers (36 -> 18 each) and the embedding/head matrices.
    pp = per_gpu(cfg, 1, 2, "bf16", context=8192, concurrency=4, runtime_bytes=0)
    assert pp["kv"] == pytest.approx(one["kv"] / 2)
    assert one["weights"] / 2 < pp["weights"] < one["weights"] * 0.6


def test_mla_cache_is_not_split_by_tensor_parallelism():
    cfg = load_config("DeepSeek-V3")
    a, b = (per_gpu(cfg, t, 1, "fp8", context=4096, concurrency=2) for t in (1, 8))
    assert b["kv"] == pytest.approx(a["kv"]) and b["weights"] == pytest.approx(a["weights"] / 8)
    assert per_gpu(cfg, 8, 2, "fp8", context=4096, concurrency=2)["kv"] == pytest.approx(a["kv"] * 31 / 61)


def test_plan_picks_the_smallest_layout_that_fits():
    b200 = ACCELERATORS["B200"].memory_bytes
    h100 = ACCELERATORS["H100 SXM"].memory_bytes
    p = plan(load_config("DeepSeek-V3"), b200, "fp8", context=32768, concurrency=16)
    assert (p["tp"], p["pp"], p["fits"]) == (8, 1, True) and p["per_gpu"]["total"] <= p["budget"]
    assert per_gpu(load_config("DeepSeek-V3"), 4, 1, "fp8", 32768, 16)["total"] > p["budget"]
    assert plan(load_config("Qwen3-4B"), h100, "bf16", 32768, 8)["tp"] == 1
    # A long context at high concurrency needs more GPUs than the weights alone would.
    many = plan(load_config("Qwen3-4B"), h100, "bf16", 40960, 64)
    assert many["tp"] > 1 and many["fits"]
    # DeepSeek-V3 at FP8 on H100s: one node is not enough, pipeline across two (16 GPUs).
    p = plan(load_config("DeepSeek-V3"), h100, "fp8", 32768, 16)
    assert (p["tp"], p["pp"], p["gpus"]) == (8, 2, 16)
    assert not plan(load_config("DeepSeek-V3"), 24 * GB, "bf16", 32768, 16, max_pp=2)["fits"]


def test_vllm_command():
    assert par.vllm_serve_command("Qwen/Qwen3-4B", 2, 1, 32768, 0.9) == (
        "vllm serve Qwen/Qwen3-4B --tensor-parallel-size 2 --pipeline-parallel-size 1 "
        "--max-model-len 32768 --gpu-memory-utilization 0.9")
    assert "--max-model-len" not in par.vllm_serve_command("m")
    assert math.isclose(float(par.vllm_serve_command("m", gpu_memory_utilization=0.85).split()[-1]), 0.85)
