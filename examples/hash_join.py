"""Multi-stream hash join: build on one stream, probe partitions on others.

The build relation is uploaded and inserted into an open-addressing table on
the build stream; each probe stream uploads its own part of the probe relation
and looks every key up in the shared table. Results are checked against a
NumPy join. ``--no-tracking`` launches the same kernels unfenced.
"""

from __future__ import annotations

import common  # sets up the target (GPU, or the simulator without one)
import numpy as np
from common import Report, Timer, expected_probe, hash_join, hazards_now, make_relations, parse_args
from numba import cuda

import numba_streamsafe as nss


def run(n: int, nstreams: int, tracking: bool, seed: int) -> Report:
    build, probe = make_relations(n, seed)
    parts = np.array_split(probe, nstreams)
    build_stream = cuda.stream()
    probe_streams = [cuda.stream() for _ in range(nstreams)]
    before = hazards_now()
    with nss.tracking(tracking), Timer() as t:
        d_build = nss.to_device(build, stream=build_stream, tag="build keys")
        d_parts = [nss.to_device(p, stream=s, tag="probe keys")
                   for p, s in zip(parts, probe_streams)]
        outs, _, _ = hash_join(d_build, d_parts, build_stream, probe_streams)
        got = [nss.copy_to_host(o, stream=s) for o, s in zip(outs, probe_streams)]
        for s in probe_streams:
            s.synchronize()
    report = Report("multi-stream hash join", n, tracking, seconds=t.seconds)
    report.checks["join equals the NumPy join"] = bool(
        np.array_equal(np.concatenate(got), expected_probe(build, probe)))
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
