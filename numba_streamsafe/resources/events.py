"""EventPool: a free list of the events the tracker records its marks with."""

from __future__ import annotations

import collections
import logging
import threading
from typing import Any

from numba_streamsafe._driver.base import Driver
from numba_streamsafe.errors import DriverError
from numba_streamsafe.hot import hot as _hot

__all__ = ["EventPool"]

_log = logging.getLogger("numba_streamsafe")


class EventPool:
    """A free list of timing-disabled events.

    A handle may be reused as soon as no mark refers to it: a
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
        # The compiled hot path takes its own lock type without a Python call.
        self._lock = _hot.Lock() if _hot is not None else threading.Lock()
        self.in_use = 0
        #: Events recorded over the pool's life (:meth:`record`).
        self.recorded = 0
        #: Advanced by :meth:`forget` (a context reset): handles given out before
        #: belong to a destroyed context. Marks kept by other devices' resources
        #: (:class:`~numba_streamsafe.resources.marks.ForeignMark`) compare it.
        self.generation = 0

    def acquire(self) -> Any:
        """Return an idle handle, creating one when none is idle."""
        with self._lock:
            self.in_use += 1
            if self._idle:
                return self._idle.pop()
        try:
            return self._driver.event_create()
        except BaseException:
            with self._lock:
                self.in_use -= 1
            raise

    def release(self, handle: Any) -> None:
        """Give ``handle`` back; destroyed when the pool already keeps ``max_idle``.

        Never raises: it runs when a mark loses its last user, in the middle
        of a resource's state update (a free, a commit, a context reset). An
        event the driver refuses to destroy is logged and leaked.
        """
        with self._lock:
            self.in_use -= 1
            if len(self._idle) < self._max_idle:
                self._idle.append(handle)
                return
        try:
            self._driver.event_destroy(handle)
        except DriverError as exc:
            _log.warning("could not destroy event %r (it is leaked): %s", handle, exc)

    def record(self, stream: int) -> Any:
        """A pooled event recorded on ``stream``."""
        handle = self.acquire()
        try:
            self._driver.event_record(handle, stream)
        except BaseException:
            self.release(handle)
            raise
        self.recorded += 1
        return handle

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
            self.generation += 1
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
