"""Kernels of the sorts: a bucketed sort and a bitonic sort, as tracked kernels.

Each array argument is annotated ``Read``, ``Write`` or ``ReadWrite``: that is all
a launch on any stream needs to be ordered after the work it depends on.
``ptx_signature`` is what ``tests/numba/test_examples_ptx.py`` compiles each kernel with.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import target  # picks the GPU, or the simulator without one, before numba.cuda loads
from numba import cuda
from target import launch_shape

from numba_streamsafe import Read, ReadWrite, Write, tracked_kernel

#: Keys are below 2**KEY_BITS.
KEY_BITS = 32
#: Pad value of sort buckets: above every key.
PAD = np.int64(1) << 62


@tracked_kernel
def fill(out: Write, value):
    i = cuda.grid(1)
    step = cuda.gridsize(1)
    while i < out.size:
        out[i] = value
        i += step


fill.ptx_signature = "void(int64[:], int64)"


@tracked_kernel
def histogram(keys: Read, counts: ReadWrite, shift):
    i = cuda.grid(1)
    step = cuda.gridsize(1)
    while i < keys.size:
        cuda.atomic.add(counts, keys[i] >> shift, 1)
        i += step


histogram.ptx_signature = "void(int64[:], int64[:], int64)"


@tracked_kernel
def gather_bucket(keys: Read, out: ReadWrite, cursor: ReadWrite, bucket, shift):
    """Append every key of ``bucket`` to ``out`` (order unspecified)."""
    i = cuda.grid(1)
    step = cuda.gridsize(1)
    while i < keys.size:
        k = keys[i]
        if (k >> shift) == bucket:
            out[cuda.atomic.add(cursor, 0, 1)] = k
        i += step


gather_bucket.ptx_signature = "void(int64[:], int64[:], int64[:], int64, int64)"


@tracked_kernel
def bitonic_step(a: ReadWrite, j, k):
    """One compare-exchange pass of a bitonic sort over a power-of-two array."""
    i = cuda.grid(1)
    step = cuda.gridsize(1)
    while i < a.size:
        ixj = i ^ j
        if ixj > i:
            x = a[i]
            y = a[ixj]
            if ((i & k) == 0 and x > y) or ((i & k) != 0 and x < y):
                a[i] = y
                a[ixj] = x
        i += step


bitonic_step.ptx_signature = "void(int64[:], int64, int64)"


@tracked_kernel
def bitonic_step2(a: ReadWrite, j, k):
    """The compare-exchange passes of strides ``j`` and ``j // 2`` in one pass over ``a``.

    Each thread owns the four elements ``i, i + j/2, i + j, i + j + j/2`` (bits
    ``j`` and ``j/2`` of ``i`` clear): both strides exchange only within that
    group, so the two passes cost one read and one write of ``a``.
    """
    h = j // 2
    lh = 0
    while (1 << lh) < h:
        lh += 1
    t = cuda.grid(1)
    step = cuda.gridsize(1)
    while t < a.size // 4:
        i = ((t >> lh) << (lh + 2)) | (t & (h - 1))
        up = (i & k) == 0
        e0 = a[i]
        e1 = a[i + h]
        e2 = a[i + j]
        e3 = a[i + j + h]
        if (e0 > e2) == up:
            e0, e2 = e2, e0
        if (e1 > e3) == up:
            e1, e3 = e3, e1
        if (e0 > e1) == up:
            e0, e1 = e1, e0
        if (e2 > e3) == up:
            e2, e3 = e3, e2
        a[i] = e0
        a[i + h] = e1
        a[i + j] = e2
        a[i + j + h] = e3
        t += step


bitonic_step2.ptx_signature = "void(int64[:], int64, int64)"


#: Elements a block sorts in shared memory; the local passes need arrays of at least this size.
TILE = 2048


@tracked_kernel
def bitonic_local(a: ReadWrite, k_lo, k_hi):
    """Every pass with a stride below TILE, for k from ``k_lo`` to ``k_hi``, in shared memory.

    One block owns one TILE of ``a``; the directions follow the global index,
    so the result is the same as that of the global passes it replaces.
    """
    tile = cuda.shared.array(2048, dtype=np.int64)
    t = cuda.threadIdx.x
    base = cuda.blockIdx.x * 2048
    tile[t] = a[base + t]
    tile[t + 1024] = a[base + t + 1024]
    cuda.syncthreads()
    k = k_lo
    while k <= k_hi:
        j = k // 2
        if j > 1024:
            j = 1024
        while j > 0:
            i = ((t & ~(j - 1)) << 1) | (t & (j - 1))  # j is a power of two: no division
            x = tile[i]
            y = tile[i + j]
            if ((base + i) & k) == 0:
                if x > y:
                    tile[i] = y
                    tile[i + j] = x
            elif x < y:
                tile[i] = y
                tile[i + j] = x
            cuda.syncthreads()
            j //= 2
        k *= 2
    a[base + t] = tile[t]
    a[base + t + 1024] = tile[t + 1024]


bitonic_local.ptx_signature = "void(int64[:], int64, int64)"


@tracked_kernel
def copy_into(src: Read, dst: Write):
    i = cuda.grid(1)
    step = cuda.gridsize(1)
    while i < src.size:
        dst[i] = src[i]
        i += step


copy_into.ptx_signature = "void(int64[:], int64[:])"


@tracked_kernel
def merge_runs(a: Read, b: Read, out: Write):
    """Merge the sorted runs ``a`` and ``b`` into ``out`` (``a.size + b.size`` long).

    An element's place is its index in its own run plus the number of
    elements of the other run before it (binary search; ``a`` first on ties).
    Neighbouring threads search for neighbouring keys, so a warp's searches
    share their cache lines.
    """
    i = cuda.grid(1)
    step = cuda.gridsize(1)
    na = a.size
    while i < out.size:
        if i < na:  # x's place: i + how many of b are below x
            x = a[i]
            lo = 0
            hi = b.size
            while lo < hi:
                mid = (lo + hi) // 2
                if b[mid] < x:
                    lo = mid + 1
                else:
                    hi = mid
            out[i + lo] = x
        else:  # x's place: its index in b + how many of a are at most x
            x = b[i - na]
            lo = 0
            hi = na
            while lo < hi:
                mid = (lo + hi) // 2
                if a[mid] <= x:
                    lo = mid + 1
                else:
                    hi = mid
            out[i - na + lo] = x
        i += step


merge_runs.ptx_signature = "void(int64[:], int64[:], int64[:])"


def next_pow2(n: int) -> int:
    """The smallest power of two that is at least ``n`` (1 for ``n`` up to 1)."""
    return 1 << max(0, int(n - 1).bit_length())


def bitonic_sort(a: Any, stream: Any, strides_per_pass: int = 2) -> None:
    """Sort a power-of-two device array in place on ``stream``.

    Strides below TILE run in shared memory (one launch per merge size
    instead of one per stride) when the array holds at least one tile. The
    strides above it run two per pass over global memory
    (:func:`bitonic_step2`: half the passes and launches), or, with
    ``strides_per_pass=1``, one per pass (:func:`bitonic_step`).
    """
    if strides_per_pass not in (1, 2):
        raise ValueError(f"strides_per_pass must be 1 or 2, got {strides_per_pass!r}")
    n = a.size
    grid, block = launch_shape(n // 2)
    grid4, block4 = launch_shape(n // 4)
    local = n >= TILE and not target.SIMULATOR
    if local:
        bitonic_local[n // TILE, TILE // 2, stream](a, 2, TILE)
    k = 2 * TILE if local else 2
    lowest = TILE if local else 1
    while k <= n:
        j = k // 2
        while strides_per_pass == 2 and j >= 2 * lowest:
            bitonic_step2[grid4, block4, stream](a, j, k)
            j //= 4
        while j >= lowest:
            bitonic_step[grid, block, stream](a, j, k)
            j //= 2
        if local:
            bitonic_local[n // TILE, TILE // 2, stream](a, k, k)
        k *= 2
