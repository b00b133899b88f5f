"""Where the time of the sort -> join pipeline goes, phase by phase.

Not a benchmark of record: a diagnostic for ``pipeline.py``. Runs the
pipeline's phases (upload and sort, table build, probe batches) one after the
other with a device synchronize between them, for the tracked ordering and
for a device-wide synchronize after every stage, and prints the median wall
time of each phase. ``--sort bucket`` times the serial variant, whose upload
and sort are separate phases.
"""

from __future__ import annotations

import argparse
import statistics
import time

from _harness import SIMULATOR, cuda, device_name
from data import HostBatches, make_relations, pinned_copy
from ordered_pipeline import build_table, multistream_sort, probe_batches, streamed_sort
from orderings import ORDERINGS

import numba_streamsafe as nss


def phases(kind: str, build, batches, streams, sort: str) -> dict[str, float]:
    order = ORDERINGS[kind]()
    collect, workers, build_stream, probe_streams = streams
    out: dict[str, float] = {}

    def timed(name, fn):
        cuda.synchronize()
        start = time.perf_counter()
        value = fn()
        cuda.synchronize()
        out[name] = time.perf_counter() - start
        return value

    with nss.tracking(order.tracking):
        if sort == "bucket":
            d_build = timed("upload build", lambda: order.upload(build, collect, "build keys"))
            d_sorted = timed("sort", lambda: multistream_sort(
                d_build, build.size, workers, collect, order))
            ready = order.mark(collect)
        else:
            d_sorted, ready = timed("upload and sort", lambda: streamed_sort(
                build, workers, collect, len(workers), order))
        table = timed("build table", lambda: build_table(d_sorted, build_stream, order, ready))
        timed("probe batches", lambda: probe_batches(batches, table, probe_streams, order))
    order.finish()
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=1 << 9 if SIMULATOR else 1 << 24)
    parser.add_argument("--rounds", type=int, default=1 if SIMULATOR else 5)
    parser.add_argument("--streams", type=int, default=4)
    parser.add_argument("--batches", type=int, default=8)
    parser.add_argument("--sort", choices=("streamed", "bucket"), default="streamed")
    parser.add_argument("--build-memory", choices=("pinned", "pageable"), default="pinned")
    args = parser.parse_args()
    build, probe = make_relations(args.n, 1)
    if args.build_memory == "pinned":
        build = pinned_copy(build)
    batches = HostBatches.of(probe, args.batches)
    streams = (cuda.stream(), [cuda.stream() for _ in range(args.streams)], cuda.stream(),
               [cuda.stream() for _ in range(args.streams)])
    kinds = ("tracked", "sync")
    samples: dict[str, dict[str, list[float]]] = {k: {} for k in kinds}
    for round_ in range(args.rounds + 1):
        for kind in kinds:
            for name, seconds in phases(kind, build, batches, streams, args.sort).items():
                if round_:
                    samples[kind].setdefault(name, []).append(seconds)
    print(f"pipeline phases ({args.sort} sort, build keys in {args.build_memory} memory), "
          f"n={args.n}, median of {args.rounds}, on {device_name()}")
    for kind in kinds:
        row = "  ".join(f"{name} {statistics.median(v) * 1e3:7.2f} ms"
                        for name, v in samples[kind].items())
        print(f"  {kind:8s} {row}")


if __name__ == "__main__":
    main()
