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
import time
from types import SimpleNamespace
from typing import Any

import numba_streamsafe as nss
from numba_streamsafe._driver.sim import SimDriver
from numba_streamsafe.resources import AsyncResource
from numba_streamsafe.runtime import DeviceRuntime


class QuietDriver(SimDriver):
    """The simulated driver with no work in its event, wait and tracing calls."""

    traces_accesses = False

    def event_record(self, event: int, stream: int) -> None:
        pass

    def stream_wait_event(self, stream: int, event: int) -> None:
        pass

    def event_query(self, event: int) -> bool:
        return False


class _Memory:
    """What the hooks read of Numba's ``MemoryPointer``."""

    def __init__(self, block: Any) -> None:
        self.owner = SimpleNamespace(_nss_block=block)
        self.device_pointer_value = block.ptr
        self.size = block.nbytes


class _Array:
    """What the hooks read of Numba's device array."""

    def __init__(self, block: Any) -> None:
        self.gpu_data = _Memory(block)


class _Stream:
    """A stream object as Numba passes it (it carries its handle)."""

    def __init__(self, handle: int) -> None:
        self.handle = handle


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
    dst, src = _Array(res.allocate(1 << 16, s)), _Array(res.allocate(1 << 16, s))
    stream = _Stream(s)
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
