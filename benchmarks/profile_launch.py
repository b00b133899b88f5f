"""Where the host time of a tracked launch goes: cProfile of N launches.

Not a benchmark of record: a diagnostic for the launch path. Prints the
per-launch cost of plain Numba, the tracked kernel with tracking off (argument
resolution only) and on, then the top functions of the tracked run.
"""

from __future__ import annotations

import cProfile
import pstats
import sys
import time

import numpy as np
from _harness import SIMULATOR, cuda

import numba_streamsafe as nss
from numba_streamsafe import Read, Write, tracked_kernel


def body(a, b, c):
    i = cuda.grid(1)
    if i < c.size:
        c[i] = a[i] + b[i]


def main() -> None:
    args = [x for x in sys.argv[1:] if not x.startswith("--")]
    n = int(args[0]) if args else (4 if SIMULATOR else 20000)
    plain = cuda.jit(body)
    tracked = tracked_kernel(body, access={"a": Read, "b": Read, "c": Write})
    s1, s2 = cuda.stream(), cuda.stream()
    a, b, c = (nss.device_array(256, np.float32, stream=s1) for _ in range(3))
    for k in (plain, tracked):
        k[1, 32, s1](a, b, c)
    cuda.synchronize()

    def loop(k, streams):
        for i in range(n):
            k[1, 32, streams[i & 1]](a, b, c)
        cuda.synchronize()

    for label, streams in (("same", (s1, s1)), ("cross", (s1, s2))):
        for name, k, tracking in (("plain", plain, True), ("tracked, tracking off", tracked, False),
                                  ("tracked", tracked, True)):
            with nss.tracking(tracking):
                t = time.perf_counter()
                loop(k, streams)
                print(f"{label:5s} {name:22s} {(time.perf_counter() - t) / n * 1e6:7.2f} us")
    prof = cProfile.Profile()
    prof.enable()
    loop(tracked, (s1, s2))
    prof.disable()
    pstats.Stats(prof).sort_stats("tottime").print_stats(25)


if __name__ == "__main__" and "--components" not in sys.argv:
    main()


def components() -> None:
    """Time each piece of the tracked launch path on its own (µs per call)."""
    import timeit

    from numba_streamsafe.access import Access
    from numba_streamsafe.numba import target

    tracked = tracked_kernel(body, access={"a": Read, "b": Read, "c": Write})
    s1, s2 = cuda.stream(), cuda.stream()
    a, b, c = (nss.device_array(256, np.float32, stream=s1) for _ in range(3))
    tracked[1, 32, s1](a, b, c)
    cuda.synchronize()
    rt = nss.get_runtime()
    h1, h2 = rt.stream_handle(s1), rt.stream_handle(s2)
    uses = [(nss.block_of(x), acc) for x, acc in ((a, Access.READ), (b, Access.READ),
                                                     (c, Access.WRITE))]
    res = rt.resource
    ev = res.events.acquire()
    drv = rt.driver
    disp = tracked.dispatcher
    pieces = {
        "get_runtime()": lambda: nss.get_runtime(),
        "rt.stream_handle(s)": lambda: rt.stream_handle(s1),
        "kernel[1, 32, s] (config object)": lambda: tracked[1, 32, s1],
        "kernel._uses (3 arrays)": lambda: tracked._uses(rt, (a, b, c)),
        "target.resolve (1 array)": lambda: target.resolve(rt, a),
        "prepare_launch same stream": lambda: res.prepare_launch(uses, h1),
        "commit_launch same stream": lambda: res.commit_launch(uses, h1),
        "driver.event_record": lambda: drv.event_record(ev, h1),
        "driver.stream_wait_event": lambda: drv.stream_wait_event(h2, ev),
        "numba launch disp[1,32,s,0](...)": lambda: disp[1, 32, s1, 0](a, b, c),
        "tracked launch, same stream": lambda: tracked[1, 32, s1](a, b, c),
    }
    for name, fn in pieces.items():
        n = 2000 if "launch" in name and "_launch" not in name else 20000
        t = min(timeit.repeat(fn, number=n, repeat=3)) / n * 1e6
        print(f"  {name:36s} {t:7.2f} us")
    cuda.synchronize()
    res.events.release(ev)


if __name__ == "__main__" and "--components" in sys.argv:
    components()
