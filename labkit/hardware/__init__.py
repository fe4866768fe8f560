"""The machine: device detection, the compute-dtype decision, bandwidth and matmul microbenchmarks,
datasheet catalog (and matching a GPU's name to it), the roofline model (chapters 00 and 04). The CUDA
check that uses them is ``labkit.gpucheck``, on top of every layer."""
