"""Experiments the chapters run on real engines (chapters 01, 02, 04, 05, 06 and 06b): engines side by
side, weight format against engine, GGUF quantization levels, llama.cpp's decode against the
roofline, vLLM's prefix cache and its own serving benchmark, whether a ``vllm serve`` fits a GPU, and
the bundled model offline. Starting, stopping and reading the engines is :mod:`labkit.engines`."""
