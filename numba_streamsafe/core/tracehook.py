"""The trace observer: the one slot that says whether a trace
(:func:`numba_streamsafe.trace`) records, and what the hot paths record into.

While a trace records, :data:`active` is its
:class:`~numba_streamsafe.diagnostics.tracing.Trace` (the Python hot paths,
allocate, free, every fenced launch and copy, read it once: a run without a
trace pays one module-attribute read per operation) and the engine's
:class:`TraceLog` takes what the compiled hot paths record (operation ids,
the waits the mark book queues, the events it records, the launches of the
compiled path, each as a flat tuple of plain values): the engine reads it
with :func:`current_log` and :func:`launches_direct`. :func:`start_recording`
and :func:`stop_recording` change the slot, all of it at once; nothing else
does.

Part of the engine (:mod:`numba_streamsafe.compiled`), written in Cython's
pure-Python mode (C declarations in ``tracehook.pxd``): compiled, the mark
book and the compiled launch read the log's slot and call the log as C.
"""

from __future__ import annotations

import time
from typing import Any

import cython

__all__ = ["TraceLog", "active", "keep_names", "start_recording", "stop_recording",
           "name_arguments_for_good", "current_log", "launches_direct", "COMPILED"]

#: Whether this module runs compiled (else it runs as Python source).
COMPILED: bool = cython.compiled

_perf_ns = time.perf_counter_ns


@cython.cclass
class TraceLog:
    """The hot-path records of one trace, begun at ``t0``
    (:func:`time.perf_counter_ns`).

    Every record is a tuple of ints and strings only, which the garbage
    collector stops tracking at its first collection: a long trace adds no
    work to later collections. Calls come with the GIL held, which orders
    them.

    Attributes
    ----------
    waits : list of tuple
        ``(stream, on_stream, free)`` per wait queued.
    seals : list of tuple
        ``(device, stream)`` per event recorded.
    launches : list of tuple
        One per launch of the compiled path (:meth:`launched`): ``op_id, t0,
        waits before, seals before, t1, waits after, seals after, label,
        device, stream``, then ``argument, access, ptr, generation, device``
        per block.
    """

    def __init__(self, t0: int) -> None:
        self.t0 = t0
        self.seq = 0
        self.waits = []
        self.seals = []
        self.launches = []

    def next_id(self) -> cython.longlong:
        """A new operation id (1, 2, ...), shared by all of the trace's records."""
        self.seq += 1
        return self.seq

    def now(self) -> cython.longlong:
        """Nanoseconds since the trace began."""
        return _perf_ns() - self.t0

    def waited(self, stream: Any, on_stream: Any, free: cython.bint) -> None:
        """``stream`` now waits for ``on_stream``'s event (for a free queued on
        ``stream`` when ``free``)."""
        self.waits.append((stream, on_stream, free))

    def sealed(self, device: Any, stream: Any) -> None:
        """An event was recorded on ``stream`` of ``device``."""
        self.seals.append((device, stream))

    def launched(self, op_id: cython.longlong, t0: cython.longlong, w0: cython.Py_ssize_t,
                 e0: cython.Py_ssize_t, label: str, device: Any, stream: Any,
                 uses: tuple) -> None:
        """Record a launch of the compiled path, begun at ``t0`` with ``w0``
        waits and ``e0`` seals logged: ``uses`` holds ``argument, access, ptr,
        generation, device`` per block, flat."""
        head = (op_id, t0, w0, e0, self.now(), len(self.waits), len(self.seals), label,
                device, stream)
        self.launches.append(head + uses)


# --------------------------------------------------------------------- the slot
#: The recording :class:`~numba_streamsafe.diagnostics.tracing.Trace`, or None.
active = None
#: Whether launches keep their argument names (:class:`~numba_streamsafe.core.uses.Uses`):
#: while a trace records, and in a process that made a simulated driver (its
#: race reports name the arguments).
keep_names = False
_sim_names = False
_log = None  # the trace's TraceLog while it records what the engine does (tracehook.pxd)
_direct = True


def start_recording(trace: Any, log: TraceLog | None, direct: bool) -> None:
    """``trace`` records: it is the active trace, launches keep their names,
    and the engine records into ``log`` (None: the trace records no
    operations). ``direct`` False sends every launch to the Python path (a
    trace with NVTX ranges or device times, which the compiled launch does
    not make)."""
    global active, keep_names, _log, _direct
    active = trace
    keep_names = True
    _log = log
    _direct = direct


def stop_recording() -> None:
    """No trace records: names are kept only where a checking driver wants them."""
    global active, keep_names, _log, _direct
    active = None
    keep_names = _sim_names
    _log = None
    _direct = True


def name_arguments_for_good() -> None:
    """From now on launches keep their argument names, trace or not (a checking
    driver exists: its race reports name the arguments)."""
    global keep_names, _sim_names
    _sim_names = keep_names = True


def current_log() -> TraceLog | None:
    """The log of the trace that records, or None."""
    return _log


def launches_direct() -> cython.bint:
    """Whether the compiled launch may take launches (no trace asks for the
    Python path)."""
    return _direct
