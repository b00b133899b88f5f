"""Multi-stream hash join: build on one stream, probe partitions on others.

The build relation is uploaded and inserted into an open-addressing table on
the build stream; the probe relation is streamed through the shared table in
batches of pinned host memory, round robin over the probe streams (upload,
probe and download of one batch overlap other batches). Results are checked
against a NumPy join. ``--no-tracking`` launches the same kernels unfenced.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any

import numpy as np
from cli import Report, Timer, run_main
from data import MAX_JOIN_N, HostBatches, expected_probe, make_relations
from kernels_join import ROW, build_table, hash_probe
from numba import cuda
from target import (  # the GPU, or the simulator without one
    hazards_now,
    host_sync,
    launch_shape,
    race_text,
)

import numba_streamsafe as nss


def probe(batches: HostBatches, table: Any, mask: int, probe_streams: list[Any]) -> list[Any]:
    """Stream the probe batches through ``table``, round robin over ``probe_streams``.

    Each batch is uploaded, probed and its result downloaded (into
    ``batches.results``) on its stream, so the copies of one batch overlap the
    probing of others. Returns the device result of every batch.
    """
    outs = []
    for j, (keys, result) in enumerate(zip(batches.keys, batches.results, strict=True)):
        s = probe_streams[j % len(probe_streams)]
        d_keys = nss.to_device(keys, stream=s, tag="probe keys")
        out = nss.device_array(keys.size, ROW, stream=s, tag="probe result")
        g, b = launch_shape(keys.size)
        hash_probe[g, b, s](d_keys, table, out, mask)  # waits for the build on its stream
        nss.copy_to_host(out, result, stream=s)
        outs.append(out)
    return outs


def hash_join(build: np.ndarray, batches: HostBatches, build_stream: Any,
              probe_streams: list[Any]) -> None:
    """Join: every probe key's row in ``build`` (or -1) lands in ``batches.results``."""
    d_build = nss.to_device(build, stream=build_stream, tag="build keys")
    table, mask = build_table(d_build, build_stream)
    probe(batches, table, mask, probe_streams)
    for s in probe_streams:
        host_sync(s)  # the results are on the host now


@lru_cache(maxsize=1)
def inputs(n: int, seed: int, nbatches: int) -> tuple[np.ndarray, HostBatches, np.ndarray]:
    """Build keys, pinned probe batches and the NumPy join, made once per process."""
    build, probe_keys = make_relations(n, seed)
    return build, HostBatches.of(probe_keys, nbatches), expected_probe(build, probe_keys)


def run(n: int, nstreams: int, tracking: bool, seed: int) -> Report:
    build, batches, expected = inputs(n, seed, 4 * nstreams)
    for result in batches.results:
        result[...] = -2  # a previous run's answer cannot pass this run's check
    build_stream = cuda.stream()
    probe_streams = [cuda.stream() for _ in range(nstreams)]
    before = hazards_now()
    with nss.tracking(tracking), Timer() as t:
        hash_join(build, batches, build_stream, probe_streams)
    report = Report("multi-stream hash join", n, tracking, seconds=t.seconds)
    report.checks["join equals the NumPy join"] = bool(
        np.array_equal(np.concatenate(batches.results), expected))
    report.hazards = hazards_now() - before
    report.first_race = race_text(before)
    return report


def main() -> int:
    return run_main(run, __doc__.splitlines()[0], max_n=MAX_JOIN_N)


if __name__ == "__main__":
    raise SystemExit(main())
