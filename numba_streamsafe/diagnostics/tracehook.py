"""The slot of the active trace (:func:`numba_streamsafe.trace`).

The hot paths (allocate, free, every fenced launch and copy) read
:data:`active` once; it is None unless a trace is being recorded, so a run
without a trace pays one module-attribute read per operation. Only
:mod:`numba_streamsafe.diagnostics.tracing` sets it. The engine does not read it: a trace
installs its observer in the engine (:func:`numba_streamsafe.resources.tracelog.observe`).
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
