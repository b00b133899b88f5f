"""The table of live blocks and the dependency state of each (its
:class:`~numba_streamsafe.resources.tracking.rules.Entry`: by byte range, the marks
of its last writes and of its newest reads since).

Part of the engine (:mod:`numba_streamsafe.compiled`), written in Cython's
pure-Python mode (C declarations in ``block_table.pxd``): the resource calls
it on every allocation and free.
"""

from __future__ import annotations

import bisect
from typing import Any

import cython

from numba_streamsafe.core.blocks import BlockState
from numba_streamsafe.core.errors import InvalidArgument, StaleContext, UseAfterFree
from numba_streamsafe.resources.tracking.marks import Mark, MarkBook, retired_stream_id
from numba_streamsafe.resources.tracking.rules import Entry

__all__ = ["BlockTable", "COMPILED"]

#: Whether this module runs compiled (else it runs as Python source).
COMPILED: bool = cython.compiled


@cython.cclass
class BlockTable:
    """Live blocks by address, with their entries; callers hold their resource's lock.

    The table owns its figures: ``live_bytes`` (bytes of the live blocks
    that are allocations) and ``borrowed`` (live borrowed blocks, which count
    in no byte figure). ``live`` maps each address to its entry; read it, and
    change it through :meth:`add`, :meth:`replace`, :meth:`remove` and
    :meth:`clear` only.

    Parameters
    ----------
    device : int
        The device whose blocks the table holds.
    """

    def __init__(self, device: Any) -> None:
        self.device = device
        self.live = {}
        #: Context epoch; blocks of another epoch are stale.
        self.epoch = 0
        self.live_bytes = 0
        self.borrowed = 0
        #: Sorted live addresses for :meth:`find`; None when stale.
        self.index = []

    @property
    def blocks(self) -> int:
        """Live blocks that are allocations (borrowed ones not counted)."""
        return len(self.live) - self.borrowed

    def add(self, block: Any, ready: Mark, book: MarkBook) -> Entry:
        """Make ``block`` live, its last write ``ready`` (the entry holds one
        use of the mark, taken from ``book``), and return its entry. The
        caller checked that no live block holds the address."""
        entry = Entry(block, ready)
        book.hold(ready)
        self.live[block.ptr] = entry
        self.index = None
        if block.borrowed:
            self.borrowed += 1
        else:
            self.live_bytes += block.nbytes
        return entry

    def replace(self, entry: Entry, block: Any, ready: Mark, book: MarkBook) -> Entry:
        """``block``, of ``entry``'s address and size, live in its place (a
        freed block allocated again at once): ``entry`` is gone, the new
        entry holds one use of ``ready``; the caller releases ``entry``'s
        marks. The byte figures and the sorted index stand."""
        new = Entry(block, ready)
        book.hold(ready)
        entry.gone = True
        self.live[block.ptr] = new
        return new

    def remove(self, entry: Entry) -> None:
        """``entry``'s block is no longer live; the entry is ``gone`` (the
        caller releases its marks)."""
        block = entry.block
        del self.live[block.ptr]
        entry.gone = True
        self.index = None
        if block.borrowed:
            self.borrowed -= 1
        else:
            self.live_bytes -= block.nbytes

    def entry(self, block: Any, what: str) -> Entry:
        """The live entry of ``block``.

        Raises
        ------
        StaleContext
            The block was made before a context reset.
        InvalidArgument
            The block belongs to another device.
        UseAfterFree
            The block was freed (its address may hold a newer block), or another
            resource made it.
        """
        found = self.live.get(block.ptr)
        if found is not None and cython.cast(Entry, found).block is block:
            return found
        if block.device != self.device:
            raise InvalidArgument(
                f"{what}: {block.describe()} belongs to device {block.device}, but this "
                f"resource serves device {self.device}; use that device's runtime (the "
                "launch protocol orders uses of other devices' blocks through theirs)"
            )
        if block.epoch != self.epoch:
            raise StaleContext(
                f"{what}: {block.describe()} was made before the CUDA context was reset "
                f"(epoch {block.epoch}, now {self.epoch}); it no longer exists. "
                "Allocate it again in the current context."
            )
        if found is None and block.state is BlockState.LIVE:
            raise UseAfterFree(
                f"{what}: {block.describe()} is not live here, and no free of it was asked "
                "for: another resource made it (a runtime set_runtime replaced, or one built "
                f"beside it for device {block.device}). Use it through the runtime that made "
                "it (set_runtime it back)"
            )
        if found is None or cython.cast(Entry, found).block.generation != block.generation:
            now = (f"; the address now holds generation "
                   f"{cython.cast(Entry, found).block.generation}" if found is not None else "")
            raise UseAfterFree(
                f"{what}: {block.describe()} is not live (already freed{now}). "
                "Do not use a block after deallocate; keep the array alive while it is in use."
            )
        return found  # another handle of the same allocation

    def find(self, address: Any) -> Any:
        """The live block that holds ``address``, or None."""
        index = self.index
        if index is None:
            # Rebuilt on demand: the hot paths find blocks through their
            # arrays, so allocations and frees only mark it stale.
            index = self.index = sorted(self.live)
        i = bisect.bisect_right(index, address) - 1
        if i < 0:
            return None
        block = cython.cast(Entry, self.live[index[i]]).block
        return block if address < block.ptr + block.nbytes else None

    def overlapping(self, ptr: Any, nbytes: Any) -> Any:
        """A live block with a byte in ``ptr`` .. ``ptr + nbytes - 1``, or None."""
        block = self.find(ptr)
        if block is not None:
            return block
        index = self.index
        i = bisect.bisect_left(index, ptr)
        if i < len(index) and index[i] < ptr + nbytes:
            return cython.cast(Entry, self.live[index[i]]).block
        return None

    def on_stream(self, stream: Any) -> list:
        """Live blocks allocated on ``stream``."""
        return [cython.cast(Entry, e).block for e in self.live.values()
                if cython.cast(Entry, e).block.stream == stream]

    def forget_stream(self, stream: Any) -> int:
        """End ``stream``'s history: rename it in the marks and reads of live
        blocks and drop it from every mark's waiters, so a new stream that gets
        the same handle inherits nothing. Returns how many uses of live blocks
        were the stream's (0: none of its marks is held any more)."""
        entry: Entry
        n = 0
        tomb = retired_stream_id()
        for e in self.live.values():
            entry = e
            n += entry.forget_stream(stream, tomb)
        return n

    def clear(self) -> list:
        """Forget every block, advance the epoch, and return the entries."""
        entries = list(self.live.values())
        for entry in entries:
            cython.cast(Entry, entry).gone = True
        self.live.clear()
        self.index = None
        self.live_bytes = 0
        self.borrowed = 0
        self.epoch += 1
        return entries
