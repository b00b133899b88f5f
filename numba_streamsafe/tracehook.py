"""The slot of the active trace (:func:`numba_streamsafe.trace`).

The hot paths (allocate, free, every fenced launch and copy) read
:data:`active` once; it is None unless a trace is being recorded, so a run
without a trace pays one module-attribute read per operation. Only
:mod:`numba_streamsafe.tracing` sets it.
"""

from __future__ import annotations

from typing import Any

#: The recording :class:`~numba_streamsafe.tracing.Trace`, or None.
active: Any = None
