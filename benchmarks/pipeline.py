"""The sort -> join pipeline, ordered four ways, timed side by side in one process.

The pipeline is the one of ``examples/sort_join_pipeline.py``, written against an
ordering in ``ordered_pipeline.py`` (orderings in ``orderings.py``): the build keys
uploaded from pinned host memory in chunks and sorted as they arrive, a hash
table built from them, and the probe keys streamed through it in batches of
pinned host memory. ``--build-memory pageable`` uploads the build keys from
pageable memory instead (the host stages every chunk, so the upload can overlap
only the GPU's sort); ``--strides-per-pass 1`` sorts with one bitonic stride
per global pass instead of two; ``--uploads per-stream`` uploads every chunk and
batch on the stream that uses it instead of on one upload stream (where the build
keys go first); ``--pool-internal-deps off`` stops the default
pool from reusing a block freed on another stream by making the allocating
stream wait for the freeing one; ``--sort bucket`` times the serial variant (upload
everything, then a bucketed multi-stream sort). JSON goes to ``--name`` (default
``pipeline``, ``pipeline-pageable`` or ``pipeline-bucket``).

* ``tracked``: the library orders the streams (lazy events, the default);
* ``tracked-eager``: the same with an event recorded after every launch;
* ``sync``: no tracking, a device-wide synchronize after every stage;
* ``events``: no tracking, one hand-placed event per cross-stream edge (the limit).

The kinds run interleaved, round after round, after a warm-up; medians are
reported. Every round also records the process's CPU seconds and Python's
collections (``host`` in the JSON), and each kind's slowest round is printed
with them. The collections tell whether Python's collector ran in a slow
round. The CPU seconds tell a wait from work only where the host sleeps while
it waits: the driver's default synchronize spins, so there they follow the
wall time either way.

Peak device memory is sampled at every stage boundary (driver ``cuMemGetInfo``)
for the tracked run and for the same pipeline on Numba's default memory manager
with a synchronize after every stage (what users write today).
"""

from __future__ import annotations

import argparse
import functools
import gc
import statistics
import time

import numpy as np
from _harness import SIMULATOR, cuda, device_name, write_result
from data import HostBatches, expected_rank, make_relations, pinned_copy
from ordered_pipeline import bucket_sort_join, sort_join
from orderings import ORDERINGS
from target import hazards_now

import numba_streamsafe as nss
from numba_streamsafe import AsyncResource, DeviceRuntime


def sampling(cls: type) -> type:
    """``cls`` with device memory sampled at every stage boundary."""

    class Sampled(cls):  # type: ignore[misc, valid-type]
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            self.samples: list[int] = []

        def sample(self) -> None:
            free, total = nss.get_runtime().driver.mem_info()
            self.samples.append(total - free)

        def stage(self) -> None:
            super().stage()
            self.sample()

    return Sampled


class HostStats:
    """What the host did during a run: its CPU seconds and Python's collections.

    With the driver's default (spinning) synchronize the CPU time follows the
    wall time even while the host waits for the GPU; the collections show
    whether Python's collector ran.
    """

    def __init__(self) -> None:
        self.collections = [0, 0, 0]  # per generation
        self.collector_s = 0.0
        self._started = 0.0

    def __call__(self, phase: str, info: dict) -> None:  # a gc.callbacks entry
        if phase == "start":
            self._started = time.perf_counter()
        else:
            self.collections[info["generation"]] += 1
            self.collector_s += time.perf_counter() - self._started


def one_run(kind: str, build, batches, streams, allocator: str = "streamsafe",
            sample: bool = False, pipeline=sort_join):
    """Time one run of ``pipeline`` ordered as ``kind``.

    Returns ``(seconds, count, results, memory samples, host)``, ``host`` a
    dict of the run's process CPU seconds and collector activity.
    """
    cls = ORDERINGS["tracked" if kind == "tracked-eager" else kind]
    order = sampling(cls)(allocator) if sample else cls(allocator)
    collect, workers, build_stream, probe_streams = streams
    if sample:
        order.sample()
    cuda.synchronize()
    stats = HostStats()
    gc.callbacks.append(stats)
    try:
        cpu = time.process_time()
        start = time.perf_counter()
        with nss.tracking(order.tracking):
            count = pipeline(build, batches, collect, workers, build_stream, probe_streams, order)
        cuda.synchronize()
        seconds = time.perf_counter() - start
        cpu = time.process_time() - cpu
    finally:
        gc.callbacks.remove(stats)
    results = np.concatenate(batches.results)
    for r in batches.results:
        r[...] = -2  # a stale result cannot pass the next run's check
    host = {"cpu_s": cpu, "collections": stats.collections, "collector_s": stats.collector_s}
    return seconds, count, results, getattr(order, "samples", []), host


def release_everything() -> None:
    """Return cached memory of both allocators, so memory samples start level."""
    gc.collect()
    cuda.synchronize()
    for rt in {nss.get_runtime()}:
        rt.flush()
        rt.reap()
        rt.driver.pool_trim(0)
    if not SIMULATOR:
        cuda.current_context().deallocations.clear()


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line (``argv``, default ``sys.argv[1:]``)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=1 << 9 if SIMULATOR else 1 << 24)
    parser.add_argument("--rounds", type=int, default=1 if SIMULATOR else 15)
    parser.add_argument("--streams", type=int, default=4)
    parser.add_argument("--batches", type=int, default=8, help="probe batches (default 8)")
    parser.add_argument("--sort", choices=("streamed", "bucket"), default="streamed",
                        help="the pipeline's sort (default: the example's, streamed)")
    parser.add_argument("--chunks", type=int, default=None,
                        help="build-key chunks of the streamed sort (default: one per stream)")
    parser.add_argument("--strides-per-pass", type=int, choices=(1, 2), default=2,
                        help="bitonic strides per global pass of the streamed sort (default 2)")
    parser.add_argument("--uploads", choices=("one-stream", "per-stream"), default="one-stream",
                        help="where the host-to-device copies run: all on one upload stream, "
                             "build keys first (default, the example's), or each on the "
                             "stream that uses the data")
    parser.add_argument("--build-memory", choices=("pinned", "pageable"), default="pinned",
                        help="host memory the build keys upload from (default: pinned)")
    parser.add_argument("--pool-internal-deps", choices=("on", "off"), default="on",
                        help="the default pool's CU_MEMPOOL_ATTR_REUSE_ALLOW_INTERNAL_DEPENDENCIES "
                             "for this process (default: on, the driver's default)")
    parser.add_argument("--name", default=None,
                        help="JSON name under $NSS_BENCH_DIR (default: pipeline, "
                             "pipeline-pageable or pipeline-bucket)")
    args = parser.parse_args(argv)
    if args.sort == "bucket" and (args.chunks is not None or args.strides_per_pass
                                  != parser.get_default("strides_per_pass")
                                  or args.uploads != parser.get_default("uploads")):
        parser.error("--chunks, --strides-per-pass and --uploads apply to the streamed sort only")
    if args.sort == "bucket":
        args.uploads = None  # the serial variant uploads on its collector stream
    return args


def prepare(args: argparse.Namespace):
    """What every run of ``args``' pipeline takes: ``(pipeline, build keys, probe
    batches, expected answer, streams)``, ``streams`` as :func:`one_run` takes them."""
    upload = cuda.stream() if args.uploads == "one-stream" else None
    pipeline = (bucket_sort_join if args.sort == "bucket"
                else functools.partial(sort_join, chunks=args.chunks,
                                       strides_per_pass=args.strides_per_pass, upload=upload))

    build, probe = make_relations(args.n, 1)
    if args.build_memory == "pinned":
        build = pinned_copy(build)
    batches = HostBatches.of(probe, args.batches)
    expected = expected_rank(build, probe)
    streams = (cuda.stream(), [cuda.stream() for _ in range(args.streams)], cuda.stream(),
               [cuda.stream() for _ in range(args.streams)])
    return pipeline, build, batches, expected, streams


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    pipeline, build, batches, expected, streams = prepare(args)

    lazy_rt = nss.get_runtime()
    if args.pool_internal_deps == "off":
        # A block freed on one stream is then reused on another only when the pool
        # knows the free has completed or is ordered before the allocation.
        lazy_rt.driver.set_pool_attribute("REUSE_ALLOW_INTERNAL_DEPENDENCIES", 0)
    eager_rt = DeviceRuntime(AsyncResource(lazy_rt.driver, fences="eager"))
    kinds = ["tracked", "tracked-eager", "sync", "events"]
    times: dict[str, list[float]] = {k: [] for k in kinds}
    host: dict[str, list[dict]] = {k: [] for k in kinds}
    # On the simulator "correct" also means: no hazard seen by the simulated driver.
    correct: dict[str, bool] = {k: True for k in kinds}
    for round_ in range(args.rounds + 1):  # the first round warms up
        for kind in kinds:
            nss.set_runtime(eager_rt if kind == "tracked-eager" else lazy_rt)
            before = hazards_now()
            seconds, count, results, _, used = one_run(kind, build, batches, streams,
                                                       pipeline=pipeline)
            ok = np.array_equal(results, expected) and hazards_now() == before
            correct[kind] &= bool(ok) and int(count[0]) == int((expected >= 0).sum())
            if round_:
                times[kind].append(seconds)
                host[kind].append(used)
    nss.set_runtime(lazy_rt)

    release_everything()
    _, _, _, ours, _ = one_run("tracked", build, batches, streams, sample=True,
                               pipeline=pipeline)
    release_everything()
    _, _, _, numba, _ = one_run("sync", build, batches, streams, allocator="numba",
                                sample=True, pipeline=pipeline)
    peak_ours = max(ours) - ours[0]
    peak_numba = max(numba) - numba[0]

    med = {k: statistics.median(v) for k, v in times.items()}
    result = {
        "n": args.n,
        "sort": args.sort,
        "chunks": (args.chunks or args.streams) if args.sort == "streamed" else None,
        "build_memory": args.build_memory,
        "uploads": args.uploads,
        "strides_per_pass": args.strides_per_pass,
        "pool_internal_deps": args.pool_internal_deps,
        "rounds": args.rounds,
        "median_s": med,
        "samples_s": times,
        "host": host,
        "correct": correct,
        "tracked_over_sync": med["tracked"] / med["sync"],
        "tracked_throughput_vs_events": med["events"] / med["tracked"],
        "eager_over_lazy": med["tracked-eager"] / med["tracked"],
        "peak_bytes": {"ours": peak_ours, "numba_default": peak_numba},
        "peak_ours_over_numba": peak_ours / peak_numba if peak_numba else float("nan"),
    }
    uploads = f", uploads {args.uploads}" if args.uploads else ""
    print(f"sort -> join pipeline ({args.sort} sort, build keys in {args.build_memory} memory"
          f"{uploads}), "
          f"n={args.n}, {args.rounds} rounds, on {device_name()}")
    for kind in kinds:
        slowest = max(range(len(times[kind])), key=times[kind].__getitem__)
        h = host[kind][slowest]
        cpu_median = statistics.median(x["cpu_s"] for x in host[kind])
        print(f"  {kind:14s} median {med[kind] * 1e3:8.2f} ms  "
              f"{'correct' if correct[kind] else 'WRONG'}  "
              f"(slowest round {times[kind][slowest] * 1e3:.2f} ms: host CPU "
              f"{h['cpu_s'] * 1e3:.2f} ms, median {cpu_median * 1e3:.2f}; "
              f"collections {h['collections']} in {h['collector_s'] * 1e3:.2f} ms)")
    print(f"  tracked / sync            {result['tracked_over_sync']:.3f}")
    print(f"  throughput vs hand events {result['tracked_throughput_vs_events']:.3f}")
    print(f"  eager / lazy              {result['eager_over_lazy']:.3f}")
    print(f"  peak bytes ours {peak_ours}  numba default {peak_numba}")
    default_name = ("pipeline-bucket" if args.sort == "bucket"
                    else "pipeline-pageable" if args.build_memory == "pageable" else "pipeline")
    write_result(args.name or default_name, result)
    return result


if __name__ == "__main__":
    main()
