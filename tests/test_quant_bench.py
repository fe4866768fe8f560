"""Chapter 06's quantization measurements (labkit.llm.quant_bench) on tiny random Llama models: the
probed inputs are the layers' real inputs, a model scored against itself diverges by nothing, the
fused INT8/INT4 kernels compute labkit's round-to-nearest product, torchao's INT8 bytes, and the
whole-model bytes-per-parameter rule."""

import copy
import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from labkit.llm import lowbit_kernels as LK
from labkit.llm import perplexity as P
from labkit.llm import quant_bench as QB
from labkit.llm import quantize as Q
from labkit.llm import runtime_quant as RQ
from labkit.llm.architecture import embedding_params, load_config, param_count


@pytest.fixture(scope="module")
def model(tiny_llama):
    return tiny_llama(num_hidden_layers=4, max_position_embeddings=256)


@pytest.fixture(scope="module")
def ev():
    return torch.randint(0, 256, (2, 24), generator=torch.Generator().manual_seed(1))


def test_probe_layers_are_the_first_middle_and_last_projections(model):
    probe = QB.probe_layers(model)
    assert list(probe) == [f"layer {i} {k}" for i in (0, 2, 3) for k in ("q_proj", "down_proj")]
    assert probe["layer 2 down_proj"] == "model.layers.2.mlp.down_proj"
    assert all(isinstance(model.get_submodule(p), nn.Linear) for p in probe.values())


def test_first_inputs_are_the_layers_inputs_on_the_first_window_and_hooks_go(model, ev):
    probe = QB.probe_layers(model)
    with QB.first_inputs(model, probe) as kept:
        P.window_logits(model, ev)  # two windows: only the first one's inputs are kept
    with torch.no_grad():
        direct = model.model.layers[0].input_layernorm(model.model.embed_tokens(ev[:1]))[0]
    assert torch.allclose(kept["layer 0 q_proj"], direct, atol=1e-6)
    assert kept["layer 3 down_proj"].shape == (24, 128) and kept["layer 3 down_proj"].dtype == torch.float32
    assert not any(m._forward_hooks for m in model.modules())
    with QB.first_inputs(model, probe) as again:
        P.window_logits(model, ev[1:])
    assert not torch.allclose(again["layer 0 q_proj"], kept["layer 0 q_proj"])


def test_layer_weights_copy_float_and_dequantize_quantized_layers(model):
    probe = QB.probe_layers(model)
    fp = QB.layer_weights(model, probe)
    w = model.get_submodule(probe["layer 0 q_proj"]).weight
    assert torch.equal(fp["layer 0 q_proj"], w) and fp["layer 0 q_proj"].data_ptr() != w.data_ptr()
    m4 = copy.deepcopy(model)
    Q.quantize_model(m4, bits=4, group_size=32)
    q = QB.layer_weights(m4, probe)
    layer = m4.get_submodule(probe["layer 0 q_proj"])
    assert torch.equal(q["layer 0 q_proj"], layer.dequantized_weight())
    step = Q.expand_scales(layer.scales.float(), 64, 32)
    assert 0 < (q["layer 0 q_proj"] - fp["layer 0 q_proj"]).abs().max() <= 0.5 * step.max() + 1e-6
    assert QB.linear_bytes(model) == sum(m.weight.numel() * 4 for _, m in Q.quantizable_linears(model))


@pytest.fixture(scope="module")
def base(model, ev):
    reference = [torch.cat([ev[0, :8], ev[0, 8:12]])]  # any sequence works as a reference
    prompt = torch.randint(0, 256, (1, 10), generator=torch.Generator().manual_seed(2))
    return QB.Baseline(model, ev, QB.eval_logits(model, ev), reference, 4, prompt)


def test_a_model_scored_against_itself_diverges_by_nothing(model, base):
    r = QB.measure_format(model, base, QB.linear_bytes(model), keep_logits=True)
    assert r["kl"] == 0.0 and r["top1"] == 1.0 and r["linear_bytes"] == QB.linear_bytes(model)
    assert r["ppl"] == pytest.approx(math.exp(r["nll"])) and r["tokens"] == 2 * 23
    assert r["logits"].shape == (1, 24, 256) and 0 < r["tok_s"] < math.inf
    line = QB.result_line("FP32", r)
    assert line.startswith("FP32 ") and "KL 0.0000" in line and "same next token 100.0%" in line


def test_a_quantized_copy_is_scored_against_the_base(model, base):
    m4 = copy.deepcopy(model)
    rep = Q.quantize_model(m4, bits=4, group_size=32)
    r = QB.measure_format(m4, base, rep["q_bytes"], tok_s=12.5)
    assert r["kl"] > 0 and r["tok_s"] == 12.5 and r["logits"] is None
    own = P.perplexity(m4, base.ev)["ppl"]
    assert r["ppl"] == pytest.approx(own) and r["ppl"] != pytest.approx(P.perplexity(model, base.ev)["ppl"])
    with torch.no_grad():  # agreement: greedy tokens the copy predicts given the reference prefix
        pred = m4(base.reference[0][None]).logits[0, -5:-1].argmax(-1)
    same = (pred == base.reference[0][-4:]).int()
    assert r["agree"] == pytest.approx(float(same.cumprod(0).sum()) / 4)


def test_decode_speed_is_greedy_decode_s(model, base):
    from labkit.llm.decode import greedy_decode

    tok_s = QB.decode_tokens_per_s(model, base.decode_ids, tokens=3)
    assert 0 < tok_s < math.inf
    timing = greedy_decode(model, base.decode_ids, 3)
    assert timing.step_s.shape == (3,)  # the same loop: 3 timed steps after 2 untimed ones


def test_torchao_int8_takes_one_byte_per_weight_plus_row_scales(model, base):
    pytest.importorskip("torchao")
    ma, nbytes = LK.torchao_int8(model)
    linears = Q.quantizable_linears(model)
    weights, rows = sum(m.weight.numel() for _, m in linears), sum(m.out_features for _, m in linears)
    # int8 codes, plus per row a scale (at most float32) and an int8 zero point (torchao 0.18 stores one)
    assert weights < nbytes <= weights + rows * (4 + 1)
    assert all(type(m.weight) is nn.Parameter and m.weight.dtype == torch.float32 for _, m in linears)
    assert P.divergence(base.logits, P.window_logits(ma, base.ev))["kl"] < 1e-3


def test_torchao_w8a8_computes_the_model_and_its_times_split_the_layer(model, base):
    pytest.importorskip("torchao")
    w8a8 = LK.torchao_w8a8(model)
    assert type(model.model.layers[0].mlp.up_proj.weight) is nn.Parameter  # the original is untouched
    assert w8a8.model.layers[0].mlp.up_proj.weight.qdata.dtype == torch.int8
    assert P.divergence(base.logits, P.window_logits(w8a8, base.ev))["kl"] < 1e-2
    ids = torch.randint(0, 256, (1, 32), generator=torch.Generator().manual_seed(2))  # _int_mm: over 16 rows
    t = LK.w8a8_times(model, w8a8, ids, rounds=3)
    assert t["tokens"] == 32 and t["layers"] == 7  # q, k, v, o, gate, up, down of the first block
    assert set(t["prefill_s"]) == {"float", "W8A8"} and set(t["linear_s"]) == {
        "float matmul", "INT8 x INT8 matmul", "W8A8 layer"}
    assert all(v.shape == (3,) and (v > 0).all() for d in (t["prefill_s"], t["linear_s"]) for v in d.values())
    calls = LK._linear_calls(model.model.layers[0].mlp.up_proj, w8a8.model.layers[0].mlp.up_proj, 32, "cpu")
    assert calls["INT8 x INT8 matmul"]().dtype == torch.int32 and calls["W8A8 layer"]().shape == (32, 128)


@pytest.mark.skipif(not LK.has_fused_cpu_kernels(), reason="this torch has no fused INT4/INT8 CPU kernels")
@pytest.mark.parametrize("in_features", [256, 576])  # 576: not whole groups of 128, so groups of 64
def test_fused_kernels_compute_labkits_round_to_nearest_product(in_features):
    torch.manual_seed(3)
    lin = nn.Linear(in_features, 48, bias=False)
    x = torch.randn(1, in_features)
    calls = LK.kernel_calls(lin, x, 128, "cpu")
    assert list(calls) == ["float matmul", "labkit INT8 (dequantize + matmul)",
                           "labkit INT4 (unpack + dequantize + matmul)", "torch fused INT8 kernel",
                           "torch fused INT4 kernel"]
    with torch.no_grad():
        out = {k: f() for k, f in calls.items()}
        g = 128 if in_features % 128 == 0 else 64
        rtn4 = F.linear(x, Q.dequantize_weight(*Q.quantize_weight(lin.weight, 4, g), 4, in_features, g))
    assert torch.allclose(out["torch fused INT8 kernel"], out["labkit INT8 (dequantize + matmul)"], atol=1e-5)
    assert torch.allclose(out["torch fused INT4 kernel"], rtn4, atol=1e-5)
    assert not torch.allclose(out["torch fused INT4 kernel"], out["float matmul"], atol=1e-3)  # it is 4-bit
    packed, g_used, sz = LK.fused_int4_operands(lin.weight.detach(), 128)
    assert g_used == g and sz.shape == (in_features // g, 48, 2) and not sz[..., 1].any()
    assert "torch fused INT4 kernel" not in LK.kernel_calls(lin, x, 128, "cuda")  # CPU kernels only


def test_kernel_times_times_every_call():
    lin = nn.Linear(128, 32)
    us = LK.kernel_times(lin, 64, "cpu", repeats=2)
    assert set(us) == set(LK.kernel_calls(lin, torch.zeros(1, 128), 64))
    assert all(0 < v < 1e6 for v in us.values())


def test_risk_ladder_rungs_and_the_model_restored(model, ev):
    ref = P.window_logits(model, ev[:1])
    risk = QB.risk_ladder(model, ev[:1], ref, bits=(8, 4))
    assert set(risk) == {(s, b) for s in (*QB.RISK_STEPS[1:], QB.KIVI) for b in (8, 4)}
    assert all(r["kl"] > -1e-6 for r in risk.values())  # KL >= 0, up to float32 rounding near 0
    assert risk[("KV cache", 8)]["kl"] < risk[("KV cache", 4)]["kl"]
    assert risk[("activations", 8)]["kl"] < risk[("activations", 4)]["kl"]
    assert torch.equal(P.window_logits(model, ev[:1]), ref)  # every fake quantization was undone


def test_attention_rounded_in_the_first_rows_only_leaves_the_rest_exact_and_measures_the_carry(model):
    ids = torch.randint(0, 256, (2, 32), generator=torch.Generator().manual_seed(2))
    with torch.no_grad(), RQ.attention_quant(model):
        exact = model(ids).logits
    with torch.no_grad(), RQ.attention_quant(model, probs_bits=4, probs_rows=8):
        first = model(ids).logits
    with torch.no_grad(), RQ.attention_quant(model, probs_bits=4):
        every = model(ids).logits
    assert torch.equal(first[:, :8], every[:, :8]) and not torch.equal(first[:, :8], exact[:, :8])
    assert not torch.equal(first[:, 8:], every[:, 8:])  # rows after 8 are not rounded...
    late = (first[:, 8:] - exact[:, 8:]).abs().max()
    assert late < (every[:, 8:] - exact[:, 8:]).abs().max()  # ...so they move less than when rounded
    r = QB.attention_error_carry(model, ids, bits=1)  # coarse: KL well above float32 rounding here
    assert len(r["carried"]) == len(r["growth"]) == 2 and all(x >= 0 for x in r["carried"])
    assert [len(v) for v in r["by_position"].values()] == [32, 32]
    q = {k: [sum(v[i:i + 8]) / 8 for i in range(0, 32, 8)] for k, v in r["by_position"].items()}  # by quarter
    assert q["first rows"][0] == pytest.approx(q["every row"][0])  # the first quarter is rounded in both
    assert all(a <= b + 1e-9 for a, b in zip(q["first rows"][1:], q["every row"][1:], strict=True))
    with torch.no_grad():
        assert torch.equal(model(ids).logits, P.window_logits(model, ids))  # and the model is restored


def test_bytes_per_param_rule():
    assert QB.bytes_per_param(100, 20, 4, 2) == pytest.approx((80 * 0.5 + 20 * 2) / 100)
    tied = {"vocab_size": 10, "hidden_size": 4, "tie_word_embeddings": True}
    assert embedding_params(tied)["matrices"] == 40
    assert embedding_params(tied | {"tie_word_embeddings": False})["matrices"] == 80  # embedding + head
    llama = load_config("Llama-3-8B")
    total, emb = param_count(llama)["total"], embedding_params(llama)["matrices"]
    assert emb == 128_256 * 4096 * 2
    # INT4 linears with a float16 scale per 128 weights, embedding and head in 8 bits: 0.58 bytes/param
    assert QB.bytes_per_param(total, emb, 4 + 16 / 128, 1) == pytest.approx(0.579, abs=0.001)


@pytest.mark.skipif(not hasattr(torch.ops.aten, "_weight_int8pack_mm"), reason="no fused INT8 CPU kernel")
def test_fused_int8_model_computes_labkits_int8_product_in_one_byte_per_weight(model, base):
    mf, nbytes = LK.fused_int8_model(model)
    m8 = copy.deepcopy(model)
    rep = Q.quantize_model(m8, bits=8)
    linears = Q.quantizable_linears(model)
    assert all(isinstance(mf.get_submodule(n), LK.FusedInt8Linear) for n, _ in linears)
    assert nbytes == sum(LK.FusedInt8Linear(m).nbytes() for _, m in linears)
    assert sum(m.weight.numel() for _, m in linears) < nbytes < rep["fp_bytes"] / 3
    with torch.inference_mode():
        a, b = P.window_logits(mf, base.ev), P.window_logits(m8, base.ev)
    assert torch.allclose(a, b, atol=1e-3)
    assert not isinstance(model.get_submodule(linears[0][0]), LK.FusedInt8Linear)  # the original is kept
    fused = mf.get_submodule(linears[0][0])  # one row goes through the kernel, several through a float copy
    x = torch.randn(3, fused.qweight.shape[1])
    with torch.inference_mode():
        one_by_one = torch.cat([fused(r[None]) for r in x])
        assert torch.allclose(fused(x), one_by_one, atol=1e-4)


def test_decode_rounds_interleave_and_ratio_interval_and_sentence(model, base):
    from labkit.llm.decode import decode_rounds, speed_sentence
    from labkit.stats import ratio_interval

    tok_s = decode_rounds({"a": model, "b": model}, base.decode_ids, rounds=3, tokens=2)
    assert set(tok_s) == {"a", "b"} and all(len(v) == 3 and min(v) > 0 for v in tok_s.values())
    short = decode_rounds({"a": model, "b": model}, base.decode_ids, rounds=5, tokens=2, min_rounds=2,
                             budget_s=1e-6)  # no time at all: the floor of rounds, each covering both
    assert [len(v) for v in short.values()] == [2, 2]
    roomy = decode_rounds({"a": model}, base.decode_ids, rounds=4, tokens=2, min_rounds=2, budget_s=1e6)
    assert len(roomy["a"]) == 4
    r = ratio_interval([2.0, 4.0, 6.0], [1.0, 2.0, 4.0])  # per-round ratios 2, 2, 1.5 (labkit.stats)
    assert r["n"] == 3 and r["median"] == 2.0 and r["lo"] == 1.5 and r["hi"] == 2.0
    assert "faster" in speed_sentence("INT8", "FP32", r)
    assert "slower" in speed_sentence("INT8", "FP32", {"median": 0.8, "lo": 0.7, "hi": 0.9, "n": 5})
    even = {"median": 1.1, "lo": 0.9, "hi": 1.2, "n": 5}
    assert "cannot tell apart" in speed_sentence("INT8", "FP32", even)


def test_batched_windows_score_as_one_by_one(model, ev):
    one_by_one = P.window_logits(model, ev)
    together = P.window_logits(model, ev, batch_tokens=10_000)  # both windows in one pass
    assert together.shape == one_by_one.shape and torch.allclose(together, one_by_one, atol=1e-4)
    assert torch.equal(QB.eval_logits(model, ev), P.window_logits(model, ev, QB.EVAL_BATCH_TOKENS))


def test_a_quantized_kv_cache_at_long_context(model):
    ids = torch.randint(0, 256, (1, 96), generator=torch.Generator().manual_seed(3))
    kv = QB.kv_cache_long_context(model, ids[:, :64], ids[:, 64:])
    labels = {"INT8, prefix only", *QB.KV_VARIANTS}
    assert set(kv) == labels | {"bytes"} and kv["bytes"]["q_bytes"] < kv["bytes"]["fp_bytes"]
    assert all(kv[k]["kl"] > -1e-6 for k in labels)
    assert kv["INT8, prefix and continuation"]["kl"] < kv["INT4 per token"]["kl"]
    assert kv["INT8, prefix only"]["kl"] != kv["INT8, prefix and continuation"]["kl"]  # the new tokens count
    with torch.inference_mode():  # nothing stays rounded: the plain model scores as before
        assert model.config._attn_implementation == "sdpa" and torch.isfinite(model(ids).logits).all()


def test_per_tensor_int8_and_fp8_rounding_and_their_range_errors():
    g = torch.Generator().manual_seed(0)
    w = torch.randn(64, 128, generator=g) * 0.02
    w[0, 0] = 2.0  # one outlier, 100 standard deviations out: it sets both formats' single scale
    i8 = QB.per_tensor_round(w, "int8")
    step = 2.0 / 127
    assert ((i8 - w).abs() <= step / 2 + 1e-7).all() and len(torch.unique(i8)) <= 255
    f8 = QB.per_tensor_round(w, "float8_e4m3fn")
    assert float(f8[0, 0]) == pytest.approx(2.0) and f8.dtype == torch.float32
    small = (w.abs() > 1e-3) & (w.abs() < 0.02)  # E4M3's 3 mantissa bits: at most 1/16 relative error
    assert ((f8 - w).abs()[small] <= w.abs()[small] / 16 + 1e-7).all()
    e = QB.range_errors(w)
    assert set(e) == {"int8", "float8_e4m3fn", "float8_e5m2"}
    assert e["float8_e4m3fn"]["small"] < e["int8"]["small"] and e["float8_e4m3fn"]["mse"] < e["int8"]["mse"]
    flat = torch.randn(64, 128, generator=g)  # no outlier: INT8's even grid is the finer one
    ef = QB.range_errors(flat)
    assert ef["int8"]["mse"] < ef["float8_e4m3fn"]["mse"]
