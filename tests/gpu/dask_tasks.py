"""Tasks that the GPU Dask test runs on its workers (imported there by name).

A worker process imports this module when it unpickles a task, so the kernels
are compiled once per worker, on the worker's GPU.
"""

from __future__ import annotations

import numpy as np
from numba import cuda

import numba_streamsafe as nss
from numba_streamsafe import Read, Write, tracked_kernel

BLOCK = 256


@tracked_kernel
def slow_fill(out: Write, value, spins):
    i = cuda.grid(1)
    if i < out.size:
        if spins > 0:
            cuda.nanosleep(spins)
        out[i] = value


@tracked_kernel
def add(src: Read, dst: Write, k):
    i = cuda.grid(1)
    if i < src.size:
        dst[i] = src[i] + k


def work(value: int, n: int, spins: int) -> tuple[bool, str]:
    """A slow producer and a consumer on two streams of the worker's GPU.

    Returns whether the result was right and the GPU's UUID, so the
    client can check that each worker has a GPU of its own.
    """
    grid = (n + BLOCK - 1) // BLOCK
    a, b = cuda.stream(), cuda.stream()
    x = nss.device_array(n, np.int64, stream=a)
    y = nss.device_array(n, np.int64, stream=b)
    slow_fill[grid, BLOCK, a](x, value, spins)
    add[grid, BLOCK, b](x, y, 1)  # must wait for the slow fill on stream a
    out = nss.copy_to_host(y, stream=b)
    b.synchronize()
    uuid = getattr(cuda.get_current_device(), "uuid", "simulated")  # the simulator has none
    return bool((out == value + 1).all()), str(uuid)


def work_over_rmm(value: int, n: int, spins: int) -> tuple[bool, int, str]:
    """:func:`work`, while an array of the library's is alive: whether the
    result was right, the bytes the worker's RMM resource has handed out at
    that point (dask-cuda's ``rmm_track_allocations`` adaptor counts them)
    and the name of the resource the worker's layer takes its memory from."""
    import rmm.mr

    held = nss.device_array(n, np.int64)
    right, _ = work(value, n, spins)
    allocated = rmm.mr.get_current_device_resource().get_allocated_bytes()
    upstream = nss.memory_stats()["upstream"]
    del held
    return right, allocated, upstream
