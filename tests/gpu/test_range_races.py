"""Ranges on a real GPU, through tracked kernels: views of one array and
arrays inside declared tuples.

Each case provokes its hazard ``NSS_RACE_TRIALS`` times (default 100) with
tracking on and, interleaved, with it off (the negative control, wrong in at
least 70 % of trials). A slow kernel sleeps before it touches memory, so an
unordered kernel on the other stream gets there first. The plain-Numba
versions of these cases run in ``transparent_races.py``.
"""

from __future__ import annotations

import collections
import os
import time

import numpy as np
import pytest

import numba_streamsafe as nss

pytestmark = pytest.mark.gpu

TRIALS = int(os.environ.get("NSS_RACE_TRIALS", "100"))
N = 1 << 16
Q = N // 4
GRID, BLOCK = 256, 256

Pair = collections.namedtuple("Pair", "left right")


class Cases:
    """Streams, kernels and the calibrated sleep; one method per hazard, each
    returning True when the result is wrong."""

    def __init__(self, cuda, kernels) -> None:
        self.cuda, self.k = cuda, kernels
        self.a, self.b = cuda.stream(), cuda.stream()
        self.spins = 1000
        self.slow_ms = 0.0

    def fresh(self, value: int = 0):
        x = nss.device_array(N, np.int32, stream=self.a)
        self.k.fill[GRID, BLOCK, self.a](x, value)
        self.cuda.synchronize()
        return x

    def done(self) -> None:
        self.a.synchronize()
        self.b.synchronize()

    def calibrate(self) -> float:
        x = self.fresh()
        while True:
            start, end = self.cuda.event(), self.cuda.event()
            start.record(self.a)
            self.k.slow_fill[GRID, BLOCK, self.a](x, 1, self.spins)
            end.record(self.a)
            end.synchronize()
            ms = self.cuda.event_elapsed_time(start, end)
            if ms >= 1.0 or self.spins >= 64_000:
                return ms
            self.spins *= 2

    # ------------------------------------------------------------- the views
    def view_overlap_read_after_write(self, v: int) -> bool:
        k, x, y = self.k, self.fresh(), self.fresh()
        k.slow_fill[GRID, BLOCK, self.a](x[:3 * Q], v, self.spins)
        k.copy[GRID, BLOCK, self.b](x[2 * Q:], y[:2 * Q])
        h = nss.copy_to_host(y[:Q], stream=self.b)
        self.done()
        return bool((h != v).any())

    def view_overlap_write_after_read(self, v: int) -> bool:
        k, x, y = self.k, self.fresh(v), self.fresh()
        k.slow_copy[GRID, BLOCK, self.a](x[:3 * Q], y[:3 * Q], self.spins)
        k.fill[GRID, BLOCK, self.b](x[2 * Q:], -1)
        h = nss.copy_to_host(y[:3 * Q], stream=self.a)
        self.done()
        return bool((h != v).any())

    def view_overlap_write_after_write(self, v: int) -> bool:
        k, x = self.k, self.fresh()
        k.slow_fill[GRID, BLOCK, self.a](x[:3 * Q], v, self.spins)
        k.fill[GRID, BLOCK, self.b](x[2 * Q:], v + 1)      # the later write must win
        self.done()
        h = nss.copy_to_host(x[2 * Q:3 * Q], stream=self.b)  # both writes are done
        self.b.synchronize()
        return bool((h != v + 1).any())

    def view_adjacent_one_element(self, v: int) -> bool:
        k, x, y = self.k, self.fresh(), self.fresh()
        k.slow_fill[GRID, BLOCK, self.a](x[:2 * Q + 1], v, self.spins)
        k.copy[GRID, BLOCK, self.b](x[2 * Q:], y[:2 * Q])
        h = nss.copy_to_host(y[:1], stream=self.b)
        self.done()
        return bool(h[0] != v)

    def view_strided_against_contiguous(self, v: int) -> bool:
        k, x, y = self.k, self.fresh(), self.fresh()
        k.slow_fill[GRID, BLOCK, self.a](x[::2], v, self.spins)
        k.copy[GRID, BLOCK, self.b](x[2 * Q:2 * Q + 2], y[:2])
        h = nss.copy_to_host(y[:1], stream=self.b)
        self.done()
        return bool(h[0] != v)

    def view_read_then_whole_free(self, v: int) -> bool:
        k, y = self.k, self.fresh()
        x = self.fresh(v)
        k.slow_copy[GRID, BLOCK, self.b](x[2 * Q:], y[:2 * Q], self.spins)
        del x
        z = nss.device_array(N, np.int32, stream=self.a)  # x's memory again, on a
        k.fill[GRID, BLOCK, self.a](z, -1)
        h = nss.copy_to_host(y[:2 * Q], stream=self.b)
        self.done()
        return bool((h != v).any())

    # ------------------------------------------------------------ the tuples
    def tuple_read(self, v: int) -> bool:
        x, z, y = self.fresh(), self.fresh(1), self.fresh()
        self.k.slow_fill[GRID, BLOCK, self.a](x, v, self.spins)
        self.k.pair_sum[GRID, BLOCK, self.b]((x, z), y)
        h = nss.copy_to_host(y, stream=self.b)
        self.done()
        return bool((h != v + 1).any())

    def tuple_write(self, v: int) -> bool:
        x, z, y = self.fresh(), self.fresh(), self.fresh()
        self.k.slow_pair_fill[GRID, BLOCK, self.a]((x, z), v, self.spins)
        self.k.copy[GRID, BLOCK, self.b](z, y)
        h = nss.copy_to_host(y, stream=self.b)
        self.done()
        return bool((h != v).any())

    def nested_tuple_read(self, v: int) -> bool:
        x, z, y = self.fresh(), self.fresh(1), self.fresh()
        self.k.slow_fill[GRID, BLOCK, self.a](x, v, self.spins)
        self.k.nested_sum[GRID, BLOCK, self.b](((x,), z), y)
        h = nss.copy_to_host(y, stream=self.b)
        self.done()
        return bool((h != v + 1).any())

    def namedtuple_read(self, v: int) -> bool:
        x, z, y = self.fresh(), self.fresh(1), self.fresh()
        self.k.slow_fill[GRID, BLOCK, self.a](x, v, self.spins)
        self.k.pair_sum[GRID, BLOCK, self.b](Pair(x, z), y)
        h = nss.copy_to_host(y, stream=self.b)
        self.done()
        return bool((h != v + 1).any())


CASES = ["view_overlap_read_after_write", "view_overlap_write_after_read",
         "view_overlap_write_after_write", "view_adjacent_one_element",
         "view_strided_against_contiguous", "view_read_then_whole_free",
         "tuple_read", "tuple_write", "nested_tuple_read", "namedtuple_read"]


@pytest.fixture(scope="module")
def cases(gpu, kernels):
    c = Cases(gpu, kernels)
    for name in CASES:  # compile every kernel for its argument types, ordered
        getattr(c, name)(1)
    c.slow_ms = c.calibrate()
    return c


@pytest.mark.parametrize("case", CASES)
def test_range_race_is_ordered(cases, race_report, case):
    trial = getattr(cases, case)
    wrong = {True: 0, False: 0}
    started = time.perf_counter()
    for i in range(TRIALS):
        for tracked in (True, False):
            with nss.tracking(tracked):
                wrong[tracked] += trial(i % 50 + 2)
            cases.cuda.synchronize()
    line = (f"tracked-{case} tracked_wrong={wrong[True]}/{TRIALS} "
            f"untracked_wrong={wrong[False]}/{TRIALS} spins={cases.spins} "
            f"slow_ms={cases.slow_ms:.2f} seconds={time.perf_counter() - started:.1f}")
    race_report(line)
    assert wrong[True] == 0, line
    assert wrong[False] >= 0.7 * TRIALS, "the race did not show without ordering: " + line
