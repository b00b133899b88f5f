"""The engine's host work per tracked launch, with the driver taken out: the
compiled preflight and commit of three whole-array uses (two reads, one write)
against a driver whose event and wait calls do nothing.

A GPU launch's host time is this work plus the driver's and Python's; on a
shared machine that total moves by several percent from process to process,
which hides an engine change of a few percent. This measures the engine alone,
on any machine, so that two trees can be compared by running the script with
each on ``PYTHONPATH``, processes taking turns (``--rounds`` interleaves the
variants inside one process).

Variants: ``same`` (every launch on one stream), ``cross`` (launches alternate
two streams, each reading what the other wrote: a wait per launch) and
``views`` (as ``same`` with each use a half of its block).

    python benchmarks/engine_host.py [--launches N] [--rounds R]
"""

from __future__ import annotations

import argparse
import statistics
import time

from numba_streamsafe._driver.sim import SimDriver
from numba_streamsafe.core.access import Access
from numba_streamsafe.resources import AsyncResource


class QuietDriver(SimDriver):
    """The simulated driver with no work in its event, wait and access-tracing
    calls (the engine's decisions are all that is left to time)."""

    traces_accesses = False

    def event_record(self, event: int, stream: int) -> None:
        pass

    def stream_wait_event(self, stream: int, event: int) -> None:
        pass

    def event_query(self, event: int) -> bool:
        return False


def run(variant: str, launches: int) -> float:
    """Nanoseconds per launch (preflight + commit) of ``variant``."""
    drv = QuietDriver()
    res = AsyncResource(drv)
    s, t = drv.create_stream(), drv.create_stream()
    a, b, c = (res.allocate(1 << 16, s) for _ in range(3))
    if variant == "views":
        half = 1 << 15
        uses = [(a, Access.READ, 0, half), (b, Access.READ, 0, half), (c, Access.WRITE, 0, half)]
        other = uses
    else:
        uses = [(a, Access.READ), (b, Access.READ), (c, Access.WRITE)]
        other = [(c, Access.READ), (b, Access.READ), (a, Access.WRITE)]
    streams = (s, t) if variant == "cross" else (s, s)
    pre, com = res.preflight, res.commit
    for i in range(1000):  # warm: marks and events exist
        st = streams[i & 1]
        u = uses if i & 1 == 0 else other
        pre(u, st)
        com(u, st)
    start = time.perf_counter_ns()
    for i in range(launches):
        st = streams[i & 1]
        u = uses if i & 1 == 0 else other
        pre(u, st)
        com(u, st)
    return (time.perf_counter_ns() - start) / launches


def main(argv: list[str] | None = None) -> dict[str, float]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--launches", type=int, default=200_000)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args(argv)
    variants = ("same", "cross", "views")
    per: dict[str, list[float]] = {v: [] for v in variants}
    for _ in range(args.rounds):
        for v in variants:
            per[v].append(run(v, args.launches))
    med = {v: statistics.median(x) for v, x in per.items()}
    print(f"engine preflight + commit, three uses, driver calls empty ({args.launches} launches "
          f"x {args.rounds} rounds): " + ", ".join(f"{v} {med[v]:.0f} ns" for v in variants))
    return med


if __name__ == "__main__":
    main()
