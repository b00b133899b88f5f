"""Where a kernel's accesses come from: inference from its Numba IR, what the inference
knows of the calls a kernel makes, and declared accesses checked against both.
"""
