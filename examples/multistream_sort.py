"""Multi-stream sort: one bucket of the shared input per stream, collected on another.

The input is uploaded on a collector stream; every worker stream reads it to
gather and sort its own bucket; the collector then reads every bucket into one
sorted array. No event or synchronize is written by hand: the tracked kernels
order the streams. ``--no-tracking`` launches the same kernels unfenced.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from cli import Report, Timer, run_main
from kernels_sort import (
    KEY_BITS,
    PAD,
    bitonic_sort,
    copy_into,
    fill,
    gather_bucket,
    histogram,
    next_pow2,
)
from numba import cuda
from target import (  # the GPU, or the simulator without one
    hazards_now,
    host_sync,
    launch_shape,
    race_text,
)

import numba_streamsafe as nss


def multistream_sort(d_keys: Any, collect: Any, workers: list[Any]) -> Any:
    """Sort ``d_keys`` (uniform keys below 2**KEY_BITS) with one bucket per worker stream."""
    n = d_keys.size
    shift = KEY_BITS - (len(workers).bit_length() - 1)  # bucket = the key's top bits

    # On the collector: count the keys of each bucket, and bring the counts to the host.
    counts = nss.device_array(len(workers), np.int64, stream=collect, tag="bucket counts")
    nss.memset(counts, 0, stream=collect)
    g, b = launch_shape(n)
    histogram[g, b, collect](d_keys, counts, shift)
    sizes = nss.copy_to_host(counts, stream=collect)
    host_sync(collect)  # the bucket sizes are needed on the host

    # On each worker: gather its bucket (padded to a power of two) and sort it.
    # Every worker reads d_keys, which the collector wrote: each launch waits for
    # that upload by itself.
    buckets = []
    for i, s in enumerate(workers):
        cap = next_pow2(max(int(sizes[i]), 1))
        out = nss.device_array(cap, np.int64, stream=s, tag=f"bucket {i}")
        cursor = nss.device_array(1, np.int64, stream=s, tag=f"cursor {i}")
        gc_, bc = launch_shape(cap)
        fill[gc_, bc, s](out, PAD)
        nss.memset(cursor, 0, stream=s)
        gather_bucket[g, b, s](d_keys, out, cursor, i, shift)
        bitonic_sort(out, s)
        buckets.append(out)

    # On the collector: copy the buckets one after the other into the result.
    # Each copy waits for its worker's sort.
    result = nss.device_array(n, np.int64, stream=collect, tag="sorted")
    offset = 0
    for i, out in enumerate(buckets):
        size = int(sizes[i])
        if size:
            gs, bs = launch_shape(size)
            copy_into[gs, bs, collect](out[:size], result[offset:offset + size])
        offset += size
    del buckets, out  # freed on their worker streams, after the collector's reads
    return result


def run(n: int, nstreams: int, tracking: bool, seed: int) -> Report:
    rng = np.random.default_rng(seed)
    keys = rng.integers(0, np.int64(1) << KEY_BITS, size=n, dtype=np.int64)
    collect = cuda.stream()
    workers = [cuda.stream() for _ in range(nstreams)]
    before = hazards_now()
    with nss.tracking(tracking), Timer() as t:
        d_keys = nss.to_device(keys, stream=collect, tag="keys")
        d_sorted = multistream_sort(d_keys, collect, workers)
        got = nss.copy_to_host(d_sorted, stream=collect)
        collect.synchronize()
    report = Report("multi-stream sort", n, tracking, seconds=t.seconds)
    report.checks["sorted output equals numpy.sort"] = bool(np.array_equal(got, np.sort(keys)))
    report.hazards = hazards_now() - before
    report.first_race = race_text(before)
    return report


def main() -> int:
    return run_main(run, __doc__.splitlines()[0], min_n=0)


if __name__ == "__main__":
    raise SystemExit(main())
