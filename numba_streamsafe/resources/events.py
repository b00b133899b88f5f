"""Pooled, reference-counted events shared by the blocks of one launch."""

from __future__ import annotations

import collections
import threading
from typing import Any

from numba_streamsafe._driver.base import Driver

__all__ = ["EventPool", "SharedEvent"]


class SharedEvent:
    """One recorded event, shared by every block a launch touched.

    ``refs`` counts the block states holding it; at zero the handle goes back
    to its pool. Callers change ``refs`` only under their resource's lock.
    """

    __slots__ = ("handle", "stream", "refs", "pool")

    def __init__(self, handle: Any, stream: int, pool: EventPool) -> None:
        self.handle = handle
        self.stream = stream
        self.refs = 0
        self.pool = pool

    def acquire(self) -> SharedEvent:
        self.refs += 1
        return self

    def release(self) -> None:
        self.refs -= 1
        if self.refs == 0:
            self.pool.release(self.handle)


class EventPool:
    """A free list of timing-disabled events.

    A handle may be reused as soon as no block state refers to it: a
    ``cuStreamWaitEvent`` already queued captured the event as it was when the
    wait was queued, so re-recording the handle later does not disturb it.

    Parameters
    ----------
    driver : Driver
        Backend that creates and destroys the events.
    max_idle : int
        Idle handles kept; more are destroyed on release.
    """

    def __init__(self, driver: Driver, max_idle: int = 1024) -> None:
        self._driver = driver
        self._idle: collections.deque[Any] = collections.deque()
        self._max_idle = max_idle
        self._lock = threading.Lock()
        self.in_use = 0

    def acquire(self) -> Any:
        """Return an idle handle, creating one when none is idle."""
        with self._lock:
            if self._idle:
                self.in_use += 1
                return self._idle.pop()
        handle = self._driver.event_create()
        with self._lock:
            self.in_use += 1
        return handle

    def release(self, handle: Any) -> None:
        with self._lock:
            self.in_use -= 1
            if len(self._idle) < self._max_idle:
                self._idle.append(handle)
                return
        self._driver.event_destroy(handle)

    def record(self, stream: int) -> SharedEvent:
        """Record a pooled event on ``stream`` and wrap it, with no references yet."""
        handle = self.acquire()
        try:
            self._driver.event_record(handle, stream)
        except BaseException:
            self.release(handle)
            raise
        return SharedEvent(handle, stream, self)

    @property
    def idle(self) -> int:
        """Handles waiting in the pool."""
        return len(self._idle)

    def forget(self) -> None:
        """Destroy the idle handles, ignoring errors (their context may be gone),
        and forget the ones in use."""
        with self._lock:
            idle, self._idle = list(self._idle), collections.deque()
            self.in_use = 0
        for handle in idle:
            try:
                self._driver.event_destroy(handle)
            except Exception:
                pass

    def close(self) -> None:
        """Destroy every idle handle."""
        with self._lock:
            idle, self._idle = list(self._idle), collections.deque()
        for handle in idle:
            self._driver.event_destroy(handle)
