"""Freed bytes on their way back to where they came from: the
:class:`Reaper` of an :class:`~.async_resource.AsyncResource`.

A free is queued on its block's stream (``cuMemFreeAsync``, or an upstream's
stream-ordered give-back) after the waits that order every use before it;
the bytes count as *pending* until that stream has run the free. A freed
block small enough may instead be *kept*, for the next allocation of its size
on its stream. The reaper holds both, and the lock that lets one thread at a
time synchronise pending streams.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator
from typing import Any

from numba_streamsafe._driver.base import Driver
from numba_streamsafe.core.errors import DriverError
from numba_streamsafe.core.streams import MAX_DEFAULT_STREAM
from numba_streamsafe.resources.tracking.freed import KeptBlocks, PendingFrees
from numba_streamsafe.resources.tracking.lock import Lock

__all__ = ["Reaper"]


class Reaper:
    """The pending frees and the kept blocks of one resource.

    Parameters
    ----------
    driver : Driver
        Synchronises and queries the streams of pending frees.
    lock : Lock
        The resource's tracking lock: every change of :attr:`pending` and
        :attr:`kept` is made under it (the caller takes it where a method says
        so).
    free : callable
        ``free(ptr, stream)``: gives a block back in stream order (the
        resource's memory source).
    reuse_bytes : int
        The most bytes of freed blocks kept for reuse (0: none).

    Attributes
    ----------
    pending : PendingFrees
        Bytes whose free is queued and not yet known to have run, per stream
        (with what the stream's frees keep alive).
    kept : KeptBlocks
        Freed blocks kept for the next allocation of their size on their stream.
    """

    def __init__(self, driver: Driver, lock: Lock, free: Callable[[int, int], None],
                 reuse_bytes: int) -> None:
        self.driver = driver
        self.lock = lock
        self.free = free
        self.reuse_bytes = reuse_bytes
        self.pending = PendingFrees()
        self.kept = KeptBlocks(reuse_bytes)
        #: Held while pending frees are synchronised and while a stream is
        #: retired, so a stream is never destroyed under a reap that syncs it.
        self._reap_lock = threading.RLock()

    # ------------------------------------------------------------ the figures
    @property
    def nbytes(self) -> int:
        """Pending and kept bytes."""
        return self.pending.nbytes + self.kept.nbytes  # type: ignore[no-any-return]

    def per_stream(self) -> dict[int, int]:
        """Pending and kept bytes per stream; caller holds the lock."""
        out: dict[int, int] = self.pending.per_stream()
        for s, n in self.kept.per_stream().items():
            out[s] = out.get(s, 0) + n
        return out

    # --------------------------------------------------------------- freeing
    def set_reuse_bytes(self, nbytes: int) -> None:
        """Keep at most ``nbytes`` of freed blocks from now on: the oldest kept
        blocks past it are freed now (their bytes become pending)."""
        with self.lock:
            self.reuse_bytes = nbytes
            self.kept.limit = nbytes
            if self.kept.nbytes > nbytes:
                self.kept.free_oldest(nbytes, self.free, self.pending)

    def keeps(self, nbytes: int, stream: int, owner: Any) -> bool:
        """Whether a freed block of ``nbytes`` on ``stream`` is kept for reuse
        (making room if need be): only blocks of streams whose owning object
        is known (kept alive while they wait) and of the default streams (a
        raw handle may be destroyed and reused by another stream). Caller
        holds the lock."""
        if nbytes > self.reuse_bytes or (owner is None and stream > MAX_DEFAULT_STREAM):
            return False
        return self.kept.nbytes + nbytes <= self.reuse_bytes or self._make_room(nbytes)

    def _make_room(self, nbytes: int) -> bool:
        """Free the oldest kept blocks until ``nbytes`` more fit under
        ``reuse_bytes``; False if a free failed. Caller holds the lock."""
        try:
            self.kept.free_oldest(self.reuse_bytes - nbytes, self.free, self.pending)
        except DriverError:
            return False
        return True

    # ---------------------------------------------------------------- reaping
    @contextlib.contextmanager
    def exclusive(self) -> Iterator[None]:
        """No other thread reaps (or retires a stream) inside the block."""
        with self._reap_lock:
            yield

    def reap_all(self, forget: Callable[[], None]) -> None:
        """Give every kept block back, then synchronise every stream with
        pending frees and stop counting them; ``forget()`` runs under the lock
        once they are taken (the resource drops its unused marks there)."""
        with self._reap_lock:
            with self.lock:
                if self.kept:
                    self.kept.free_oldest(0, self.free, self.pending)
                drained = self.pending.take_all()
                forget()
            self.sync(drained)

    def take_stream(self, stream: int) -> dict[int, list[Any]]:
        """Give ``stream``'s kept blocks back and take its pending frees (to
        :meth:`sync`); caller holds the lock and :meth:`exclusive`."""
        if self.kept.has_stream(stream):
            self.kept.free_stream(stream, self.free, self.pending)
        return self.pending.take(stream)  # type: ignore[no-any-return]

    def sync(self, drained: dict[int, list[Any]]) -> None:
        """Synchronise the streams of ``drained`` pending frees and stop counting
        them; caller holds :meth:`exclusive`. On a failure the rest stays pending."""
        items = list(drained.items())
        for i, (stream, (nbytes, _owner, _keep)) in enumerate(items):
            try:
                self.driver.stream_synchronize(stream)
            except BaseException:
                with self.lock:
                    self.pending.put_back(items[i:])
                raise
            with self.lock:
                self.pending.release(nbytes)

    def reap_completed(self) -> None:
        """Release the pending bytes of streams that have gone idle, without waiting.

        An idle stream (``cuStreamQuery``) has run every free queued on it.
        Does nothing while another thread reaps or retires a stream.
        """
        if not self._reap_lock.acquire(blocking=False):
            return
        try:
            with self.lock:
                streams = list(self.pending.slots)
            for stream in streams:
                try:
                    idle = self.driver.stream_query(stream)
                except DriverError:
                    continue
                if idle:
                    with self.lock:
                        slot = self.pending.release_stream(stream)
                    del slot  # what it kept alive goes outside the lock
        finally:
            self._reap_lock.release()

    def clear(self) -> list[int]:
        """Forget every pending free and kept block (a context reset); the
        addresses of the kept blocks, which the caller gives back. Caller holds
        the lock."""
        self.pending.clear()
        return self.kept.clear()  # type: ignore[no-any-return]
