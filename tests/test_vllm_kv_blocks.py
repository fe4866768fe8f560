"""labkit.experiments.vllm_kv_blocks (chapter 06b): vLLM's KV meter read beside the paged arithmetic."""

import pytest

from labkit.experiments.vllm_kv_blocks import KVMeter, cache_config

# the shape of vLLM 0.32's CPU build (labels abridged, the engine's own order)
METRICS = """# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig
# TYPE vllm:cache_config_info gauge
vllm:cache_config_info{block_size="128",cache_dtype="auto",enable_prefix_caching="False",engine="0",\
kv_cache_max_concurrency="22.75",num_gpu_blocks="364"} 1.0
"""


def test_cache_config_reads_the_labels():
    assert cache_config(METRICS) == (128, 364, 22.75)
    with pytest.raises(RuntimeError, match="block_size"):
        cache_config("# TYPE vllm:kv_cache_usage_perc gauge\nvllm:kv_cache_usage_perc 0.1\n")


def test_used_blocks_come_from_readings_with_every_request_running():
    m = KVMeter((35, 200, 130), 32, 128, 364, 22.75, ((0, 0.0), (2, 3 / 364), (3, 5 / 364), (1, 2 / 364)))
    assert m.used_blocks == 5 and m.expected == (5, 5)  # 36, 201, 131 tokens: 1 + 2 + 2; at the last too
    assert KVMeter((35,), 32, 128, 364, None, ((0, 0.0),)).used_blocks is None
