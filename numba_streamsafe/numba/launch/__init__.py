"""Tracked kernels and their launches: the kernel class and its kinds, configured
launches, the direct launch (compiled where a compiler is present), its parameter packing
and plans, and the launch switches of a runtime.
"""
