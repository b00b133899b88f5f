"""Kernels and helpers shared by the examples: a bucketed multi-stream sort and a
hash join, written once with tracked kernels.

Importing this module picks the target: a GPU when the CUDA driver finds one,
otherwise Numba's CUDA simulator with the library's simulated driver (set
before Numba's CUDA module is imported).
"""

from __future__ import annotations

import argparse
import ctypes
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any


def _gpu_present() -> bool:
    try:
        lib = ctypes.CDLL("libcuda.so.1")
    except OSError:
        return False
    count = ctypes.c_int(0)
    return lib.cuInit(0) == 0 and lib.cuDeviceGetCount(ctypes.byref(count)) == 0 and count.value > 0


if "NUMBA_ENABLE_CUDASIM" not in os.environ and not _gpu_present():
    os.environ["NUMBA_ENABLE_CUDASIM"] = "1"

import numpy as np  # noqa: E402
from numba import cuda  # noqa: E402

import numba_streamsafe as nss  # noqa: E402
from numba_streamsafe import Read, ReadWrite, Write, tracked_kernel  # noqa: E402
from numba_streamsafe.numba.target import SIMULATOR  # noqa: E402

#: Pad value of sort buckets: above every key.
PAD = np.int64(1) << 62
EMPTY = np.int64(-1)
#: Longest probe sequence of the hash table (see hash_build).
MAX_PROBES = 1024
KEY_BITS = 32
#: The type of a join's row numbers (a probe's answer): 32-bit, as cuDF's
#: gather maps, which halves the result traffic of int64. Relations here have
#: fewer than 2**31 rows (checked by :func:`make_relations`).
ROW = np.int32


# --------------------------------------------------------------------- kernels
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


# --------------------------------------------------------------------- helpers
def launch_shape(n: int) -> tuple[int, int]:
    """Grid and block for a grid-stride kernel over ``n`` items."""
    if SIMULATOR:
        return 2, 16
    return max(1, min((n + 255) // 256, 132 * 16)), 256


def next_pow2(n: int) -> int:
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
    local = n >= TILE and not SIMULATOR
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


@dataclass
class Report:
    """What an example did: its checks, times and the target it ran on."""

    name: str
    n: int
    tracking: bool
    checks: dict[str, bool] = field(default_factory=dict)
    seconds: float = 0.0
    hazards: int = 0

    @property
    def correct(self) -> bool:
        return all(self.checks.values())

    def print(self) -> None:
        where = ("Numba's CUDA simulator with the simulated driver (no GPU found)"
                 if SIMULATOR else cuda.get_current_device().name.decode()
                 if isinstance(cuda.get_current_device().name, bytes)
                 else str(cuda.get_current_device().name))
        print(f"{self.name}: n={self.n} on {where}")
        print(f"  tracking: {'on' if self.tracking else 'OFF (race expected)'}")
        for check, ok in self.checks.items():
            print(f"  {check}: {'ok' if ok else 'WRONG'}")
        if SIMULATOR:
            print(f"  hazards seen by the simulated driver: {self.hazards}")
        print(f"  time: {self.seconds * 1e3:.1f} ms")
        verdict = "correct" if self.correct and self.hazards == 0 else "RACE SHOWN"
        if self.tracking and not (self.correct and self.hazards == 0):
            verdict = "FAILED"
        print(f"  result: {verdict}")


def parse_args(description: str, default_gpu_n: int = 1 << 24, sim_n: int = 1 << 9,
               min_n: int = 1, max_n: int | None = None) -> argparse.Namespace:
    """The examples' command line.

    Values an example cannot run with (``--n`` outside ``min_n``..``max_n``,
    ``--streams`` not a power of two, ``--repeat`` below 1, a negative
    ``--seed``) end the program with argparse's one-line usage error and exit
    status 2.
    """
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--n", type=int, default=None,
                        help=f"number of keys, at least {min_n} (default {default_gpu_n} on a "
                             f"GPU, {sim_n} on the simulator)")
    parser.add_argument("--streams", type=int, default=4, help="worker streams (power of two)")
    parser.add_argument("--no-tracking", action="store_true",
                        help="launch without fences, to show the race")
    parser.add_argument("--repeat", type=int, default=1, help="runs (the last one is reported)")
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    if args.n is None:
        args.n = sim_n if SIMULATOR else default_gpu_n
    if args.n < min_n:
        parser.error(f"--n must be at least {min_n}, got {args.n}")
    if max_n is not None and args.n > max_n:
        parser.error(f"--n must be at most {max_n}, got {args.n}")
    if args.streams < 1 or args.streams & (args.streams - 1):
        parser.error(f"--streams must be a power of two, got {args.streams}")
    if args.repeat < 1:
        parser.error(f"--repeat must be at least 1, got {args.repeat}")
    if args.seed < 0:
        parser.error(f"--seed must be non-negative, got {args.seed}")
    return args


def run_main(run: Callable[[int, int, bool, int], Report], description: str, *,
             min_n: int = 1, max_n: int | None = None) -> int:
    """Parse the example's arguments, run it ``--repeat`` times and report.

    ``min_n`` and ``max_n`` bound ``--n`` (see :func:`parse_args`). Exits
    non-zero when a tracked run is wrong or shows a hazard; an untracked run
    reports how often the race showed.
    """
    args = parse_args(description, min_n=min_n, max_n=max_n)
    reports = [run(args.n, args.streams, not args.no_tracking, args.seed)
               for _ in range(args.repeat)]
    reports[-1].print()
    if args.repeat > 1:
        wrong = sum(not r.correct for r in reports)
        racy = sum(r.hazards > 0 for r in reports)
        median = sorted(r.seconds for r in reports)[len(reports) // 2]
        print(f"  runs: {args.repeat}, wrong results in {wrong}"
              + (f", hazards in {racy}" if SIMULATOR else "")
              + f"; median time {median * 1e3:.1f} ms"
              + f" (each: {' '.join(f'{r.seconds * 1e3:.1f}' for r in reports)})")
    ok = all(r.correct and r.hazards == 0 for r in reports)
    return 0 if (args.no_tracking or ok) else 1


#: The most keys a join example takes: row numbers are :data:`ROW`.
MAX_JOIN_N = int(np.iinfo(ROW).max)


def hazards_now() -> int:
    driver = nss.get_runtime().driver
    return len(getattr(driver, "hazards", ()))


def device_synchronize() -> None:
    cuda.synchronize()


def host_sync(stream: Any) -> None:
    """Synchronise the host with ``stream`` (on the simulator, tell the model too)."""
    if SIMULATOR:
        rt = nss.get_runtime()
        rt.driver.stream_synchronize(rt.stream_handle(stream))
    else:
        stream.synchronize()


class Timer:
    def __enter__(self) -> Timer:
        self.start = time.perf_counter()
        return self

    def __exit__(self, *exc: Any) -> None:
        device_synchronize()
        self.seconds = time.perf_counter() - self.start


# ------------------------------------------------------------------ ordering
class Ordering:
    """How a run orders its streams and where its memory comes from.

    The default is the product: memory from numba_streamsafe and no ordering
    code at all (tracked kernels and copies order themselves). The other
    kinds exist to compare against, with tracking turned off:
    ``DeviceSync`` (a device-wide synchronize after every stage) and
    ``HandEvents`` (hand-placed events at exactly the cross-stream edges).
    Those keep every buffer alive until the run ends, as hand-ordered code must.
    """

    tracking = True

    def __init__(self, allocator: str = "streamsafe") -> None:
        if allocator not in ("streamsafe", "numba"):
            raise ValueError(f"allocator must be 'streamsafe' or 'numba', got {allocator!r}")
        self.allocator = allocator
        self.kept: list[Any] = []

    def alloc(self, shape: Any, dtype: Any, stream: Any, tag: str) -> Any:
        if self.allocator == "numba":
            return self.keep(cuda.device_array(shape, dtype, stream=stream))
        return self.keep(nss.device_array(shape, dtype, stream=stream, tag=tag))

    def upload(self, host: np.ndarray, stream: Any, tag: str, into: Any = None) -> Any:
        """Copy ``host`` to a new device array (or into ``into``) on ``stream``."""
        if self.allocator == "numba":
            return self.keep(cuda.to_device(host, stream=stream, to=into))
        return self.keep(nss.to_device(host, stream=stream, to=into, tag=tag))

    def upload_for(self, host: np.ndarray, consumer: Any, upload: Any, tag: str) -> Any:
        """Copy ``host`` on the ``upload`` stream into an array allocated on ``consumer``.

        The array is freed on ``consumer`` once it is dropped, so its free never
        holds up the upload stream. Later work on ``consumer`` is ordered after
        the copy (a stage boundary for :class:`DeviceSync`).
        """
        out = self.alloc(host.shape, host.dtype, consumer, tag)
        self.wait(upload, self.mark(consumer))  # a stream-ordered allocation precedes its use
        self.upload(host, upload, tag, into=out)
        self.wait(consumer, self.mark(upload))
        self.stage()
        return out

    def keep(self, array: Any) -> Any:
        return array

    def mark(self, stream: Any) -> Any:
        """After the work queued on ``stream`` so far: a token others can wait for."""
        return None

    def wait(self, stream: Any, token: Any) -> None:
        """Order later work on ``stream`` after ``token``."""

    def stage(self) -> None:
        """The end of a pipeline stage."""

    def finish(self) -> None:
        """The run is over and synchronised: release what it kept."""
        self.kept.clear()


class Unordered(Ordering):
    """No ordering at all: the race the library prevents."""

    tracking = False


class _Manual(Ordering):
    tracking = False

    def keep(self, array: Any) -> Any:
        self.kept.append(array)
        return array


class DeviceSync(_Manual):
    """A device-wide synchronize after every stage."""

    def stage(self) -> None:
        nss.get_runtime().driver.synchronize()  # cuCtxSynchronize (or the model's)


class HandEvents(_Manual):
    """One event per cross-stream edge, placed by hand (through the runtime's
    driver, so the simulated driver checks them too)."""

    def __init__(self, allocator: str = "streamsafe") -> None:
        super().__init__(allocator)
        self.events: list[Any] = []

    def mark(self, stream: Any) -> Any:
        rt = nss.get_runtime()
        event = rt.driver.event_create()
        rt.driver.event_record(event, rt.stream_handle(stream))
        self.events.append(event)
        return event

    def wait(self, stream: Any, token: Any) -> None:
        if token is not None:
            rt = nss.get_runtime()
            rt.driver.stream_wait_event(rt.stream_handle(stream), token)

    def finish(self) -> None:
        super().finish()
        driver = nss.get_runtime().driver
        for event in self.events:
            driver.event_destroy(event)
        self.events.clear()


ORDERINGS = {"tracked": Ordering, "unordered": Unordered, "sync": DeviceSync,
             "events": HandEvents}


# ------------------------------------------------------------------ algorithms
def multistream_sort(d_keys: Any, n: int, streams: list[Any], collect: Any,
                     order: Ordering | None = None) -> Any:
    """Sort ``d_keys`` (uniform keys below 2**KEY_BITS) with one bucket per stream.

    A histogram on ``collect`` sizes the buckets; each worker stream gathers
    and bitonic-sorts its bucket; ``collect`` then copies the buckets into one
    sorted array, reading what the workers wrote.
    """
    order = order or Ordering()
    nb = len(streams)
    shift = KEY_BITS - (nb.bit_length() - 1)
    counts = order.alloc(nb, np.int64, collect, "bucket counts")
    nss.memset(counts, 0, stream=collect)
    g, b = launch_shape(n)
    histogram[g, b, collect](d_keys, counts, shift)
    sizes = nss.copy_to_host(counts, stream=collect)
    host_sync(collect)  # the bucket sizes are needed on the host

    buckets = []
    done = []
    for i, s in enumerate(streams):
        cap = next_pow2(max(int(sizes[i]), 1))
        out = order.alloc(cap, np.int64, s, f"bucket {i}")
        cursor = order.alloc(1, np.int64, s, f"cursor {i}")
        gc_, bc = launch_shape(cap)
        fill[gc_, bc, s](out, PAD)
        nss.memset(cursor, 0, stream=s)
        gather_bucket[g, b, s](d_keys, out, cursor, i, shift)
        bitonic_sort(out, s)
        buckets.append(out)
        done.append(order.mark(s))
    order.stage()

    result = order.alloc(n, np.int64, collect, "sorted")
    offset = 0
    for i, out in enumerate(buckets):
        size = int(sizes[i])
        order.wait(collect, done[i])
        if size:
            gs, bs = launch_shape(size)
            copy_into[gs, bs, collect](out[:size], result[offset:offset + size])
        offset += size
    del buckets, out  # freed on their worker streams, after collect's reads
    order.stage()
    return result


def streamed_sort(host_keys: np.ndarray, streams: list[Any], collect: Any, chunks: int,
                  order: Ordering | None = None, strides_per_pass: int = 2,
                  upload: Any = None) -> tuple[Any, Any]:
    """Sort host keys while they upload: chunk by chunk, each sorted as it arrives.

    Chunk ``i`` is uploaded and bitonic-sorted on ``streams[i % len(streams)]``
    (uploaded on the ``upload`` stream instead when given, into memory of the
    sorting stream: see :meth:`Ordering.upload_for`), so the upload of one
    chunk overlaps the sort of the chunks before it. From
    pinned memory (:func:`pinned_copy`) the uploads are asynchronous and run on
    the copy engine. From pageable memory the host stages each chunk itself,
    and an upload waits for its stream's earlier work, so more chunks than
    streams make the host wait for sorts.
    The sorted runs are merged pairwise as soon as two of the same length are
    ready (a binary counter), on the stream of the older run; the last merge
    runs on ``collect``. ``strides_per_pass`` is :func:`bitonic_sort`'s.
    Returns the sorted device array and the ordering token after which it may
    be read.
    """
    order = order or Ordering()
    n = host_keys.size
    if n == 0:
        raise ValueError("streamed_sort needs at least one key")
    if chunks < 1:
        raise ValueError(f"chunks must be at least 1, got {chunks}")
    runs: list[tuple[Any, int, Any, Any]] = []  # (sorted run, chunks merged, stream, token)

    def merge(last: bool) -> None:
        (a, wa, sa, ta), (b, wb, _, tb) = runs[-2], runs[-1]
        del runs[-2:]
        s = collect if last else sa
        order.wait(s, ta)
        order.wait(s, tb)
        out = order.alloc(a.size + b.size, np.int64, s, "merged run")
        g, bl = launch_shape(out.size)
        merge_runs[g, bl, s](a, b, out)
        runs.append((out, wa + wb, s, order.mark(s)))
        # a and b are freed here, on their own streams, after the merge's reads

    for i, chunk in enumerate(np.array_split(host_keys, max(1, min(chunks, n)))):
        s = streams[i % len(streams)]
        d_chunk = (order.upload(chunk, s, f"build chunk {i}") if upload is None
                   else order.upload_for(chunk, s, upload, f"build chunk {i}"))
        cap = next_pow2(chunk.size)
        run = d_chunk
        if cap != chunk.size:  # bitonic sort needs a power of two: pad above every key
            run = order.alloc(cap, np.int64, s, f"padded chunk {i}")
            g, b = launch_shape(cap)
            fill[g, b, s](run, PAD)
            g, b = launch_shape(chunk.size)
            copy_into[g, b, s](d_chunk, run[:chunk.size])
        del d_chunk
        bitonic_sort(run, s, strides_per_pass)
        runs.append((run[:chunk.size], 1, s, order.mark(s)))
        del run
        order.stage()
        while len(runs) > 1 and runs[-1][1] == runs[-2][1]:
            merge(last=False)
            order.stage()
    while len(runs) > 1:
        merge(last=len(runs) == 2)
        order.stage()
    result, _, _, token = runs[0]
    return result, token


def build_table(d_build: Any, build_stream: Any, order: Ordering | None = None,
                build_ready: Any = None) -> tuple[Any, int, Any]:
    """Insert ``d_build`` into an open-addressing table on ``build_stream``.

    ``build_ready`` is the ordering token after which ``d_build`` may be read.
    Returns the table (key and payload interleaved, see :func:`hash_build`),
    its slot mask, and the token after which the table may be probed.
    """
    order = order or Ordering()
    nb = d_build.size
    cap = next_pow2(2 * max(nb, 1))
    table = order.alloc(2 * cap, np.int64, build_stream, "hash table")
    g, b = launch_shape(2 * cap)
    fill[g, b, build_stream](table, EMPTY)
    order.wait(build_stream, build_ready)
    g, b = launch_shape(nb)
    hash_build[g, b, build_stream](d_build, table, cap - 1)
    built = order.mark(build_stream)
    order.stage()
    return table, cap - 1, built


@dataclass
class HostBatches:
    """The probe relation in batches of pinned host memory, with pinned result buffers.

    No batch is empty: fewer keys than batches give one batch per key.
    """

    keys: list[np.ndarray]
    results: list[np.ndarray]

    @classmethod
    def of(cls, probe: np.ndarray, nbatches: int) -> HostBatches:
        keys, results = [], []
        for part in np.array_split(probe, max(1, min(nbatches, probe.size))):
            keys.append(pinned_copy(part))
            results.append(cuda.pinned_array(part.shape, ROW))
        return cls(keys, results)


def pinned_copy(host: np.ndarray) -> np.ndarray:
    """``host`` copied into page-locked memory, from which uploads are asynchronous."""
    pinned = cuda.pinned_array(host.shape, host.dtype)
    pinned[...] = host
    return pinned


def probe_batches(batches: HostBatches, table: tuple[Any, int, Any], probe_streams: list[Any],
                  order: Ordering | None = None, upload: Any = None) -> list[Any]:
    """Stream the probe batches through the table, round robin over ``probe_streams``.

    Each batch is uploaded, probed and its result downloaded (into
    ``batches.results``) on its stream, so the copies of one batch overlap the
    probing of others. With an ``upload`` stream, every batch is uploaded there
    first, one after the other, and the probes wait for their batch: the keys
    then arrive while the table is built instead of after the probes queued
    before them on the same stream. Returns the device result of every batch.
    """
    order = order or Ordering()
    slots, mask, built = table
    staged: list[Any] = []
    if upload is not None:
        # Allocated on the upload stream and all queued before any is dropped,
        # so no free (fenced after its probe) holds up a later upload.
        uploaded = []
        for keys in batches.keys:
            staged.append(order.upload(keys, upload, "probe keys"))
            uploaded.append(order.mark(upload))
        order.stage()
    outs = []
    for j, (keys, result) in enumerate(zip(batches.keys, batches.results, strict=True)):
        s = probe_streams[j % len(probe_streams)]
        if upload is None:
            d_keys = order.upload(keys, s, "probe keys")
        else:
            d_keys = staged[j]
            order.wait(s, uploaded[j])
        out = order.alloc(keys.size, ROW, s, "probe result")
        order.wait(s, built)
        g, b = launch_shape(keys.size)
        hash_probe[g, b, s](d_keys, slots, out, mask)
        nss.copy_to_host(out, result, stream=s)
        outs.append(out)
        order.stage()
    del staged  # freed on the upload stream after their probes' reads
    return outs


def sort_join(build: np.ndarray, batches: HostBatches, collect: Any, workers: list[Any],
              build_stream: Any, probe_streams: list[Any], order: Ordering | None = None,
              chunks: int | None = None, strides_per_pass: int = 2,
              upload: Any = None) -> np.ndarray:
    """The sort -> join pipeline.

    The build keys are uploaded in ``chunks`` pieces (default: one per worker
    stream) and sorted as they arrive (:func:`streamed_sort`), the sorted keys
    inserted into a hash table (payload: the key's rank), the probe batches
    streamed through it, and the matches counted on ``collect``. Results land
    in ``batches.results``; returns the match count. ``strides_per_pass`` is
    :func:`bitonic_sort`'s. With an ``upload`` stream every host-to-device copy
    runs there, the build keys first, so the probe keys do not share the
    copy engine with the build keys that the sort is waiting for.
    """
    order = order or Ordering()
    d_sorted, sorted_ready = streamed_sort(build, workers, collect, chunks or len(workers),
                                           order, strides_per_pass, upload)
    table = build_table(d_sorted, build_stream, order, sorted_ready)
    del d_sorted  # still being read by the build: the free is fenced
    return join_probes(batches, table, collect, probe_streams, order, upload)


def join_probes(batches: HostBatches, table: tuple[Any, int, Any], collect: Any,
                probe_streams: list[Any], order: Ordering, upload: Any = None) -> np.ndarray:
    """Probe ``table`` with every batch and count the matches on ``collect``.

    Synchronises the host with every stream used and ends ``order``'s run.
    """
    outs = probe_batches(batches, table, probe_streams, order, upload)
    del table  # still being read by the probes: the frees are fenced
    probed = [order.mark(s) for s in probe_streams]
    total = order.alloc(1, np.int64, collect, "match count")
    nss.memset(total, 0, stream=collect)
    for token in probed:
        order.wait(collect, token)
    for out in outs:
        g, b = launch_shape(out.size)
        count_matches[g, b, collect](out, total)
    count = nss.copy_to_host(total, stream=collect)
    order.stage()
    for s in [collect, *probe_streams, *([upload] if upload is not None else [])]:
        host_sync(s)
    order.finish()
    return count


def bucket_sort_join(build: np.ndarray, batches: HostBatches, collect: Any, workers: list[Any],
                     build_stream: Any, probe_streams: list[Any],
                     order: Ordering | None = None) -> np.ndarray:
    """The same join after uploading all build keys and then bucket-sorting them.

    A serial chain (upload, then sort, then build): only the probe batches can
    overlap. Kept to compare with :func:`sort_join`.
    """
    order = order or Ordering()
    d_build = order.upload(build, collect, "build keys")
    d_sorted = multistream_sort(d_build, build.size, workers, collect, order)
    sorted_ready = order.mark(collect)
    del d_build  # freed on the collector stream after the workers' reads
    table = build_table(d_sorted, build_stream, order, sorted_ready)
    del d_sorted
    return join_probes(batches, table, collect, probe_streams, order)


@lru_cache(maxsize=2)
def make_relations(n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Unique build keys below 2**KEY_BITS and probe keys, half of them present."""
    if not 0 < n <= np.iinfo(ROW).max:
        raise ValueError(f"n must be from 1 to {np.iinfo(ROW).max} (row numbers are "
                         f"{ROW.__name__}), got {n}")
    rng = np.random.default_rng(seed)
    build = rng.choice(np.int64(1) << KEY_BITS, size=n, replace=False).astype(np.int64) \
        if n < (1 << 20) else _unique_keys(rng, n)
    present = rng.choice(build, size=n // 2)
    absent = rng.integers(0, np.int64(1) << KEY_BITS, size=n - n // 2, dtype=np.int64)
    probe = np.concatenate([present, absent])
    rng.shuffle(probe)
    return build, probe


def _unique_keys(rng: np.random.Generator, n: int) -> np.ndarray:
    keys = np.unique(rng.integers(0, np.int64(1) << KEY_BITS, size=int(n * 1.1), dtype=np.int64))
    while keys.size < n:
        more = rng.integers(0, np.int64(1) << KEY_BITS, size=n, dtype=np.int64)
        keys = np.unique(np.concatenate([keys, more]))
    rng.shuffle(keys)
    return keys[:n].copy()


def expected_probe(build: np.ndarray, probe: np.ndarray) -> np.ndarray:
    """Reference join: the build row of each probe key, or -1."""
    order = np.argsort(build, kind="stable")
    sorted_build = build[order]
    pos = np.searchsorted(sorted_build, probe)
    pos = np.minimum(pos, sorted_build.size - 1)
    hit = sorted_build[pos] == probe
    return np.where(hit, order[pos], -1)


def expected_rank(build: np.ndarray, probe: np.ndarray) -> np.ndarray:
    """Reference sort -> join: the rank of each probe key among the sorted build keys, or -1."""
    sorted_build = np.sort(build)
    pos = np.minimum(np.searchsorted(sorted_build, probe), sorted_build.size - 1)
    return np.where(sorted_build[pos] == probe, pos, -1)
