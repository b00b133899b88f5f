"""A plain Numba program of many streams, each handing its work to the next
with two events of its own, under the plugin: how many events the library
records and holds, against the program's own.

Stream ``i`` writes its array, records event ``made[i]`` there, and the next
stream waits for it and reads that array into its own; then stream ``i + 1``
records ``read[i]`` and stream ``i`` waits for it before writing its array
again. The program orders every cross-stream use itself: the library needs
no wait and no event of its own. Prints one JSON line: the program's events
(records made), the library's events recorded and waits queued, and the
library's events still held at the end (``memory_stats()["events.in_use"]``),
with the arrays still alive and after they are dropped.

    NUMBA_CUDA_MEMORY_MANAGER=numba_streamsafe python benchmarks/stream_events.py [--streams N]
"""

from __future__ import annotations

import argparse
import json
import os

import numpy as np
from numba import cuda

import numba_streamsafe as nss


@cuda.jit
def fill(x, k):
    i = cuda.grid(1)
    if i < x.size:
        x[i] = k


@cuda.jit
def copy(src, dst):
    i = cuda.grid(1)
    if i < dst.size:
        dst[i] = src[i]


def main() -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--streams", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    n = 32 if os.environ.get("NUMBA_ENABLE_CUDASIM") == "1" else 4096
    count = args.streams
    streams = [cuda.stream() for _ in range(count)]
    arrays = [cuda.device_array(n, np.int64, stream=s) for s in streams]
    made = [cuda.event() for _ in range(count)]
    read = [cuda.event() for _ in range(count)]
    cuda.synchronize()
    start = nss.memory_stats()
    records = 0
    for r in range(args.rounds):
        for i in range(count):
            s, nxt = streams[i], streams[(i + 1) % count]
            fill[n // 32, 32, s](arrays[i], r * count + i)
            made[i].record(s)
            made[i].wait(nxt)
            copy[n // 32, 32, nxt](arrays[i], arrays[(i + 1) % count])
            read[i].record(nxt)
            read[i].wait(s)
            records += 2
    cuda.synchronize()
    end = nss.memory_stats()
    held_alive = end.get("events.in_use")
    last = args.rounds * count - 1
    right = int(arrays[0].copy_to_host()[0]) == last
    del arrays
    after_free = nss.memory_stats().get("events.in_use")
    result = {
        "streams": count,
        "program events recorded": records,
        "library events recorded": end.get("events_recorded", 0) - start.get("events_recorded", 0),
        "library waits queued": end.get("waits_inserted", 0) - start.get("waits_inserted", 0),
        "library waits skipped": end.get("waits_skipped", 0) - start.get("waits_skipped", 0),
        "library events held (arrays alive)": held_alive,
        "library events held (arrays dropped)": after_free,
        "right": right,
    }
    print(json.dumps(result))
    return result


if __name__ == "__main__":
    main()
