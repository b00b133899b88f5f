"""Races written in plain Numba, run by ``test_transparent_gpu.py`` in a child
interpreter with ``NUMBA_CUDA_MEMORY_MANAGER=numba_streamsafe`` (the plugin
must be selected before Numba makes its context).

Each case provokes one hazard ``TRIALS`` times with transparent mode on and,
interleaved, with it off (``numba_streamsafe.transparent(False)``: Numba's
own launch and copy paths, unordered). A slow plain kernel sleeps before it
touches memory, so an unordered operation on the other stream gets there
first. Prints one line per case: ``CASE name on_wrong off_wrong trials``.
"""

from __future__ import annotations

import collections
import gc
import os
import sys
import time

import numpy as np
from numba import cuda, guvectorize, int32, vectorize

import numba_streamsafe as nss
from numba_streamsafe import Read, Write, tracked_kernel

TRIALS = int(os.environ.get("NSS_RACE_TRIALS", "100"))
N = 1 << 16
GRID, BLOCK = 256, 256
SLEEP_NS = 1000


@cuda.jit
def slow_fill(out, value, spins):
    for _ in range(spins):
        cuda.nanosleep(SLEEP_NS)
    i = cuda.grid(1)
    while i < out.size:
        out[i] = value
        i += cuda.gridsize(1)


@cuda.jit
def slow_copy(src, dst, spins):
    for _ in range(spins):
        cuda.nanosleep(SLEEP_NS)
    i = cuda.grid(1)
    while i < src.size:
        dst[i] = src[i]
        i += cuda.gridsize(1)


@cuda.jit
def copy(src, dst):
    i = cuda.grid(1)
    while i < src.size:
        dst[i] = src[i]
        i += cuda.gridsize(1)


@cuda.jit
def fill(out, value):
    i = cuda.grid(1)
    while i < out.size:
        out[i] = value
        i += cuda.gridsize(1)


@tracked_kernel
def tracked_slow_fill(out: Write, value, spins):
    for _ in range(spins):
        cuda.nanosleep(SLEEP_NS)
    i = cuda.grid(1)
    while i < out.size:
        out[i] = value
        i += cuda.gridsize(1)


@tracked_kernel
def tracked_copy(src: Read, dst: Write):
    i = cuda.grid(1)
    while i < src.size:
        dst[i] = src[i]
        i += cuda.gridsize(1)


@vectorize([int32(int32)], target="cuda")
def plus_one(v):
    return v + 1


total = cuda.reduce(lambda p, q: p + q)


@guvectorize(["void(int32[:], int32[:])"], "(n)->(n)", target="cuda")
def row_copy(src, dst):
    for i in range(src.shape[0]):
        dst[i] = src[i]


@cuda.jit("void(int32[:], int32, int64)")
def eager_slow_fill(out, value, spins):
    for _ in range(spins):
        cuda.nanosleep(SLEEP_NS)
    i = cuda.grid(1)
    while i < out.size:
        out[i] = value
        i += cuda.gridsize(1)


@cuda.jit
def pair_sum(pair, out):
    i = cuda.grid(1)
    while i < out.size:
        out[i] = pair[0][i] + pair[1][i]
        i += cuda.gridsize(1)


@cuda.jit
def nested_sum(nest, out):
    i = cuda.grid(1)
    while i < out.size:
        out[i] = nest[0][0][i] + nest[1][i]
        i += cuda.gridsize(1)


@cuda.jit
def slow_pair_fill(pair, value, spins):
    for _ in range(spins):
        cuda.nanosleep(SLEEP_NS)
    i = cuda.grid(1)
    while i < pair[0].size:
        pair[0][i] = value
        pair[1][i] = value
        i += cuda.gridsize(1)


Pair = collections.namedtuple("Pair", "left right")
Q = N // 4  # views below are quarters of an array


@cuda.jit(device=True)
def put(arr, i, value):
    arr[i] = value


@cuda.jit
def copy_via_device_function(src, dst):
    i = cuda.grid(1)
    while i < src.size:
        put(dst, i, src[i])
        i += cuda.gridsize(1)


class Cases:
    """The streams and the calibrated sleep; one method per hazard, each
    returning True when the result is wrong."""

    def __init__(self) -> None:
        self.a, self.b = cuda.stream(), cuda.stream()
        self.spins = 1000

    def fresh(self, value: int = 0) -> object:
        """A new array on the plugin's memory, filled with ``value`` and idle."""
        x = cuda.device_array(N, dtype=np.int32)
        fill[GRID, BLOCK, 0](x, value)
        cuda.synchronize()
        return x

    def done(self) -> None:
        self.a.synchronize()
        self.b.synchronize()

    # --- the cases of the transparent-mode issue's table
    def tracked_write_numba_copy_to_host(self, v: int) -> bool:
        x = self.fresh()
        tracked_slow_fill[GRID, BLOCK, self.a](x, v, self.spins)
        h = x.copy_to_host(stream=self.b)
        self.done()
        return bool((h != v).any())

    def plain_read_free_reuse(self, v: int) -> bool:
        with nss.stream_scope(self.a):
            x = cuda.device_array(N, dtype=np.int32)
        fill[GRID, BLOCK, self.a](x, v)
        self.a.synchronize()
        y = self.fresh()
        slow_copy[GRID, BLOCK, self.b](x, y, self.spins)
        del x
        with nss.stream_scope(self.a):
            z = cuda.device_array(N, dtype=np.int32)  # the same address, reused on a
        fill[GRID, BLOCK, self.a](z, -1)
        h = y.copy_to_host(stream=self.b)
        self.done()
        return bool((h != v).any())

    def plain_write_plain_read(self, v: int) -> bool:
        x, y = self.fresh(), self.fresh()
        slow_fill[GRID, BLOCK, self.a](x, v, self.spins)
        copy[GRID, BLOCK, self.b](x, y)
        h = y.copy_to_host(stream=self.b)
        self.done()
        return bool((h != v).any())

    # --- the other launches
    def forall_write_plain_read(self, v: int) -> bool:
        x, y = self.fresh(), self.fresh()
        slow_fill.forall(N, 256, self.a)(x, v, self.spins)
        copy[GRID, BLOCK, self.b](x, y)
        h = y.copy_to_host(stream=self.b)
        self.done()
        return bool((h != v).any())

    def ufunc_read(self, v: int) -> bool:
        x, y = self.fresh(), self.fresh()
        slow_fill[GRID, BLOCK, self.a](x, v, self.spins)
        plus_one(x, out=y, stream=self.b)
        h = y.copy_to_host(stream=self.b)
        self.done()
        return bool((h != v + 1).any())

    def reduce_read(self, v: int) -> bool:
        x = self.fresh()
        slow_fill[GRID, BLOCK, self.a](x, v, self.spins)
        got = total(x, stream=self.b)
        self.done()
        return int(got) != v * N

    def gufunc_read(self, v: int) -> bool:
        x, y = self.fresh(), self.fresh()
        slow_fill[GRID, BLOCK, self.a](x, v, self.spins)
        row_copy(x.reshape(256, N // 256), y.reshape(256, N // 256), stream=self.b)
        h = y.copy_to_host(stream=self.b)
        self.done()
        return bool((h != v).any())

    def eager_kernel_device_function(self, v: int) -> bool:
        x, y = self.fresh(), self.fresh()
        eager_slow_fill[GRID, BLOCK, self.a](x, v, self.spins)
        copy_via_device_function[GRID, BLOCK, self.b](x, y)
        h = y.copy_to_host(stream=self.b)
        self.done()
        return bool((h != v).any())

    # --- Numba's copies and fills
    def device_copy(self, v: int) -> bool:
        x, y = self.fresh(), self.fresh()
        slow_fill[GRID, BLOCK, self.a](x, v, self.spins)
        y.copy_to_device(x, stream=self.b)
        h = y.copy_to_host(stream=self.b)
        self.done()
        return bool((h != v).any())

    def upload_over_slow_read(self, v: int) -> bool:
        x, y = self.fresh(v), self.fresh()
        slow_copy[GRID, BLOCK, self.a](x, y, self.spins)
        cuda.to_device(np.full(N, -1, np.int32), stream=self.b, to=x)
        h = y.copy_to_host(stream=self.a)
        self.done()
        return bool((h != v).any())

    def setitem_after_write(self, v: int) -> bool:
        x = self.fresh()
        slow_fill[GRID, BLOCK, self.a](x, -1, self.spins)
        x.setitem(slice(None), v, stream=self.b)
        self.done()
        return bool((x.copy_to_host() != v).any())

    def memset_after_write(self, v: int) -> bool:
        from numba.cuda.cudadrv import driver

        x = self.fresh()
        slow_fill[GRID, BLOCK, self.a](x, v, self.spins)
        driver.device_memset(x, 0, x.nbytes, stream=self.b)
        self.done()
        return bool((x.copy_to_host() != 0).any())

    def pinned_copy_to_host(self, v: int) -> bool:
        x = self.fresh()
        out = cuda.pinned_array(N, dtype=np.int32)
        slow_fill[GRID, BLOCK, self.a](x, v, self.spins)
        x.copy_to_host(out, stream=self.b)
        self.done()
        return bool((out != v).any())


    # --- views of one array (ranges): only the bytes two views share are ordered
    def view_overlap_read_after_write(self, v: int) -> bool:
        x, y = self.fresh(), self.fresh()
        slow_fill[GRID, BLOCK, self.a](x[:3 * Q], v, self.spins)
        copy[GRID, BLOCK, self.b](x[2 * Q:], y[:2 * Q])      # x[2Q:3Q] is shared
        h = y[:Q].copy_to_host(stream=self.b)
        self.done()
        return bool((h != v).any())

    def view_overlap_write_after_read(self, v: int) -> bool:
        x, y = self.fresh(v), self.fresh()
        slow_copy[GRID, BLOCK, self.a](x[:3 * Q], y[:3 * Q], self.spins)
        fill[GRID, BLOCK, self.b](x[2 * Q:], -1)            # must wait for that read
        h = y[:3 * Q].copy_to_host(stream=self.a)
        self.done()
        return bool((h != v).any())

    def view_overlap_write_after_write(self, v: int) -> bool:
        x = self.fresh()
        slow_fill[GRID, BLOCK, self.a](x[:3 * Q], v, self.spins)
        fill[GRID, BLOCK, self.b](x[2 * Q:], v + 1)         # the later write must win
        self.done()
        h = x[2 * Q:3 * Q].copy_to_host(stream=self.b)      # both writes are done
        self.b.synchronize()
        return bool((h != v + 1).any())

    def view_adjacent_one_element(self, v: int) -> bool:
        x, y = self.fresh(), self.fresh()
        slow_fill[GRID, BLOCK, self.a](x[:2 * Q + 1], v, self.spins)
        copy[GRID, BLOCK, self.b](x[2 * Q:], y[:2 * Q])      # shares x[2Q] alone
        h = y[:1].copy_to_host(stream=self.b)
        self.done()
        return bool(h[0] != v)

    def view_strided_against_contiguous(self, v: int) -> bool:
        x, y = self.fresh(), self.fresh()
        slow_fill[GRID, BLOCK, self.a](x[::2], v, self.spins)  # the even elements
        copy[GRID, BLOCK, self.b](x[2 * Q:2 * Q + 2], y[:2])  # x[2Q] is even
        h = y[:1].copy_to_host(stream=self.b)
        self.done()
        return bool(h[0] != v)

    def view_read_then_whole_free(self, v: int) -> bool:
        with nss.stream_scope(self.a):
            x = cuda.device_array(N, dtype=np.int32)
        fill[GRID, BLOCK, self.a](x, v)
        self.a.synchronize()
        y = self.fresh()
        slow_copy[GRID, BLOCK, self.b](x[2 * Q:], y[:2 * Q], self.spins)
        del x                                             # the whole array's free
        with nss.stream_scope(self.a):
            z = cuda.device_array(N, dtype=np.int32)      # the same address, reused on a
        fill[GRID, BLOCK, self.a](z, -1)
        h = y[:2 * Q].copy_to_host(stream=self.b)
        self.done()
        return bool((h != v).any())

    # --- arrays inside tuples
    def tuple_read(self, v: int) -> bool:
        x, z, y = self.fresh(), self.fresh(1), self.fresh()
        slow_fill[GRID, BLOCK, self.a](x, v, self.spins)
        pair_sum[GRID, BLOCK, self.b]((x, z), y)
        h = y.copy_to_host(stream=self.b)
        self.done()
        return bool((h != v + 1).any())

    def tuple_write(self, v: int) -> bool:
        x, z, y = self.fresh(), self.fresh(), self.fresh()
        slow_pair_fill[GRID, BLOCK, self.a]((x, z), v, self.spins)
        copy[GRID, BLOCK, self.b](z, y)
        h = y.copy_to_host(stream=self.b)
        self.done()
        return bool((h != v).any())

    def nested_tuple_read(self, v: int) -> bool:
        x, z, y = self.fresh(), self.fresh(1), self.fresh()
        slow_fill[GRID, BLOCK, self.a](x, v, self.spins)
        nested_sum[GRID, BLOCK, self.b](((x,), z), y)
        h = y.copy_to_host(stream=self.b)
        self.done()
        return bool((h != v + 1).any())

    def namedtuple_read(self, v: int) -> bool:
        x, z, y = self.fresh(), self.fresh(1), self.fresh()
        slow_fill[GRID, BLOCK, self.a](x, v, self.spins)
        pair_sum[GRID, BLOCK, self.b](Pair(x, z), y)
        h = y.copy_to_host(stream=self.b)
        self.done()
        return bool((h != v + 1).any())


RANGE_NAMES = ["view_overlap_read_after_write", "view_overlap_write_after_read",
               "view_overlap_write_after_write", "view_adjacent_one_element",
               "view_strided_against_contiguous", "view_read_then_whole_free",
               "tuple_read", "tuple_write", "nested_tuple_read", "namedtuple_read"]

NAMES = ["tracked_write_numba_copy_to_host", "plain_read_free_reuse", "plain_write_plain_read",
         "forall_write_plain_read", "ufunc_read", "reduce_read", "gufunc_read",
         "eager_kernel_device_function", "device_copy",
         "upload_over_slow_read", "setitem_after_write", "memset_after_write",
         "pinned_copy_to_host", *RANGE_NAMES]


def calibrate(cases: Cases) -> float:
    """Lengthen the sleep until a slow kernel lasts at least 1 ms."""
    x = cuda.device_array(N, dtype=np.int32)
    while True:
        start, end = cuda.event(), cuda.event()
        start.record(cases.a)
        slow_fill[GRID, BLOCK, cases.a](x, 1, cases.spins)
        end.record(cases.a)
        end.synchronize()
        ms = cuda.event_elapsed_time(start, end)
        if ms >= 1.0 or cases.spins >= 64_000:
            return ms
        cases.spins *= 2


def main(names: list[str]) -> None:
    cases = Cases()
    working = []
    for name in names:  # compile everything once, ordered
        try:
            getattr(cases, name)(1)
            working.append(name)
        except Exception as exc:  # reported as this case's failure; the others still run
            print(f"ERROR {name} {type(exc).__name__}: {exc}", flush=True)
    names = working
    ms = calibrate(cases)
    print(f"SPINS {cases.spins} slow_ms={ms:.2f}", flush=True)
    for name in names:
        case = getattr(cases, name)
        started = time.perf_counter()
        wrong = {True: 0, False: 0}
        for i in range(TRIALS):
            for on in (True, False):
                with nss.transparent(on):
                    wrong[on] += case(i % 50 + 2)
                gc.collect()
        cuda.synchronize()
        print(f"CASE {name} {wrong[True]} {wrong[False]} {TRIALS}", flush=True)
        print(f"TIME {name} {time.perf_counter() - started:.1f} s", flush=True)
    print("OUTSTANDING", nss.get_runtime(0).bytes_outstanding(), flush=True)


if __name__ == "__main__":
    main(sys.argv[1:] or NAMES)
