"""Cost of check mode against ordering mode, side by side in one process.

Two runtimes of device 0 take turns, round by round: the ordering one (the
process's own) and a check-mode one (an ``AsyncResource(check=True)`` over the
same driver: no wait queued, no event recorded, every free at once). Per round:

* ``launch``: a tracked launch writing one array and reading two, on one stream;
* ``pipeline``: one run of the examples' sort -> join pipeline ordered by the
  program itself with Numba events (``orderings.NumbaEvents``): check mode
  must find no race in it, and ordering mode must queue none of its own waits
  (the program's events satisfy them all);
* ``cupy``: the same pipeline ordered with CuPy's events on the streams'
  handles (a mixed program; where CuPy is installed): check mode learns them
  from the driver observer (CUPTI) and must find no race, ordering mode
  (observer off, as by default) queues its own waits;
* ``example``: one run of ``examples/sort_join_pipeline.py``'s work as written,
  which relies on the library for its cross-stream ordering: check mode
  reports those races (real ones, for the program without the library).

The check-mode runtime observes (``AsyncResource(observe=True)``, as check
mode does by default): the driver observer runs during its rounds only
(started before each, stopped after), so the ordering rounds pay nothing for it.

Prints check / order per figure (medians of per-round ratios), the races and
the waits, and writes ``check_mode.json``.
"""

from __future__ import annotations

import argparse
import importlib
import time

import numpy as np
from _harness import SIMULATOR, cuda, device_name, ratio_of_medians, write_result
from launch_overhead import body  # the kernel the launch benchmarks time

import numba_streamsafe as nss
from numba_streamsafe import Read, Write, tracked_kernel
from numba_streamsafe._driver import observer
from numba_streamsafe.numba.launch import launcher
from numba_streamsafe.resources import AsyncResource


def main() -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--launches", type=int, default=4 if SIMULATOR else 2000)
    parser.add_argument("--rounds", type=int, default=2 if SIMULATOR else 7)
    parser.add_argument("--n", type=int, default=1 << 10 if SIMULATOR else 1 << 20)
    args = parser.parse_args()
    import pipeline as pipeline_bench  # benchmarks/pipeline.py: one_run, prepare
    import sort_join_pipeline  # examples/, which _harness puts on the path

    # Numba's events and synchronises are told to the runtimes (transparent mode's hooks).
    importlib.import_module("numba_streamsafe.numba.transparent").install()
    order = nss.get_runtime()
    check = nss.DeviceRuntime(AsyncResource(order.driver, reuse_bytes=0, check=True,
                                            observe=True))
    observing = observer.running()
    print(f"driver observer: {'running' if observing else observer.reason()}")
    try:
        import cupy  # noqa: F401
        mixed = True
    except ImportError:
        mixed = False
    kernel = tracked_kernel(body, access={"a": Read, "b": Read, "c": Write})
    s1 = cuda.stream()
    run_args = pipeline_bench.parse_args(["--n", str(args.n), "--rounds", "1"])
    pipeline, build, batches, expected, streams = pipeline_bench.prepare(run_args)
    per: dict[str, list[float]] = {}
    waits = {"queued": 0, "skipped": 0}

    direct: dict[str, list[float]] = {}

    def launches(n: int) -> float:
        a, b, c = (nss.device_array(256, np.float32, stream=s1) for _ in range(3))
        for _ in range(3):
            kernel[1, 32, s1](a, b, c)
        cuda.synchronize()
        first = launcher.launches()
        start = time.perf_counter()
        for _ in range(n):
            kernel[1, 32, s1](a, b, c)
        cuda.synchronize()
        seconds = (time.perf_counter() - start) / n
        mode = "check" if nss.get_runtime() is check else "order"
        direct.setdefault(mode, []).append((launcher.launches() - first) / n)
        return seconds

    def self_ordered(rt: nss.DeviceRuntime, how: str = "numba-events") -> float:
        marks = rt.resource.tracker.marks
        before = marks.waits, marks.skipped
        seconds, count, results, _, _ = pipeline_bench.one_run(
            how, build, batches, streams, pipeline=pipeline)
        assert np.array_equal(results, expected), "the self-ordered pipeline went wrong"
        if rt is order and how == "numba-events":
            waits["queued"] += marks.waits - before[0]
            waits["skipped"] += marks.skipped - before[1]
        return seconds

    def example() -> float:
        start = time.perf_counter()
        report = sort_join_pipeline.run(args.n, 4, True, 1)
        cuda.synchronize()
        assert report is not None
        return time.perf_counter() - start

    def use(rt: nss.DeviceRuntime) -> None:
        """Make ``rt`` the process's runtime; the observer runs for the check one only."""
        nss.set_runtime(rt)
        if rt is check and observing:
            observer.start()
        else:
            observer.stop()

    for rt in (order, check):  # warm both (compiles once)
        use(rt)
        launches(10)
        self_ordered(rt)
        if mixed:
            self_ordered(rt, "cupy-events")
        example()
    waits = {"queued": 0, "skipped": 0}
    log = check.resource.tracker.race_log
    races_before = len(log.hazards)
    races: dict[str, int] = {"pipeline": 0, "cupy": 0, "example": 0}
    for _ in range(args.rounds):
        for name, rt in (("order", order), ("check", check)):
            use(rt)
            per.setdefault(f"{name} launch", []).append(launches(args.launches))
            seen = len(log.hazards)
            per.setdefault(f"{name} pipeline", []).append(self_ordered(rt))
            if rt is check:
                races["pipeline"] += len(log.hazards) - seen
            if mixed:
                seen = len(log.hazards)
                per.setdefault(f"{name} cupy", []).append(self_ordered(rt, "cupy-events"))
                if rt is check:
                    check.resource.tracker.catch_up()
                    races["cupy"] += len(log.hazards) - seen
            seen = len(log.hazards)
            per.setdefault(f"{name} example", []).append(example())
            if rt is check:
                races["example"] += len(log.hazards) - seen
    use(order)
    result = {"device": device_name(), "rounds": args.rounds, "launches": args.launches,
              "n": args.n, "observer": observing,
              "races_in_self_ordered_pipeline": races["pipeline"],
              "races_in_cupy_ordered_pipeline": races["cupy"] if mixed else None,
              "races_in_example": races["example"],
              "races_in_warm_up": races_before,
              "library_waits_in_self_ordered_pipeline": waits["queued"],
              "waits_skipped_in_self_ordered_pipeline": waits["skipped"],
              "example_races": sorted({str(h) for h in log.hazards})[:20]}
    print(f"check mode against ordering mode on {result['device']} ({args.rounds} rounds)")
    for figure in ("launch", "pipeline", *(("cupy",) if mixed else ()), "example"):
        ratio = ratio_of_medians(per, f"check {figure}", f"order {figure}")
        result[f"check_over_order_{figure}"] = ratio
        unit, scale = ("us", 1e6) if figure == "launch" else ("ms", 1e3)
        order_t = sorted(per[f"order {figure}"])[len(per[f"order {figure}"]) // 2] * scale
        check_t = sorted(per[f"check {figure}"])[len(per[f"check {figure}"]) // 2] * scale
        result[f"order_{figure}"] = order_t
        result[f"check_{figure}"] = check_t
        print(f"  {figure:9s}: order {order_t:9.2f} {unit}  check {check_t:9.2f} {unit}  "
              f"check / order {ratio:.3f}")
    result["direct_share"] = {k: min(v) for k, v in direct.items()}
    print(f"  launches taken by the compiled launch: {result['direct_share']}")
    print(f"  races found in check mode: self-ordered pipeline {races['pipeline']}, "
          f"ordered with CuPy's events {races['cupy'] if mixed else 'n/a'}, "
          f"the example as written (relies on the library) {races['example']}")
    print(f"  ordering mode, self-ordered pipeline: library waits queued {waits['queued']}, "
          f"skipped {waits['skipped']}")
    write_result("check_mode", result)
    return result


if __name__ == "__main__":
    main()
