"""Mixed programs on a GPU, run by ``test_mixed_gpu.py`` in a child interpreter
with the plugin selected (``NUMBA_CUDA_MEMORY_MANAGER=numba_streamsafe``):
plain Numba kernels on CuPy's, PyTorch's and cuda.core's streams (through
``cuda.external_stream``), whose cross-stream order comes from those
libraries (their events, stream, event and device synchronises, PyTorch's
``wait_stream``), or from a Numba event recorded and waited on second
``external_stream`` objects of the streams' handles; and CuPy's copies and
fills into the library's memory.

Usage: ``mixed_program.py ordered|unordered [lib ...]``. Each case runs once
and prints ``CASE lib name kinds lines wrong``: the race kinds reported
while it ran and the lines of this file they name (``-`` for none), and
whether the consumer read a wrong value (``0``/``1``). Also prints the
observer's state (``OBSERVER ...``), and ``WAITS queued skipped`` at the end.
In check mode (``NUMBA_STREAMSAFE_MODE=check``) every race is collected
(``NUMBA_STREAMSAFE_CHECK_REPORT=exit``); in ordering mode the library orders
what the program leaves unordered.
"""

from __future__ import annotations

import functools
import sys

import numpy as np
from numba import cuda

import numba_streamsafe as nss
from numba_streamsafe._driver import observer

N = 1 << 20
ORDERED = sys.argv[1] == "ordered"


@cuda.jit
def produce(out, value, spin):
    """Writes ``value`` everywhere, slowly (so an unordered reader sees the old value)."""
    i = cuda.grid(1)
    while i < out.size:
        acc = value
        for _ in range(spin):
            acc = acc * 1.0000001 - value * 0.0000001
        out[i] = value + (acc - acc)
        i += cuda.gridsize(1)


@cuda.jit
def consume(src, dst):
    i = cuda.grid(1)
    while i < src.size:
        dst[i] = src[i]
        i += cuda.gridsize(1)


# ----------------------------------------------------------------- the libraries
class Lib:
    """Streams and ordering of one library: ``stream()`` a new stream object,
    ``handle(s)``, and the orderings it offers (absent: not offered)."""

    name = ""

    def __init__(self) -> None:
        self.s1, self.s2 = self.stream(), self.stream()

    def handle(self, s):  # pragma: no cover - each library's own
        raise NotImplementedError


class CuPy(Lib):
    name = "cupy"

    def __init__(self) -> None:
        import cupy

        self.cp = cupy
        super().__init__()

    def stream(self):
        return self.cp.cuda.Stream(non_blocking=True)

    def handle(self, s):
        return s.ptr

    def event(self, a, b):
        ev = self.cp.cuda.Event()
        ev.record(a)
        b.wait_event(ev)

    def stream_synchronize(self, a, b):
        a.synchronize()

    def event_synchronize(self, a, b):
        ev = self.cp.cuda.Event()
        ev.record(a)
        ev.synchronize()

    def device_synchronize(self, a, b):
        self.cp.cuda.Device().synchronize()


class Torch(Lib):
    name = "torch"

    def __init__(self) -> None:
        import torch

        self.torch = torch
        super().__init__()

    def stream(self):
        return self.torch.cuda.Stream()

    def handle(self, s):
        return s.cuda_stream

    def event(self, a, b):
        ev = self.torch.cuda.Event()
        ev.record(a)
        b.wait_event(ev)

    def wait_stream(self, a, b):
        b.wait_stream(a)

    def stream_synchronize(self, a, b):
        a.synchronize()

    def event_synchronize(self, a, b):
        ev = self.torch.cuda.Event()
        ev.record(a)
        ev.synchronize()

    def device_synchronize(self, a, b):
        self.torch.cuda.synchronize()


class Core(Lib):
    name = "cuda.core"

    def __init__(self) -> None:
        from cuda.core import Device

        self.device = Device()
        self.device.set_current()
        super().__init__()

    def stream(self):
        return self.device.create_stream()

    def handle(self, s):
        return int(s.handle)

    def event(self, a, b):
        b.wait(a.record())

    def wait_stream(self, a, b):
        b.wait(a)

    def stream_synchronize(self, a, b):
        a.sync()

    def event_synchronize(self, a, b):
        a.record().sync()

    def device_synchronize(self, a, b):
        self.device.sync()


def numba_event(lib, a, b):
    """A Numba event recorded on, and waited by, new ``external_stream`` objects
    of the streams' handles (not the objects the kernels ran on)."""
    ev = cuda.event()
    ev.record(cuda.external_stream(lib.handle(a)))
    ev.wait(cuda.external_stream(lib.handle(b)))


ORDERINGS = ("event", "wait_stream", "stream_synchronize", "event_synchronize",
             "device_synchronize", "numba_event")


# ------------------------------------------------------------------- the cases
def _races_since(start: int) -> tuple[str, str]:
    found = nss.hazards()[start:]
    kinds = ",".join(sorted({h.kind for h in found})) or "-"
    lines = sorted({h.second.site.rsplit(":", 1)[1] for h in found
                    if h.second is not None and h.second.site
                    and h.second.site.rsplit(":", 1)[0].endswith("mixed_program.py")})
    return kinds, ",".join(lines) or "-"


def handoff(lib, how):
    """Numba writes ``x`` on ``s1``; ``how`` orders ``s2`` after it (or, unordered,
    nothing does); Numba reads ``x`` on ``s2``."""
    e1 = cuda.external_stream(lib.handle(lib.s1))
    with nss.stream_scope(e1):
        x = cuda.to_device(np.zeros(N, np.float32))
        y = cuda.device_array(N, np.float32)
    cuda.synchronize()
    start = len(nss.hazards())
    produce[64, 256, e1](x, 1.0, 2000)
    if ORDERED:
        how(lib.s1, lib.s2)
    consume[64, 256, cuda.external_stream(lib.handle(lib.s2))](x, y)  # reads x: s2 after s1?
    cuda.synchronize()
    wrong = int(not np.all(y.copy_to_host() == 1.0))
    kinds, lines = _races_since(start)
    del x, y
    return kinds, lines, wrong


def foreign_copy(lib, fill):
    """Numba reads ``x`` on ``s1``; CuPy then writes it on ``s2`` (a copy, or
    with ``fill`` a memset), after an event of ``s1`` (ordered) or not."""
    cp = lib.cp
    e1 = cuda.external_stream(lib.handle(lib.s1))
    with nss.stream_scope(e1):
        x = cuda.to_device(np.ones(N, np.float32))
        y = cuda.device_array(N, np.float32)
    src = cp.full(N, 7.0, dtype=cp.float32)
    cuda.synchronize()
    start = len(nss.hazards())
    consume[64, 256, e1](x, y)
    if ORDERED:
        lib.event(lib.s1, lib.s2)
    # CuPy's view of x's memory, made from its address (no interface: nothing ordered).
    ptr = x.device_ctypes_pointer.value
    memory = cp.cuda.UnownedMemory(ptr, 4 * N, x)
    view = cp.cuda.MemoryPointer(memory, 0)
    if fill:
        view.memset_async(0, 4 * N, stream=lib.s2)  # CuPy writes x: not after s1?
    else:
        view.copy_from_device_async(src.data, 4 * N, stream=lib.s2)  # CuPy writes x: not after s1?
    cuda.synchronize()
    wrong = int(not np.all(y.copy_to_host() == 1.0))
    kinds, lines = _races_since(start)
    del x, y
    return kinds, lines, wrong


def main() -> None:
    names = sys.argv[2:] or ["cupy", "torch", "cuda.core"]
    makers = {"cupy": CuPy, "torch": Torch, "cuda.core": Core}
    for name in names:
        try:
            lib = makers[name]()
        except ImportError as exc:
            print("SKIP", name, exc)
            continue
        for how in ORDERINGS:
            if how == "numba_event":
                order = functools.partial(numba_event, lib)
            else:
                order = getattr(lib, how, None)
            if order is None:
                continue
            kinds, lines, wrong = handoff(lib, order)
            print("CASE", name, how, kinds, lines, wrong, flush=True)
        if name == "cupy":
            for fill in (False, True):
                kinds, lines, wrong = foreign_copy(lib, fill)
                print("CASE", name, "memset" if fill else "copy", kinds, lines, wrong,
                      flush=True)
    stats = nss.memory_stats()
    print("WAITS", stats["waits_inserted"], stats["waits_skipped"])
    print("OBSERVER", "running" if observer.running() else f"off: {observer.reason()}")


if __name__ == "__main__":
    main()
