"""Memory resources: where blocks come from and how their uses are ordered.

Nothing here imports Numba. Resources call a
:class:`~numba_streamsafe._driver.base.Driver`, never CUDA directly.

One concept per module: ``base`` (the MemoryResource contract and adaptors),
``marks`` and ``rules`` (the engine's state and its decisions, compiled
where a compiler is present), ``async_resource`` (the tracking resource,
composed of ``marks``, ``rules``, ``block_table``, ``freed`` and
``deferred``), ``direct``, ``budget``, ``logging_resource`` and ``guard`` (resources
and adaptors).
"""

from numba_streamsafe.resources.async_resource import POOL_KEEP_ALL, AsyncOptions, AsyncResource
from numba_streamsafe.resources.base import MemoryResource, ResourceAdaptor, ResourceStats
from numba_streamsafe.resources.budget import BudgetResource
from numba_streamsafe.resources.direct import DirectResource
from numba_streamsafe.resources.guard import DebugGuardResource
from numba_streamsafe.resources.logging_resource import LoggingResource
from numba_streamsafe.resources.tracking.marks import EventPool, Mark

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
]
