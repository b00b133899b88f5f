"""The examples' sort -> join pipeline, written once against an :class:`~orderings.Ordering`.

The benchmarks run it ordered four ways (see ``pipeline.py``). With the
tracked ``Ordering()`` every ``order.*`` call but ``alloc`` and ``upload`` does
nothing, and the GPU work is that of the examples (``examples/multistream_sort.py``,
``hash_join.py``, ``sort_join_pipeline.py``), which carry it as straight-line
code: ``tests/numba/test_examples_match_benchmarks.py`` checks that both queue
the same driver calls.
"""

from __future__ import annotations

from typing import Any

import _harness  # noqa: F401  (puts examples/ on the path, picks the target)
import numpy as np
from data import HostBatches
from kernels_join import EMPTY, ROW, count_matches, hash_build, hash_probe
from kernels_sort import (
    KEY_BITS,
    PAD,
    bitonic_sort,
    copy_into,
    fill,
    gather_bucket,
    histogram,
    merge_runs,
    next_pow2,
)
from orderings import Ordering
from target import host_sync, launch_shape

import numba_streamsafe as nss


def multistream_sort(d_keys: Any, n: int, streams: list[Any], collect: Any,
                     order: Ordering | None = None) -> Any:
    """Sort ``d_keys`` (uniform keys below 2**KEY_BITS) with one bucket per stream.

    A histogram on ``collect`` sizes the buckets; each worker stream gathers
    and bitonic-sorts its bucket; ``collect`` then copies the buckets into one
    sorted array, reading what the workers wrote.
    """
    order = order or Ordering()
    nb = len(streams)
    shift = KEY_BITS - (nb.bit_length() - 1)
    counts = order.alloc(nb, np.int64, collect, "bucket counts")
    nss.memset(counts, 0, stream=collect)
    g, b = launch_shape(n)
    histogram[g, b, collect](d_keys, counts, shift)
    sizes = nss.copy_to_host(counts, stream=collect)
    host_sync(collect)  # the bucket sizes are needed on the host

    buckets = []
    done = []
    for i, s in enumerate(streams):
        cap = next_pow2(max(int(sizes[i]), 1))
        out = order.alloc(cap, np.int64, s, f"bucket {i}")
        cursor = order.alloc(1, np.int64, s, f"cursor {i}")
        gc_, bc = launch_shape(cap)
        fill[gc_, bc, s](out, PAD)
        nss.memset(cursor, 0, stream=s)
        gather_bucket[g, b, s](d_keys, out, cursor, i, shift)
        bitonic_sort(out, s)
        buckets.append(out)
        done.append(order.mark(s))
    order.stage()

    result = order.alloc(n, np.int64, collect, "sorted")
    offset = 0
    for i, out in enumerate(buckets):
        size = int(sizes[i])
        order.wait(collect, done[i])
        if size:
            gs, bs = launch_shape(size)
            copy_into[gs, bs, collect](out[:size], result[offset:offset + size])
        offset += size
    del buckets, out  # freed on their worker streams, after collect's reads
    order.stage()
    return result


def streamed_sort(host_keys: np.ndarray, streams: list[Any], collect: Any, chunks: int,
                  order: Ordering | None = None, strides_per_pass: int = 2,
                  upload: Any = None) -> tuple[Any, Any]:
    """Sort host keys while they upload: chunk by chunk, each sorted as it arrives.

    Chunk ``i`` is uploaded and bitonic-sorted on ``streams[i % len(streams)]``
    (uploaded on the ``upload`` stream instead when given, into memory of the
    sorting stream: see :meth:`Ordering.upload_for`), so the upload of one
    chunk overlaps the sort of the chunks before it. From
    pinned memory (:func:`pinned_copy`) the uploads are asynchronous and run on
    the copy engine. From pageable memory the host stages each chunk itself,
    and an upload waits for its stream's earlier work, so more chunks than
    streams make the host wait for sorts.
    The sorted runs are merged pairwise as soon as two of the same length are
    ready (a binary counter), on the stream of the older run; the last merge
    runs on ``collect``. ``strides_per_pass`` is :func:`bitonic_sort`'s.
    Returns the sorted device array and the ordering token after which it may
    be read.
    """
    order = order or Ordering()
    n = host_keys.size
    if n == 0:
        raise ValueError("streamed_sort needs at least one key")
    if chunks < 1:
        raise ValueError(f"chunks must be at least 1, got {chunks}")
    runs: list[tuple[Any, int, Any, Any]] = []  # (sorted run, chunks merged, stream, token)

    def merge(last: bool) -> None:
        (a, wa, sa, ta), (b, wb, _, tb) = runs[-2], runs[-1]
        del runs[-2:]
        s = collect if last else sa
        order.wait(s, ta)
        order.wait(s, tb)
        out = order.alloc(a.size + b.size, np.int64, s, "merged run")
        g, bl = launch_shape(out.size)
        merge_runs[g, bl, s](a, b, out)
        runs.append((out, wa + wb, s, order.mark(s)))
        # a and b are freed here, on their own streams, after the merge's reads

    for i, chunk in enumerate(np.array_split(host_keys, max(1, min(chunks, n)))):
        s = streams[i % len(streams)]
        d_chunk = (order.upload(chunk, s, f"build chunk {i}") if upload is None
                   else order.upload_for(chunk, s, upload, f"build chunk {i}"))
        cap = next_pow2(chunk.size)
        run = d_chunk
        if cap != chunk.size:  # bitonic sort needs a power of two: pad above every key
            run = order.alloc(cap, np.int64, s, f"padded chunk {i}")
            g, b = launch_shape(cap)
            fill[g, b, s](run, PAD)
            g, b = launch_shape(chunk.size)
            copy_into[g, b, s](d_chunk, run[:chunk.size])
        del d_chunk
        bitonic_sort(run, s, strides_per_pass)
        runs.append((run[:chunk.size], 1, s, order.mark(s)))
        del run
        order.stage()
        while len(runs) > 1 and runs[-1][1] == runs[-2][1]:
            merge(last=False)
            order.stage()
    while len(runs) > 1:
        merge(last=len(runs) == 2)
        order.stage()
    result, _, _, token = runs[0]
    return result, token


def build_table(d_build: Any, build_stream: Any, order: Ordering | None = None,
                build_ready: Any = None) -> tuple[Any, int, Any]:
    """Insert ``d_build`` into an open-addressing table on ``build_stream``.

    ``build_ready`` is the ordering token after which ``d_build`` may be read.
    Returns the table (key and payload interleaved, see :func:`hash_build`),
    its slot mask, and the token after which the table may be probed.
    """
    order = order or Ordering()
    nb = d_build.size
    cap = next_pow2(2 * max(nb, 1))
    table = order.alloc(2 * cap, np.int64, build_stream, "hash table")
    g, b = launch_shape(2 * cap)
    fill[g, b, build_stream](table, EMPTY)
    order.wait(build_stream, build_ready)
    g, b = launch_shape(nb)
    hash_build[g, b, build_stream](d_build, table, cap - 1)
    built = order.mark(build_stream)
    order.stage()
    return table, cap - 1, built


def probe_batches(batches: HostBatches, table: tuple[Any, int, Any], probe_streams: list[Any],
                  order: Ordering | None = None, upload: Any = None) -> list[Any]:
    """Stream the probe batches through the table, round robin over ``probe_streams``.

    Each batch is uploaded, probed and its result downloaded (into
    ``batches.results``) on its stream, so the copies of one batch overlap the
    probing of others. With an ``upload`` stream, every batch is uploaded there
    first, one after the other, and the probes wait for their batch: the keys
    then arrive while the table is built instead of after the probes queued
    before them on the same stream. Returns the device result of every batch.
    """
    order = order or Ordering()
    slots, mask, built = table
    staged: list[Any] = []
    if upload is not None:
        # Allocated on the upload stream and all queued before any is dropped,
        # so no free (fenced after its probe) holds up a later upload.
        uploaded = []
        for keys in batches.keys:
            staged.append(order.upload(keys, upload, "probe keys"))
            uploaded.append(order.mark(upload))
        order.stage()
    outs = []
    for j, (keys, result) in enumerate(zip(batches.keys, batches.results, strict=True)):
        s = probe_streams[j % len(probe_streams)]
        if upload is None:
            d_keys = order.upload(keys, s, "probe keys")
        else:
            d_keys = staged[j]
            order.wait(s, uploaded[j])
        out = order.alloc(keys.size, ROW, s, "probe result")
        order.wait(s, built)
        g, b = launch_shape(keys.size)
        hash_probe[g, b, s](d_keys, slots, out, mask)
        nss.copy_to_host(out, result, stream=s)
        outs.append(out)
        order.stage()
    del staged  # freed on the upload stream after their probes' reads
    return outs


def sort_join(build: np.ndarray, batches: HostBatches, collect: Any, workers: list[Any],
              build_stream: Any, probe_streams: list[Any], order: Ordering | None = None,
              chunks: int | None = None, strides_per_pass: int = 2,
              upload: Any = None) -> np.ndarray:
    """The sort -> join pipeline.

    The build keys are uploaded in ``chunks`` pieces (default: one per worker
    stream) and sorted as they arrive (:func:`streamed_sort`), the sorted keys
    inserted into a hash table (payload: the key's rank), the probe batches
    streamed through it, and the matches counted on ``collect``. Results land
    in ``batches.results``; returns the match count. ``strides_per_pass`` is
    :func:`bitonic_sort`'s. With an ``upload`` stream every host-to-device copy
    runs there, the build keys first, so the probe keys do not share the
    copy engine with the build keys that the sort is waiting for.
    """
    order = order or Ordering()
    d_sorted, sorted_ready = streamed_sort(build, workers, collect, chunks or len(workers),
                                           order, strides_per_pass, upload)
    table = build_table(d_sorted, build_stream, order, sorted_ready)
    del d_sorted  # still being read by the build: the free is fenced
    return join_probes(batches, table, collect, probe_streams, order, upload)


def join_probes(batches: HostBatches, table: tuple[Any, int, Any], collect: Any,
                probe_streams: list[Any], order: Ordering, upload: Any = None) -> np.ndarray:
    """Probe ``table`` with every batch and count the matches on ``collect``.

    Synchronises the host with every stream used and ends ``order``'s run.
    """
    outs = probe_batches(batches, table, probe_streams, order, upload)
    del table  # still being read by the probes: the frees are fenced
    probed = [order.mark(s) for s in probe_streams]
    total = order.alloc(1, np.int64, collect, "match count")
    nss.memset(total, 0, stream=collect)
    for token in probed:
        order.wait(collect, token)
    for out in outs:
        g, b = launch_shape(out.size)
        count_matches[g, b, collect](out, total)
    count = nss.copy_to_host(total, stream=collect)
    order.stage()
    for s in [collect, *probe_streams, *([upload] if upload is not None else [])]:
        host_sync(s)
    order.finish()
    return count


def bucket_sort_join(build: np.ndarray, batches: HostBatches, collect: Any, workers: list[Any],
                     build_stream: Any, probe_streams: list[Any],
                     order: Ordering | None = None) -> np.ndarray:
    """The same join after uploading all build keys and then bucket-sorting them.

    A serial chain (upload, then sort, then build): only the probe batches can
    overlap. Kept to compare with :func:`sort_join`.
    """
    order = order or Ordering()
    d_build = order.upload(build, collect, "build keys")
    d_sorted = multistream_sort(d_build, build.size, workers, collect, order)
    sorted_ready = order.mark(collect)
    del d_build  # freed on the collector stream after the workers' reads
    table = build_table(d_sorted, build_stream, order, sorted_ready)
    del d_sorted
    return join_probes(batches, table, collect, probe_streams, order)
