"""Multi-stream sort: one bucket of the shared input per stream, collected on another.

The input is uploaded on a collector stream; every worker stream reads it to
gather and sort its own bucket; the collector then reads every bucket into one
sorted array. No event or synchronize is written by hand: the tracked kernels
order the streams. ``--no-tracking`` launches the same kernels unfenced.
"""

from __future__ import annotations

import common  # sets up the target (GPU, or the simulator without one)
import numpy as np
from common import Report, Timer, hazards_now, multistream_sort, run_main
from numba import cuda

import numba_streamsafe as nss


def run(n: int, nstreams: int, tracking: bool, seed: int) -> Report:
    rng = np.random.default_rng(seed)
    keys = rng.integers(0, np.int64(1) << common.KEY_BITS, size=n, dtype=np.int64)
    collect = cuda.stream()
    workers = [cuda.stream() for _ in range(nstreams)]
    before = hazards_now()
    with nss.tracking(tracking), Timer() as t:
        d_keys = nss.to_device(keys, stream=collect, tag="keys")
        d_sorted = multistream_sort(d_keys, n, workers, collect)
        got = nss.copy_to_host(d_sorted, stream=collect)
        collect.synchronize()
    report = Report("multi-stream sort", n, tracking, seconds=t.seconds)
    report.checks["sorted output equals numpy.sort"] = bool(np.array_equal(got, np.sort(keys)))
    report.hazards = hazards_now() - before
    return report


def main() -> int:
    return run_main(run, __doc__.splitlines()[0], min_n=0)


if __name__ == "__main__":
    raise SystemExit(main())
