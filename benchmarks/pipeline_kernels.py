"""The pipeline's kernels and copies one at a time, on one stream.

Not a benchmark of record: a diagnostic for ``pipeline.py``, showing which
parts of the sort -> join pipeline take the GPU's time. Each item runs alone
on one stream with a synchronize around it; medians over ``--rounds`` runs
after one warm-up. The bitonic sort is timed at both pass widths
(``strides_per_pass`` 1 and 2) on a chunk of the pipeline's size and on all
its keys, from the same unsorted keys (restored by a device-to-device copy,
timed on its own).
"""

from __future__ import annotations

import argparse

import numpy as np
from _harness import SIMULATOR, cuda, device_name, median_time
from kernels_join import ROW, hash_probe
from kernels_sort import bitonic_sort, merge_runs
from ordered_pipeline import build_table
from target import launch_shape

import numba_streamsafe as nss


def main() -> dict[str, float]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=1 << 8 if SIMULATOR else 1 << 24,
                        help="keys of each relation (a power of two)")
    parser.add_argument("--streams", type=int, default=4, help="sort chunks (pipeline's streams)")
    parser.add_argument("--rounds", type=int, default=1 if SIMULATOR else 7)
    args = parser.parse_args()
    if args.n < 2 * args.streams or args.n & (args.n - 1):
        parser.error("--n must be a power of two of at least twice --streams")

    s = cuda.stream()
    rng = np.random.default_rng(0)
    times: dict[str, float] = {}

    def timed(name: str, fn) -> None:
        fn()  # warm-up (and JIT)
        times[name] = median_time(fn, args.rounds, s.synchronize)[0]
        print(f"  {name:40s} {times[name] * 1e3:9.3f} ms", flush=True)

    print(f"pipeline kernels, n={args.n}, median of {args.rounds}, on {device_name()}")
    for n in (args.n // args.streams, args.n):
        keys = nss.to_device(rng.integers(0, 1 << 32, n, dtype=np.int64), stream=s)
        work = nss.device_array(n, np.int64, stream=s)
        timed(f"device copy of {n} keys",
              lambda work=work, keys=keys: work.copy_to_device(keys, stream=s))
        for width in (1, 2):
            def sort(width=width, work=work, keys=keys):
                work.copy_to_device(keys, stream=s)
                bitonic_sort(work, s, width)
            timed(f"copy + bitonic sort of {n}, {width} per pass", sort)

    half = args.n // 2
    a = nss.to_device(np.sort(rng.integers(0, 1 << 32, half, dtype=np.int64)), stream=s)
    b = nss.to_device(np.sort(rng.integers(0, 1 << 32, half, dtype=np.int64)), stream=s)
    merged = nss.device_array(args.n, np.int64, stream=s)
    g, bl = launch_shape(args.n)
    timed(f"merge of two runs of {half}", lambda: merge_runs[g, bl, s](a, b, merged))
    host = cuda.pinned_array(args.n, np.int64)
    host[...] = 1
    dev = nss.device_array(args.n, np.int64, stream=s)
    timed(f"pinned upload of {args.n} keys", lambda: dev.copy_to_device(host, stream=s))
    timed(f"pinned download of {args.n} keys", lambda: dev.copy_to_host(host, stream=s))
    rows_host = cuda.pinned_array(args.n, ROW)
    rows = nss.device_array(args.n, ROW, stream=s)
    timed(f"pinned download of {args.n} rows", lambda: rows.copy_to_host(rows_host, stream=s))
    timed(f"table build from {args.n} keys", lambda: build_table(merged, s))
    table, mask, _ = build_table(merged, s)
    timed(f"probe of {args.n} keys",
          lambda: hash_probe[g, bl, s](merged, table, rows, mask))
    s.synchronize()
    return times


if __name__ == "__main__":
    main()
