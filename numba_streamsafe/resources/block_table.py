"""The table of live blocks and the dependency state of each (its
:class:`~numba_streamsafe.resources.rules.Entry`: its last write and, per
stream, its newest read since that write)."""

from __future__ import annotations

import bisect

from numba_streamsafe.core.blocks import Block
from numba_streamsafe.core.errors import InvalidArgument, StaleContext, UseAfterFree
from numba_streamsafe.resources.marks import Mark, retired_stream_id
from numba_streamsafe.resources.rules import Entry

__all__ = ["Entry", "BlockTable"]


class BlockTable:
    """Live blocks by address, with their entries; callers hold their resource's lock.

    Parameters
    ----------
    device : int
        The device whose blocks the table holds.
    """

    __slots__ = ("device", "live", "epoch", "live_bytes", "index")

    def __init__(self, device: int) -> None:
        self.device = device
        self.live: dict[int, Entry] = {}
        #: Context epoch; blocks of another epoch are stale.
        self.epoch = 0
        self.live_bytes = 0
        #: Sorted live addresses for :meth:`find`; None when stale. The
        #: resource's hot paths update ``live``, ``live_bytes`` and ``index``
        #: in place, as :meth:`add` and :meth:`remove` do.
        self.index: list[int] | None = []

    def add(self, block: Block, ready: Mark) -> None:
        self.live[block.ptr] = Entry(block, ready)
        self.index = None
        self.live_bytes += block.nbytes

    def remove(self, entry: Entry) -> None:
        del self.live[entry.block.ptr]
        entry.gone = True
        self.index = None
        self.live_bytes -= entry.block.nbytes

    def entry(self, block: Block, what: str) -> Entry:
        """The live entry of ``block``.

        Raises
        ------
        StaleContext
            The block was made before a context reset.
        InvalidArgument
            The block belongs to another device.
        UseAfterFree
            The block was freed (its address may hold a newer block).
        """
        entry = self.live.get(block.ptr)
        if entry is not None and entry.block is block:
            return entry
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
        if entry is None or entry.block.generation != block.generation:
            now = (f"; the address now holds generation {entry.block.generation}"
                   if entry is not None else "")
            raise UseAfterFree(
                f"{what}: {block.describe()} is not live (already freed{now}). "
                "Do not use a block after deallocate; keep the array alive while it is in use."
            )
        return entry  # another handle of the same allocation

    def find(self, address: int) -> Block | None:
        """The live block that holds ``address``, or None."""
        index = self.index
        if index is None:
            # Rebuilt on demand: the hot paths find blocks through their
            # arrays, so allocations and frees only mark it stale.
            index = self.index = sorted(self.live)
        i = bisect.bisect_right(index, address) - 1
        if i < 0:
            return None
        block = self.live[index[i]].block
        return block if address < block.ptr + block.nbytes else None

    def overlapping(self, ptr: int, nbytes: int) -> Block | None:
        """A live block with a byte in ``ptr`` .. ``ptr + nbytes - 1``, or None."""
        block = self.find(ptr)
        if block is not None:
            return block
        index = self.index
        assert index is not None  # find() built it
        i = bisect.bisect_left(index, ptr)
        if i < len(index) and index[i] < ptr + nbytes:
            return self.live[index[i]].block
        return None

    def on_stream(self, stream: int) -> list[Block]:
        """Live blocks allocated on ``stream``."""
        return [e.block for e in self.live.values() if e.block.stream == stream]

    def forget_stream(self, stream: int) -> None:
        """End ``stream``'s history: rename it in the marks and reads of live
        blocks and drop it from every mark's waiters, so a new stream that gets
        the same handle inherits nothing."""
        tomb = retired_stream_id()
        for entry in self.live.values():
            lw = entry.last_write
            if lw.stream == stream:
                lw.stream = tomb
            if lw.waiters:
                lw.waiters.pop(stream, None)
            reads = entry.reads
            if reads:
                mark = reads.pop(stream, None)
                if mark is not None:
                    mark.stream = tomb
                    reads[tomb] = mark
                for m in reads.values():
                    if m.waiters:
                        m.waiters.pop(stream, None)

    def clear(self) -> list[Entry]:
        """Forget every block, advance the epoch, and return the entries."""
        entries = list(self.live.values())
        for entry in entries:
            entry.gone = True
        self.live.clear()
        self.index = None
        self.live_bytes = 0
        self.epoch += 1
        return entries
