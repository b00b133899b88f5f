"""The slot of the active trace (:func:`numba_streamsafe.trace`).

The hot paths (allocate, free, every fenced launch and copy) read
:data:`active` once; it is None unless a trace is being recorded, so a run
without a trace pays one module-attribute read per operation. The compiled
launch reads :data:`observer` too, and stays on its path while a trace
records. Only :mod:`numba_streamsafe.tracing` sets them.
"""

from __future__ import annotations

from typing import Any

#: The recording :class:`~numba_streamsafe.tracing.Trace`, or None.
active: Any = None

#: The :class:`~numba_streamsafe.resources.tracelog.TraceLog` of the active
#: trace while it records (the mark book logs its waits and events there);
#: None otherwise.
log: Any = None

#: :data:`log` when the compiled launch may record its launches there itself
#: (a trace that records, with neither NVTX ranges nor device times): such a
#: trace keeps launches on the compiled path. None otherwise. Both are set
#: after :data:`active` and cleared before it.
observer: Any = None

#: Whether launches keep their argument names (:class:`~numba_streamsafe.protocol.Uses`):
#: while a trace records, and in a process that made a simulated driver (its
#: race reports name the arguments).
keep_names: bool = False
#: Set for good once a simulated driver exists in the process.
sim_names: bool = False
