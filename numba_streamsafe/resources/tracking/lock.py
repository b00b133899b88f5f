"""The engine's lock (:class:`Lock`): :class:`threading.Lock`'s interface,
taken from C by the compiled engine without a Python call.

Part of the engine (:mod:`numba_streamsafe.compiled`), written in Cython's
pure-Python mode (C declarations in ``lock.pxd``).
"""

from __future__ import annotations

import sys
import threading
import time
from typing import Any

import cython

__all__ = ["Lock", "COMPILED"]

#: Whether this module runs compiled (else it runs as Python source).
COMPILED: bool = cython.compiled

#: Whether this interpreter has a GIL (the compiled :class:`Lock` relies on it).
_GIL = cython.declare(cython.bint, getattr(sys, "_is_gil_enabled", lambda: True)())


@cython.cclass
class Lock:
    """A mutual-exclusion lock with :class:`threading.Lock`'s interface
    (``acquire``, ``release``, ``locked``, ``with``), which the compiled
    engine also takes from C, without a Python call. A thread that has to
    wait for it waits with the GIL released.

    Compiled, under a GIL, the lock is its ``_held`` flag, which only code
    holding the GIL reads or writes: taking a free lock is one test and one
    store. A thread that finds it held counts itself in ``_waiters`` and
    sleeps on ``_wake`` (a CPython lock used as a semaphore, held while
    nobody is woken); each release that finds waiters wakes one, which
    takes the lock or, when another thread took it first, sleeps again.
    Where there is no GIL (a free-threaded build), ``_wake`` is the lock
    itself.
    """

    def __init__(self) -> None:
        self._held = False
        self._waiters = 0
        if cython.compiled:
            self._wake = PyThread_allocate_lock()  # noqa: F821 (marks.pxd)
            if self._wake == cython.NULL:
                raise MemoryError("could not allocate a lock")
            if _GIL:
                PyThread_acquire_lock(self._wake, 0)  # noqa: F821 (nobody is woken yet)
        else:
            self._py = threading.Lock()

    def __dealloc__(self) -> None:
        if cython.compiled and self._wake != cython.NULL:
            if _GIL:  # CPython's lock must be released before it is freed
                PyThread_release_lock(self._wake)  # noqa: F821
            PyThread_free_lock(self._wake)  # noqa: F821 (marks.pxd)

    def take(self) -> cython.int:
        """Acquire, waiting as long as it takes (the GIL released meanwhile)."""
        if cython.compiled:
            if _GIL:
                if self._held:
                    self._wait(-1)
                self._held = True
                return 0
            if not PyThread_acquire_lock(self._wake, 0):  # noqa: F821
                with cython.nogil:
                    PyThread_acquire_lock(self._wake, 1)  # noqa: F821
        else:
            self._py.acquire()
        self._held = True
        return 0

    def give(self) -> None:
        """Release (the caller holds the lock)."""
        self._held = False
        if cython.compiled:
            if not _GIL or self._waiters:
                PyThread_release_lock(self._wake)  # noqa: F821 (wake one waiter)
        else:
            self._py.release()

    def _wait(self, micros: cython.longlong) -> cython.bint:
        """Compiled, with a GIL: sleep until the lock is free or ``micros``
        (-1: no limit) have passed; True when it is free (the caller takes
        it). The GIL is released while asleep."""
        deadline = 0.0 if micros < 0 else time.monotonic() + micros * 1e-6
        left: cython.longlong = micros
        self._waiters += 1
        try:
            while self._held:
                with cython.nogil:
                    PyThread_acquire_lock_timed(self._wake, left, 0)  # noqa: F821
                if micros >= 0 and self._held:
                    left = int((deadline - time.monotonic()) * 1e6)
                    if left <= 0:
                        return False
        finally:
            self._waiters -= 1
        return True

    def acquire(self, blocking: bool = True, timeout: float = -1) -> bool:
        """As :meth:`threading.Lock.acquire`."""
        if timeout != -1 and not blocking:
            raise ValueError("can't specify a timeout for a non-blocking call")
        if timeout < 0 and timeout != -1:
            raise ValueError("timeout value must be a non-negative number")
        got: cython.bint
        if not cython.compiled:
            got = self._py.acquire(blocking, timeout)
        else:
            micros: cython.longlong = -1 if timeout == -1 else int(timeout * 1e6)
            if _GIL:
                got = not self._held or (blocking and self._wait(micros))
            else:
                got = PyThread_acquire_lock_timed(self._wake, 0, 0)  # noqa: F821
                if not got and blocking:
                    with cython.nogil:
                        got = PyThread_acquire_lock_timed(self._wake, micros, 0)  # noqa: F821
        if got:
            self._held = True
        return bool(got)

    def release(self) -> None:
        """As :meth:`threading.Lock.release`."""
        if not self._held:
            raise RuntimeError("release unlocked lock")
        self.give()

    def locked(self) -> bool:
        """Whether the lock is held."""
        return bool(self._held)

    def __enter__(self) -> bool:
        self.take()
        return True

    def __exit__(self, *exc: Any) -> None:
        self.give()
