"""The machine: device detection, the compute-dtype decision, bandwidth and matmul microbenchmarks,
datasheet catalog, the roofline model, and the CUDA check (chapters 00 and 04)."""
