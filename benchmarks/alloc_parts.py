"""Where the microseconds of one ``cuda.device_array`` cycle go, per memory manager.

Not a benchmark of record: a diagnostic for ``alloc_free.py``. Each manager
(Numba's default, ours, RMM's async plugin when installed) runs in a process of
its own, pinned to the same CPU core, and times, for a 4 KiB array:

- ``device_array``: ``cuda.device_array`` + drop (what ``alloc_free.py`` times);
- ``ctx.memalloc``: Numba's context allocation + drop (the manager's part);
- ``mgr.memalloc``: the manager's ``memalloc`` + drop, without Numba's context;
- ``array over held``: a ``DeviceNDArray`` over memory already held (Numba's
  part, the same for every manager).

Medians of repeated timeit runs, µs per cycle; every manager's process runs
``--passes`` times (default 2), the managers taking turns, and the lowest
median of each part is printed. With ``--profile`` the plugin's first process
also prints the top functions of a cProfile of the device_array cycle.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import statistics
import subprocess
import sys
import timeit

OURS = "numba_streamsafe"
RMM = "rmm.allocators.numba"


def parts(profile: bool) -> None:
    import numpy as np
    from _harness import SIMULATOR, cuda

    if os.environ.get("NUMBA_CUDA_MEMORY_MANAGER") == RMM:
        import rmm

        rmm.reinitialize(pool_allocator=False)
        rmm.mr.set_current_device_resource(rmm.mr.CudaAsyncMemoryResource())
    n = 1024
    held = cuda.device_array(n, np.float32)
    cuda.synchronize()
    if SIMULATOR:
        pieces = {"device_array": lambda: cuda.device_array(n, np.float32)}
    else:
        from numba.cuda.cudadrv.devicearray import DeviceNDArray

        ctx = cuda.current_context()
        mgr = ctx.memory_manager
        dtype = np.dtype(np.float32)
        data = held.gpu_data
        pieces = {
            "device_array": lambda: cuda.device_array(n, np.float32),
            "ctx.memalloc": lambda: ctx.memalloc(4 * n),
            "mgr.memalloc": lambda: mgr.memalloc(4 * n),
            "array over held": lambda: DeviceNDArray((n,), (4,), dtype, gpu_data=data),
        }
    number = 20 if SIMULATOR else 5000
    for name, fn in pieces.items():
        fn()
        t = statistics.median(timeit.repeat(fn, number=number, repeat=9)) / number * 1e6
        print(f"{name}\t{t:.3f}", flush=True)
    cuda.synchronize()
    if profile:
        import cProfile
        import pstats

        prof = cProfile.Profile()
        prof.enable()
        for _ in range(number):
            cuda.device_array(n, np.float32)
        prof.disable()
        cuda.synchronize()
        pstats.Stats(prof, stream=sys.stderr).sort_stats("tottime").print_stats(18)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--profile", action="store_true", help="cProfile the plugin's cycle")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--passes", type=int, default=2, help="processes per manager")
    parser.add_argument("--cpu", type=int, default=None)
    args = parser.parse_args()
    cpu = args.cpu
    if cpu is None and hasattr(os, "sched_getaffinity"):
        cpu = max(os.sched_getaffinity(0))
    if cpu is not None and hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {cpu})
    if args.worker:
        parts(args.profile)
        return
    from _installed import memory_manager_env

    managers = ["default", OURS] + ([RMM] if importlib.util.find_spec("rmm") else [])
    table: dict[str, dict[str, float]] = {m: {} for m in managers}
    for pass_ in range(args.passes):
        for m in managers:
            env = memory_manager_env(None if m == "default" else m)
            cmd = [sys.executable, __file__, "--worker",
                   *(["--cpu", str(cpu)] if cpu is not None else [])]
            if args.profile and m == OURS and pass_ == 0:
                cmd.append("--profile")
            out = subprocess.run(cmd, env=env, check=True, stdout=subprocess.PIPE,
                                 text=True).stdout
            for line in out.splitlines():
                name, value = line.split("\t")
                table[m][name] = min(float(value), table[m].get(name, float("inf")))
    names = list(next(iter(table.values())))
    print(f"4 KiB cycle, us (lowest of {args.passes} process medians), CPU {cpu}")
    print(f"{'part':18s}" + "".join(f"{m[:20]:>22s}" for m in managers))
    for name in names:
        print(f"{name:18s}" + "".join(f"{table[m][name]:22.2f}" for m in managers))


if __name__ == "__main__":
    main()
