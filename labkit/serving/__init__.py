"""Serving, seen from the client (chapters 02 and 05): streaming clients for the OpenAI and Ollama
APIs and an in-process model, the request record, request metrics (TTFT, TPOT, ITL), the load
generator and its plots. Starting real servers is :mod:`labkit.engines`' job."""
