"""Round-to-nearest quantization, packed storage, QuantLinear, KV/activation/attention fake quantization
and the quality measures (chapter 06), each against a direct computation."""

import math

import pytest
import torch
from torch import nn

from labkit.llm import perplexity as P
from labkit.llm import quantize as Q


def test_pack_unpack_roundtrip_every_code():
    q = torch.arange(-8, 8, dtype=torch.int8).repeat(3, 4)[:, torch.randperm(64)]
    packed = Q.pack_int4(q)
    assert packed.dtype == torch.uint8 and packed.shape == (3, 32)
    assert torch.equal(Q.unpack_int4(packed), q)
    # two values per byte: column j in the low nibble, column j + 32 in the high one, each + 8
    assert int(packed[0, 0]) == (int(q[0, 0]) + 8) | ((int(q[0, 32]) + 8) << 4)
    assert int(packed[2, 31]) == (int(q[2, 31]) + 8) | ((int(q[2, 63]) + 8) << 4)
    with pytest.raises(ValueError):
        Q.pack_int4(torch.zeros(2, 3, dtype=torch.int8))


@pytest.mark.parametrize("bits,group", [(8, None), (4, 128), (4, 64), (4, 32)])
def test_rtn_error_is_at_most_half_a_step(bits, group):
    torch.manual_seed(1)
    w = torch.randn(48, 576) * torch.logspace(-2, 0, 48)[:, None]  # rows of very different size
    qw, sc = Q.quantize_weight(w, bits, group)
    g = 576 if bits == 8 else group
    assert sc.dtype == torch.float16 and sc.shape == (48, math.ceil(576 / g))
    deq = Q.dequantize_weight(qw, sc, bits, 576, group)
    step = Q.expand_scales(sc, 576, None if bits == 8 else group).float()
    # half a step, plus the clipping that float16-rounded scales can cause at the group maximum
    assert ((w - deq).abs() <= step * (0.5 + Q.qmax(bits) * 2**-10)).all()
    codes = Q.unpack_int4(qw) if bits == 4 else qw
    assert codes.abs().max() <= Q.qmax(bits)


def test_ragged_last_group_uses_its_own_scale():
    # 576 columns in groups of 128: four full groups and one of 64, scale j covers columns 128j..
    torch.manual_seed(2)
    w = torch.randn(8, 576)
    w[:, 512:] *= 100  # only the last (short) group is large
    qw, sc = Q.quantize_weight(w, 4, 128)
    assert sc.shape == (8, 5)
    direct = torch.stack([w[:, j * 128:(j + 1) * 128].abs().amax(1) / 7 for j in range(5)], 1)
    assert torch.allclose(sc.float(), direct, rtol=1e-3)
    deq = Q.dequantize_weight(qw, sc, 4, 576, 128)
    assert ((w[:, :512] - deq[:, :512]).abs() <= direct[:, :4].repeat_interleave(128, 1) * 0.51).all()


@torch.no_grad()
def test_quantlinear_matches_dequantized_matmul_and_the_float_layer():
    torch.manual_seed(3)
    lin = nn.Linear(256, 96, bias=True)
    x = torch.randn(5, 7, 256)
    for bits, group in [(8, None), (4, 128)]:
        ql = Q.QuantLinear.from_linear(lin, bits, group)
        w = Q.dequantize_weight(ql.qweight, ql.scales, bits, 256, group)
        assert torch.equal(ql.dequantized_weight(), w)
        assert torch.allclose(ql(x), x @ w.t() + lin.bias, atol=1e-5)
        rel = float(torch.linalg.norm(ql(x) - lin(x)) / torch.linalg.norm(lin(x)))
        assert rel < (0.01 if bits == 8 else 0.15), rel
        # bytes from the stored tensors: codes, float16 scales, bias
        per_row = 256 if bits == 8 else 128
        assert ql.nbytes() == 96 * per_row + 96 * (1 if bits == 8 else 2) * 2 + 96 * 4


def test_quantize_model_skips_the_tied_head_and_counts_bytes(tiny_llama):
    model = tiny_llama(tie_word_embeddings=True)
    ids = torch.randint(0, 256, (1, 24))
    with torch.no_grad():
        ref = model(ids).logits
    emb = model.get_input_embeddings().weight
    names = [n for n, _ in Q.quantizable_linears(model)]
    assert len(names) == 2 * 7 and not any("lm_head" in n for n in names)
    rep = Q.quantize_model(model, 4, 32)
    assert rep["layers"] == 14 and rep["fp32_bytes"] == rep["params"] * 4
    qls = [m for m in model.modules() if isinstance(m, Q.QuantLinear)]
    q_direct = sum(m.qweight.numel() + m.scales.numel() * 2 for m in qls)
    assert rep["q_bytes"] == q_direct and rep["ratio_fp32"] <= 0.3
    assert isinstance(model.lm_head, nn.Linear) and model.lm_head.weight is emb
    parts = Q.weight_breakdown(model)
    assert parts["embedding"] == emb.numel() * 4 and parts["quantized"] == q_direct and parts["linear"] == 0
    with torch.no_grad():
        out = model(ids).logits
    assert torch.corrcoef(torch.stack([out.flatten(), ref.flatten()]))[0, 1] > 0.9


def test_quantize_model_accepts_precomputed_weights(tiny_llama):
    model = tiny_llama()
    name, lin = Q.quantizable_linears(model)[0]
    qw, sc = Q.quantize_weight(lin.weight.detach(), 4, 16)
    Q.quantize_model(model, 4, 16, quantized={name: (qw, sc)})
    assert torch.equal(model.get_submodule(name).qweight, qw)


def test_kv_quantization_error_and_bytes(tiny_llama):
    torch.manual_seed(4)
    k = torch.randn(2, 3, 50, 64) * torch.rand(2, 3, 50, 1) * 10
    q, s = Q.quantize_kv(k)
    assert q.dtype == torch.int8 and s.shape == (2, 3, 50, 1)
    assert ((Q.dequantize_kv(q, s) - k).abs() <= s.float() * 0.51 + 1e-6).all()
    model = tiny_llama()
    with torch.no_grad():
        cache = model(torch.randint(0, 256, (1, 30)), use_cache=True).past_key_values
    before = [layer.keys.clone() for layer in cache.layers]
    rep = Q.quantize_cache_(cache)
    head_dim = 16
    assert rep["fp_bytes"] == 2 * 2 * 2 * 30 * head_dim * 4  # layers x (K,V) x kv heads x tokens x dim x fp32
    assert rep["q_bytes"] == rep["fp_bytes"] * (head_dim + 2) // (4 * head_dim)
    for b, layer in zip(before, cache.layers, strict=True):
        assert not torch.equal(b, layer.keys) and torch.allclose(b, layer.keys, atol=b.abs().max() / 100)


def test_activation_and_attention_fake_quant_change_little_and_clean_up(tiny_llama):
    model = tiny_llama()
    ids = torch.randint(0, 256, (1, 40))
    with torch.no_grad():
        ref = model(ids).logits
        with Q.activation_quant(model) as n:
            act = model(ids).logits
        assert n == 14
        with Q.attention_quant(model):
            plain = model(ids).logits
        with Q.attention_quant(model, kv_bits=8, probs_bits=8):
            both = model(ids).logits
        after = model(ids).logits
    assert torch.allclose(plain, ref, atol=1e-4)  # the eager path reproduces sdpa
    for out in (act, both):
        assert not torch.equal(out, ref) and torch.allclose(out, ref, atol=0.05)
    assert torch.equal(after, ref) and model.config._attn_implementation == "sdpa"
    x = torch.randn(3, 5, 32)
    fq = Q.fake_quant_per_token(x)
    assert ((fq - x).abs() <= x.abs().amax(-1, keepdim=True) / 127 * 0.51).all()


def test_perplexity_and_divergence_against_direct_values():
    ids = torch.randint(0, 50, (2, 9))
    uniform = torch.zeros(2, 9, 50)
    r = P.perplexity_from_logits(uniform, ids)
    assert r["ppl"] == pytest.approx(50, rel=1e-5) and r["tokens"] == 16
    logits = torch.randn(2, 9, 50)
    d = P.divergence(logits, logits)
    assert d["kl"] == pytest.approx(0, abs=1e-6) and d["top1"] == 1 and d["kl_per_pos"].shape == (9,)
    assert P.divergence(logits, uniform)["kl"] > 0


def test_windows_and_greedy_agreement_of_a_model_with_itself(tiny_llama):
    class Tok:
        chat_template = None
        pad_token_id, eos_token_id = 0, 0

        def __call__(self, text, return_tensors=None):
            return type("E", (), {"input_ids": torch.tensor([[ord(c) % 256 for c in text]])})()

    tok = Tok()
    w = P.token_windows(tok, "x" * 100, window=30)
    assert w.shape == (3, 30)
    model = tiny_llama()
    seqs = P.greedy_continuations(model, tok, ["hello", "abc"], max_new_tokens=6)
    assert [len(s) for s in seqs] == [11, 9]
    assert P.greedy_agreement(model, seqs, 6) == {"top1": 1.0, "prefix": 1.0}
    other = tiny_llama(seed=9, tie_word_embeddings=False)
    assert P.greedy_agreement(other, seqs, 6)["top1"] < 1
    assert "post office" in P.load_text("heldout") and P.load_text("calibration") != P.load_text("heldout")


def test_greedy_continuations_keeps_a_pad_id_of_zero():
    """A tokenizer whose pad id is 0 (a valid id) must not have it replaced by end-of-sequence."""
    import torch

    from labkit.llm import perplexity

    seen = {}

    class Tok:
        pad_token_id, eos_token_id, chat_template = 0, 2, None

        def __call__(self, text, **kw):
            return type("Enc", (), {"input_ids": torch.tensor([[5, 6]])})()

    class Model(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.w = torch.nn.Parameter(torch.zeros(1))

        def generate(self, ids, pad_token_id=None, max_new_tokens=1, **kw):
            seen["pad"] = pad_token_id
            return torch.cat([ids, torch.ones(1, max_new_tokens, dtype=ids.dtype)], 1)

    out = perplexity.greedy_continuations(Model(), Tok(), ["hi"], max_new_tokens=3)
    assert seen["pad"] == 0 and out[0].tolist()[-3:] == [1, 1, 1]


def test_per_channel_keys_beat_per_token_on_outlier_channels():
    """KIVI's point: keys carry a few large channels in every token. At 4 bits a per-token scale is
    set by the outlier and rounds the small channels to zero; a per-channel scale keeps them."""
    import torch

    from labkit.llm import quantize as Q

    g = torch.Generator().manual_seed(0)
    k = torch.randn(1, 2, 64, 32, generator=g)
    k[..., 3] *= 40  # an outlier channel, as real keys have
    per_token = Q.dequantize_kv(*Q.quantize_kv(k, 4), k.dtype)
    per_channel = Q.fake_quant_kv_per_channel(k, 4, group=32)
    small = [c for c in range(32) if c != 3]
    err_t = (per_token - k)[..., small].pow(2).mean()
    err_c = (per_channel - k)[..., small].pow(2).mean()
    assert err_c < 0.1 * err_t, (float(err_c), float(err_t))
    assert per_channel.shape == k.shape and per_channel.dtype == k.dtype
    odd = Q.fake_quant_kv_per_channel(k[:, :, :50], 4, group=32)  # a partial last group
    assert odd.shape == (1, 2, 50, 32) and torch.allclose(odd[:, :, :32], per_channel[:, :, :32])
