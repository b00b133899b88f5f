"""Tracked kernels for the GPU race suite.

The slow kernels sleep before they touch memory (``cuda.nanosleep``, about
``spins`` microseconds), so that an unordered kernel on another stream has a
wide window to run in between: with tracking off the race shows almost every
time; with tracking on it must never show.

Every kernel is a grid-stride loop over its array, and carries
``ptx_signature`` so that ``tests/numba/test_ptx.py`` can compile it on a
machine with no GPU. Import this module only after deciding the target
(it imports ``numba.cuda``).
"""

from numba import cuda

from numba_streamsafe import Read, Write, tracked_kernel

#: Nanoseconds per sleep; the hardware sleeps roughly this long (at most 1 ms).
SLEEP_NS = 1000


@tracked_kernel
def slow_fill(out: Write, value, spins):
    """Sleep ``spins`` times ``SLEEP_NS``, then set every element to ``value``."""
    for _ in range(spins):
        cuda.nanosleep(SLEEP_NS)
    i = cuda.grid(1)
    step = cuda.gridsize(1)
    while i < out.size:
        out[i] = value
        i += step


slow_fill.ptx_signature = "void(int32[:], int32, int64)"


@tracked_kernel
def slow_copy(src: Read, dst: Write, spins):
    """Sleep first, then copy: reads ``src`` late, so a writer on another
    stream gets there first unless it is ordered after this kernel."""
    for _ in range(spins):
        cuda.nanosleep(SLEEP_NS)
    i = cuda.grid(1)
    step = cuda.gridsize(1)
    while i < src.size:
        dst[i] = src[i]
        i += step


slow_copy.ptx_signature = "void(int32[:], int32[:], int64)"


@tracked_kernel
def copy(src: Read, dst: Write):
    i = cuda.grid(1)
    step = cuda.gridsize(1)
    while i < src.size:
        dst[i] = src[i]
        i += step


copy.ptx_signature = "void(int32[:], int32[:])"


@tracked_kernel
def fill(out: Write, value):
    i = cuda.grid(1)
    step = cuda.gridsize(1)
    while i < out.size:
        out[i] = value
        i += step


fill.ptx_signature = "void(int32[:], int32)"


@tracked_kernel
def unannotated(a, value):
    i = cuda.grid(1)
    if i < a.size:
        a[i] = value


unannotated.ptx_signature = "void(int32[:], int32)"


@tracked_kernel(access={"pair": "r", "out": "w"})
def pair_sum(pair, out):
    """``out = pair[0] + pair[1]``: the arrays of a tuple read (its access)."""
    i = cuda.grid(1)
    step = cuda.gridsize(1)
    while i < out.size:
        out[i] = pair[0][i] + pair[1][i]
        i += step


pair_sum.ptx_signature = "void(UniTuple(int32[:], 2), int32[:])"


@tracked_kernel(access={"nest": "r", "out": "w"})
def nested_sum(nest, out):
    """``out = nest[0][0] + nest[1]``: the arrays of a nested tuple read."""
    i = cuda.grid(1)
    step = cuda.gridsize(1)
    while i < out.size:
        out[i] = nest[0][0][i] + nest[1][i]
        i += step


nested_sum.ptx_signature = "void(Tuple((UniTuple(int32[:], 1), int32[:])), int32[:])"


@tracked_kernel(access={"pair": "w"})
def slow_pair_fill(pair, value, spins):
    """Sleep first, then set both arrays of ``pair`` to ``value``."""
    for _ in range(spins):
        cuda.nanosleep(SLEEP_NS)
    i = cuda.grid(1)
    step = cuda.gridsize(1)
    while i < pair[0].size:
        pair[0][i] = value
        pair[1][i] = value
        i += step


slow_pair_fill.ptx_signature = "void(UniTuple(int32[:], 2), int32, int64)"
