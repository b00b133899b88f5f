"""Tracked kernels annotated under ``from __future__ import annotations``.

Every annotation here is a string. Imported by ``test_kernel.py``; the future
import is per module, hence this file.
"""

from __future__ import annotations

from numba import cuda

import numba_streamsafe as nss
from numba_streamsafe import Read, ReadWrite, Write, tracked_kernel


@tracked_kernel
def by_name(src: Read, dst: Write, acc: ReadWrite, n: int):
    i = cuda.grid(1)
    step = cuda.gridsize(1)
    while i < n:
        dst[i] = src[i]
        acc[i] += src[i]
        i += step


@tracked_kernel
def by_attribute(src: nss.Read, dst: nss.Write, k):
    i = cuda.grid(1)
    step = cuda.gridsize(1)
    while i < dst.size:
        dst[i] = src[i] * k
        i += step


# ``Missing`` names nothing, so typing.get_type_hints fails for the whole
# function: the tracker must still read each annotation's own text.
@tracked_kernel
def unresolvable(src: Read, dst: Write, k: Missing):  # noqa: F821
    i = cuda.grid(1)
    step = cuda.gridsize(1)
    while i < dst.size:
        dst[i] = src[i] + k
        i += step


# Quoted names: under the future import they arrive as "'r'", "'write'"...
@tracked_kernel
def quoted(src: "r", dst: "write", acc: "rw", other: "sideways", n):  # noqa: F821, UP037
    i = cuda.grid(1)
    step = cuda.gridsize(1)
    while i < n:
        dst[i] = src[i]
        acc[i] += 1
        i += step
