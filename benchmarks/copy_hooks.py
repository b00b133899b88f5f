"""The host work of transparent mode's hook on one of Numba's copies, with the
driver taken out: a hooked device-to-device copy of two tracked blocks on one
stream object, around a copy that does nothing, against the simulated driver
with its event, wait and access-tracing calls emptied. The same call unhooked
is printed beside it (the floor: a Python call).

A GPU copy's host time is this work plus the driver's and Numba's. Like
``engine_host.py`` it measures the library's own part on any machine, so that
two trees can be compared by running this script with each on ``PYTHONPATH``,
processes taking turns.

    python benchmarks/copy_hooks.py [--calls N] [--rounds R]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE.parent)]
from engine_host import QuietDriver  # noqa: E402

import numba_streamsafe as nss  # noqa: E402
from numba_streamsafe.resources import AsyncResource  # noqa: E402
from numba_streamsafe.runtime import DeviceRuntime  # noqa: E402
from tests.helpers.numba_objects import NumbaArray, NumbaStream  # noqa: E402


def _copy(dst: Any, src: Any, size: int, stream: Any = 0) -> None:
    """Numba's ``device_to_device``, doing nothing."""


def _hook() -> Any:
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
    args = parser.parse_args(argv)
    drv = QuietDriver(backing=False)
    res = AsyncResource(drv)
    nss.set_runtime(DeviceRuntime(res, drv))  # this process's runtime of device 0
    s = drv.create_stream()
    dst, src = NumbaArray(res.allocate(1 << 16, s)), NumbaArray(res.allocate(1 << 16, s))
    stream = NumbaStream(s)
    variants = {"hooked": _hook(), "unhooked": _copy}
    per: dict[str, list[float]] = {v: [] for v in variants}
    for _ in range(args.rounds):
        for name, copy in variants.items():
            start = time.perf_counter_ns()
            for _ in range(args.calls):
                copy(dst, src, 1 << 16, stream)
            per[name].append((time.perf_counter_ns() - start) / args.calls / 1000)
    med = {v: statistics.median(x) for v, x in per.items()}
    print(f"a hooked device copy's own work, driver calls empty ({args.calls} calls x "
          f"{args.rounds} rounds): " + ", ".join(f"{v} {med[v]:.2f} us" for v in variants))
    return med


if __name__ == "__main__":
    main()
