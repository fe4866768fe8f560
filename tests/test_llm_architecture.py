"""Parameter counts from config.json alone (labkit.llm.architecture, chapter 03)."""

import json

import pytest

from labkit.llm.architecture import SHIPPED, load_config, param_count, summary

# Published figures: model cards / technical reports (billions of parameters).
PUBLISHED = {
    "Qwen3-4B": (4.0, 4.0),
    "Llama-3-8B": (8.03, 8.03),
    "DeepSeek-V3": (671.0, 37.0),
    "Qwen3-235B-A22B": (235.0, 22.0),
}


@pytest.mark.parametrize("name", sorted(SHIPPED))
def test_shipped_configs_land_on_published_sizes(name):
    counts = param_count(load_config(name))
    total, active = PUBLISHED[name]
    assert counts["total"] / 1e9 == pytest.approx(total, rel=0.02)
    assert counts["active"] / 1e9 == pytest.approx(active, rel=0.03)
    assert counts["active"] <= counts["total"]


def test_llama3_8b_is_exact():
    # 8,030,261,248 is the parameter count of the released checkpoint.
    assert param_count(load_config("Llama-3-8B"))["total"] == 8_030_261_248


def test_bundled_model_count_equals_its_safetensors():
    from labkit.llm.memory import safetensors_params
    from labkit.models import llm_dir

    n = safetensors_params(llm_dir("float32") / "model.safetensors")
    assert param_count(load_config("smollm2-135m")) == {"total": n, "active": n}
    assert n == 134_515_008


def test_tied_embeddings_count_once():
    c = dict(hidden_size=8, vocab_size=100, num_hidden_layers=1, num_attention_heads=2,
             num_key_value_heads=1, intermediate_size=16, tie_word_embeddings=True)
    tied = param_count(c)["total"]
    untied = param_count({**c, "tie_word_embeddings": False})["total"]
    assert untied - tied == 100 * 8


def test_tiny_llama_matches_torch_module(tiny_llama):
    from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM

    model = tiny_llama(hidden_size=32, intermediate_size=48, vocab_size=64, tie_word_embeddings=False)
    assert param_count(model.config.to_dict())["total"] == sum(p.numel() for p in model.parameters())
    moe = Qwen3MoeConfig(hidden_size=32, intermediate_size=48, moe_intermediate_size=16, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, head_dim=8, vocab_size=64,
                         num_experts=6, num_experts_per_tok=2, tie_word_embeddings=False)
    n = sum(p.numel() for p in Qwen3MoeForCausalLM(moe).parameters())
    counts = param_count(moe.to_dict())
    assert counts["total"] == n
    assert counts["active"] == n - 2 * 4 * 3 * 32 * 16  # 2 layers x 4 idle experts x 3 matrices


def test_load_config_reads_a_path_and_rejects_unknown_names(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"hidden_size": 1}))
    assert load_config(str(tmp_path)) == {"hidden_size": 1}
    with pytest.raises(ValueError, match="shipped config"):
        load_config("no-such-model")


def test_summary_has_the_tutorial_fields():
    s = summary(load_config("Qwen3-4B"))
    assert (s["architecture"], s["hidden_size"], s["layers"], s["heads"], s["vocab_size"]) == (
        "Qwen3ForCausalLM", 2560, 36, 32, 151936)
    assert summary(load_config("DeepSeek-V3"))["experts"] == 256


def test_config_row_and_attention_crossover():
    from labkit.llm.architecture import attention_crossover_tokens, config_row

    row = config_row("Qwen3-235B-A22B")
    assert row["layers"] == 94 and row["heads"] == "64/4" and row["experts"] == "8/128"
    assert row["vocab"] == 151936
    assert row["params B"].startswith("235 (22.2 active") and row["published B"] == "235/22"
    assert config_row("smollm2-135m")["off by"] == "0.4%"
    assert config_row("x", load_config("Qwen3-4B"))["off by"] == "-"
    small = attention_crossover_tokens(load_config("smollm2-135m"))
    # 2 x 134.5M FLOPs of weights vs 4 x 9 heads x 64 x 30 layers per cached token
    assert small == pytest.approx(2 * param_count(load_config("smollm2-135m"))["total"] / (4 * 9 * 64 * 30))
    assert attention_crossover_tokens(load_config("Llama-3-8B")) > 5 * small
