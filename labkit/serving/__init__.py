"""Serving and measuring it: streaming clients, request metrics (TTFT, TPOT, ITL), plots, the load
generator, a loopback test server, vLLM's lifecycle and engines side by side (chapters 02 and 05);
batching measured and simulated, fleets, cold starts, monitoring, cost and deploy files (chapter 08)."""
