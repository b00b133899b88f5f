"""The host work of transparent mode's hooks on Numba, with the driver taken
out, against the simulated driver with its event, wait and access-tracing
calls emptied; each beside the same call unhooked (the floor: a Python call):

* ``copy``: a hooked device-to-device copy of two tracked blocks on one
  stream object, around a copy that does nothing;
* ``record+wait``: a hooked ``Event.record`` on a stream with a use, then
  ``Event.wait`` on another stream (the program ordering itself), around
  methods that do nothing. No libcuda here: the hooks fall back to the
  methods they wrap;
* ``synchronize``: a hooked ``Stream.synchronize`` of a stream object with a
  use, around a method that does nothing.

A GPU call's host time is this work plus the driver's and Numba's. Like
``engine_host.py`` it measures the library's own part on any machine, so that
two trees can be compared by running this script with each on ``PYTHONPATH``,
processes taking turns.

    python benchmarks/hooks_host.py [--calls N] [--rounds R]
        [--variant all|copy|record+wait|synchronize]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from engine_host import QuietDriver

import numba_streamsafe as nss  # as PYTHONPATH finds it: trees are compared so
from numba_streamsafe.core.access import Access
from numba_streamsafe.numba import program_order
from numba_streamsafe.resources import AsyncResource
from numba_streamsafe.runtime import DeviceRuntime

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # this checkout's helpers
from tests.helpers.numba_objects import NumbaArray, NumbaEvent, NumbaStream  # noqa: E402


def _copy(dst: Any, src: Any, size: int, stream: Any = 0) -> None:
    """Numba's ``device_to_device``, doing nothing."""


def _record(self: Any, stream: Any = 0) -> None:
    """Numba's ``Event.record``, doing nothing."""


def _wait(self: Any, stream: Any = 0) -> None:
    """Numba's ``Event.wait``, doing nothing."""


def _synchronize(self: Any) -> None:
    """Numba's ``Stream.synchronize``, doing nothing."""


def _synchronize_hook() -> Any:
    try:
        return program_order.stream_synchronize_hook(_synchronize)  # type: ignore[attr-defined]
    except AttributeError:  # a tree from before the hook moved to program_order
        from numba_streamsafe.numba import transparent

        return transparent._gpu_stream_synchronize(_synchronize)  # type: ignore[attr-defined]


def _copy_hook() -> Any:
    try:
        from numba_streamsafe.numba import copies
    except ImportError:  # a tree from before numba/copies.py
        from numba_streamsafe.numba import transparent

        return transparent._copy_hook(  # type: ignore[attr-defined]
            _copy, label="device copy (Numba)", write_dst=True, read_src=True)
    return copies.copy_hook(_copy, fence=True, label="device copy (Numba)", write_dst=True,
                            read_src=True)


def main(argv: list[str] | None = None) -> dict[str, float]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=5000)
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--variant", choices=("all", "copy", "record+wait", "synchronize"),
                        default="all", help="one call alone, hooked and unhooked (for callgrind)")
    args = parser.parse_args(argv)
    drv = QuietDriver(backing=False)
    res = AsyncResource(drv)
    nss.set_runtime(DeviceRuntime(res, drv))  # this process's runtime of device 0
    a, b = drv.create_stream(), drv.create_stream()
    dst, src = NumbaArray(res.allocate(1 << 16, a)), NumbaArray(res.allocate(1 << 16, a))
    on_a, on_b = NumbaStream(a), NumbaStream(b)
    block = res.allocate(1 << 16, a)
    use = [(block, Access.WRITE, 0, block.nbytes)]
    event = NumbaEvent(drv.event_create())
    copy_hook = _copy_hook()
    record, wait = program_order.record_hook(_record), program_order.wait_hook(_wait)
    synchronize = _synchronize_hook()

    def copies(copy: Callable[..., Any]) -> float:
        start = time.perf_counter_ns()
        for _ in range(args.calls):
            copy(dst, src, 1 << 16, on_a)
        return (time.perf_counter_ns() - start) / args.calls / 1000

    def orderings(rec: Callable[..., Any], wt: Callable[..., Any]) -> float:
        """Each record after a use on ``a`` (its mark to close); only the two
        calls timed."""
        total = 0
        for _ in range(args.calls):
            res.preflight(use, a)
            res.commit(use, a)
            start = time.perf_counter_ns()
            rec(event, on_a)
            wt(event, on_b)
            total += time.perf_counter_ns() - start
        return total / args.calls / 1000

    def syncs(sync: Callable[..., Any]) -> float:
        """Each synchronise after a use on ``a`` by its stream object (its mark
        to close); only the call timed."""
        total = 0
        for _ in range(args.calls):
            res.preflight(use, a, on_a)
            res.commit(use, a, on_a)
            start = time.perf_counter_ns()
            sync(on_a)
            total += time.perf_counter_ns() - start
        return total / args.calls / 1000

    variants: dict[str, Callable[[], float]] = {
        "copy hooked": lambda: copies(copy_hook), "copy unhooked": lambda: copies(_copy),
        "record+wait hooked": lambda: orderings(record, wait),
        "record+wait unhooked": lambda: orderings(_record, _wait),
        "synchronize hooked": lambda: syncs(synchronize),
        "synchronize unhooked": lambda: syncs(_synchronize)}
    if args.variant != "all":
        variants = {v: run for v, run in variants.items() if v.startswith(args.variant + " ")}
    per: dict[str, list[float]] = {v: [] for v in variants}
    for _ in range(args.rounds):
        for name, run in variants.items():
            per[name].append(run())
    med = {v: statistics.median(x) for v, x in per.items()}
    print(f"transparent mode's hooks, their own work, driver calls empty ({args.calls} calls x "
          f"{args.rounds} rounds): " + ", ".join(f"{v} {med[v]:.2f} us" for v in variants))
    return med


if __name__ == "__main__":
    main()
