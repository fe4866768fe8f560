"""How an LLM works and what it costs: architecture and parameter counts, a from-scratch forward
pass, attention, KV cache, sampling, MoE, memory estimates, weight formats, fusion (chapters 01,
03 and 05)."""
