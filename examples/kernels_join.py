"""Kernels of the hash join: an open-addressing table built and probed on the GPU.

:func:`build_table` clears a table and inserts keys into it on one stream.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import target  # noqa: F401  (picks the GPU, or the simulator without one, before numba.cuda)
from kernels_sort import fill, next_pow2
from numba import cuda
from target import launch_shape

import numba_streamsafe as nss
from numba_streamsafe import Read, ReadWrite, Write, tracked_kernel

#: The key cell of a free slot.
EMPTY = np.int64(-1)
#: Longest probe sequence of the hash table (see hash_build).
MAX_PROBES = 1024
#: The type of a join's row numbers (a probe's answer): 32-bit, as cuDF's
#: gather maps, which halves the result traffic of int64. Relations here have
#: fewer than 2**31 rows (checked by :func:`data.make_relations`).
ROW = np.int32


@tracked_kernel
def hash_build(keys: Read, table: ReadWrite, mask):
    """Insert ``keys[i] -> i`` into an open-addressing table (linear probing).

    Slot ``h`` of ``table`` is the pair ``table[2h]`` (key, EMPTY when free)
    and ``table[2h + 1]`` (payload): one 16-byte cell, so the payload written
    after the key's compare-and-swap lands in the sector the swap just
    fetched, and a probe reads both in one. Probing stops after MAX_PROBES
    slots (at half load a run that long does not occur), so a table that is
    not what the build expects (read before it was cleared: the race) gives
    wrong results, quickly, instead of a kernel that never ends.
    """
    i = cuda.grid(1)
    step = cuda.gridsize(1)
    while i < keys.size:
        k = keys[i]
        h = ((k ^ (k >> 16)) * 73244475) & mask
        probes = 0
        while probes < MAX_PROBES:
            old = cuda.atomic.cas(table, 2 * h, -1, k)
            if old == -1 or old == k:
                table[2 * h + 1] = i
                break
            h = (h + 1) & mask
            probes += 1
        i += step


hash_build.ptx_signature = "void(int64[:], int64[:], int64)"


@tracked_kernel
def hash_probe(keys: Read, table: Read, out: Write, mask):
    """``out[i]`` = the payload of ``keys[i]`` in the table, or -1.

    ``out`` holds row numbers (:data:`ROW`, 32-bit), as a join's gather map does.
    """
    i = cuda.grid(1)
    step = cuda.gridsize(1)
    while i < keys.size:
        k = keys[i]
        h = ((k ^ (k >> 16)) * 73244475) & mask
        result = -1
        probes = 0
        while probes < MAX_PROBES:  # bounded, whatever the table holds
            t = table[2 * h]
            if t == k:
                result = table[2 * h + 1]
                break
            if t == -1:
                break
            h = (h + 1) & mask
            probes += 1
        out[i] = result
        i += step


hash_probe.ptx_signature = "void(int64[:], int64[:], int32[:], int64)"


@tracked_kernel
def count_matches(found: Read, total: ReadWrite):
    i = cuda.grid(1)
    step = cuda.gridsize(1)
    while i < found.size:
        if found[i] >= 0:
            cuda.atomic.add(total, 0, 1)
        i += step


count_matches.ptx_signature = "void(int32[:], int64[:])"


def build_table(d_keys: Any, stream: Any) -> tuple[Any, int]:
    """A hash table of ``d_keys`` (key ``d_keys[i]`` -> payload ``i``), built on ``stream``.

    Returns the table (key and payload interleaved, see :func:`hash_build`) and
    its slot mask. The table has twice as many slots as keys, rounded up to a
    power of two; it is cleared to ``EMPTY`` first, on the same stream.
    """
    nslots = next_pow2(2 * max(d_keys.size, 1))
    table = nss.device_array(2 * nslots, np.int64, stream=stream, tag="hash table")
    g, b = launch_shape(2 * nslots)
    fill[g, b, stream](table, EMPTY)
    g, b = launch_shape(d_keys.size)
    hash_build[g, b, stream](d_keys, table, nslots - 1)
    return table, nslots - 1
