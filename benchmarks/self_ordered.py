"""A plain Numba program that orders itself with Numba events, under the
plugin: what the library's waits cost it, and how many it queues.

Two streams take turns: a producer kernel writes ``x`` on one, an event
recorded there is waited for on the other, a consumer kernel reads ``x`` and
writes ``y`` there, and an event orders the next producer after the consumer.
Every cross-stream use is ordered by the program itself, so the library need
queue no wait of its own (``memory_stats()["waits_inserted"]``). Prints the
cost of one round (two launches and their events) and the library's waits per
round; runs with any version of the package (to compare before and after the
library learnt the program's ordering).

Run with ``NUMBA_CUDA_MEMORY_MANAGER=numba_streamsafe``.
"""

from __future__ import annotations

import argparse
import json
import os
import time

import numpy as np
from numba import cuda

import numba_streamsafe as nss


@cuda.jit
def produce(x, k):
    i = cuda.grid(1)
    if i < x.size:
        x[i] = k


@cuda.jit
def consume(x, y):
    i = cuda.grid(1)
    if i < y.size:
        y[i] = x[i] + 1.0


def main() -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=2000)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    a, b = cuda.stream(), cuda.stream()
    x = cuda.device_array(1 << 16, np.float32, stream=a)
    y = cuda.device_array(1 << 16, np.float32, stream=b)
    made, consumed = cuda.event(timing=False), cuda.event(timing=False)

    def rounds(n: int) -> float:
        cuda.synchronize()
        start = time.perf_counter()
        for k in range(n):
            produce[64, 1024, a](x, float(k))
            made.record(a)
            made.wait(b)
            consume[64, 1024, b](x, y)
            consumed.record(b)
            consumed.wait(a)
        cuda.synchronize()
        return (time.perf_counter() - start) / n

    rounds(10)
    stats = nss.memory_stats()
    waits0 = stats.get("waits_inserted", 0)
    times = [rounds(args.rounds) for _ in range(args.repeats)]
    stats = nss.memory_stats()
    waits = (stats.get("waits_inserted", 0) - waits0) / (args.rounds * args.repeats)
    expect = float(args.rounds - 1) + 1.0
    assert float(y.copy_to_host()[0]) == expect, "the consumer read a stale x"
    result = {"us_per_round": sorted(times)[len(times) // 2] * 1e6,
              "library_waits_per_round": waits,
              "waits_skipped": stats.get("waits_skipped"),
              "package": os.path.dirname(nss.__file__)}
    print(json.dumps(result))
    return result


if __name__ == "__main__":
    main()
