"""Multi-stream hash join: build on one stream, probe partitions on others.

The build relation is uploaded and inserted into an open-addressing table on
the build stream; the probe relation is streamed through the shared table in
batches of pinned host memory, round robin over the probe streams (upload,
probe and download of one batch overlap other batches). Results are checked
against a NumPy join. ``--no-tracking`` launches the same kernels unfenced.
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np
from common import (
    MAX_JOIN_N,
    HostBatches,
    Report,
    Timer,
    build_table,
    expected_probe,
    hazards_now,
    host_sync,
    make_relations,
    probe_batches,
    run_main,
)
from numba import cuda

import numba_streamsafe as nss


@lru_cache(maxsize=1)
def inputs(n: int, seed: int, nbatches: int) -> tuple[np.ndarray, HostBatches, np.ndarray]:
    """Build keys, pinned probe batches and the NumPy join, made once per process."""
    build, probe = make_relations(n, seed)
    return build, HostBatches.of(probe, nbatches), expected_probe(build, probe)


def run(n: int, nstreams: int, tracking: bool, seed: int) -> Report:
    build, batches, expected = inputs(n, seed, 4 * nstreams)
    for result in batches.results:
        result[...] = -2  # a previous run's answer cannot pass this run's check
    build_stream = cuda.stream()
    probe_streams = [cuda.stream() for _ in range(nstreams)]
    before = hazards_now()
    with nss.tracking(tracking), Timer() as t:
        d_build = nss.to_device(build, stream=build_stream, tag="build keys")
        table = build_table(d_build, build_stream)
        probe_batches(batches, table, probe_streams)
        for s in probe_streams:
            host_sync(s)
    got = batches.results
    report = Report("multi-stream hash join", n, tracking, seconds=t.seconds)
    report.checks["join equals the NumPy join"] = bool(
        np.array_equal(np.concatenate(got), expected))
    report.hazards = hazards_now() - before
    return report


def main() -> int:
    return run_main(run, __doc__.splitlines()[0], max_n=MAX_JOIN_N)


if __name__ == "__main__":
    raise SystemExit(main())
