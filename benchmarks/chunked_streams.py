"""Chunks of one array on K streams against K separate arrays, side by side.

The pattern CUDA's stream guides teach: one array cut into K disjoint chunks
(views ``x[i*c:(i+1)*c]``), chunk i worked on by a slow kernel on stream i.
With ranges tracked, the chunks' kernels overlap as those of K separate
arrays do; tracked per allocation, each would wait for the one before.

Runs with the plugin selected (``NUMBA_CUDA_MEMORY_MANAGER=numba_streamsafe``,
set here before Numba loads). In one process, rounds interleaved, wall time
of one round (every stream's kernel once, then a synchronize):

* ``views`` and ``separate``, for a plain ``cuda.jit`` kernel in transparent
  mode and for a ``@tracked_kernel``;
* ``views, ordering off`` (and ``separate``): the plain kernel inside
  ``numba_streamsafe.transparent(False)`` (no waits at all: the floor).

Then the host cost of a launch whose argument is a view against one whose
argument is the whole array (tracked and plain, one stream, interleaved).
Prints views / separate per K and kernel, view / whole per launch, and
writes ``chunked_streams.json``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

os.environ.setdefault("NUMBA_CUDA_MEMORY_MANAGER", "numba_streamsafe")

import numpy as np  # noqa: E402
from _harness import SIMULATOR, cuda, device_name, ratio_of_medians, write_result  # noqa: E402

import numba_streamsafe as nss  # noqa: E402
from numba_streamsafe import tracked_kernel  # noqa: E402


def body(x, iters):
    """Each element ``iters`` dependent multiply-adds: a slow kernel that
    reads and writes its chunk."""
    i = cuda.grid(1)
    if i < x.size:
        v = x[i]
        for _ in range(iters):
            v = v * np.float32(0.999) + np.float32(0.001)
        x[i] = v


def touch(x):
    i = cuda.grid(1)
    if i < x.size:
        x[i] += 1


def launch_cost(args: argparse.Namespace) -> dict:
    """Host cost of a launch whose argument is a view against one whose
    argument is the whole array, tracked and plain, on one stream."""
    plain = cuda.jit(touch)
    tracked = tracked_kernel(touch, access={"x": "rw"})
    s = cuda.stream()
    x = cuda.to_device(np.zeros(1 << 12, np.float32))
    view = x[1 << 10:3 << 10]
    variants = {"tracked whole": (tracked, x), "tracked view": (tracked, view),
                "plain whole": (plain, x), "plain view": (plain, view)}
    for kernel, arg in variants.values():
        for _ in range(3):
            kernel[1, 32, s](arg)
    cuda.synchronize()
    per: dict[str, list[float]] = {name: [] for name in variants}
    for _ in range(args.rounds):
        for name, (kernel, arg) in variants.items():
            cuda.synchronize()
            start = time.perf_counter()
            for _ in range(args.launches):
                kernel[1, 32, s](arg)
            cuda.synchronize()
            per[name].append((time.perf_counter() - start) / args.launches * 1e6)

    return {"us_per_launch": {name: statistics.median(v) for name, v in per.items()},
            "tracked view / whole": ratio_of_medians(per, "tracked view", "tracked whole"),
            "plain view / whole": ratio_of_medians(per, "plain view", "plain whole")}


def main() -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--chunk", type=int, default=64 if SIMULATOR else 1 << 14,
                        help="elements per chunk")
    parser.add_argument("--iters", type=int, default=2 if SIMULATOR else 200_000,
                        help="multiply-adds per element (the kernel's length)")
    parser.add_argument("--rounds", type=int, default=2 if SIMULATOR else 9)
    parser.add_argument("--k", type=int, nargs="+", default=[4, 8])
    parser.add_argument("--launches", type=int, default=4 if SIMULATOR else 5000,
                        help="launches a round of the launch-cost comparison")
    args = parser.parse_args()
    plain = cuda.jit(body)
    tracked = tracked_kernel(body, access={"x": "rw"})
    block = 128
    grid = (args.chunk + block - 1) // block
    results: dict[str, dict] = {}
    for k in args.k:
        streams = [cuda.stream() for _ in range(k)]
        whole = cuda.to_device(np.zeros(k * args.chunk, np.float32))
        views = [whole[i * args.chunk:(i + 1) * args.chunk] for i in range(k)]
        separate = [cuda.to_device(np.zeros(args.chunk, np.float32)) for _ in range(k)]
        cuda.synchronize()

        def one_round(kernel, arrays, streams=streams):
            for s, a in zip(streams, arrays, strict=True):
                kernel[grid, block, s](a, args.iters)

        def off(kernel, arrays, streams=streams):
            with nss.transparent(False):
                one_round(kernel, arrays, streams)

        variants = {
            "plain views": (one_round, plain, views),
            "plain separate": (one_round, plain, separate),
            "tracked views": (one_round, tracked, views),
            "tracked separate": (one_round, tracked, separate),
            "plain views, ordering off": (off, plain, views),
            "plain separate, ordering off": (off, plain, separate),  # the same updates
        }
        for go, kernel, arrays in variants.values():  # compile and warm up
            go(kernel, arrays)
        cuda.synchronize()
        per: dict[str, list[float]] = {name: [] for name in variants}
        for _ in range(args.rounds):
            for name, (go, kernel, arrays) in variants.items():
                cuda.synchronize()
                start = time.perf_counter()
                go(kernel, arrays)
                cuda.synchronize()
                per[name].append(time.perf_counter() - start)

        # Every element got the same updates either way: the results agree.
        got = whole.copy_to_host().reshape(k, args.chunk)
        want = np.stack([a.copy_to_host() for a in separate])
        results[f"K={k}"] = {
            "ms_per_round": {name: statistics.median(v) * 1e3 for name, v in per.items()},
            "plain views / separate": ratio_of_medians(per, "plain views", "plain separate"),
            "tracked views / separate": ratio_of_medians(per, "tracked views", "tracked separate"),
            "plain views / ordering off": ratio_of_medians(per, "plain views",
                                                           "plain views, ordering off"),
            "correct": bool(np.allclose(got, want, rtol=1e-5)),
        }
    launch = launch_cost(args)
    print(f"chunks of one array on K streams against K separate arrays on {device_name()} "
          f"({args.chunk} elements a chunk, {args.iters} iterations, {args.rounds} rounds)")
    for key, r in results.items():
        m = r["ms_per_round"]
        print(f"  {key}: plain views {m['plain views']:.3f} ms, separate "
              f"{m['plain separate']:.3f} ms, ordering off {m['plain views, ordering off']:.3f} "
              f"ms; tracked views {m['tracked views']:.3f} ms, separate "
              f"{m['tracked separate']:.3f} ms")
        print(f"  {key}: views / separate: plain {r['plain views / separate']:.3f}, tracked "
              f"{r['tracked views / separate']:.3f}; correct: {r['correct']}")
    m = launch["us_per_launch"]
    print(f"  launch cost, one stream: tracked whole {m['tracked whole']:.2f} us, tracked view "
          f"{m['tracked view']:.2f} us (view / whole {launch['tracked view / whole']:.3f}); "
          f"plain whole {m['plain whole']:.2f} us, plain view {m['plain view']:.2f} us (view / "
          f"whole {launch['plain view / whole']:.3f})")
    results["launch"] = launch
    write_result("chunked_streams", {"chunk": args.chunk, "iters": args.iters,
                                     "rounds": args.rounds, "results": results})
    return results


if __name__ == "__main__":
    main()
