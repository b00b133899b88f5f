"""Where a program with one large array spends its time, with and without the
plugin: numba-cuda's random-numbers documentation example
(``test_random``: 2M generator states made on the host and copied over
(``create_xoroshiro128p_states``, timed in its steps), a
1.8 GB float32 array written by a kernel, copied back to pageable host memory
and checked with NumPy), phase by phase, each phase ended by a device
synchronise so that its GPU work is counted in it. Beside the example's work
it times a second launch (a launch once compiled) and it checks the copy once
(its mean and an upper bound); its total is that work's, not the example's.
The "free" row is not comparable: Numba's own memory manager defers its
frees, the plugin queues them.

Processes take turns, the order alternating from round to round (the host's
speed moves between processes). Prints, per phase, the median seconds
without and with the plugin and their difference. The library is
byte-compiled first, as pip installs it (``_installed.py``). Needs a GPU
(numba-cuda skips this example on its simulator).

    python benchmarks/big_array_phases.py [--rounds 3] [--shape 701 900 719] [--grid 16]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time


def child(shape: tuple[int, int, int], grid: int) -> dict[str, float]:
    """One run of the program in this process: seconds per phase."""
    t: dict[str, float] = {}
    start = time.perf_counter()
    import numpy as np
    from numba import cuda
    from numba.cuda.random import (
        init_xoroshiro128p_states_cpu,
        xoroshiro128p_dtype,
        xoroshiro128p_uniform_float32,
    )
    if os.environ.get("NUMBA_CUDA_MEMORY_MANAGER") == "numba_streamsafe":
        import numba_streamsafe  # noqa: F401  (Numba imports it at the context's creation)
    t["import"] = time.perf_counter() - start
    s = time.perf_counter()
    cuda.current_context()
    t["context"] = time.perf_counter() - s

    @cuda.jit
    def random_3d(arr, rng_states):
        startx, starty, startz = cuda.grid(3)
        stridex, stridey, stridez = cuda.gridsize(3)
        tid = (startz * stridey * stridex) + (starty * stridex) + startx
        for i in range(startz, arr.shape[0], stridez):
            for j in range(starty, arr.shape[1], stridey):
                for k in range(startx, arr.shape[2], stridex):
                    arr[i, j, k] = xoroshiro128p_uniform_float32(rng_states, tid)

    def phase(name: str, fn):  # type: ignore[no-untyped-def]
        s = time.perf_counter()
        out = fn()
        cuda.synchronize()
        t[name] = time.perf_counter() - s
        return out

    nthreads = 8 * 8 * 8 * grid ** 3
    v: dict = {}
    # create_xoroshiro128p_states(nthreads, seed=1), as numba-cuda writes it, in its steps
    v["states"] = phase("rng states: device_array",
                        lambda: cuda.device_array(nthreads, dtype=xoroshiro128p_dtype, stream=0))
    v["cpu"] = phase("rng states: np.empty",
                     lambda: np.empty(shape=(nthreads,), dtype=xoroshiro128p_dtype))
    phase("rng states: host init (CPU jit)", lambda: init_xoroshiro128p_states_cpu(v["cpu"], 1, 0))
    phase("rng states: copy_to_device", lambda: v["states"].copy_to_device(v["cpu"], stream=0))
    v["arr"] = phase("device_array", lambda: cuda.device_array(shape, dtype=np.float32))
    phase("first launch (compile)",
          lambda: random_3d[(grid, grid, grid), (8, 8, 8)](v["arr"], v["states"]))
    phase("second launch", lambda: random_3d[(grid, grid, grid), (8, 8, 8)](v["arr"], v["states"]))
    v["host"] = phase("copy_to_host", lambda: v["arr"].copy_to_host())
    phase("numpy checks",
          lambda: (float(np.mean(v["host"])), bool(np.all(v["host"] <= 1.0))))
    phase("free", lambda: (v.pop("arr"), v.pop("states")) and None)
    v.clear()
    t["total"] = time.perf_counter() - start
    return t


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--shape", type=int, nargs=3, default=(701, 900, 719))
    parser.add_argument("--grid", type=int, default=16, help="blocks per grid dimension")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    shape = tuple(args.shape)
    if args.child:
        print(json.dumps(child(shape, args.grid)))  # type: ignore[arg-type]
        return
    if os.environ.get("NUMBA_ENABLE_CUDASIM") == "1":
        sys.exit("big_array_phases.py needs a GPU: numba-cuda's simulator does not run this "
                 "example (unset NUMBA_ENABLE_CUDASIM)")
    from _installed import PLUGIN, byte_compile_library, memory_manager_env

    byte_compile_library()
    runs: dict[bool, list[dict[str, float]]] = {False: [], True: []}
    for k in range(args.rounds):
        for plugin in ((False, True) if k % 2 == 0 else (True, False)):
            env = memory_manager_env(PLUGIN if plugin else None)
            out = subprocess.run([sys.executable, __file__, "--child", "--grid",
                                  str(args.grid), "--shape", *map(str, shape)],
                                 env=env, capture_output=True, text=True, timeout=600)
            lines = out.stdout.strip().splitlines()
            if out.returncode or not lines:
                sys.exit(f"child failed (plugin={plugin}, exit {out.returncode}):\n"
                         f"{out.stderr[-3000:]}")
            runs[plugin].append(json.loads(lines[-1]))
    print(f"{'phase (median s)':32s} {'without':>9s} {'with':>9s} {'with - w/o':>11s}")
    for name in runs[False][0]:
        a = statistics.median(r[name] for r in runs[False])
        b = statistics.median(r[name] for r in runs[True])
        print(f"{name:32s} {a:9.3f} {b:9.3f} {b - a:+11.3f}")


if __name__ == "__main__":
    main()
