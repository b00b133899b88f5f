"""Sort -> join pipeline over shared buffers on several streams.

1. sort: the build keys are uploaded on the collector stream, bucket-sorted on
   the worker streams and collected into one sorted array;
2. build: the build stream inserts the sorted keys into a hash table, each
   key's payload being its rank;
3. probe: every probe stream looks up its part of the probe keys;
4. count: the collector stream counts the matches of every part.

Each stage reads what another stream wrote, and temporaries are freed while
other streams may still use them; the library orders all of it. The result
is checked against NumPy (ranks from numpy.sort, matches from a NumPy join).
``--no-tracking`` launches the same work unfenced to show the race.
"""

from __future__ import annotations

from typing import Any

import common  # sets up the target (GPU, or the simulator without one)
import numpy as np
from common import (
    Report,
    Timer,
    count_matches,
    hash_join,
    hazards_now,
    launch_shape,
    make_relations,
    multistream_sort,
    parse_args,
)
from numba import cuda

import numba_streamsafe as nss


def pipeline(build: np.ndarray, probe: np.ndarray, collect: Any, workers: list[Any],
             build_stream: Any, probe_streams: list[Any]) -> tuple[np.ndarray, list[np.ndarray],
                                                                   np.ndarray]:
    n = build.size
    d_build = nss.to_device(build, stream=collect, tag="build keys")
    d_sorted = multistream_sort(d_build, n, workers, collect)
    del d_build  # freed on the collector stream after the workers' reads
    parts = np.array_split(probe, len(probe_streams))
    d_parts = [nss.to_device(p, stream=s, tag="probe keys") for p, s in zip(parts, probe_streams)]
    outs, table_keys, table_vals = hash_join(d_sorted, d_parts, build_stream, probe_streams)
    del d_sorted, table_keys, table_vals  # still being read by the probes: frees are fenced
    total = nss.device_array(1, np.int64, stream=collect, tag="match count")
    nss.memset(total, 0, stream=collect)
    for out in outs:
        g, b = launch_shape(out.size)
        count_matches[g, b, collect](out, total)
    results = [nss.copy_to_host(o, stream=s) for o, s in zip(outs, probe_streams)]
    count = nss.copy_to_host(total, stream=collect)
    for s in [collect, *probe_streams]:
        s.synchronize()
    return count, results, parts


def run(n: int, nstreams: int, tracking: bool, seed: int) -> Report:
    build, probe = make_relations(n, seed)
    collect = cuda.stream()
    workers = [cuda.stream() for _ in range(nstreams)]
    build_stream = cuda.stream()
    probe_streams = [cuda.stream() for _ in range(nstreams)]
    before = hazards_now()
    with nss.tracking(tracking), Timer() as t:
        count, results, _ = pipeline(build, probe, collect, workers, build_stream, probe_streams)
    sorted_build = np.sort(build)
    pos = np.minimum(np.searchsorted(sorted_build, probe), n - 1)
    expected = np.where(sorted_build[pos] == probe, pos, -1)
    got = np.concatenate(results)
    report = Report("sort -> join pipeline", n, tracking, seconds=t.seconds)
    report.checks["every probe finds its key's rank in the sorted build keys"] = bool(
        np.array_equal(got, expected))
    report.checks["match count equals NumPy's"] = int(count[0]) == int((expected >= 0).sum())
    report.hazards = hazards_now() - before
    return report


def main() -> int:
    args = parse_args(__doc__.splitlines()[0])
    for _ in range(args.repeat):
        report = run(args.n, args.streams, not args.no_tracking, args.seed)
    report.print()
    return 0 if (args.no_tracking or (report.correct and report.hazards == 0)) else 1


if __name__ == "__main__":
    raise SystemExit(main())
