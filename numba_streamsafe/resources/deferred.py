"""The finalizer-safe queue of blocks waiting to be freed at a safe point."""

from __future__ import annotations

import collections
import contextlib
import logging
import threading
from collections.abc import Callable, Iterator

from numba_streamsafe.core.blocks import Block
from numba_streamsafe.core.errors import DriverError, UseAfterFree

__all__ = ["DeferredFrees"]

_log = logging.getLogger("numba_streamsafe")


class DeferredFrees:
    """Blocks whose owners died, to be freed at the next safe point.

    :meth:`push` takes no lock and makes no driver call (a ``deque.append``),
    so it is safe from a garbage-collector finalizer on any thread, inside any
    locked section and at interpreter shutdown. :meth:`drain` runs the frees;
    resources call it at their safe points (allocation, launch, reap, flush),
    never from a finalizer, with their own lock held or not as their ``free``
    expects. :meth:`hold` keeps the queue closed for a while (Numba's
    ``defer_cleanup``).
    """

    __slots__ = ("_queue", "_holds", "_lock")

    def __init__(self) -> None:
        self._queue: collections.deque[Block] = collections.deque()
        self._holds = 0
        self._lock = threading.Lock()

    def push(self, block: Block) -> None:
        self._queue.append(block)

    @property
    def queue(self) -> collections.deque[Block]:
        """The queue itself, for a cheap emptiness check on hot paths."""
        return self._queue

    @property
    def held(self) -> bool:
        """True while a :meth:`hold` is in force (drains do nothing)."""
        return self._holds > 0

    def __len__(self) -> int:
        return len(self._queue)

    def __bool__(self) -> bool:
        return bool(self._queue)

    def clear(self) -> None:
        self._queue.clear()

    @contextlib.contextmanager
    def hold(self) -> Iterator[None]:
        """No drain runs until the block exits (queued blocks stay live)."""
        with self._lock:
            self._holds += 1
        try:
            yield
        finally:
            with self._lock:
                self._holds -= 1

    def drain(self, free: Callable[[Block], None], *, reraise: bool = False,
              on_error: Callable[[Block, Exception], bool] | None = None) -> None:
        """Call ``free(block)`` once for each block queued when the drain starts.

        A block that is no longer live (``UseAfterFree``, ``StaleContext``: freed
        explicitly, or its context is gone) is dropped. A ``DriverError`` puts the
        block back for the next safe point and ends the drain; it is logged, or
        raised when ``reraise``. Any other error goes to ``on_error``, which
        returns True when it dealt with it; otherwise it propagates.
        """
        if self._holds:
            return
        queue = self._queue
        for _ in range(len(queue)):
            try:
                block = queue.popleft()
            except IndexError:
                return
            try:
                free(block)
            except UseAfterFree:
                pass
            except DriverError as exc:
                queue.append(block)
                if reraise:
                    raise
                _log.warning("deferred free of %s failed, will retry: %s", block.describe(), exc)
                return
            except Exception as exc:
                if on_error is None or not on_error(block, exc):
                    raise
