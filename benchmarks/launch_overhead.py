"""Host cost of a tracked launch against a plain Numba launch, side by side.

A kernel with three device-array arguments (read, read, write) is launched N
times per round, tracked and untracked interleaved round by round, in two
scenarios: all on one stream (no fence needed) and alternating between two
streams (every launch must wait for the previous one's write). A third
variant, "tracked, Numba path", turns the direct launches off
(``launch_policy(rt).direct_launch = False``) to show what fencing alone costs
on top of Numba's launch, and "tracked, traced" records every launch in a
``numba_streamsafe.trace()`` (its cost over "tracked"). Prints the per-launch
medians and the ratios; writes the numbers as JSON.

The floor: where the driver launches directly (a GPU), a "raw" variant
launches the same compiled overload with the same arguments through
``cuda.bindings.driver.cuLaunchKernel`` itself, its parameters packed once
before the rounds (no tracking, no argument walk, no packing per launch). Every
round times every variant back to back; ratios are medians of per-round
ratios. The multi-thread figure: ``--threads`` threads (default 8), each with
a stream and arrays of its own, launch at once; total launches per second
tracked over raw (over untracked Numba where there is no raw launch).
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import functools
import statistics
import threading
import time
from collections.abc import Callable
from typing import Any

import numpy as np
from _harness import SIMULATOR, cuda, device_name, ratio_of_medians, write_result

import numba_streamsafe as nss
from numba_streamsafe import Read, Write, tracked_kernel
from numba_streamsafe.numba.launch.policy import launch_policy

# Numba's simulator swaps the kernel module's ``cuda`` while a kernel runs; the
# threads synchronise through this name instead.
synchronize = cuda.synchronize


def body(a, b, c):
    i = cuda.grid(1)
    if i < c.size:
        c[i] = a[i] + b[i]


class RawLaunch:
    """The floor: ``cuLaunchKernel`` of ``tracked``'s direct-launch plan for
    ``args``, parameters packed once into a buffer of its own."""

    def __init__(self, rt: Any, tracked: Any, args: tuple[Any, ...]) -> None:
        from cuda.bindings import driver as drv

        from numba_streamsafe.numba.launch.launch_plan import argtypes_of

        plan = tracked.direct.plan(tracked.dispatcher, rt.device, argtypes_of(args))
        if plan is None or plan.pack(args) is None:
            raise RuntimeError("no direct-launch plan for the benchmark's kernel")
        scratch = plan._scratch
        self.buffer = ctypes.create_string_buffer(scratch.buffer.raw, len(scratch.buffer))
        shift = ctypes.addressof(self.buffer) - ctypes.addressof(scratch.buffer)
        n = len(scratch.pointers)
        self.pointers = (ctypes.c_void_p * n)(*[p + shift for p in scratch.pointers])
        self.params = ctypes.addressof(self.pointers)
        self.function = plan.function
        self.rt = rt
        self.launch_kernel = drv.cuLaunchKernel

    def with_events(self, streams: tuple[Any, Any]) -> Callable[[int], None]:
        """The hand-placed-events floor across streams: launch ``i`` on
        ``streams[i & 1]`` waits for the event recorded after launch ``i - 1``
        on the other stream, and records its own (``cuStreamWaitEvent``, raw
        ``cuLaunchKernel``, ``cuEventRecord``), as a careful programmer would
        order the alternating launches by hand."""
        from cuda.bindings import driver as drv

        cuda.current_context()
        handles = [self.rt.stream_handle(s) for s in streams]
        flags = drv.CUevent_flags.CU_EVENT_DISABLE_TIMING
        events = [drv.cuEventCreate(flags)[1] for _ in range(2)]
        launch, f, params = self.launch_kernel, self.function, self.params
        wait, record = drv.cuStreamWaitEvent, drv.cuEventRecord
        keep = (self, events)

        def go(i: int) -> None:
            h = handles[i & 1]
            wait(h, events[(i + 1) & 1], 0)
            launch(f, 1, 1, 1, 32, 1, 1, 0, h, params, 0)
            record(events[i & 1], h)

        go.keep = keep  # type: ignore[attr-defined]
        for i in range(2):  # both events recorded once before the first wait
            record(events[i], handles[i])
        return go

    def launcher(self, stream: Any, keep_gil: bool = False) -> Callable[[], None]:
        """One raw launch of the kernel on ``stream`` (1 block of 32 threads),
        through cuda-bindings (the GIL released through the call), or with
        ``keep_gil`` through ``ctypes.PyDLL`` on libcuda's ``cuLaunchKernel``
        (the GIL kept)."""
        cuda.current_context()  # this thread's context current, as Numba's launches make it
        handle = self.rt.stream_handle(stream)
        launch, f, params = self.launch_kernel, self.function, self.params
        keep = self  # the parameter buffers ``params`` points into live as long as ``go``
        if keep_gil:
            pydll = ctypes.PyDLL("libcuda.so.1").cuLaunchKernel
            pydll.restype = ctypes.c_int
            ch, cf, cp = (ctypes.c_void_p(int(x)) for x in (handle, f, params))

            def go() -> None:
                pydll(cf, 1, 1, 1, 32, 1, 1, 0, ch, cp, None)
        else:
            def go() -> None:  # the floor: nothing but the bindings' call
                launch(f, 1, 1, 1, 32, 1, 1, 0, handle, params, 0)

        go.keep = keep  # type: ignore[attr-defined]
        return go


def threaded(variants: dict[str, Callable[[int], Callable[[], None]]], nthreads: int,
             launches: int, rounds: int,
             before: dict[str, Callable[[], None]] | None = None) -> dict[str, list[float]]:
    """Launches per second of ``nthreads`` threads launching at once, per variant
    and round (variants interleaved round by round). ``variants[label](t)`` is
    called on thread ``t`` once and returns its launch function; ``before[label]()``,
    where given, runs on the main thread before each of that variant's rounds."""
    labels = list(variants)
    per: dict[str, list[float]] = {label: [] for label in labels}
    start_gate = threading.Barrier(nthreads + 1)
    end_gate = threading.Barrier(nthreads + 1)
    current: list[str] = [labels[0]]
    errors: list[BaseException] = []

    def work(t: int) -> None:
        try:
            fns = {label: make(t) for label, make in variants.items()}
            for fn in fns.values():  # warm up on this thread
                fn()
            synchronize()
        except BaseException as exc:  # noqa: BLE001 - reported by the main thread
            errors.append(exc)
            fns = {}
        for _ in range(rounds * len(labels)):
            start_gate.wait()
            fn = fns.get(current[0])
            if fn is not None:
                for _ in range(launches):
                    fn()
            end_gate.wait()

    threads = [threading.Thread(target=work, args=(t,), daemon=True) for t in range(nthreads)]
    for th in threads:
        th.start()
    for _ in range(rounds):
        for label in labels:
            current[0] = label
            if before and label in before:
                before[label]()
            synchronize()
            start = time.perf_counter()
            start_gate.wait()
            end_gate.wait()
            synchronize()
            per[label].append(nthreads * launches / (time.perf_counter() - start))
    for th in threads:
        th.join()
    if errors:
        raise errors[0]
    return per


def main() -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--launches", type=int, default=4 if SIMULATOR else 5000)
    parser.add_argument("--rounds", type=int, default=2 if SIMULATOR else 15)
    parser.add_argument("--threads", type=int, default=0 if SIMULATOR else 8,
                        help="threads launching at once for the multi-thread figure (0: skip; "
                        "Numba's simulator runs kernels on one thread only)")
    parser.add_argument("--gil-variants", action="store_true",
                        help="the multi-thread figure also with the GIL kept through the "
                        "launch (raw and tracked): a diagnostic")
    parser.add_argument("--threads-only", action="store_true",
                        help="only the multi-thread figure (for a profiler)")
    args = parser.parse_args()

    plain = cuda.jit(body)
    tracked = tracked_kernel(body, access={"a": Read, "b": Read, "c": Write})
    s1, s2 = cuda.stream(), cuda.stream()
    n = 256
    a, b, c = (nss.device_array(n, np.float32, stream=s1) for _ in range(3))
    nss.memset(a, 0, stream=s1)
    nss.memset(b, 0, stream=s1)
    cuda.synchronize()
    for k in (plain, tracked):  # compile and warm up
        for _ in range(3):
            k[1, 32, s1](a, b, c)
    cuda.synchronize()

    rt = nss.get_runtime()
    direct = launch_policy(rt).direct_launch
    variants = [("untracked", plain, direct), ("tracked", tracked, direct),
                ("tracked, traced", tracked, direct)]
    if direct:
        variants.append(("tracked, Numba path", tracked, False))
    raw = RawLaunch(rt, tracked, (a, b, c)) if direct else None
    from numba_streamsafe.numba.launch import launcher

    hot_entry = launcher.COMPILED and direct
    raw_fns = {s: raw.launcher(s) for s in (s1, s2)} if raw is not None else {}
    with_events = raw.with_events((s1, s2)) if raw is not None else None
    peers = peer_launchers(s1, n) if raw is not None else {}
    results: dict[str, Any] = {}
    scenarios = (("same stream", (s1, s1)), ("cross stream", (s1, s2)))
    for scenario, streams in () if args.threads_only else scenarios:
        per: dict[str, list[float]] = {label: [] for label, _, _ in variants}
        for _ in range(args.rounds):
            for label, k, on in variants:
                launch_policy(rt).direct_launch = on
                cuda.synchronize()
                recording = nss.trace() if label == "tracked, traced" else contextlib.nullcontext()
                with recording:
                    start = time.perf_counter()
                    for i in range(args.launches):
                        k[1, 32, streams[i & 1]](a, b, c)
                    cuda.synchronize()
                    per[label].append((time.perf_counter() - start) / args.launches * 1e6)
            if hot_entry and tracked.launch_state is not None:
                # Where the microseconds go: the compiled entry point alone, without
                # ``k[grid, block, stream]`` and the Python call around it.
                launch_policy(rt).direct_launch = direct  # the last variant turned it off
                state, enter = tracked.launch_state, launcher.launch
                cfgs = ((1, 32, streams[0]), (1, 32, streams[1]))
                abc = (a, b, c)
                per.setdefault("tracked, C entry", [])
                cuda.synchronize()
                launched = launcher.launches()
                start = time.perf_counter()
                for i in range(args.launches):
                    enter(state, cfgs[i & 1], abc)
                cuda.synchronize()
                per["tracked, C entry"].append((time.perf_counter() - start) / args.launches * 1e6)
                if launcher.launches() - launched != args.launches:
                    raise RuntimeError("the compiled entry handed launches back: its figure "
                                       "would not be a launch")
            if raw is not None:
                fns = (raw_fns[streams[0]], raw_fns[streams[1]])
                per.setdefault("raw", [])
                cuda.synchronize()
                start = time.perf_counter()
                for i in range(args.launches):
                    fns[i & 1]()
                cuda.synchronize()
                per["raw"].append((time.perf_counter() - start) / args.launches * 1e6)
            if with_events is not None and streams[0] is not streams[1]:
                per.setdefault("raw + events", [])
                cuda.synchronize()
                start = time.perf_counter()
                for i in range(args.launches):
                    with_events(i)
                cuda.synchronize()
                per["raw + events"].append((time.perf_counter() - start) / args.launches * 1e6)
            if streams[0] is streams[1]:
                for label, fn in peers.items():
                    per.setdefault(label, [])
                    cuda.synchronize()
                    start = time.perf_counter()
                    for _ in range(args.launches):
                        fn()
                    cuda.synchronize()
                    per[label].append((time.perf_counter() - start) / args.launches * 1e6)
        launch_policy(rt).direct_launch = direct
        med = {k: statistics.median(v) for k, v in per.items()}
        results[scenario] = {"us_per_launch": med, "samples_us": per,
                             "ratio": ratio_of_medians(per, "tracked", "untracked")}
        results[scenario]["ratio_traced"] = ratio_of_medians(per, "tracked, traced", "tracked")
        if "tracked, Numba path" in med:
            results[scenario]["ratio_numba_path"] = ratio_of_medians(
                per, "tracked, Numba path", "untracked")
        if "tracked, C entry" in per and len(per["tracked, C entry"]) == args.rounds:
            results[scenario]["ratio_c_entry"] = ratio_of_medians(per, "tracked, C entry", "raw")
        if "raw" in per:
            results[scenario]["ratio_raw"] = ratio_of_medians(per, "tracked", "raw")
            results[scenario]["untracked_over_raw"] = ratio_of_medians(per, "untracked", "raw")
        if "raw + events" in per:
            results[scenario]["ratio_events_floor"] = ratio_of_medians(per, "tracked",
                                                                       "raw + events")
        for label in peers:
            if label in per:
                results[scenario][f"{label} / raw"] = ratio_of_medians(per, label, "raw")
    if args.threads > 0:
        results["threads"] = threads_figure(rt, tracked, plain, raw, args)
    print(f"launch overhead on {device_name()} ({args.launches} launches x {args.rounds} rounds)")
    for scenario in ("same stream", "cross stream"):
        if scenario not in results:
            continue
        r = results[scenario]
        m = r["us_per_launch"]
        line = (f"  {scenario:12s}: untracked {m['untracked']:7.2f} us  "
                f"tracked {m['tracked']:7.2f} us  ratio {r['ratio']:.3f}")
        if "ratio_numba_path" in r:
            line += (f"  (Numba path {m['tracked, Numba path']:7.2f} us, "
                     f"ratio {r['ratio_numba_path']:.3f})")
        line += f"  traced {m['tracked, traced']:7.2f} us, traced/tracked {r['ratio_traced']:.3f}"
        print(line)
        if "ratio_raw" in r:
            print(f"  {'':12s}  raw cuLaunchKernel {m['raw']:7.2f} us  tracked / raw "
                  f"{r['ratio_raw']:.3f}  untracked / raw {r['untracked_over_raw']:.3f}")
        if "ratio_events_floor" in r:
            print(f"  {'':12s}  hand-placed events floor {m['raw + events']:7.2f} us  tracked / "
                  f"floor {r['ratio_events_floor']:.3f}")
        for label in peers:
            if f"{label} / raw" in r:
                print(f"  {'':12s}  {label} {m[label]:7.2f} us  / raw {r[f'{label} / raw']:.3f}")
        if "ratio_c_entry" in r:
            print(f"  {'':12s}  compiled entry alone {m['tracked, C entry']:7.2f} us  "
                  f"(/ raw {r['ratio_c_entry']:.3f}); the Python call around it "
                  f"{m['tracked'] - m['tracked, C entry']:5.2f} us")
    if "threads" in results:
        th = results["threads"]
        lps = "  ".join(f"{k} {v:,.0f}/s" for k, v in th["launches_per_s"].items())
        print(f"  {th['threads']} threads at once: {lps}  tracked / {th['floor']} "
              f"{th['ratio']:.3f}")
    if launcher.COMPILED:
        print(f"  compiled launches: {launcher.launches()}, of which the driver layer retried "
              f"{launcher.retried()}")
    write_result("launch_overhead", {"launches": args.launches, "rounds": args.rounds,
                                     "results": results})
    return results


def peer_launchers(stream: Any, n: int) -> dict[str, Callable[[], None]]:
    """The same kernel's launch as other GPU libraries make it, on ``stream``:
    a CuPy ``RawKernel`` and a PyTorch elementwise ``add`` (each where it
    imports). Their arrays are their own; no ordering is placed."""
    out: dict[str, Callable[[], None]] = {}
    handle = int(stream.handle.value) if hasattr(stream.handle, "value") else int(stream.handle)
    try:
        import cupy as cp

        kern = cp.RawKernel(r"""
        extern "C" __global__ void body(const float* a, const float* b, float* c, long long n) {
            long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x;
            if (i < n) c[i] = a[i] + b[i];
        }""", "body")
        ca, cb, cc = (cp.zeros(n, cp.float32) for _ in range(3))
        cs = cp.cuda.ExternalStream(handle)
        cn = np.int64(n)

        def cupy_launch() -> None:
            with cs:
                kern((1,), (32,), (ca, cb, cc, cn))

        cupy_launch()
        out["CuPy RawKernel"] = cupy_launch
    except Exception as exc:  # noqa: BLE001 - a peer that is not installed is left out
        print(f"  (CuPy column left out: {type(exc).__name__}: {exc})")
    try:
        import torch

        ta, tb, tc = (torch.zeros(n, device="cuda") for _ in range(3))
        ts = torch.cuda.ExternalStream(handle)

        def torch_launch() -> None:
            with torch.cuda.stream(ts):
                torch.add(ta, tb, out=tc)

        torch_launch()
        out["PyTorch add"] = torch_launch
    except Exception as exc:  # noqa: BLE001
        print(f"  (PyTorch column left out: {type(exc).__name__}: {exc})")
    return out


def threads_figure(rt: Any, tracked: Any, plain: Any, raw: RawLaunch | None,
                   args: argparse.Namespace) -> dict[str, Any]:
    """Total launches per second of ``args.threads`` threads, each on a stream
    and arrays of its own: tracked, and the floor (raw where available, else
    untracked Numba)."""
    n = 256
    own = []
    for _ in range(args.threads):
        s = cuda.stream()
        arrays = tuple(nss.device_array(n, np.float32, stream=s) for _ in range(3))
        for x in arrays[:2]:
            nss.memset(x, 0, stream=s)
        own.append((s, arrays))
    cuda.synchronize()

    def make_tracked(t: int) -> Callable[[], None]:
        s, xs = own[t]
        launch = tracked[1, 32, s]
        return lambda: launch(*xs)

    def make_floor(t: int) -> Callable[[], None]:
        s, xs = own[t]
        if raw is not None:
            return RawLaunch(rt, tracked, xs).launcher(s)
        launch = plain[1, 32, s]
        return lambda: launch(*xs)

    floor = "raw" if raw is not None else "untracked"
    variants = {"tracked": make_tracked, floor: make_floor}
    before: dict[str, Callable[[], None]] = {}
    if args.gil_variants and raw is not None:
        # Diagnostics: the raw launch with the GIL kept through cuLaunchKernel
        # (ctypes.PyDLL), and the tracked one with it released every time.
        from numba_streamsafe.numba.launch import launcher

        def make_raw_gil(t: int) -> Callable[[], None]:
            s, xs = own[t]
            return RawLaunch(rt, tracked, xs).launcher(s, keep_gil=True)

        variants["raw, GIL held"] = make_raw_gil
        if launcher.COMPILED:
            variants["tracked, GIL released"] = make_tracked
            asked = launcher.release_gil(False)
            for label in variants:
                before[label] = functools.partial(launcher.release_gil,
                                                  label == "tracked, GIL released" or asked)
    per = threaded(variants, args.threads, args.launches, args.rounds, before)
    if before:
        launcher.release_gil(asked)
    return {"threads": args.threads, "floor": floor,
            "launches_per_s": {k: statistics.median(v) for k, v in per.items()},
            "samples_per_s": per, "ratio": ratio_of_medians(per, "tracked", floor)}


if __name__ == "__main__":
    main()
