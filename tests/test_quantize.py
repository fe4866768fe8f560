"""Round-to-nearest quantization, packed storage, QuantLinear, KV/activation/attention fake quantization
and the quality measures (chapter 06), each against a direct computation."""

import math

import pytest
import torch
from torch import nn

from labkit.llm import perplexity as P
from labkit.llm import quantize as Q
from labkit.llm import runtime_quant as RQ


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
    q, s = RQ.quantize_kv(k)
    assert q.dtype == torch.int8 and s.shape == (2, 3, 50, 1)
    assert ((RQ.dequantize_kv(q, s) - k).abs() <= s.float() * 0.51 + 1e-6).all()
    model = tiny_llama()
    with torch.no_grad():
        cache = model(torch.randint(0, 256, (1, 30)), use_cache=True).past_key_values
    before = [layer.keys.clone() for layer in cache.layers]
    rep = RQ.quantize_cache_(cache)
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
        with RQ.activation_quant(model) as n:
            act = model(ids).logits
        assert n == 14
        with RQ.attention_quant(model):
            plain = model(ids).logits
        with RQ.attention_quant(model, kv_bits=8, probs_bits=8):
            both = model(ids).logits
        after = model(ids).logits
    assert torch.allclose(plain, ref, atol=1e-4)  # the eager path reproduces sdpa
    for out in (act, both):
        assert not torch.equal(out, ref) and torch.allclose(out, ref, atol=0.05)
    assert torch.equal(after, ref) and model.config._attn_implementation == "sdpa"
    x = torch.randn(3, 5, 32)
    fq = RQ.fake_quant_per_token(x)
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


def test_kivi_style_keys_beat_per_token_on_outlier_channels_and_cost_their_scales():
    """KIVI's point: keys carry a few large channels in every token. At 4 bits a per-token scale is
    set by the outlier and rounds the small channels coarsely; a per-channel one keeps them. Its
    asymmetric grid holds each group's min and max exactly; storage counts the float16 min and scale."""
    import torch

    from labkit.llm import runtime_quant as RQ

    g = torch.Generator().manual_seed(0)
    k = torch.randn(1, 2, 64, 32, generator=g) + 3  # off-centre: an asymmetric grid uses all its codes
    k[..., 3] *= 40  # an outlier channel, as real keys have
    v = torch.randn(1, 2, 64, 32, generator=g)
    per_token = RQ.dequantize_kv(*RQ.quantize_kv(k, 4), k.dtype)
    kivi_k, kivi_v = RQ.fake_quant_kivi(k, v, 4, group=32)
    small = [c for c in range(32) if c != 3]
    err_t = (per_token - k)[..., small].pow(2).mean()
    err_c = (kivi_k - k)[..., small].pow(2).mean()
    assert err_c < 0.1 * err_t, (float(err_c), float(err_t))
    assert kivi_k.shape == k.shape and kivi_k.dtype == k.dtype
    groups = k.view(1, 2, 2, 32, 32)  # keys: per channel over 32 tokens, min and max kept (float16)
    step = (groups.amax(3) - groups.amin(3)) / 15
    assert ((kivi_k.view(1, 2, 2, 32, 32) - groups).abs() <= step[:, :, :, None] * 0.51 + 0.02).all()
    assert torch.allclose(kivi_k.view(1, 2, 2, 32, 32).amin(3), groups.amin(3), atol=0.02)
    direct_v = RQ.fake_quant_asym(v, 4, -1, 32)  # values: per token over 32 channels
    assert torch.equal(kivi_v, direct_v) and not torch.equal(kivi_v, RQ.fake_quant_asym(v, 4, -2, 32))
    odd, _ = RQ.fake_quant_kivi(k[:, :, :50], v[:, :, :50], 4, group=32)  # a partial last group
    assert odd.shape == (1, 2, 50, 32) and torch.allclose(odd[:, :, :32], kivi_k[:, :, :32])
    from labkit.llm.kvcache import kv_bits_per_element

    assert kv_bits_per_element(4, 64) == 4.25 and kv_bits_per_element(4, 64, kivi=True) == 5.0
    assert kv_bits_per_element(8, 64) == 8.25 and kv_bits_per_element(4, 64, kivi=True, group=64) == 4.5


def test_asymmetric_rtn_with_clip_search_beats_symmetric_and_stores_what_it_counts(tiny_llama):
    g = torch.Generator().manual_seed(5)
    w = torch.randn(48, 320, generator=g) * 0.05 + 0.02  # off-centre groups: a zero point helps
    w[:, 7] *= 30  # an outlier column: clipping helps the rest of its groups
    codes, scales, zeros = Q.quantize_weight_asym(w, 4, 128)
    assert codes.shape == (48, 160) and codes.dtype == torch.uint8 and scales.shape == zeros.shape == (48, 3)
    assert scales.dtype == torch.float16 and zeros.dtype == torch.uint8 and int(zeros.max()) <= 15
    deq = Q.dequantize_weight_asym(codes, scales, zeros, 4, 320, 128)
    sym = Q.dequantize_weight(*Q.quantize_weight(w, 4, 128), 4, 320, 128)
    full = Q.dequantize_weight_asym(*Q.quantize_weight_asym(w, 4, 128, clip=(1.0,)), 4, 320, 128)
    mse = {k: float((v - w).pow(2).mean()) for k, v in (("clip", deq), ("minmax", full), ("sym", sym))}
    assert mse["clip"] <= mse["minmax"] < mse["sym"], mse
    # the search picks, per group, the least squared error of the shares it tries: never worse than none
    per_group = lambda q: (q - w).pow(2).view(48, -1).split(128, 1)  # noqa: E731
    for a, b in zip(per_group(deq), per_group(full), strict=True):
        assert (a.sum(1) <= b.sum(1) + 1e-9).all()
    z = torch.zeros(4, 128)
    z[:, 5] = 1.0  # 0 stays exact: the range always holds it
    zq = Q.dequantize_weight_asym(*Q.quantize_weight_asym(z, 4, 128), 4, 128, 128)
    assert torch.equal(zq[:, :5], z[:, :5])
    model = tiny_llama()
    before = {n: m.weight.detach().clone() for n, m in Q.quantizable_linears(model)}
    rep = Q.rtn_asym_model_(model, 4, 32)
    linears = Q.quantizable_linears(model)
    params = sum(m.weight.numel() for _, m in linears)
    groups = sum(m.out_features * -(-m.in_features // 32) for _, m in linears)
    assert rep["layers"] == len(linears) and rep["params"] == params
    assert rep["q_bytes"] == params // 2 + groups * (2 + 1)  # nibbles, float16 scales, uint8 zero points
    for n, m in linears:
        expect = Q.dequantize_weight_asym(*Q.quantize_weight_asym(before[n], 4, 32), 4, m.in_features, 32)
        assert torch.equal(m.weight.detach(), expect)


def test_sliding_windows_score_every_token_once_with_context():
    ids = torch.arange(1000, 3300)  # 2300 tokens
    sw = P.sliding_windows(ids, window=1024, stride=512)
    assert sw.windows.shape == (4, 1024) and sw.starts == (0, 512, 1024, 1276) and sw.shape == (4, 1024)
    predicted = []  # absolute positions of the tokens each window scores
    for s, f, win in zip(sw.starts, sw.first, sw.windows, strict=True):
        assert torch.equal(win, ids[s:s + 1024])
        predicted += [s + p + 1 for p in range(f, 1023)]
        assert f == 0 or f >= 512 - 1  # a window's first scored prediction sees window - stride tokens
    assert predicted == list(range(1, 2300)) and sw.numel() == 2299
    one = P.sliding_windows(ids[:300], 1024, 512)
    assert one.windows.shape == (1, 300) and one.first == (0,)
    with pytest.raises(ValueError):
        P.sliding_windows(ids, 512, 1024)


def test_sliding_logits_equal_a_full_context_pass_when_the_window_covers_the_text(tiny_llama):
    model = tiny_llama(max_position_embeddings=256)
    ids = torch.randint(0, 256, (120,), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        full = model(ids[None]).logits[0, :-1].float()
    whole = P.sliding_logits(model, P.sliding_windows(ids, 128, 64))
    assert whole.shape == (119, 256) and torch.allclose(whole, full, atol=1e-5)
    slid = P.sliding_logits(model, P.sliding_windows(ids, 64, 32), batch_tokens=128)
    assert slid.shape == (119, 256) and torch.allclose(slid[:63], full[:63], atol=1e-5)
    assert not torch.allclose(slid[63:], full[63:], atol=1e-3)  # later tokens see 32+ tokens, not all before
    nll = P.token_nll(whole, ids)
    assert nll.dtype == torch.float64 and float(nll.mean()) == pytest.approx(
        float(torch.nn.functional.cross_entropy(full, ids[1:])), rel=1e-5)


def test_paragraph_groups_and_bootstrap_intervals():
    class Tok:  # a fast tokenizer's offsets: one token per word
        def __call__(self, text, return_offsets_mapping=False):
            import re
            return {"offset_mapping": [(m.start(), m.end()) for m in re.finditer(r"\S+", text)]}

    text = "a b c\n\nd e\n\nf g h i"
    assert P.paragraph_groups(Tok(), text) == [0, 0, 0, 1, 1, 2, 2, 2, 2]
    g = torch.Generator().manual_seed(0)
    nll = torch.rand(400, generator=g, dtype=torch.float64) * 4
    groups = [0] + [i // 40 for i in range(400)]  # a whole text's groups: its first token is never predicted
    c = P.ppl_interval(nll, groups)
    assert c["lo"] < c["ppl"] < c["hi"] and c["n"] == 10
    assert c["ppl"] == pytest.approx(math.exp(float(nll.mean())))
    same = P.ppl_ratio_interval(nll, nll, groups)
    assert same["ratio"] == same["lo"] == same["hi"] == 1.0
    worse = P.ppl_ratio_interval(nll, nll + 0.1, groups)
    assert worse["ratio"] == pytest.approx(math.exp(0.1)) and worse["lo"] == pytest.approx(math.exp(0.1))


def test_token_nll_from_log_probabilities_equals_cross_entropy():
    g = torch.Generator().manual_seed(1)
    logits, ids = torch.randn(2, 9, 50, generator=g), torch.randint(0, 50, (2, 9), generator=g)
    a = P.token_nll(logits, ids)
    b = P.token_nll(torch.log_softmax(logits, -1), ids, log_probs=True)
    assert a.shape == (16,) and torch.allclose(a, b, atol=1e-6)
    assert float(a.mean()) == pytest.approx(P.perplexity_from_logits(logits, ids)["nll"], rel=1e-6)


def test_divergence_from_cached_reference_statistics_equals_the_direct_one():
    g = torch.Generator().manual_seed(2)
    ref, other = torch.randn(30, 40, generator=g), torch.randn(30, 40, generator=g)
    p, q = torch.log_softmax(ref, -1), torch.log_softmax(other, -1)
    probs = p.exp()
    stats = {"p": probs, "p_logp": torch.linalg.vecdot(probs, p), "top": p.argmax(-1)}
    cached = P.divergence_logp(p, q, stats)
    direct = P.divergence(ref, other)
    assert cached["kl"] == pytest.approx(direct["kl"], rel=1e-5) and cached["top1"] == direct["top1"]
    assert cached["kl"] == pytest.approx(float((probs * (p - q)).sum(-1).mean()), rel=1e-5)


def test_a_one_point_clip_grid_takes_the_short_path_to_the_searchs_answer():
    """A grid of one shrink has nothing to search (AWQ's scale search quantizes that way): the short
    path must give what the search gives over the same point twice."""
    w = torch.randn(40, 300, generator=torch.Generator().manual_seed(0)) * 0.05
    w[3, 7] = 2.0  # an outlier widens one group's range
    for bits in (4, 8):
        short = Q.quantize_weight_asym(w, bits, 128, clip=(0.9,))
        searched = Q.quantize_weight_asym(w, bits, 128, clip=(0.9, 0.9))
        assert all(torch.equal(a, b) for a, b in zip(short, searched, strict=True))
