"""Races and correctly ordered programs run in check mode on a GPU, by
``test_check_mode_gpu.py`` in a child interpreter with
``NUMBA_STREAMSAFE_MODE=check``, ``NUMBA_STREAMSAFE_CHECK_REPORT=exit`` and
(``plain`` argument) ``NUMBA_CUDA_MEMORY_MANAGER=numba_streamsafe``; with a
second argument ``block``, in ordering mode, each case inside
``nss.race_check()``.

Each case runs once; the races the checking resource reports during it are
printed as one line ``CASE name kinds lines``: the hazard kinds, and the
lines of this file the reports name (``-`` for none). Also prints ``WAITS n``,
the waits the library queued over the whole run (0: the program ran as written).
"""

from __future__ import annotations

import contextlib
import gc
import re
import sys

import numpy as np
from kernels import copy as tracked_copy  # tests/gpu/kernels.py, beside this file
from kernels import fill as tracked_fill
from numba import cuda

import numba_streamsafe as nss

N = 1 << 16


@cuda.jit
def fill(out, value):
    i = cuda.grid(1)
    while i < out.size:
        out[i] = value
        i += cuda.gridsize(1)


@cuda.jit
def copy(src, dst):
    i = cuda.grid(1)
    while i < src.size:
        dst[i] = src[i]
        i += cuda.gridsize(1)


def arrays(plain, *streams):
    """One array per stream, allocated on it. Numba's allocations under the
    plugin come from the current stream scope (a Numba array's own stream
    stays the default one, so its copy_to_host() is synchronous)."""
    if not plain:
        return [nss.device_array(N, np.float32, stream=s) for s in streams]
    out = []
    for s in streams:
        with nss.stream_scope(s):
            out.append(cuda.device_array(N, np.float32))
    return out


# ------------------------------------------------------------------- races
def raw(plain, a, b):
    x, y = arrays(plain, a, b)
    (fill if plain else tracked_fill)[64, 256, a](x, 1.0)
    (copy if plain else tracked_copy)[64, 256, b](x, y)       # reads x: not after the fill


def war(plain, a, b):
    x, y = arrays(plain, a, b)
    cuda.synchronize()
    (copy if plain else tracked_copy)[64, 256, a](x, y)       # reads x on a
    (fill if plain else tracked_fill)[64, 256, b](x, 2.0)     # writes x: not after the read


def waw(plain, a, b):
    x, = arrays(plain, a)
    cuda.synchronize()
    (fill if plain else tracked_fill)[64, 256, a](x, 1.0)
    (fill if plain else tracked_fill)[64, 256, b](x, 2.0)     # writes x: not after a's write


def free_after_use(plain, a, b):
    x, y = arrays(plain, a, b)
    cuda.synchronize()
    (copy if plain else tracked_copy)[64, 256, b](x, y)       # reads x on b
    del x                                                     # freed on a, b may still read
    gc.collect()
    nss.get_runtime().flush()


def copy_after_write(plain, a, b):
    x, = arrays(plain, a)
    cuda.synchronize()
    (fill if plain else tracked_fill)[64, 256, a](x, 1.0)
    host = np.empty(N, np.float32)
    if plain:
        x.copy_to_host(host, stream=b)                        # reads x on b
    else:
        nss.copy_to_host(x, host, stream=b)                   # reads x on b
    b.synchronize()


# ----------------------------------------------------------------- ordered
def event(plain, a, b):
    x, y = arrays(plain, a, b)
    (fill if plain else tracked_fill)[64, 256, a](x, 1.0)
    done = cuda.event()
    done.record(a)
    done.wait(b)
    (copy if plain else tracked_copy)[64, 256, b](x, y)


def event_synchronize(plain, a, b):
    x, y = arrays(plain, a, b)
    (fill if plain else tracked_fill)[64, 256, a](x, 1.0)
    done = cuda.event()
    done.record(a)
    done.synchronize()
    (copy if plain else tracked_copy)[64, 256, b](x, y)


def event_query(plain, a, b):
    x, y = arrays(plain, a, b)
    (fill if plain else tracked_fill)[64, 256, a](x, 1.0)
    done = cuda.event()
    done.record(a)
    if not hasattr(done, "query"):  # the simulator's events have none
        done.synchronize()
    while hasattr(done, "query") and not done.query():
        pass
    (copy if plain else tracked_copy)[64, 256, b](x, y)


def stream_synchronize(plain, a, b):
    x, y = arrays(plain, a, b)
    (fill if plain else tracked_fill)[64, 256, a](x, 1.0)
    a.synchronize()
    (copy if plain else tracked_copy)[64, 256, b](x, y)


def device_synchronize(plain, a, b):
    x, y = arrays(plain, a, b)
    (fill if plain else tracked_fill)[64, 256, a](x, 1.0)
    cuda.synchronize()
    (copy if plain else tracked_copy)[64, 256, b](x, y)


def synchronous_copy(plain, a, b):
    """A copy to the host on the default stream: the host waits for a's fill
    (the legacy stream waits for blocking streams) and for the copy."""
    x, y = arrays(plain, a, b)
    (fill if plain else tracked_fill)[64, 256, a](x, 1.0)
    host = x.copy_to_host() if plain else nss.copy_to_host(x, stream=0)
    (copy if plain else tracked_copy)[64, 256, b](x, y)
    (fill if plain else tracked_fill)[64, 256, b](x, 2.0)     # after the copy's read
    assert host[0] == 1.0


def legacy_stream(plain, a, b):
    """Numba's streams are blocking: the legacy default stream's work waits for
    theirs, and theirs for its."""
    x, y = arrays(plain, a, b)
    (fill if plain else tracked_fill)[64, 256, a](x, 1.0)
    (copy if plain else tracked_copy)[64, 256, 0](x, y)       # legacy: after a's fill
    (fill if plain else tracked_fill)[64, 256, b](x, 3.0)     # b: after the legacy copy


RACES = (raw, war, waw, free_after_use, copy_after_write)
ORDERED = (event, event_synchronize, event_query, stream_synchronize, device_synchronize,
           synchronous_copy, legacy_stream)


def main() -> None:
    plain = sys.argv[1:2] == ["plain"]
    block = sys.argv[2:3] == ["block"]  # ordering mode, each case in a race check
    a, b = cuda.stream(), cuda.stream()
    for case in RACES + ORDERED:
        cuda.synchronize()
        gc.collect()
        before = len(nss.hazards())
        with nss.race_check(stop_at_first=False) if block else contextlib.nullcontext() as check:
            case(plain, a, b)
            cuda.synchronize()
            gc.collect()
            nss.get_runtime().flush()
        found = check.hazards if block else nss.hazards()[before:]
        kinds = ",".join(h.kind for h in found) or "-"
        lines = ",".join(sorted({m for h in found
                                 for m in re.findall(r"check_program\.py:(\d+)", str(h))})) or "-"
        print("CASE", case.__name__, kinds, lines, flush=True)
    print("WAITS", nss.memory_stats()["waits_inserted"], flush=True)


if __name__ == "__main__":
    main()
