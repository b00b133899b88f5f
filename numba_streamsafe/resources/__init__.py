"""Memory resources: where blocks come from and how their uses are ordered.

Nothing here imports Numba. Resources call a
:class:`~numba_streamsafe._driver.base.Driver`, never CUDA directly.

One concept per module: ``base`` (the MemoryResource contract and adaptors),
``tracking`` (the engine's state and its decisions: ``marks``, ``rules``,
``block_table``, ``freed``, compiled where a compiler is present),
``async_resource`` (the tracking resource), ``upstream`` (where its memory
comes from: the device's pool, or RMM), ``direct`` (untracked ``cuMemAlloc``)
and ``adaptors`` (``budget``, ``logging_resource`` and ``guard``).
"""

from numba_streamsafe.resources.adaptors.budget import BudgetResource
from numba_streamsafe.resources.adaptors.guard import DebugGuardResource
from numba_streamsafe.resources.adaptors.logging_resource import LoggingResource
from numba_streamsafe.resources.async_resource import POOL_KEEP_ALL, AsyncOptions, AsyncResource
from numba_streamsafe.resources.base import MemoryResource, ResourceAdaptor, ResourceStats
from numba_streamsafe.resources.direct import DirectResource
from numba_streamsafe.resources.tracking.marks import EventPool, Mark
from numba_streamsafe.resources.upstream import RmmUpstream, Upstream, rmm_upstream

__all__ = [
    "MemoryResource",
    "ResourceAdaptor",
    "ResourceStats",
    "AsyncResource",
    "AsyncOptions",
    "POOL_KEEP_ALL",
    "DirectResource",
    "LoggingResource",
    "BudgetResource",
    "DebugGuardResource",
    "EventPool",
    "Mark",
    "Upstream",
    "RmmUpstream",
    "rmm_upstream",
]
