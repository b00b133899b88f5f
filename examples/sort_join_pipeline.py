"""Sort -> join pipeline over shared buffers on several streams.

1. sort: the build keys (in pinned host memory) are uploaded in chunks on
   the upload stream, and each chunk is bitonic-sorted on a worker stream
   (round robin) as soon as it has arrived, while the next one uploads;
   sorted runs are merged pairwise, the last merge on the collector stream;
2. build: the build stream inserts the sorted keys into a hash table, each
   key's payload being its rank;
3. probe: the probe keys are uploaded in batches of pinned host memory on
   the upload stream after the build keys (so they never slow the copies the
   sort waits for) and arrive while the table is built; each batch is probed
   and its result downloaded on one of the probe streams (round robin);
4. count: the collector stream counts the matches of every batch.

Each stage reads what another stream wrote, and temporaries are freed while
other streams may still use them; the library orders all of it. The result
is checked against NumPy (ranks from numpy.sort, matches from a NumPy join).
``--no-tracking`` launches the same work unfenced to show the race.
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np
from common import (
    MAX_JOIN_N,
    HostBatches,
    Report,
    Timer,
    expected_rank,
    hazards_now,
    make_relations,
    pinned_copy,
    run_main,
    sort_join,
)
from numba import cuda

import numba_streamsafe as nss


@lru_cache(maxsize=1)
def inputs(n: int, seed: int, nbatches: int) -> tuple[np.ndarray, HostBatches, np.ndarray]:
    """Pinned build keys, pinned probe batches and the NumPy answer, made once per process."""
    build, probe = make_relations(n, seed)
    return pinned_copy(build), HostBatches.of(probe, nbatches), expected_rank(build, probe)


def run(n: int, nstreams: int, tracking: bool, seed: int) -> Report:
    build, batches, expected = inputs(n, seed, 2 * nstreams)
    for result in batches.results:
        result[...] = -2  # a previous run's answer cannot pass this run's check
    collect = cuda.stream()
    workers = [cuda.stream() for _ in range(nstreams)]
    build_stream = cuda.stream()
    probe_streams = [cuda.stream() for _ in range(nstreams)]
    upload = cuda.stream()
    before = hazards_now()
    with nss.tracking(tracking), Timer() as t:
        count = sort_join(build, batches, collect, workers, build_stream, probe_streams,
                          upload=upload)
    got = np.concatenate(batches.results)
    report = Report("sort -> join pipeline", n, tracking, seconds=t.seconds)
    report.checks["every probe finds its key's rank in the sorted build keys"] = bool(
        np.array_equal(got, expected))
    report.checks["match count equals NumPy's"] = int(count[0]) == int((expected >= 0).sum())
    report.hazards = hazards_now() - before
    return report


def main() -> int:
    return run_main(run, __doc__.splitlines()[0], max_n=MAX_JOIN_N)


if __name__ == "__main__":
    raise SystemExit(main())
