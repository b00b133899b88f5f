"""The Numba layer: memory-manager plugin, tracked kernels and tracked copies.

Works on a GPU (Numba's CUDA target over the CUDA driver) and on the CPU
(Numba's CUDA simulator over the library's simulated driver, whose hazard
checker then sees every launch and copy).
"""
