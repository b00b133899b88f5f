"""Cost of check mode against ordering mode, side by side in one process.

Two runtimes of device 0 take turns, round by round: the ordering one (the
process's own) and a check-mode one (its driver wrapped in a
:class:`~numba_streamsafe._driver.mirror.CheckingDriver`, tracking off, every
free at once), each installed for its rounds. Per round:

* ``launch``: a tracked launch writing one array and reading two, on one
  stream and across two streams (every launch writes ``c`` on the other
  stream: ordering mode waits, check mode reports the races it finds);
* ``pipeline``: one run of ``examples/sort_join_pipeline.py``'s work (its
  races in check mode are real: it relies on the library for its ordering).

Prints check / order per figure (medians of per-round ratios) and writes
``check_mode.json``.
"""

from __future__ import annotations

import argparse
import time

import numpy as np
from _harness import SIMULATOR, cuda, device_name, ratio_of_medians, write_result

import numba_streamsafe as nss
from numba_streamsafe import Read, Write, tracked_kernel
from numba_streamsafe._driver.mirror import CheckingDriver
from numba_streamsafe.numba.launch.policy import launch_policy
from numba_streamsafe.resources import AsyncResource


def body(a, b, c):
    i = cuda.grid(1)
    if i < c.size:
        c[i] = a[i] + b[i]


def main() -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--launches", type=int, default=4 if SIMULATOR else 2000)
    parser.add_argument("--rounds", type=int, default=2 if SIMULATOR else 7)
    parser.add_argument("--n", type=int, default=1 << 10 if SIMULATOR else 1 << 20)
    args = parser.parse_args()
    import sort_join_pipeline  # examples/, which _harness puts on the path

    order = nss.get_runtime()
    check = nss.DeviceRuntime(AsyncResource(CheckingDriver(order.driver), reuse_bytes=0))
    launch_policy(check).tracking = False
    kernel = tracked_kernel(body, access={"a": Read, "b": Read, "c": Write})
    s1, s2 = cuda.stream(), cuda.stream()
    per: dict[str, list[float]] = {}

    def launches(streams: list, n: int) -> float:
        a, b, c = (nss.device_array(256, np.float32, stream=s1) for _ in range(3))
        for _ in range(3):
            kernel[1, 32, s1](a, b, c)
        cuda.synchronize()
        start = time.perf_counter()
        for i in range(n):
            kernel[1, 32, streams[i & 1]](a, b, c)
        cuda.synchronize()
        return (time.perf_counter() - start) / n

    def pipeline() -> float:
        start = time.perf_counter()
        report = sort_join_pipeline.run(args.n, 4, True, 1)
        cuda.synchronize()
        assert report is not None
        return time.perf_counter() - start

    for rt in (order, check):  # warm both (compiles once)
        nss.set_runtime(rt)
        launches([s1, s1], 10)
        pipeline()
    for _ in range(args.rounds):
        for name, rt in (("order", order), ("check", check)):
            nss.set_runtime(rt)
            per.setdefault(f"{name} same", []).append(launches([s1, s1], args.launches))
            per.setdefault(f"{name} cross", []).append(launches([s1, s2], args.launches))
            per.setdefault(f"{name} pipeline", []).append(pipeline())
    nss.set_runtime(order)
    result = {"device": device_name(), "rounds": args.rounds, "launches": args.launches,
              "n": args.n, "hazards_in_check_mode": len(check.driver.hazards)}
    print(f"check mode against ordering mode on {result['device']} ({args.rounds} rounds)")
    for figure in ("same", "cross", "pipeline"):
        ratio = ratio_of_medians(per, f"check {figure}", f"order {figure}")
        result[f"check_over_order_{figure}"] = ratio
        unit, scale = ("us", 1e6) if figure != "pipeline" else ("ms", 1e3)
        order_t = sorted(per[f"order {figure}"])[len(per[f"order {figure}"]) // 2] * scale
        check_t = sorted(per[f"check {figure}"])[len(per[f"check {figure}"]) // 2] * scale
        print(f"  {figure:9s}: order {order_t:9.2f} {unit}  check {check_t:9.2f} {unit}  "
              f"check / order {ratio:.3f}")
    print(f"  races the model found in check mode (the pipeline relies on the library): "
          f"{result['hazards_in_check_mode']}")
    write_result("check_mode", result)
    return result


if __name__ == "__main__":
    main()
