"""Chapter 01's figures for the report, read from the page's variables once the chapter has run
(its closing cell calls :func:`labkit.figures.keep`)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..experiments.offline import refused
from ..hardware import roofline
from ..results import record
from . import take


def keep(page: Mapping[str, Any]) -> None:
    """Record chapter 01's figures from ``page``, the notebook's variables at its end."""

    # Parameters
    errors = take(page, "errors")[0]
    record("concepts", "size_name_error_max", max(errors), "x",
           "largest |counted / size in the name - 1| over Qwen3-4B, Llama-3-8B")

    # Tokens
    prof, qwen_vocab, tok, token_counts = take(page, "prof qwen_vocab tok token_counts")
    for text, key in (("Hello world", "hello_world"), ("unbelievable", "unbelievable"),
                      ("inference", "inference"), ("engineering", "engineering")):
        record("concepts", f"{key}_tokens", token_counts[text], "tokens",
               f"{prof.llm}'s tokenizer, no special tokens")
    record("concepts", "vocab_size", len(tok), "entries", f"{prof.llm}'s tokenizer")
    record("concepts", "qwen3_vocab_size", qwen_vocab, "entries", "vocab_size in Qwen3-4B's shipped config")

    # Weights and bytes
    seven_b = take(page, "seven_b")[0]
    record("concepts", "fp16_7b_gb", seven_b, "GB", "7e9 x 2 bytes (the tutorial's own inputs)")

    # The VRAM rule of thumb, checked
    embed_share, file_bytes, gguf_params, recipe = take(page, "embed_share file_bytes gguf_params recipe")
    record("concepts", "gguf_bytes_per_param", file_bytes / gguf_params, "bytes/param",
           "the bundled Q4_1 GGUF file ÷ its parameters")
    record("concepts", "gguf_embedding_share", embed_share, "x",
           "share of the bundled GGUF's parameters kept in Q8_0")
    record("concepts", "q4_1_recipe_llama3_8b_bytes_per_param", recipe, "bytes/param",
           "Q8_0 embeddings + Q4_1 elsewhere, from the config")

    # Datasheet figures and model choice, computed
    ceil_3b, ceil_70b, h100, rtx = take(page, "ceil_3b ceil_70b h100 rtx")
    record("concepts", "h100_memory_gb", h100.memory_bytes / 1e9, "GB", h100.source)
    record("concepts", "rtx3060_memory_gb", rtx.memory_bytes / 1e9, "GB", rtx.source)
    record("concepts", "h100_fp8_pflops", h100.tflops["fp8"] / 1e3, "PFLOPS", "dense FP8, " + h100.source)
    record("concepts", "ceiling_3b_h100_bf16_tps", ceil_3b, "tokens/s",
           "3e9 x 2 bytes read per token at 3.35 TB/s")
    record("concepts", "ceiling_70b_h100_fp8_tps", ceil_70b, "tokens/s",
           "70e9 x 1 byte read per token at 3.35 TB/s")
    record("concepts", "vram_examples_max_rel_error",
           max(abs(h100.memory_bytes / 80e9 - 1), abs(rtx.memory_bytes / 12e9 - 1)), "x",
           "largest |catalog / tutorial - 1| over the H100 (80 GB) and the RTX 3060 (12 GB)")
    record("concepts", "ceiling_over_quoted_tps_min", min(ceil_3b / 200, ceil_70b / 30), "x",
           "the lower of: 3B bf16 ceiling ÷ 200 tokens/s, 70B FP8 ceiling ÷ 30 tokens/s (one H100)")

    # Why open weights matter: what they let you do, here
    off = take(page, "off")[0]
    record("concepts", "offline_forward_ok", off["ok"], "",
           f"{prof.llm} generated {off['new_tokens']} tokens, network refused")
    record("concepts", "offline_connect_refused", refused(off["connect"]), "", str(off["connect"]))
    record("concepts", "offline_lookup_refused", refused(off["lookup"]), "", str(off["lookup"]))
    record("concepts", "offline_control_connected", off["control_connect"] == "ok", "",
           "plain child: " + off["control_connect"])
    record("concepts", "offline_wall_s", off["wall_s"], "s",
           "sandboxed child: Python start, imports, load, generate")
    (counted, device, from_config, from_tensors, loaded_gb, low, n_tokens, params) = take(
        page, "counted device from_config from_tensors loaded_gb low n_tokens params")
    record("concepts", "bf16_rule_gb", low, "GB",
           f"2 bytes x {params:,} parameters: the FP16/BF16 rule of thumb")
    record("concepts", "bf16_load_gb", loaded_gb, "GB",
           f"memory growth on loading the bf16 model on {device}")
    record("concepts", "bf16_load_over_rule", loaded_gb / low, "x",
           "memory growth on load ÷ the rule of thumb")
    record("concepts", "counted_over_rule_flops", counted / roofline.forward_flops(params, n_tokens), "x",
           f"FlopCounterMode ÷ labkit's forward_flops, 2 x params x {n_tokens} tokens")
    record("concepts", "params_from_config", from_config, "parameters",
           f"{prof.llm}: labkit.llm.architecture.param_count")
    record("concepts", "params_from_tensors", from_tensors, "parameters",
           f"{prof.llm}: the loaded model's tensors")
    call_iv, call_ms, classic_ms, slower, token_ms = take(page, "call_iv call_ms classic_ms slower token_ms")
    iv = call_iv[slower]
    record("concepts", "classic_predict_ms_max", classic_ms, "ms",
           "one prediction, the slower of " + " and ".join(k for k in call_ms if k != "token")
           + f" (digits), median of {iv['n']} with its interval, {device}",
           spread=(iv["lo"], iv["hi"], int(iv["n"])))
    record("concepts", "llm_token_over_classic", token_ms / classic_ms, "x",
           f"{prof.llm}'s one-token forward pass over the slower prediction, same rounds")
