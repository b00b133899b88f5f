"""Allocate + free cycles through ``numba.cuda.device_array``, memory managers side by side.

The memory manager is chosen per process (``NUMBA_CUDA_MEMORY_MANAGER``), so
each manager runs in a worker process of its own: Numba's default manager,
ours (``numba_streamsafe``) and RMM's plugin over its async memory resource
(``rmm.allocators.numba``, when RMM is installed), ours over that same RMM
resource (``numba_streamsafe+rmm``: ``NUMBA_STREAMSAFE_UPSTREAM=rmm``, compared
with RMM's plugin), and the floor: a bare
plugin doing ``cuMemAllocAsync`` / ``cuMemFreeAsync`` and nothing else
(``bare_async_emm``, GPU only: Numba's simulator has no memory managers). The workers stay alive and
take turns: round by round, each manager times one batch of cycles while the
others wait, so host speed drifting over the run (other tenants, clocks)
reaches every manager alike. All of them are pinned to one CPU core (they
never run at once): the same loop was measured at 36 and at 17 µs per cycle
in one process, depending on the core it ran on. Ratios are taken per round and their median is
reported, with each manager's median cost per cycle, for 4 KiB and 64 MiB.

Each cycle allocates an array, touches nothing, and drops it.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import statistics
import subprocess
import sys
import time

SIZES = {"4KiB": 4 << 10, "64MiB": 64 << 20}
OURS = "numba_streamsafe"
#: Ours with RMM's async resource as the upstream (against RMM's own plugin).
OURS_RMM = "numba_streamsafe+rmm"
RMM = "rmm.allocators.numba"
#: The floor: cuMemAllocAsync / cuMemFreeAsync with nothing around them.
BARE = "bare_async_emm"


def pin(cpu: int | None) -> None:
    """Run this process on ``cpu`` only (where the platform allows it)."""
    if cpu is not None and hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {cpu})


def worker(cpu: int | None) -> None:
    """Serve ``<nbytes> <cycles>`` lines from stdin with the cost per cycle in µs."""
    pin(cpu)
    import numpy as np
    from _harness import cuda

    if (os.environ.get("NUMBA_CUDA_MEMORY_MANAGER") == RMM
            or os.environ.get("NUMBA_STREAMSAFE_UPSTREAM") == "rmm"):
        import rmm

        rmm.reinitialize(pool_allocator=False)
        rmm.mr.set_current_device_resource(rmm.mr.CudaAsyncMemoryResource())

    def cycles(nbytes: int, count: int) -> float:
        n = nbytes // 4
        cuda.synchronize()
        start = time.perf_counter()
        for _ in range(count):
            a = cuda.device_array(n, np.float32)
            del a
        cuda.synchronize()
        return (time.perf_counter() - start) / count * 1e6

    for nbytes in SIZES.values():
        cycles(nbytes, 20)  # create the context, warm up every path
    print("ready", flush=True)
    for line in sys.stdin:
        nbytes, count = map(int, line.split())
        print(f"{cycles(nbytes, count):.6f}", flush=True)


class Worker:
    def __init__(self, manager: str, cpu: int | None) -> None:
        env = dict(os.environ)
        if manager == "default":
            env.pop("NUMBA_CUDA_MEMORY_MANAGER", None)
        elif manager == OURS_RMM:
            env["NUMBA_CUDA_MEMORY_MANAGER"] = OURS
            env["NUMBA_STREAMSAFE_UPSTREAM"] = "rmm"
        else:
            env["NUMBA_CUDA_MEMORY_MANAGER"] = manager
        self.manager = manager
        self.proc = subprocess.Popen([sys.executable, __file__, "--worker",
                                      *(["--cpu", str(cpu)] if cpu is not None else [])], env=env,
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        self._expect("ready")

    def _expect(self, word: str) -> None:
        line = self.proc.stdout.readline().strip()  # type: ignore[union-attr]
        if line != word:
            self.close()
            raise RuntimeError(f"worker for {self.manager!r} said {line!r}, expected {word!r}")

    def time(self, nbytes: int, count: int) -> float:
        self.proc.stdin.write(f"{nbytes} {count}\n")  # type: ignore[union-attr]
        self.proc.stdin.flush()  # type: ignore[union-attr]
        line = self.proc.stdout.readline()  # type: ignore[union-attr]
        if not line:
            raise RuntimeError(f"worker for {self.manager!r} exited (code {self.proc.wait()})")
        return float(line)

    def close(self) -> None:
        if self.proc.stdin:
            self.proc.stdin.close()
        self.proc.wait(timeout=60)


def main() -> dict:
    from _harness import SIMULATOR, device_name, write_result

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cycles", type=int, default=4 if SIMULATOR else 1000,
                        help="cycles per manager per round")
    parser.add_argument("--rounds", type=int, default=2 if SIMULATOR else 41)
    parser.add_argument("--cpu", type=int, default=None,
                        help="CPU core for every process (default: the last one allowed)")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args.cpu)
        return {}
    cpu = args.cpu
    if cpu is None and hasattr(os, "sched_getaffinity"):
        cpu = max(os.sched_getaffinity(0))
    pin(cpu)

    managers = ["default", OURS]
    if importlib.util.find_spec("rmm") is not None and not SIMULATOR:
        managers += [RMM, OURS_RMM]
    if not SIMULATOR:
        managers.append(BARE)
    workers = [Worker(m, cpu) for m in managers]
    samples: dict[str, dict[str, list[float]]] = {m: {s: [] for s in SIZES} for m in managers}
    try:
        for label, nbytes in SIZES.items():
            for r in range(args.rounds):
                # Rotate who goes first, so no manager always follows the same one.
                for w in workers[r % len(workers):] + workers[:r % len(workers)]:
                    samples[w.manager][label].append(w.time(nbytes, args.cycles))
    finally:
        for w in workers:
            w.close()

    results: dict = {"managers": managers, "rounds": args.rounds, "cycles": args.cycles,
                     "cpu": cpu,
                     "us_per_cycle": {}, "ratio": {}, "samples_us": samples}
    for m in managers:
        results["us_per_cycle"][m] = {s: statistics.median(v) for s, v in samples[m].items()}
    for other in managers:
        if other in (OURS, OURS_RMM):
            continue
        results["ratio"][other] = {
            s: statistics.median(a / b for a, b in zip(samples[OURS][s], samples[other][s],
                                                       strict=True))
            for s in SIZES
        }
    if OURS_RMM in managers:
        results["ratio_rmm"] = {
            s: statistics.median(a / b for a, b in zip(samples[OURS_RMM][s], samples[RMM][s],
                                                       strict=True))
            for s in SIZES
        }
    print(f"allocate + free through cuda.device_array on {device_name()}, "
          f"{args.rounds} rounds x {args.cycles} cycles, managers taking turns on CPU {cpu}")
    for m in managers:
        costs = "  ".join(f"{s} {v:7.2f} us" for s, v in results["us_per_cycle"][m].items())
        print(f"  {m:22s} {costs}")
    for other, by_size in results["ratio"].items():
        ratios = "  ".join(f"{s} {v:.3f}" for s, v in by_size.items())
        print(f"  ours / {other:15s} {ratios}  (median of per-round ratios)")
    if "ratio_rmm" in results:
        ratios = "  ".join(f"{s} {v:.3f}" for s, v in results["ratio_rmm"].items())
        print(f"  ours over RMM / RMM's plugin {ratios}  (both on RMM's async resource)")
    write_result("alloc_free", results)
    print(json.dumps({"ratio": results["ratio"]}))
    return results


if __name__ == "__main__":
    main()
