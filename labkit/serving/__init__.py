"""Serving and measuring it: streaming clients, request metrics (TTFT, TPOT, ITL), plots, the load
generator, a loopback test server, vLLM's lifecycle and engines side by side (chapters 02 and 05)."""
