"""Cost of ``cuda.synchronize()`` and of one launch as a program makes and drops streams.

Runs with the plugin selected (``NUMBA_CUDA_MEMORY_MANAGER=numba_streamsafe``,
set here before Numba loads), on the simulator where there is no GPU (set
``NUMBA_ENABLE_CUDASIM=1`` to choose it where there is one). Each step makes
a stream with ``cuda.stream()``, launches a plain ``cuda.jit`` kernel on it
that reads an array every step reads and writes one every step writes
(transparent mode orders it after the last step's launch), hands its work
to a long-lived stream through an event, and drops the stream. A
device-wide synchronise comes every ``--sync-every`` steps, as a long run's
checkpoints do.

At the start and after each count of ``--checkpoints`` streams made, it
times, in rounds that take the three in turn: ``cuda.synchronize()`` (after a
launch on the long-lived stream), one launch on a new stream (the step's
launch) and one launch on the long-lived stream. It prints the median of
each with its ratio to the start. The states cannot be interleaved (the
program only moves forward), so each figure is a median at its point, the
start measured in the same process. Writes ``stream_churn.json``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

os.environ.setdefault("NUMBA_CUDA_MEMORY_MANAGER", "numba_streamsafe")

import numpy as np  # noqa: E402
from _harness import SIMULATOR, cuda, device_name, write_result  # noqa: E402

#: The figures, in the order they are printed.
FIGURES = ("synchronize", "launch, new stream", "launch, long-lived stream")


def body(a, c):
    # One thread walks the arrays: the simulator's cost of a launch stays small
    # (it runs a Python thread per CUDA thread), so the library's and the
    # simulated driver's part of it shows.
    if cuda.grid(1) == 0:
        for i in range(c.size):
            c[i] = a[i] + 1


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--checkpoints", default="500,1000,2000,4000",
                        help="counts of streams made and dropped at which to measure")
    parser.add_argument("--repeats", type=int, default=101 if SIMULATOR else 501,
                        help="rounds of the three timings at each point")
    parser.add_argument("--sync-every", type=int, default=100,
                        help="steps between device-wide synchronises (0: none)")
    args = parser.parse_args(argv)
    checkpoints = sorted(int(c) for c in args.checkpoints.split(","))
    kernel = cuda.jit(body)
    hub = cuda.stream()  # the long-lived stream the steps hand their work to
    a, c, d = (cuda.to_device(np.zeros(32, np.float32)) for _ in range(3))
    made = 0

    def step() -> None:
        nonlocal made
        s = cuda.stream()
        made += 1
        kernel[1, 1, s](a, c)
        done = cuda.event()
        done.record(s)
        done.wait(hub)
        if args.sync_every and made % args.sync_every == 0:
            cuda.synchronize()

    def measure() -> dict[str, float]:
        per: dict[str, list[float]] = {name: [] for name in FIGURES}
        for _ in range(args.repeats):
            kernel[1, 1, hub](a, d)
            start = time.perf_counter()
            cuda.synchronize()
            per["synchronize"].append(time.perf_counter() - start)
            s = cuda.stream()
            start = time.perf_counter()
            kernel[1, 1, s](a, c)
            per["launch, new stream"].append(time.perf_counter() - start)
            del s
            cuda.synchronize()
            start = time.perf_counter()
            kernel[1, 1, hub](a, d)
            per["launch, long-lived stream"].append(time.perf_counter() - start)
        cuda.synchronize()
        return {name: statistics.median(v) * 1e3 for name, v in per.items()}

    for _ in range(5):  # warm up: the kernel compiled, the first streams made
        step()
        kernel[1, 1, hub](a, d)
    cuda.synchronize()
    made = 0
    figures = {0: measure()}
    for point in checkpoints:
        while made < point:
            step()
        cuda.synchronize()
        figures[point] = measure()
    start_figures = figures[0]
    ratios = {point: {k: f[k] / start_figures[k] for k in f} for point, f in figures.items()}
    state = _driver_state()
    print(f"stream churn on {device_name()}: one stream made and dropped per step, a launch "
          f"on it, its work handed to a long-lived stream by an event; device sync every "
          f"{args.sync_every} steps; medians of {args.repeats} rounds, ms (ratio to the start)")
    print(f"  {'streams made':>12s}  " + "  ".join(f"{name:>25s}" for name in FIGURES))
    for point, f in figures.items():
        cells = (f"{f[name]:9.3f} ms ({ratios[point][name]:6.2f}x)" for name in FIGURES)
        print(f"  {point:12d}  " + "  ".join(f"{cell:>25s}" for cell in cells))
    if state:
        print(f"  at the end: {state['live_streams']} live streams of the simulated driver, "
              f"{state['host_clock_entries']} entries in its host clock")
    c.copy_to_host()  # the launches ran
    result = {"repeats": args.repeats, "sync_every": args.sync_every,
              "figures_ms": {str(k): v for k, v in figures.items()},
              "ratio_to_start": {str(k): v for k, v in ratios.items()}, **state}
    write_result("stream_churn", result)
    return result


def _driver_state() -> dict[str, int]:
    """The simulated driver's live streams and host clock size (empty on a GPU)."""
    import numba_streamsafe as nss
    from numba_streamsafe._driver.sim import SimDriver

    driver = nss.get_runtime().driver
    if not isinstance(driver, SimDriver):
        return {}
    return {"live_streams": driver.live_streams,
            "host_clock_entries": len(driver.system.host_clock)}


if __name__ == "__main__":
    main()
