"""DirectResource: synchronous ``cuMemAlloc`` / ``cuMemFree``, no tracking."""

from __future__ import annotations

import bisect
import contextlib
import threading
from typing import Any

from numba_streamsafe._driver.base import Driver
from numba_streamsafe.core.blocks import (
    Block,
    BlockState,
    check_block,
    next_generation,
    positive_size,
)
from numba_streamsafe.core.errors import DriverError, InvalidArgument, StaleContext, UseAfterFree
from numba_streamsafe.core.streams import resource_stream
from numba_streamsafe.resources.base import MemoryResource, ResourceStats
from numba_streamsafe.resources.deferred import DeferredFrees

__all__ = ["DirectResource"]


class DirectResource(MemoryResource):
    """Blocks from ``cuMemAlloc``; freed at once with ``cuMemFree``.

    ``cuMemFree`` waits for the device, so frees are never pending, but uses
    are not tracked: :meth:`supports_tracking` is False and the tracking calls
    raise :class:`~numba_streamsafe.core.errors.StreamMisuse`. Useful under
    compute-sanitizer, where a pool would hide out-of-bounds accesses between
    neighbouring blocks.
    """

    #: Where new memory comes from (``memory_stats()["upstream"]``).
    upstream_name = "cuMemAlloc (untracked)"

    def __init__(self, driver: Driver) -> None:
        self.driver = driver
        self.device = driver.device
        self._lock = threading.Lock()
        self._live: dict[int, Block] = {}
        self._bases: list[int] = []
        self._live_bytes = 0
        self._peak = 0
        self._allocations = 0
        self._frees = 0
        self._epoch = 0
        self._deferred = DeferredFrees()

    def allocate(self, nbytes: int, stream: int, tag: str = "", *, stream_owner: Any = None
                 ) -> Block:
        nbytes = positive_size(nbytes, tag)
        stream = resource_stream(stream, "DirectResource.allocate")
        self.flush()
        self.driver.check_stream(stream)
        ptr = self.driver.alloc(nbytes)
        block = Block(ptr, nbytes, self.device, stream, tag, next_generation(), self._epoch)
        with self._lock:
            self._live[ptr] = block
            bisect.insort(self._bases, ptr)
            self._live_bytes += nbytes
            self._peak = max(self._peak, self._live_bytes)
            self._allocations += 1
        return block

    def deallocate(self, block: Block) -> None:
        check_block(block, "deallocate")
        if block.device != self.device:
            raise InvalidArgument(
                f"deallocate: {block.describe()} belongs to device {block.device}, but this "
                f"resource serves device {self.device}; use that device's runtime"
            )
        with self._lock:
            if block.epoch != self._epoch:
                raise StaleContext(f"deallocate: {block.describe()} predates a context reset")
            live = self._live.get(block.ptr)
            if live is None or live.generation != block.generation:
                raise UseAfterFree(
                    f"deallocate: {block.describe()} is not live (already freed); "
                    "free each block once"
                )
            self.driver.free(block.ptr)
            del self._live[block.ptr]
            self._bases.pop(bisect.bisect_left(self._bases, block.ptr))
            self._live_bytes -= block.nbytes
            self._frees += 1
            block.state = BlockState.FREED

    def defer_free(self, block: Block) -> None:
        # cuMemFree synchronises the device, which a finalizer must not do:
        # queue the block for the next flush, as the async resource does.
        check_block(block, "defer_free")
        self._deferred.push(block)

    def flush(self) -> None:
        self._deferred.drain(self.deallocate, reraise=True)

    def hold_frees(self) -> contextlib.AbstractContextManager[None]:
        return self._deferred.hold()

    def bytes_outstanding(self) -> int:
        return self._live_bytes

    def reap_pending(self) -> None:
        self.flush()

    def find(self, address: int) -> Block | None:
        with self._lock:
            i = bisect.bisect_right(self._bases, address) - 1
            if i < 0:
                return None
            block = self._live[self._bases[i]]
            return block if address < block.ptr + block.nbytes else None

    def stats(self) -> ResourceStats:
        with self._lock:
            return ResourceStats(self._live_bytes, 0, self._peak, len(self._live),
                                 self._allocations, self._frees, len(self._deferred), 0, 0)

    @property
    def epoch(self) -> int:
        return self._epoch

    def reset_context(self) -> None:
        """Free every live block (ignoring driver errors: a gone context took its
        memory with it), forget queued frees and advance the epoch."""
        with self._lock:
            self._epoch += 1
            blocks = list(self._live.values())
            self._live.clear()
            self._bases.clear()
            self._live_bytes = 0
            self._deferred.clear()
        for block in blocks:
            block.state = BlockState.FREED
            try:
                self.driver.free(block.ptr)
            except DriverError:
                pass
