"""Kernels the simulator tests of transparent and check mode share: plain
``cuda.jit`` ones and their tracked twins."""

from __future__ import annotations

from numba import cuda

from numba_streamsafe import Read, Write, tracked_kernel

__all__ = ["fill", "copy", "tracked_fill", "tracked_copy"]


@cuda.jit
def fill(out, value):
    i = cuda.grid(1)
    if i < out.size:
        out[i] = value


@cuda.jit
def copy(src, dst):
    i = cuda.grid(1)
    if i < src.size:
        dst[i] = src[i]


@tracked_kernel
def tracked_fill(out: Write, value):
    i = cuda.grid(1)
    if i < out.size:
        out[i] = value


@tracked_kernel
def tracked_copy(src: Read, dst: Write):
    i = cuda.grid(1)
    if i < src.size:
        dst[i] = src[i]
