"""How an LLM works and what it costs: architecture and parameter counts, a from-scratch forward
pass, attention, KV cache, sampling, MoE, memory estimates, weight formats, fusion (chapters 01,
03 and 05), the timed greedy decode (chapter 04), and chapter 06's optimizations: quantization
(RTN, GPTQ, INT8 KV) and its measurements, perplexity, speculative decoding, prefix caching and
parallelism sizing."""
