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


_MODES = {"--components", "--count", "--attribution", "--alloc"}

if __name__ == "__main__" and not _MODES & set(sys.argv):
    main()


def busy() -> int:
    return sum(range(60))


def components() -> None:
    """Time each piece of the tracked launch path on its own (µs per call)."""
    import timeit

    from numba_streamsafe.core.access import Access
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
        "kernel._arguments (3 arrays)": lambda: tracked._arguments(rt, (a, b, c), s1, True, False),
        "target.resolve (1 array)": lambda: target.resolve(rt, a),
        "preflight same stream": lambda: res.preflight(uses, h1),
        "commit same stream": lambda: res.commit(uses, h1),
        "driver.event_record": lambda: drv.event_record(ev, h1),
        "driver.stream_wait_event": lambda: drv.stream_wait_event(h2, ev),
        "numba launch disp[1,32,s,0](...)": lambda: disp[1, 32, s1, 0](a, b, c),
        "tracked launch, same stream": lambda: tracked[1, 32, s1](a, b, c),
    }
    disp_cfg = (1, 32, s1, 0)
    from numba_streamsafe.numba.launch import launch_plan
    from numba_streamsafe.protocol import fenced

    plan = tracked.direct.plan(tracked.dispatcher, rt.device, launch_plan.argtypes_of((a, b, c)))
    params = plan.pack((a, b, c)) if plan is not None else 0

    def resolve():
        return tracked._arguments(rt, (a, b, c), s1, True, False)

    def c2():
        nss.get_runtime()
        u = tracked._arguments(rt, (a, b, c), s1, True, False)[1]
        h = rt.stream_handle(s1)
        res.preflight(u.blocks, h)
        disp[disp_cfg](a, b, c)
        res.commit(u.blocks, h, s1)

    pieces.update({
        "A: disp[cfg](...)": lambda: disp[disp_cfg](a, b, c),
        "B: A + _arguments": lambda: (resolve(), disp[disp_cfg](a, b, c)),
        "C: _launch via Numba's path": lambda: tracked._launch(s1, (a, b, c), None,
                                                              lambda: disp[disp_cfg]),
        "D: tracked[1, 32, s](...)": lambda: tracked[1, 32, s1](a, b, c),
        "B1: A + 3 x target.resolve": lambda: (target.resolve(rt, a), target.resolve(rt, b),
                                               target.resolve(rt, c), disp[disp_cfg](a, b, c)),
        "C1: A + runtime, _arguments, stream_handle": lambda: (
            nss.get_runtime(), resolve(), rt.stream_handle(s1),
            disp[disp_cfg](a, b, c)),
        "C2: C1 + prepare + commit": lambda: c2(),
        "C3: fenced(..., disp[cfg], args)": lambda: fenced(
            rt, h1, resolve()[1], "k", True, s1, disp[disp_cfg], a, b, c),
        "B3: A + 1.7 us of unrelated Python": lambda: (busy(), disp[disp_cfg](a, b, c)),
        "B4: A + 5 us of unrelated Python": lambda: (busy(), busy(), busy(),
                                                     disp[disp_cfg](a, b, c)),
    })
    if plan is not None:  # direct launches (a GPU)
        pieces.update({
            "E: launch_plan.argtypes_of (3 arrays)": lambda: launch_plan.argtypes_of((a, b, c)),
            "E1: kernel.direct.plan (3 arrays)": lambda: tracked.direct.plan(
                tracked.dispatcher, rt.device, launch_plan.argtypes_of((a, b, c))),
            "E2: plan.pack (3 arrays)": lambda: plan.pack((a, b, c)),
            "E3: driver.launch_kernel": lambda: drv.launch_kernel(plan.function, (1, 1, 1),
                                                                   (32, 1, 1), 0, h1, params),
        })
    import gc

    for name, fn in pieces.items():
        n = 2000 if "launch" in name or ":" in name else 20000
        t = min(timeit.repeat(fn, number=n, repeat=3)) / n * 1e6
        tgc = min(timeit.repeat(fn, setup=gc.enable, number=n, repeat=3)) / n * 1e6
        print(f"  {name:36s} {t:7.2f} us   with gc {tgc:7.2f} us")
    cuda.synchronize()
    res.events.release(ev)


if __name__ == "__main__" and "--components" in sys.argv:
    components()


def count_driver_calls() -> None:
    """Driver calls per tracked launch, same stream and alternating streams."""
    import collections

    tracked = tracked_kernel(body, access={"a": Read, "b": Read, "c": Write})
    s1, s2 = cuda.stream(), cuda.stream()
    a, b, c = (nss.device_array(256, np.float32, stream=s1) for _ in range(3))
    tracked[1, 32, s1](a, b, c)
    cuda.synchronize()
    drv = nss.get_runtime().driver
    counts: collections.Counter[str] = collections.Counter()
    for name in ("event_record", "stream_wait_event", "event_create", "alloc_async",
                 "free_async", "check_stream", "stream_synchronize", "event_query"):
        original = getattr(drv, name)

        def counted(*args, _name=name, _original=original):
            counts[_name] += 1
            return _original(*args)

        setattr(drv, name, counted)
    for label, streams in (("same", (s1, s1)), ("cross", (s1, s2))):
        counts.clear()
        for i in range(1000):
            tracked[1, 32, streams[i & 1]](a, b, c)
        cuda.synchronize()
        print(f"  {label}: driver calls per launch", {k: v / 1000 for k, v in counts.items()})


if __name__ == "__main__" and "--count" in sys.argv:
    count_driver_calls()


def attribution() -> None:
    """The composed launch with one piece at a time replaced by a no-op (µs per launch)."""
    import contextlib
    import timeit

    tracked = tracked_kernel(body, access={"a": Read, "b": Read, "c": Write})
    s1 = cuda.stream()
    a, b, c = (nss.device_array(256, np.float32, stream=s1) for _ in range(3))
    tracked[1, 32, s1](a, b, c)
    cuda.synchronize()
    rt = nss.get_runtime()
    res = rt.resource
    disp = tracked.dispatcher
    cfg = (1, 32, s1, 0)
    fixed = tracked._arguments(rt, (a, b, c), s1, True, False)

    def measure(label: str) -> None:
        t = min(timeit.repeat(lambda: tracked._launch(s1, (a, b, c), None, lambda: disp[cfg]),
                              number=2000, repeat=7)) / 2000 * 1e6
        print(f"  {label:44s} {t:7.2f} us")

    base = min(timeit.repeat(lambda: disp[cfg](a, b, c), number=2000, repeat=7)) / 2000 * 1e6
    print(f"  {'numba launch alone':44s} {base:7.2f} us")
    measure("full tracked launch")
    original = tracked._arguments
    tracked._arguments = lambda *_: fixed  # type: ignore[method-assign]
    measure("... with argument resolution precomputed")
    tracked._arguments = original  # type: ignore[method-assign]
    prep, commit = res.preflight, res.commit
    res.prepare_launch = lambda *x: None
    res.commit_launch = lambda *x: None
    measure("... with prepare and commit as no-ops")
    res.prepare_launch, res.commit_launch = prep, commit
    lock = res._lock
    res._lock = contextlib.nullcontext()
    measure("... with the resource lock a null context")
    res._lock = lock
    measure("full tracked launch again")


if __name__ == "__main__" and "--attribution" in sys.argv:
    attribution()


def alloc_attribution() -> None:
    """Pieces of one allocate + free cycle through the memory-manager plugin (µs).

    Run with ``NUMBA_CUDA_MEMORY_MANAGER=numba_streamsafe``.
    """
    import gc
    import timeit

    from numba_streamsafe.numba import target

    rt = nss.get_runtime()
    cuda.device_array(16)  # context
    ctx = cuda.current_context()
    res = rt.resource

    def core_cycle():
        res.deallocate(res.allocate(4096, 0, "x"))

    def wrap_cycle():
        blk = res.allocate(4096, 0, "x")
        mp = target.BlockPointer(ctx, blk, res.defer_free)
        del mp
        res.flush()

    def numba_cycle():
        a = cuda.device_array(1024, np.float32)
        del a

    pieces = {
        "resource allocate + deallocate": core_cycle,
        "+ MemoryPointer, finalizer, deferred free": wrap_cycle,
        "cuda.device_array + del (plugin)": numba_cycle,
        "nss.device_array + del": lambda: nss.device_array(1024, np.float32),
        "driver alloc_async + free_async": lambda: rt.driver.free_async(
            rt.driver.alloc_async(4096, 0), 0),
    }
    for name, fn in pieces.items():
        fn()
        t = min(timeit.repeat(fn, setup=gc.enable, number=2000, repeat=5)) / 2000 * 1e6
        print(f"  {name:44s} {t:7.2f} us")


if __name__ == "__main__" and "--alloc" in sys.argv:
    alloc_attribution()
