"""Allocate + free cycles through ``numba.cuda.device_array``, for one memory manager.

Run it once per manager (``NUMBA_CUDA_MEMORY_MANAGER`` unset for Numba's
default, ``=numba_streamsafe`` for ours, ``=rmm.allocators.numba`` for RMM's
plugin); ``run_all.py`` runs them side by side, five processes per manager
interleaved (host timings drift between processes), and prints the ratios of
the medians. Each
cycle allocates an array, touches nothing, and drops it; the median cost per
cycle over several rounds is reported for 4 KiB and 64 MiB.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time

import numpy as np
from _harness import SIMULATOR, cuda, device_name, write_result

SIZES = {"4KiB": 4 << 10, "64MiB": 64 << 20}


def cycle_cost(nbytes: int, cycles: int, rounds: int) -> list[float]:
    n = nbytes // 4
    per = []
    for _ in range(rounds):
        cuda.synchronize()
        start = time.perf_counter()
        for _ in range(cycles):
            a = cuda.device_array(n, np.float32)
            del a
        cuda.synchronize()
        per.append((time.perf_counter() - start) / cycles * 1e6)
    return per


def main() -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cycles", type=int, default=4 if SIMULATOR else 2000)
    parser.add_argument("--rounds", type=int, default=2 if SIMULATOR else 9)
    parser.add_argument("--run", type=int, default=0,
                        help="index of this process among repeated runs (names the JSON)")
    args = parser.parse_args()
    manager = os.environ.get("NUMBA_CUDA_MEMORY_MANAGER", "default")
    if manager == "rmm.allocators.numba":
        import rmm

        rmm.reinitialize(pool_allocator=False)
        rmm.mr.set_current_device_resource(rmm.mr.CudaAsyncMemoryResource())
    cycle_cost(4096, 10, 1)  # create the context, warm up
    results = {}
    for label, nbytes in SIZES.items():
        samples = cycle_cost(nbytes, args.cycles, args.rounds)
        results[label] = {"us_per_cycle": statistics.median(samples), "samples_us": samples}
    print(json.dumps({"manager": manager, "results": {k: v["us_per_cycle"]
                                                       for k, v in results.items()}}))
    suffix = f"_{args.run}" if args.run else ""
    write_result(f"alloc_free_{manager.replace('.', '_')}{suffix}",
                 {"manager": manager, "device": device_name(), "results": results})
    return results


if __name__ == "__main__":
    main()
