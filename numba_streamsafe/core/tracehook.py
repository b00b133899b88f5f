"""The slot of the active trace (:func:`numba_streamsafe.trace`).

The hot paths (allocate, free, every fenced launch and copy) read
:data:`active` once; it is None unless a trace is being recorded, so a run
without a trace pays one module-attribute read per operation. Only this
module's functions change its state (:mod:`numba_streamsafe.diagnostics.tracing`
calls :func:`start_recording` and :func:`stop_recording`). The engine does not read it: a trace
installs its observer in the engine (:func:`numba_streamsafe.resources.tracking.tracelog.observe`).
"""

from __future__ import annotations

from typing import Any

#: The recording :class:`~numba_streamsafe.diagnostics.tracing.Trace`, or None.
active: Any = None

#: Whether launches keep their argument names (:class:`~numba_streamsafe.protocol.Uses`):
#: while a trace records, and in a process that made a simulated driver (its
#: race reports name the arguments).
keep_names: bool = False
#: Set for good once a simulated driver exists in the process.
sim_names: bool = False

__all__ = ["active", "keep_names", "sim_names", "name_arguments_for_good", "start_recording",
           "stop_recording"]


def name_arguments_for_good() -> None:
    """From now on launches keep their argument names, trace or not (a checking
    driver exists: its race reports name the arguments)."""
    global keep_names, sim_names
    sim_names = keep_names = True


def start_recording(trace: Any) -> None:
    """``trace`` records: it is the active trace, and launches keep their names."""
    global active, keep_names
    active = trace
    keep_names = True


def stop_recording() -> None:
    """No trace records: names are kept only where a checking driver wants them."""
    global active, keep_names
    active = None
    keep_names = sim_names
