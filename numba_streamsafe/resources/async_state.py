"""The state of an :class:`~.async_resource.AsyncResource` that its parts
(:mod:`.borrowing`, :mod:`.peer_uses`, :mod:`.reaping`) work on, declared once
for type checkers; :meth:`AsyncResource.__init__` sets it."""

from __future__ import annotations

import threading
from typing import Any

from numba_streamsafe._driver.base import Driver
from numba_streamsafe.resources.deferred import DeferredFrees
from numba_streamsafe.resources.tracking.block_table import BlockTable
from numba_streamsafe.resources.tracking.freed import KeptBlocks, PendingFrees
from numba_streamsafe.resources.tracking.lock import Lock
from numba_streamsafe.resources.tracking.marks import EventPool, MarkBook
from numba_streamsafe.resources.tracking.rules import Entry

__all__ = ["AsyncState"]


class AsyncState:
    """Annotations only: the fields and the calls the parts of
    :class:`~.async_resource.AsyncResource` use."""

    driver: Driver
    options: Any
    device: int
    marks: MarkBook
    events: EventPool
    _lock: Lock
    _reap_lock: threading.RLock
    _table: BlockTable
    _live: dict[int, Entry]
    _pending: PendingFrees
    _kept: KeptBlocks
    _deferred: DeferredFrees
    _deferred_queue: Any
    _eager: bool
    _peak: int
    _live_peak: int
    _allocations: int
    _allocated_bytes: int
    _frees: int
    _freed_bytes: int
    _free: Any
    _drain: Any
    reap_completed: Any
    _deallocate_locked: Any
    _alloc: Any
    _ready_mark: Any
    reuse_bytes: int
    flush: Any
