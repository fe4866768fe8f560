"""Engines: what starts and stops real inference servers and reads their admin surfaces (chapters 02,
05, 06 and 08): one record per engine and the measured-server chooser (:mod:`.server`), each process's
lifecycle, vLLM's and llama.cpp's own tools, the scripted loopback server and one Prometheus
``/metrics`` parser. The chapters' experiments on these engines are in :mod:`labkit.experiments`."""
