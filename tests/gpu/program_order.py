"""A plain Numba program that orders itself, run by ``test_transparent_gpu.py``
in a child interpreter with ``NUMBA_CUDA_MEMORY_MANAGER=numba_streamsafe``.

A slow kernel fills ``x`` on stream ``a``; a copy on stream ``b`` reads it.
Between them the program orders the two itself (a Numba event recorded on
``a`` and waited for on ``b``, the event synchronised, ``a`` synchronised, the
device synchronised), or not at all (``none``: the library's wait orders it).
Prints one line per case: ``ORDER case right inserted skipped trials``, the
waits the library queued and skipped for the consumer's launches over the
case's trials.
"""

from __future__ import annotations

import os

import numpy as np
from numba import cuda

import numba_streamsafe as nss

TRIALS = int(os.environ.get("NSS_RACE_TRIALS", "100"))
#: Sleeps of the slow kernel (0 on Numba's simulator, which has no nanosleep).
SPINS = int(os.environ.get("NSS_ORDER_SPINS", "200"))
N = 1 << 16


@cuda.jit
def slow_fill(out, value, spins):
    for _ in range(spins):
        cuda.nanosleep(1000)
    i = cuda.grid(1)
    while i < out.size:
        out[i] = value
        i += cuda.gridsize(1)


@cuda.jit
def copy(src, dst):
    i = cuda.grid(1)
    while i < src.size:
        dst[i] = src[i]
        i += cuda.gridsize(1)


def trial(case: str, value: int, a, b) -> tuple[bool, int, int]:
    """One trial: whether the copy was right, and the waits the library queued
    and skipped for the consumer's launch."""
    x = cuda.device_array(N, dtype=np.int64)
    y = cuda.device_array(N, dtype=np.int64)
    cuda.synchronize()
    slow_fill[64, 256, a](x, value, SPINS)
    if case in ("event", "event_synchronize"):
        done = cuda.event()
        done.record(a)
        if case == "event":
            done.wait(b)
        else:
            done.synchronize()
    elif case == "stream_synchronize":
        a.synchronize()
    elif case == "device_synchronize":
        cuda.synchronize()
    before = nss.memory_stats()  # (runs the queued frees first)
    copy[64, 256, b](x, y)
    after = nss.memory_stats()
    out = y.copy_to_host(stream=b)
    b.synchronize()
    return (bool((out == value).all()), after["waits_inserted"] - before["waits_inserted"],
            after["waits_skipped"] - before["waits_skipped"])


def main() -> None:
    a, b = cuda.stream(), cuda.stream()
    for case in ("event", "event_synchronize", "stream_synchronize", "device_synchronize",
                 "none"):
        trial(case, -1, a, b)  # compiles
        right = inserted = skipped = 0
        for t in range(TRIALS):
            ok, waits, skips = trial(case, t, a, b)
            right += ok
            inserted += waits
            skipped += skips
        print("ORDER", case, right, inserted, skipped, TRIALS, flush=True)


if __name__ == "__main__":
    main()
