"""A plain Numba program that orders itself with Numba events, under the
plugin: what the library costs it, against the same program leaving the
ordering to the library, and what a hooked ``Event.record`` / ``wait`` costs
against Numba's own.

Two streams take turns: a producer kernel writes ``x`` on one, an event
recorded there is waited for on the other, a consumer kernel reads ``x`` and
writes ``y`` there, and an event orders the next producer after the consumer.
Every cross-stream use is ordered by the program itself, so the library need
queue no wait of its own (``memory_stats()["waits_inserted"]``) and record no
event (``events_recorded``). The variants, taking turns in one process:

* ``self``: that round (two launches, two records, two waits);
* ``self, unhooked``: that round with Numba's own ``Event.record`` and
  ``wait`` (the hooks taken out for it): the library does not learn the
  program's ordering and queues its own waits besides, as it did before it
  followed the program's events;
* ``library``: the same two launches without the program's events: the
  library queues its waits (and records its events) itself;
* ``one stream``: the same two launches on the producer's stream alone, no
  event: the round with no ordering to make, so that each round's ordering
  costs what it takes more than this one;
* ``record`` / ``record+wait``: an ``Event.record`` on the producer's stream
  after a launch there (and a wait for it on the other), hooked, against the
  same calls through Numba's own methods (the hooks' originals), in turns;
* ``record+wait libcuda``: the same pair as ``cuEventRecord`` and
  ``cuStreamWaitEvent`` called from Python through the engine's libcuda
  entry points, nothing else: what the program's pair costs with no
  bookkeeping at all, the least any hook of Python's calls can cost.

The hooked pair's cost above that floor is printed (``record+wait: hooked -
libcuda us``), and the ordering's cost per round for each way: the library's own
(``library`` less ``one stream``), the program's through the hooks
(``self`` less ``one stream``), and the floor of the program's two pairs
(twice ``record+wait libcuda``). ``self at the floor / library`` is the round's
ratio were the two hooked pairs to cost no more than that floor (``self`` less
twice the hooked pair's cost above it): what the best hooks of Python's calls
could reach.

Prints one JSON line: microseconds per round or call (median of
``--repeats``), the ratios, and the library's waits and events per round.
Runs with any version of the package (to compare trees: put one on
``PYTHONPATH`` and run this file).

Run with ``NUMBA_CUDA_MEMORY_MANAGER=numba_streamsafe``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from collections.abc import Callable

import numpy as np
from numba import cuda

import numba_streamsafe as nss
from numba_streamsafe.numba import transparent


@cuda.jit
def produce(x, k):
    i = cuda.grid(1)
    if i < x.size:
        x[i] = k


@cuda.jit
def consume(x, y):
    i = cuda.grid(1)
    if i < y.size:
        y[i] = x[i] + 1.0


def _original(event_type: type, name: str) -> Callable[..., None]:
    """Numba's own ``event_type.name`` (the hook's original), or the method itself
    where it is not hooked."""
    for (owner, attr), original in transparent._saved.items():
        if attr == name and isinstance(owner, type) and issubclass(event_type, owner):
            return original  # type: ignore[no-any-return]
    return getattr(event_type, name)  # type: ignore[no-any-return]


def _libcuda_pair(event: object, a: object, b: object) -> tuple | None:
    """``(record, wait, event, stream a, stream b)``: libcuda's record and wait
    as the engine calls them, with the handles they take; None where the
    engine does not reach libcuda (not compiled, the simulator, a tree
    without them)."""
    try:
        from numba_streamsafe._driver.libcuda import loaded, record_event, wait_event
        from numba_streamsafe.numba.program_order import event_handle, stream_ref
    except ImportError:
        return None
    if os.environ.get("NUMBA_ENABLE_CUDASIM") == "1" or not loaded():
        return None
    rt = nss.get_runtime()
    ev, sa, sb = event_handle(event), stream_ref(rt, a)[0], stream_ref(rt, b)[0]
    if record_event(ev, sa) != 0 or wait_event(sb, ev) != 0:
        return None
    return record_event, wait_event, ev, sa, sb


def main() -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=2000)
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args()
    simulated = os.environ.get("NUMBA_ENABLE_CUDASIM") == "1"
    blocks, threads = (1, 32) if simulated else (64, 1024)  # the simulator runs threads
    a, b = cuda.stream(), cuda.stream()
    x = cuda.device_array(blocks * threads, np.float32, stream=a)
    y = cuda.device_array(blocks * threads, np.float32, stream=b)
    timing = {} if simulated else {"timing": False}
    made, consumed = cuda.event(**timing), cuda.event(**timing)
    record, wait = _original(type(made), "record"), _original(type(made), "wait")
    n = args.rounds

    def self_ordered() -> float:
        start = time.perf_counter()
        for k in range(n):
            produce[blocks, threads, a](x, float(k))
            made.record(a)
            made.wait(b)
            consume[blocks, threads, b](x, y)
            consumed.record(b)
            consumed.wait(a)
        cuda.synchronize()
        return (time.perf_counter() - start) / n

    def unhooked() -> float:
        """The self-ordered round with Numba's own ``record`` and ``wait`` (the
        hooks taken out): the library does not learn the program's ordering and
        queues its own waits, as before it followed the program's events."""
        event_type = type(made)
        hooked = event_type.record, event_type.wait
        event_type.record, event_type.wait = record, wait
        try:
            return self_ordered()
        finally:
            event_type.record, event_type.wait = hooked

    def launches(second: object) -> float:
        """The round's two launches, the consumer on ``second``, no event."""
        start = time.perf_counter()
        for k in range(n):
            produce[blocks, threads, a](x, float(k))
            consume[blocks, threads, second](x, y)
        cuda.synchronize()
        return (time.perf_counter() - start) / n

    bare = _libcuda_pair(made, a, b)

    def bare_calls() -> float:
        """The pair through libcuda's entry points alone (``bare``)."""
        assert bare is not None
        rec, wt, ev, sa, sb = bare
        total = 0.0
        for k in range(n // 4):
            produce[blocks, threads, a](x, float(k))
            start = time.perf_counter()
            rec(ev, sa)
            wt(sb, ev)
            total += time.perf_counter() - start
        cuda.synchronize()
        return total / (n // 4)

    def calls(hooked: bool, waits: bool) -> float:
        """One launch on ``a`` (uses there to close), then the timed calls."""
        total = 0.0
        for k in range(n // 4):
            produce[blocks, threads, a](x, float(k))
            start = time.perf_counter()
            if hooked:
                made.record(a)
                if waits:
                    made.wait(b)
            else:
                record(made, a)
                if waits:
                    wait(made, b)
            total += time.perf_counter() - start
        cuda.synchronize()
        return total / (n // 4)

    variants = {"self": self_ordered, "self, unhooked": unhooked, "library": lambda: launches(b),
                "record hooked": lambda: calls(True, False),
                "record numba": lambda: calls(False, False),
                "record+wait hooked": lambda: calls(True, True),
                "record+wait numba": lambda: calls(False, True),
                "one stream": lambda: launches(a)}
    if bare is not None:
        variants["record+wait libcuda"] = bare_calls
    for run in variants.values():  # compiled and warm
        n, full = 10, n
        run()
        n = full
    times: dict[str, list[float]] = {k: [] for k in variants}
    counts: dict[str, list[float]] = {}
    for _ in range(args.repeats):
        for name, run in variants.items():
            before = nss.memory_stats()
            times[name].append(run())
            after = nss.memory_stats()
            if name in ("self", "self, unhooked", "library"):
                for key in ("waits_inserted", "events_recorded"):
                    counts.setdefault(f"{name} {key}", []).append(
                        (after.get(key, 0) - before.get(key, 0)) / n)
    assert float(y.copy_to_host()[0]) == float(n - 1) + 1.0, "the consumer read a stale x"
    us = {k: statistics.median(v) * 1e6 for k, v in times.items()}
    result = {
        "us": {k: round(v, 3) for k, v in us.items()},
        "self / library": round(us["self"] / us["library"], 3),
        "self / self unhooked": round(us["self"] / us["self, unhooked"], 3),
        "record: hooked - numba us": round(us["record hooked"] - us["record numba"], 3),
        "record+wait: hooked - numba us": round(us["record+wait hooked"]
                                                - us["record+wait numba"], 3),
        "record+wait: hooked - libcuda us": round(us["record+wait hooked"]
                                                  - us["record+wait libcuda"], 3)
        if bare is not None else None,
        "self at the floor / library": round(
            (us["self"] - 2 * (us["record+wait hooked"] - us["record+wait libcuda"]))
            / us["library"], 3) if bare is not None else None,
        "ordering us per round": {
            "library": round(us["library"] - us["one stream"], 3),
            "self, hooked": round(us["self"] - us["one stream"], 3),
            "self at the floor (2 x record+wait libcuda)":
                round(2 * us["record+wait libcuda"], 3) if bare is not None else None},
        "per round": {k: statistics.median(v) for k, v in counts.items()},
        "events held at the end": nss.memory_stats().get("events.in_use"),
        "package": os.path.dirname(nss.__file__),
    }
    print(json.dumps(result))
    return result


if __name__ == "__main__":
    main()
