"""Borrowed blocks: memory another library allocated, tracked as any block
and released, never freed, by :class:`~.async_resource.AsyncResource`."""

from __future__ import annotations

from typing import Any

from numba_streamsafe.core import tracehook
from numba_streamsafe.core.access import Access
from numba_streamsafe.core.blocks import Block, BlockState, next_generation_fast, positive_size
from numba_streamsafe.core.errors import InvalidArgument
from numba_streamsafe.core.streams import MAX_DEFAULT_STREAM
from numba_streamsafe.resources.async_state import AsyncState
from numba_streamsafe.resources.tracking.rules import Entry

_LIVE = BlockState.LIVE
_FREED = BlockState.FREED

__all__ = ["Borrowing"]


class Borrowing(AsyncState):
    """The borrowing calls of :class:`~.async_resource.AsyncResource` (which
    holds the state)."""

    def borrow(self, ptr: int, nbytes: int, stream: int, tag: str = "", *,
               stream_owner: Any = None, keep: Any = None) -> Block:
        """Track ``nbytes`` of device memory at ``ptr`` that another library
        allocated and hands over on ``stream``, as a live *borrowed* block.

        The block is ready after everything queued on ``stream`` so far (its
        last write is the stream's current mark, as an allocation's is): the
        caller has ordered the producer's work before ``stream``. Its uses are
        then tracked as any block's. The library never frees it: its release
        (:meth:`deallocate` or :meth:`defer_free`) makes ``stream`` wait for
        every use on other streams, as a free does, and then holds ``keep``
        (what keeps the memory alive: the producer's objects) until
        ``stream`` has completed that point (a synchronise at
        :meth:`reap_pending`, or found idle at the next allocation or
        borrow), so the producer cannot reuse the memory under a use still
        in flight. ``stream_owner`` is kept alive as an allocation's is.

        A borrowed block counts in no byte or allocation figure. A checking
        driver is told of the range (``Driver.register_foreign``).

        Raises
        ------
        InvalidArgument
            ``ptr`` is not a positive address, ``nbytes`` not a positive int,
            or the range overlaps a live block (free it, or borrow that
            block's range no more than once); nothing is registered.
        StreamMisuse
            ``stream`` is no stream of this device.
        """
        if not isinstance(ptr, int) or isinstance(ptr, bool) or ptr <= 0:
            raise InvalidArgument(f"borrow: the address {ptr!r} must be a positive int (a "
                                  "device pointer of the memory lent)")
        nbytes = positive_size(nbytes, tag)
        if stream > MAX_DEFAULT_STREAM:
            self.driver.check_stream(stream)
        if self._pending:
            self.reap_completed()  # drop what released borrowed blocks kept, once done
        with self._lock:
            if self._deferred_queue:
                self._deferred.drain(self._deallocate_locked)
            clash = self._table.overlapping(ptr, nbytes)
            if clash is not None:
                raise InvalidArgument(
                    f"borrow: {nbytes} B at {ptr:#x} overlap the live {clash.describe()}; "
                    "memory is tracked by one block at a time: use that block's arrays, "
                    "or release them first")
            self.driver.register_foreign(ptr, nbytes, stream)
            block = Block(ptr, nbytes, self.device, stream, tag, next_generation_fast(),
                          self._table.epoch, _LIVE, stream_owner, True, keep)
            mark = self._ready_mark(stream, stream_owner, self.driver.release_foreign, ptr)
            self._table.add(block, mark)
            if tracehook.active is not None:
                tracehook.active.allocated(self, block, stream)
        return block

    def _release_borrowed_locked(self, entry: Entry, block: Block) -> None:
        """The release of a borrowed block (:meth:`borrow`); caller holds the lock."""
        stream = block.stream
        if not entry.only_on(stream):
            marks = entry.waits_for(stream, Access.READ_WRITE)
            if marks:
                self.marks.wait_all(stream, marks, block.stream_owner, free=True)
        self.driver.release_foreign(block.ptr, stream)
        # The waits are queued: from here on nothing can fail.
        self._table.remove(entry)
        entry.release(self.marks)
        self._pending.add(stream, 0, block.stream_owner, block.keep)
        block.state = _FREED
        block.stream_owner = None
        block.keep = None
        if tracehook.active is not None:
            tracehook.active.freed(self, block, stream, "released")
