"""Memory resources: where blocks come from and how their uses are ordered.

Nothing here imports Numba. Resources call a
:class:`~numba_streamsafe._driver.base.Driver`, never CUDA directly.
"""

from numba_streamsafe.resources.async_resource import POOL_KEEP_ALL, AsyncResource
from numba_streamsafe.resources.base import MemoryResource, ResourceAdaptor, ResourceStats
from numba_streamsafe.resources.budget import BudgetResource
from numba_streamsafe.resources.direct import DirectResource
from numba_streamsafe.resources.events import EventPool, Mark
from numba_streamsafe.resources.guard import DebugGuardResource
from numba_streamsafe.resources.logging import LoggingResource

__all__ = [
    "MemoryResource",
    "ResourceAdaptor",
    "ResourceStats",
    "AsyncResource",
    "POOL_KEEP_ALL",
    "DirectResource",
    "LoggingResource",
    "BudgetResource",
    "DebugGuardResource",
    "EventPool",
    "Mark",
]
