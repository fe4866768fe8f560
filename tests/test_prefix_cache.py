"""Prefix caching: KV reuse, cached-token counts, reload vs recompute, vLLM's counters
(labkit.llm.prefix_cache and labkit.experiments.vllm_prefix, chapter 06)."""

import pytest
import torch

from labkit.engines.prometheus import samples
from labkit.experiments import vllm_prefix
from labkit.experiments.vllm_prefix import hit_rate, prefix_metric_names, prompts
from labkit.llm import prefix_cache as pc
from labkit.llm.architecture import load_config, param_count
from labkit.llm.kvcache import cache_tensor_bytes, kv_cache_bytes_for_config

# Lines of vLLM 0.32's /metrics (CPU build, read from a running server), trimmed.
VLLM_032 = """\
# HELP vllm:kv_cache_usage_perc KV-cache usage. 1 means 100 percent usage.
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine="0",model_name="smollm2"} 0.0
# HELP vllm:prefix_cache_queries_total Prefix cache queries, in terms of number of queried tokens.
# TYPE vllm:prefix_cache_queries_total counter
vllm:prefix_cache_queries_total{engine="0",model_name="smollm2"} 2238.0
# HELP vllm:prefix_cache_queries_created Prefix cache queries, in terms of number of queried tokens.
# TYPE vllm:prefix_cache_queries_created gauge
vllm:prefix_cache_queries_created{engine="0",model_name="smollm2"} 1.7960951319210465e+09
# HELP vllm:prefix_cache_hits_total Prefix cache hits, in terms of number of cached tokens.
# TYPE vllm:prefix_cache_hits_total counter
vllm:prefix_cache_hits_total{engine="0",model_name="smollm2"} 512.0
# HELP vllm:external_prefix_cache_queries_total External prefix cache queries from KV connector.
# TYPE vllm:external_prefix_cache_queries_total counter
vllm:external_prefix_cache_queries_total{engine="0",model_name="smollm2"} 0.0
# HELP vllm:external_prefix_cache_hits_total External prefix cache hits from KV connector.
# TYPE vllm:external_prefix_cache_hits_total counter
vllm:external_prefix_cache_hits_total{engine="0",model_name="smollm2"} 0.0
# HELP vllm:mm_cache_hits_total Multi-modal cache hits.
# TYPE vllm:mm_cache_hits_total counter
vllm:mm_cache_hits_total{engine="0",model_name="smollm2"} 0.0
"""


def test_metric_names_found_in_vllm_032_text():
    names = prefix_metric_names(VLLM_032)
    assert names == {"hits": "vllm:prefix_cache_hits_total", "queries": "vllm:prefix_cache_queries_total"}
    s = samples(VLLM_032)
    assert s[names["hits"]] == 512 and s[names["queries"]] == 2238
    before = {k: v / 2 for k, v in s.items()}
    assert hit_rate(before, s) == {"hits": 256, "queries": 1119, "rate": pytest.approx(256 / 1119)}


def test_metric_names_of_other_versions():
    early_v1 = {"vllm:gpu_prefix_cache_queries_total": 10.0, "vllm:gpu_prefix_cache_hits_total": 4.0,
                "vllm:gpu_prefix_cache_hits_created": 1.0}
    assert prefix_metric_names(early_v1) == {"hits": "vllm:gpu_prefix_cache_hits_total",
                                             "queries": "vllm:gpu_prefix_cache_queries_total"}
    v0 = {"vllm:gpu_prefix_cache_hit_rate": 0.25, "vllm:cpu_prefix_cache_hit_rate": 0.0}
    assert prefix_metric_names(v0) == {"rate": "vllm:gpu_prefix_cache_hit_rate"}
    with pytest.raises(KeyError, match="no prefix-cache counters"):
        prefix_metric_names({"vllm:num_requests_running": 0.0, "vllm:external_prefix_cache_hits_total": 0.0})


def test_cached_tokens():
    assert pc.cached_tokens([1, 2, 3, 4], [1, 2, 3, 9]) == 3
    assert pc.cached_tokens([1, 2, 3], [1, 2, 3]) == 2           # the last token is always computed
    assert pc.cached_tokens([5, 2, 3], [1, 2, 3]) == 0
    assert pc.cached_tokens([], [1, 2]) == 0 and pc.cached_tokens([1], []) == 0
    assert pc.cached_tokens(list(range(300)), list(range(299)) + [-1], block=128) == 256
    assert pc.cached_tokens(list(range(100)), list(range(100)), block=128) == 0


def test_stable_part_first_is_cached():
    from transformers import AutoTokenizer

    from labkit.models import llm_dir

    tok = AutoTokenizer.from_pretrained(llm_dir("float32"))
    ids = lambda s: tok(s)["input_ids"]
    # The tutorial's tip: "Weather in Paris?" / "Weather in Tokyo?" share "Weather in".
    assert pc.cached_tokens(ids("Weather in Paris?"), ids("Weather in Tokyo?")) == 2
    assert pc.cached_tokens(ids("Paris weather?"), ids("Tokyo weather?")) == 0
    p = prompts(tok, shared_tokens=256, n=2)
    hit, miss = [ids(x) for x in p["hit"]], [ids(x) for x in p["miss"]]
    assert pc.cached_tokens(hit[0], hit[1]) >= 256 and pc.cached_tokens(ids(p["warmup"]), hit[0]) >= 256
    assert pc.cached_tokens(miss[0], miss[1]) == 0 and pc.cached_tokens(hit[0], miss[0]) == 0
    assert abs(len(miss[0]) - len(hit[0])) <= 8


@pytest.fixture(scope="module")
def tiny(tiny_llama):
    return tiny_llama(num_hidden_layers=3, vocab_size=100, tie_word_embeddings=False)


def test_reuse_gives_the_logits_of_a_full_prefill(tiny):
    ids = torch.randint(0, 100, (1, 40))
    full, _ = pc.prefill(tiny, ids)
    stored = pc.prefill_prefix(tiny, ids[:, :32])
    hit, own = pc.reuse(tiny, stored, ids[:, 32:])
    assert torch.allclose(hit, full, atol=1e-5, rtol=1e-5)
    assert stored.get_seq_length() == 32 and own.get_seq_length() == 40  # the stored prefix is untouched
    again, _ = pc.reuse(tiny, stored, ids[:, 32:])
    assert torch.equal(again, hit)
    short = pc.cropped(stored, 20)                        # a shorter shared prefix from the same prefill
    assert short.get_seq_length() == 20 and stored.get_seq_length() == 32
    assert torch.allclose(pc.reuse(tiny, short, ids[:, 20:])[0], full, atol=1e-5, rtol=1e-5)
    assert not torch.allclose(pc.reuse(tiny, short, ids[:, 21:])[0], full, atol=1e-3)  # a wrong prefix shows
    with pytest.raises(ValueError):
        pc.cropped(stored, 33)
    assert cache_tensor_bytes(stored) == kv_cache_bytes_for_config(tiny.config.to_dict(), 32, dtype_bytes=4)


def test_ttft_sweep_rows(tiny):
    ids = torch.randint(0, 100, (1, 64))
    rows = pc.ttft_sweep(tiny, ids[:, :60], ids[:, 60:], (8, 60), repeats=1)
    assert [r["shared"] for r in rows] == [8, 60] and all(r["suffix"] == 4 for r in rows)
    assert all(r["miss_s"] > 0 and r["hit_s"] > 0 for r in rows)
    assert all(r["max_abs_diff"] < 1e-4 and r["same_argmax"] for r in rows)
    with pytest.raises(ValueError):
        pc.ttft_sweep(tiny, ids[:, :10], ids[:, 60:], (20,))


def test_reload_vs_recompute_arithmetic():
    cfg = load_config("Qwen3-4B")
    per_token = kv_cache_bytes_for_config(cfg, 1, dtype_bytes=2)
    assert per_token == 36 * 8 * 128 * 2 * 2 == 147_456
    params = param_count(cfg)["total"]
    # 2,048 tokens at the H100's dense bf16 peak: 2 x 4.02e9 x 2048 / 989.4e12 s = 16.7 ms.
    assert pc.recompute_seconds(2048, params, 989.4) == pytest.approx(16.65e-3, rel=1e-3)
    assert pc.reload_seconds(2048, per_token, 3.35e12) == pytest.approx(2048 * 147_456 / 3.35e12)
    breakeven = pc.breakeven_bandwidth(per_token, params, 989.4)
    assert breakeven == pytest.approx(18.1e9, rel=0.01)
    rows = pc.tier_table(2048, per_token, params, 989.4, {"hbm": 3.35e12, "pcie": 64e9, "nvme": 7e9})
    assert [r["reload_wins"] for r in rows] == [True, True, False]
    at = pc.tier_table(2048, per_token, params, 989.4, {"edge": breakeven})[0]
    assert at["reload_s"] == pytest.approx(at["recompute_s"])
    assert rows[0]["kv_mb"] == pytest.approx(2048 * per_token / 1e6)


def test_prefill_tflops_and_printable_tier_rows():
    # 4e9 params, 1,000 tokens in 8 s: 2 x 4e9 x 1e3 / 8 = 1e12 FLOP/s = 1 TFLOPS
    assert pc.prefill_tflops(4e9, 1000, 8.0) == pytest.approx(1.0)
    tiers = {"fast": 1e12, "slow": 1e8}
    raw = pc.tier_table(4096, 1e5, 1e9, 10.0, tiers)
    rows = pc.tier_rows("tiny here", 4096, 1e5, 1e9, 10.0, tiers)
    assert [r["tier"] for r in rows] == ["fast", "slow"]
    assert all(r["model / machine"] == "tiny here" for r in rows)
    # reload 4096 x 1e5 bytes: 0.41 ms at 1e12 B/s, 4,096 ms at 1e8 B/s
    assert rows[0]["reload 4096 tok ms"] == f"{raw[0]['reload_s'] * 1e3:.2f}" == "0.41"
    assert rows[1]["reload 4096 tok ms"] == "4096.00"
    assert rows[0]["recompute ms"] == rows[1]["recompute ms"] == "819.20"  # 2 x 1e9 x 4096 FLOPs / 10 TFLOPS
    assert [r["keep it"] for r in rows] == ["reload", "recompute"]
    assert [r["GB/s"] for r in rows] == ["1,000.0", "0.1"]


class _Chars:
    """A tokenizer of one token per character (what group_prompts and shared_text call)."""

    def __call__(self, text, add_special_tokens=False):
        return {"input_ids": [ord(c) for c in text]}

    def decode(self, ids):
        return "".join(map(chr, ids))


def test_group_prompts_share_a_groups_prefix_and_nothing_else():
    ids = vllm_prefix.group_prompts(_Chars(), [3, 1, 3, 12], prefix_tokens=40, own_tokens=10)
    assert [len(p) for p in ids] == [50] * 4
    assert ids[0][:40] == ids[2][:40] and ids[0][40:] != ids[2][40:]  # same group: the prefix only
    assert ids[0][:16] != ids[1][:16] and ids[1][:16] != ids[3][:16]  # groups differ within a 16-token block


def test_replay_reads_each_requests_cached_tokens(monkeypatch):
    counters = iter([0, 0, 512, 896, 896])  # hits before the first request and after each of four
    scrape = lambda url, prefix: {"vllm:prefix_cache_hits_total": float(next(counters)),  # noqa: E731
                                  "vllm:prefix_cache_queries_total": 0.0}
    sent = []

    class Client:
        def __init__(self, **_):
            pass

        def __enter__(self):
            return self

        def __exit__(self, *_):
            return False

        def post(self, url, json):
            sent.append(json["prompt"])
            return type("R", (), {"raise_for_status": lambda self: self})()

    monkeypatch.setattr(vllm_prefix.prometheus, "scrape", scrape)
    monkeypatch.setattr(vllm_prefix.httpx, "Client", Client)
    r = vllm_prefix.replay("http://x", "m", [[1], [2], [3], [4]], prefix_tokens=512, block_size=128)
    assert sent == [[1], [2], [3], [4]] and r.hits == (0, 512, 384, 0)
    assert r.whole == 0.25 and r.some == 0.5  # 512 of 512 tokens: whole; 384: its first 3 blocks only
