"""Engines: what starts and stops real inference servers and reads their admin surfaces (chapters 02,
05 and 06): vLLM's lifecycle, the scripted loopback server, the measured-server chooser, one
Prometheus ``/metrics`` parser, vLLM's prefix-cache hit rates and the engines side by side."""
