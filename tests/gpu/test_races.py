"""Adversarial race suite on a real GPU.

Each hazard is provoked ``NSS_RACE_TRIALS`` times (default 300) with tracking
on and, interleaved, with tracking off. A slow kernel (it sleeps about
``spins`` microseconds before touching memory) leaves a wide window for an
unordered kernel on the other stream, so without fences the result is wrong
almost every time; with fences it must never be.

Set ``NSS_RACE_REPORT`` to a file to append one line per hazard, e.g.
``use-after-write tracked_wrong=0/300 untracked_wrong=300/300 spins=1000 ...``.
``NSS_RACE_SPINS`` fixes the sleep length instead of calibrating it.
"""

from __future__ import annotations

import gc
import os
import time
import weakref

import numpy as np
import pytest

import numba_streamsafe as nss

pytestmark = pytest.mark.gpu

TRIALS = int(os.environ.get("NSS_RACE_TRIALS", "300"))
N = 1 << 16
GRID, BLOCK = 256, 256
#: The slow kernels should last at least this long (milliseconds).
MIN_SLOW_MS = 1.0
#: Untracked runs must be wrong in at least this share of trials.
UNTRACKED_MIN_SHARE = 0.9


class Race:
    """Streams, kernels and the calibrated sleep shared by the trials."""

    def __init__(self, cuda, kernels) -> None:
        self.cuda = cuda
        self.k = kernels
        self.a = cuda.stream()
        self.b = cuda.stream()
        self.ones = np.ones(N, dtype=np.int32)
        self.spins = int(os.environ.get("NSS_RACE_SPINS", "1000"))
        self.slow_ms = 0.0
        self.gc_calls = 0

    def warm_up(self) -> None:
        """Compile every kernel for the argument types the trials pass."""
        k, a = self.k, self.a
        x = nss.device_array(N, np.int32, stream=a)
        y = nss.device_array(N, np.int32, stream=a)
        k.fill[GRID, BLOCK, a](x, 1)
        k.copy[GRID, BLOCK, a](x, y)
        k.slow_fill[GRID, BLOCK, a](x, 1, 1)
        k.slow_copy[GRID, BLOCK, a](x, y, 1)
        nss.copy_to_host(y, stream=a)
        self.cuda.synchronize()

    def time_slow(self, spins: int) -> float:
        cuda, a = self.cuda, self.a
        x = nss.device_array(N, np.int32, stream=a)
        start, end = cuda.event(), cuda.event()
        start.record(a)
        self.k.slow_fill[GRID, BLOCK, a](x, 1, spins)
        end.record(a)
        end.synchronize()
        return cuda.event_elapsed_time(start, end)

    def calibrate(self) -> None:
        """Lengthen the sleep until a slow kernel lasts ``MIN_SLOW_MS``."""
        fixed = "NSS_RACE_SPINS" in os.environ
        self.slow_ms = self.time_slow(self.spins)
        while not fixed and self.slow_ms < MIN_SLOW_MS and self.spins < 64_000:
            self.spins *= 2
            self.slow_ms = self.time_slow(self.spins)

    def collect_if_alive(self, ref: weakref.ref) -> None:
        """A dropped array frees at once unless a cycle holds it: then collect."""
        if ref() is not None:
            gc.collect()
            self.gc_calls += 1

    # ----------------------------------------------------------- the hazards
    def use_after_write(self, value: int) -> tuple[bool, bool]:
        """Slow writer of x on a; fast reader of x on b."""
        k, a, b = self.k, self.a, self.b
        x = nss.device_array(N, np.int32, stream=a)
        y = nss.device_array(N, np.int32, stream=b)
        k.slow_fill[GRID, BLOCK, a](x, value, self.spins)
        k.copy[GRID, BLOCK, b](x, y)
        out = nss.copy_to_host(y, stream=b)
        b.synchronize()
        return bool((out != value).any()), False

    def write_after_read(self, value: int) -> tuple[bool, bool]:
        """Slow reader of x on a; fast writer of x on b."""
        k, a, b = self.k, self.a, self.b
        x = nss.device_array(N, np.int32, stream=a)
        y = nss.device_array(N, np.int32, stream=a)
        k.fill[GRID, BLOCK, a](x, 1)
        a.synchronize()
        k.slow_copy[GRID, BLOCK, a](x, y, self.spins)  # reads x late
        k.fill[GRID, BLOCK, b](x, 2)  # must wait for that read
        out = nss.copy_to_host(y, stream=a)
        a.synchronize()
        return bool((out != 1).any()), False

    def free_after_use(self, value: int) -> tuple[bool, bool]:
        """Slow reader of x on b; x dropped; z allocated on a (same address) and written."""
        k, a, b = self.k, self.a, self.b
        x = nss.to_device(self.ones, stream=a)
        a.synchronize()
        y = nss.device_array(N, np.int32, stream=b)
        k.slow_copy[GRID, BLOCK, b](x, y, self.spins)  # reads x late
        old_ptr = nss.block_of(x).ptr
        ref = weakref.ref(x.gpu_data)
        del x  # the finalizer queues the free; the next allocation drains it
        self.collect_if_alive(ref)
        z = nss.device_array(N, np.int32, stream=a)
        reused = nss.block_of(z).ptr == old_ptr
        k.fill[GRID, BLOCK, a](z, 7)  # must not land in x's bytes before the read
        out = nss.copy_to_host(y, stream=b)
        b.synchronize()
        return bool((out != 1).any()), reused


HAZARDS = ["use-after-write", "write-after-read", "free-after-use"]


@pytest.fixture(scope="module")
def race(gpu, kernels):
    r = Race(gpu, kernels)
    r.warm_up()
    r.calibrate()
    print(f"\nslow kernel: spins={r.spins} lasts {r.slow_ms:.2f} ms")
    return r


def run_trials(race: Race, hazard: str, label: str = "") -> tuple[dict[bool, int], str]:
    """``TRIALS`` trials of ``hazard``, tracked and untracked interleaved: the
    wrong results of each, and the report line (also appended to
    ``NSS_RACE_REPORT``)."""
    trial = getattr(race, hazard.replace("-", "_"))
    wrong = {True: 0, False: 0}
    reused = {True: 0, False: 0}
    started = time.perf_counter()
    for i in range(TRIALS):
        for tracked in (True, False):
            value = (0 if tracked else 1 << 20) + i + 1  # never a value of an earlier trial
            with nss.tracking(tracked):
                bad, same = trial(value)
            race.cuda.synchronize()  # the next trial starts with both streams idle
            wrong[tracked] += bad
            reused[tracked] += same
    seconds = time.perf_counter() - started
    line = (f"{label}{hazard} tracked_wrong={wrong[True]}/{TRIALS} "
            f"untracked_wrong={wrong[False]}/{TRIALS} spins={race.spins} "
            f"slow_ms={race.slow_ms:.2f} seconds={seconds:.1f}")
    if hazard == "free-after-use":
        line += (f" address_reused_tracked={reused[True]}/{TRIALS}"
                 f" address_reused_untracked={reused[False]}/{TRIALS} gc_calls={race.gc_calls}")
    print(line)
    report = os.environ.get("NSS_RACE_REPORT")
    if report:
        with open(report, "a") as f:
            f.write(line + "\n")
    return wrong, line


@pytest.mark.parametrize("hazard", HAZARDS)
def test_race(race, hazard):
    wrong, line = run_trials(race, hazard)
    assert wrong[True] == 0, line
    assert wrong[False] >= UNTRACKED_MIN_SHARE * TRIALS, (
        "the race did not show without fences, so this run proves nothing: " + line)
