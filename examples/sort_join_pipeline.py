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

``--graph`` runs stages 3 and 4 as one CUDA graph on the collector stream:
captured once (``nss.graph``), then replayed with one ``cuGraphLaunch``, which
the library orders after the probe keys' uploads and the build, like the
launches it stands for; the results are downloaded after the replay.
"""

from __future__ import annotations

from functools import lru_cache, partial
from typing import Any

import numpy as np
from cli import Report, Timer, run_main
from data import MAX_JOIN_N, HostBatches, expected_rank, make_relations, pinned_copy
from kernels_join import ROW, build_table, count_matches, hash_probe
from kernels_sort import PAD, bitonic_sort, copy_into, fill, merge_runs, next_pow2
from numba import cuda
from target import (  # the GPU, or the simulator without one
    hazards_now,
    host_sync,
    launch_shape,
    race_text,
)

import numba_streamsafe as nss


def sort_build_keys(build: np.ndarray, workers: list[Any], collect: Any, upload: Any) -> Any:
    """1. Sort the build keys while they upload: chunk by chunk, each sorted as it arrives.

    Chunk ``i`` is allocated on (and freed on) worker ``i``, copied into on the
    upload stream, and sorted on the worker. Sorted runs are merged pairwise as
    soon as two of the same length are ready (a binary counter), on the stream
    of the older run; the last merge runs on ``collect``.
    """
    runs: list[tuple[Any, int, Any]] = []  # (sorted run, chunks merged into it, its stream)
    for i, chunk in enumerate(np.array_split(build, min(len(workers), build.size))):
        s = workers[i % len(workers)]
        d_chunk = nss.device_array(chunk.shape, chunk.dtype, stream=s, tag=f"build chunk {i}")
        nss.to_device(chunk, stream=upload, to=d_chunk, tag=f"build chunk {i}")
        run = d_chunk
        cap = next_pow2(chunk.size)
        if cap != chunk.size:  # bitonic sort needs a power of two: pad above every key
            run = nss.device_array(cap, np.int64, stream=s, tag=f"padded chunk {i}")
            g, b = launch_shape(cap)
            fill[g, b, s](run, PAD)
            g, b = launch_shape(chunk.size)
            copy_into[g, b, s](d_chunk, run[:chunk.size])
        del d_chunk
        bitonic_sort(run, s)  # waits for the chunk's upload on the upload stream
        runs.append((run[:chunk.size], 1, s))
        del run
        while len(runs) > 1 and runs[-1][1] == runs[-2][1]:
            merge_last_two(runs, runs[-2][2])
    while len(runs) > 1:
        merge_last_two(runs, collect if len(runs) == 2 else runs[-2][2])
    return runs[0][0]


def merge_last_two(runs: list[tuple[Any, int, Any]], stream: Any) -> None:
    """Merge the two newest sorted runs on ``stream`` (each may come from another stream)."""
    (a, wa, _), (b, wb, _) = runs[-2], runs[-1]
    del runs[-2:]
    out = nss.device_array(a.size + b.size, np.int64, stream=stream, tag="merged run")
    g, bl = launch_shape(out.size)
    merge_runs[g, bl, stream](a, b, out)
    runs.append((out, wa + wb, stream))
    # a and b are freed here, on their own streams, after the merge's reads


def probe(batches: HostBatches, table: Any, mask: int, probe_streams: list[Any],
          upload: Any) -> list[Any]:
    """3. Upload every probe batch on the upload stream, then probe and download each
    batch on a probe stream (round robin). Returns the device result of every batch."""
    # Allocated on the upload stream and all queued before any is dropped,
    # so no free (which waits for its probe) holds up a later upload.
    staged = [nss.to_device(keys, stream=upload, tag="probe keys") for keys in batches.keys]
    outs = []
    for j, (keys, result) in enumerate(zip(batches.keys, batches.results, strict=True)):
        s = probe_streams[j % len(probe_streams)]
        d_keys = staged[j]
        out = nss.device_array(keys.size, ROW, stream=s, tag="probe result")
        g, b = launch_shape(keys.size)
        hash_probe[g, b, s](d_keys, table, out, mask)  # waits for the upload and the build
        nss.copy_to_host(out, result, stream=s)
        outs.append(out)
    del staged  # freed on the upload stream after their probes' reads
    return outs


def probe_and_count(batches: HostBatches, table: tuple[Any, int], collect: Any,
                    probe_streams: list[Any], upload: Any) -> np.ndarray:
    """3. and 4.: probe, then count the matches of every batch on ``collect``."""
    outs = probe(batches, *table, probe_streams, upload)
    total = nss.device_array(1, np.int64, stream=collect, tag="match count")
    nss.memset(total, 0, stream=collect)
    for out in outs:
        g, b = launch_shape(out.size)
        count_matches[g, b, collect](out, total)  # waits for the batch's probe
    count = nss.copy_to_host(total, stream=collect)
    for s in [collect, *probe_streams, upload]:
        host_sync(s)
    return count


def probe_and_count_graph(batches: HostBatches, table: tuple[Any, int], collect: Any,
                          probe_streams: list[Any], upload: Any) -> np.ndarray:
    """3. and 4. as one CUDA graph on ``collect``: every batch probed, then counted.

    The keys upload on the upload stream as before. The graph is captured once
    and replayed once; the replay waits for the uploads and for the build (the
    library orders it as one operation reading the keys and the table), and
    the downloads after it wait for it. ``probe_streams`` are not used: a
    graph holds the work of one stream.
    """
    d_table, mask = table
    staged = [nss.to_device(keys, stream=upload, tag="probe keys") for keys in batches.keys]
    outs = [nss.device_array(keys.size, ROW, stream=collect, tag="probe result")
            for keys in batches.keys]
    total = nss.device_array(1, np.int64, stream=collect, tag="match count")
    # Compile and load the kernels before the capture (driver calls a capture
    # may refuse): one launch of each on a one-key slice (the same types).
    g, b = launch_shape(outs[0].size)
    hash_probe[g, b, collect](staged[0][:1], d_table, outs[0][:1], mask)
    count_matches[g, b, collect](outs[0][:1], total)
    with nss.graph(collect) as graph:  # nothing runs here: the launches are recorded
        nss.memset(total, 0, stream=collect)
        for d_keys, out in zip(staged, outs, strict=True):
            g, b = launch_shape(out.size)
            hash_probe[g, b, collect](d_keys, d_table, out, mask)
            count_matches[g, b, collect](out, total)
    graph.launch()  # one cuGraphLaunch, after the uploads and the build
    for out, result in zip(outs, batches.results, strict=True):
        nss.copy_to_host(out, result, stream=collect)
    count = nss.copy_to_host(total, stream=collect)
    for s in [collect, *probe_streams, upload]:
        host_sync(s)
    graph.close()  # the graph held the keys, results and count; they go with it
    return count


def sort_join(build: np.ndarray, batches: HostBatches, collect: Any, workers: list[Any],
              build_stream: Any, probe_streams: list[Any], upload: Any,
              graph: bool = False) -> np.ndarray:
    """The whole pipeline; results land in ``batches.results``, returns the match count.
    With ``graph``, stages 3 and 4 run as one CUDA graph (:func:`probe_and_count_graph`)."""
    d_sorted = sort_build_keys(build, workers, collect, upload)
    table = build_table(d_sorted, build_stream)  # 2. payload: the key's rank
    del d_sorted  # still being read by the build: its free waits for it
    stages = probe_and_count_graph if graph else probe_and_count
    return stages(batches, table, collect, probe_streams, upload)


@lru_cache(maxsize=1)
def inputs(n: int, seed: int, nbatches: int) -> tuple[np.ndarray, HostBatches, np.ndarray]:
    """Pinned build keys, pinned probe batches and the NumPy answer, made once per process."""
    build, probe_keys = make_relations(n, seed)
    return pinned_copy(build), HostBatches.of(probe_keys, nbatches), expected_rank(build,
                                                                                   probe_keys)


def run(n: int, nstreams: int, tracking: bool, seed: int, graph: bool = False) -> Report:
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
        count = sort_join(build, batches, collect, workers, build_stream, probe_streams, upload,
                          graph)
    got = np.concatenate(batches.results)
    report = Report("sort -> join pipeline" + (" (probe stage as a CUDA graph)" if graph else ""),
                    n, tracking, seconds=t.seconds)
    report.checks["every probe finds its key's rank in the sorted build keys"] = bool(
        np.array_equal(got, expected))
    report.checks["match count equals NumPy's"] = int(count[0]) == int((expected >= 0).sum())
    report.hazards = hazards_now() - before
    report.first_race = race_text(before)
    return report


def main() -> int:
    return run_main(run, __doc__.splitlines()[0], max_n=MAX_JOIN_N,
                    graph=partial(run, graph=True))


if __name__ == "__main__":
    raise SystemExit(main())
