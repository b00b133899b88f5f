"""A user's program written against plain Numba: Numba's own allocation calls
(``cuda.device_array``, ``cuda.to_device``, ``cuda.device_array_like``), two
streams, and ``@tracked_kernel`` kernels. Nothing else of numba_streamsafe.

Run with ``NUMBA_CUDA_MEMORY_MANAGER=numba_streamsafe`` (the plugin): on a GPU
and, unchanged, on Numba's CUDA simulator, where the library's simulated
driver checks every access. ``run(tracking)`` does one round and returns
whether the result was wrong.

The race: a slow producer fills ``x`` on stream ``a``; a consumer on stream
``b`` copies ``x`` into ``y``; a second producer on ``a`` overwrites ``x``
(it must wait for the consumer's read). Untracked, ``b`` reads ``x`` before
(or while) ``a`` writes it.
"""

from __future__ import annotations

import numpy as np
from numba import config, cuda

from numba_streamsafe import Read, Write, tracked_kernel, tracking

SIMULATOR = bool(config.ENABLE_CUDASIM)
N = 256 if SIMULATOR else 1 << 16
BLOCK = 64 if SIMULATOR else 256


@tracked_kernel
def slow_fill(out: Write, value, spins):
    i = cuda.grid(1)
    if i < out.size:
        for _ in range(spins):  # one nanosleep lasts at most about 1 ms
            cuda.nanosleep(1000)
        out[i] = value


@tracked_kernel
def copy(src: Read, dst: Write):
    i = cuda.grid(1)
    if i < src.size:
        dst[i] = src[i]


@tracked_kernel
def add(src: Read, k: Read, dst: Write):
    i = cuda.grid(1)
    if i < src.size:
        dst[i] = src[i] + k[i]


def run(tracked: bool, value: int = 7, spins: int = 0) -> bool:
    """One round; True when the result is wrong. The producer sleeps ``spins``
    microseconds before it writes."""
    grid = (N + BLOCK - 1) // BLOCK
    a, b = cuda.stream(), cuda.stream()
    ones = np.ones(N, dtype=np.int64)
    with tracking(tracked):
        x = cuda.device_array(N, dtype=np.int64, stream=a)
        k = cuda.to_device(ones, stream=a)
        y = cuda.device_array_like(ones, stream=b)
        z = cuda.device_array_like(ones, stream=b)
        slow_fill[grid, BLOCK, a](x, value, spins)
        copy[grid, BLOCK, b](x, y)             # waits for the fill on a
        add[grid, BLOCK, b](y, k, z)           # reads k, uploaded on a
        slow_fill[grid, BLOCK, a](x, -1, 0)    # waits for the copy on b
        out = z.copy_to_host(stream=b)
        b.synchronize()
        a.synchronize()
    return bool((out != value + 1).any())


if __name__ == "__main__":
    print("wrong" if run(True) else "right")
