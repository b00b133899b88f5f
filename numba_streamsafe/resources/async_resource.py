"""AsyncResource: stream-ordered blocks with per-block dependency tracking."""

from __future__ import annotations

import bisect
import contextlib
import itertools
import logging
import threading
from collections.abc import Callable, Sequence
from typing import Any

from numba_streamsafe._driver.base import CUDA_ERROR_OUT_OF_MEMORY, Driver
from numba_streamsafe.access import Access
from numba_streamsafe.blocks import Block, BlockState, check_block, next_generation, positive_size
from numba_streamsafe.errors import (
    DriverError,
    InvalidArgument,
    OutOfMemory,
    StaleContext,
    StreamSafeError,
    UseAfterFree,
)
from numba_streamsafe.resources.base import MemoryResource, ResourceStats, Use
from numba_streamsafe.resources.deferred import DeferredFrees
from numba_streamsafe.resources.events import EventPool, Mark

__all__ = ["AsyncResource"]

_log = logging.getLogger("numba_streamsafe")


class _Entry:
    """Dependency state of one live block."""

    __slots__ = ("block", "last_write", "reads")

    def __init__(self, block: Block, ready: Mark) -> None:
        self.block = block
        #: The last write, or the allocation itself before any write.
        self.last_write: Mark = ready
        #: The newest read mark per stream since ``last_write``. A later mark
        #: on a stream covers the earlier ones, so one per stream suffices.
        self.reads: dict[int, Mark] = {}

    def waits_for(self, stream: int, access: int) -> list[Mark]:
        """Marks of other streams that ``access`` on ``stream`` must wait for."""
        out = []
        lw = self.last_write
        if lw.stream != stream:
            out.append(lw)
        if access & 2:
            for s, mark in self.reads.items():
                if s != stream:
                    out.append(mark)
        return out


def _unref(mark: Mark, pool: EventPool) -> None:
    mark.refs -= 1
    if mark.refs == 0:
        if mark.handle is not None:
            pool.release(mark.handle)
            mark.handle = None
        # No use refers to the mark any more: stop keeping its stream object
        # and its waiters' alive (an open mark stays in ``_marks`` until the
        # stream's next use).
        mark.owner = None
        mark.waiters = None


#: Identities given to the marks and reads of retired streams: negative, so
#: never the handle of a stream that exists (handles are >= 0).
_retired_streams = itertools.count(-2, -1)


#: ``release_threshold`` that keeps every freed byte in the pool.
POOL_KEEP_ALL = (1 << 64) - 1

_LIVE = BlockState.LIVE
_FREED = BlockState.FREED


class AsyncResource(MemoryResource):
    """Blocks from ``cuMemAllocAsync``, freed with ``cuMemFreeAsync``, fully tracked.

    Each block keeps the mark of its last write (first, of its allocation)
    and, per stream, the mark of its newest read since that write. Before a
    use on another stream the resource queues ``cuStreamWaitEvent`` for the
    hazards the access implies; before the free, the alloc stream waits for
    every cross-stream mark, so the pool cannot hand the address to anyone
    while a use is in flight. Same-stream uses never wait.

    All blocks of one launch share one :class:`~numba_streamsafe.resources.Mark`
    and so at most one event. With ``fences="lazy"`` (the default) that event
    is recorded only when another stream first has to wait for the mark, so
    work that stays on one stream records no event at all; the consumer then
    waits for everything queued on the producer's stream up to that moment,
    which covers the producer's launch. ``fences="eager"`` records the event
    right after every launch (and allocation) instead: waits are then exactly
    as late as the producer, at one ``cuEventRecord`` per launch.

    Parameters
    ----------
    driver : Driver
        Backend (CUDA or simulated).
    fences : {"lazy", "eager"}
        When a launch's event is recorded (see above).
    max_idle_events : int
        Idle events the event pool keeps.
    reuse_bytes : int
        Bytes of freed blocks kept for reuse by the next allocation of the
        same size on the same stream (0: none). The free of such a block is
        complete in stream order once its cross-stream waits are queued, so
        the next allocation on that stream may take it without a driver call;
        blocks of other sizes or streams go back to the pool. When a freed
        block does not fit, the oldest kept blocks go back to the pool to make
        room. Kept blocks count as pending until :meth:`reap_pending` (or an
        allocation that runs out of memory) returns them to the pool. Only
        blocks of streams whose owning object is known (kept alive while they
        wait) and of the default streams are kept.
    release_threshold : int or None
        Pooled bytes the device's stream-ordered pool keeps at a synchronize
        (``CU_MEMPOOL_ATTR_RELEASE_THRESHOLD``); None leaves the pool's setting
        (CUDA's default is 0: every synchronize hands freed memory back to the
        system, and the next allocations map it again). :data:`POOL_KEEP_ALL`
        keeps it all; an allocation that runs out of memory still trims the
        pool before it retries.

    Notes
    -----
    Streams are told apart by handle, and CUDA may give a destroyed stream's
    handle to the next stream created. A handle's history therefore ends with
    its stream: :meth:`retire_stream` (what ``DeviceRuntime.destroy_stream``
    calls) forgets which marks the stream waited for and renames its uses, so
    a stream that later gets the handle inherits nothing; and the owning object
    of a stream (given as ``stream_owner`` or ``owner``) is kept alive while a
    use recorded on it, or a mark it waited for, is in use, so a stream that
    destroys itself when collected (as Numba's do) cannot free its handle while
    the tracker still relies on it. A raw handle destroyed behind the
    resource's back is not covered: destroy such streams through the runtime.

    Thread-safe. :meth:`defer_free` takes no lock and makes no driver call, so
    Numba's finalizers can use it from any thread, inside any locked section
    and at interpreter shutdown; queued frees run at the next allocation,
    launch, reap or :meth:`flush`.
    """

    events: EventPool

    def __init__(self, driver: Driver, *, fences: str = "lazy", max_idle_events: int = 1024,
                 reuse_bytes: int = 64 << 20, release_threshold: int | None = None) -> None:
        if fences not in ("lazy", "eager"):
            raise InvalidArgument(f"fences must be 'lazy' or 'eager', got {fences!r}")
        if (not isinstance(max_idle_events, int) or isinstance(max_idle_events, bool)
                or max_idle_events < 0):
            raise InvalidArgument(
                f"max_idle_events must be an int >= 0 (idle events the pool keeps), got "
                f"{max_idle_events!r}"
            )
        if not isinstance(reuse_bytes, int) or isinstance(reuse_bytes, bool) or reuse_bytes < 0:
            raise InvalidArgument(f"reuse_bytes must be an int >= 0, got {reuse_bytes!r}")
        self.reuse_bytes = reuse_bytes
        if release_threshold is not None:
            if (not isinstance(release_threshold, int) or isinstance(release_threshold, bool)
                    or not 0 <= release_threshold <= POOL_KEEP_ALL):
                raise InvalidArgument(
                    f"release_threshold must be None or an int from 0 to 2**64 - 1, got "
                    f"{release_threshold!r}"
                )
            driver.set_pool_attribute("RELEASE_THRESHOLD", release_threshold)
        self.fences = fences
        self._eager = fences == "eager"
        self.driver = driver
        self.device = driver.device
        self.events = EventPool(driver, max_idle_events)
        self._lock = threading.Lock()
        #: Held while pending frees are synchronised and while a stream is
        #: retired, so a stream is never destroyed under a reap that syncs it.
        self._reap_lock = threading.RLock()
        self._live: dict[int, _Entry] = {}
        #: The open (not yet sealed) mark of each stream.
        self._marks: dict[int, Mark] = {}
        #: Sorted live addresses for :meth:`find`; None when stale.
        self._index: list[int] | None = []
        self._live_bytes = 0
        self._pending_bytes = 0
        #: stream -> [bytes whose free is queued there, the stream's keep-alive owner]
        self._pending: dict[int, list[Any]] = {}
        self._deferred = DeferredFrees()
        self._deferred_queue = self._deferred.queue  # truthiness checked on every allocation
        #: (stream, nbytes) -> addresses of freed blocks kept for reuse on that stream.
        self._kept: dict[tuple[int, int], list[int]] = {}
        #: stream -> its owning object, alive while blocks are kept for it.
        self._kept_owners: dict[int, Any] = {}
        self._kept_bytes = 0
        self._epoch = 0
        self._peak = 0
        self._allocations = 0
        self._frees = 0

    # ------------------------------------------------------------ allocation
    def allocate(self, nbytes: int, stream: int, tag: str = "", *, stream_owner: Any = None
                 ) -> Block:
        if nbytes.__class__ is not int or nbytes <= 0:
            nbytes = positive_size(nbytes, tag)
        driver = self.driver
        if stream > 2:  # not the legacy or per-thread default stream
            driver.check_stream(stream)
        if self._pending and not self._allocations & 63:
            self.reap_completed()
        queue, kept = self._deferred_queue, self._kept
        if queue or kept:
            # Queued frees and the kept block under one lock: the common
            # free-then-allocate cycle of one size makes no driver call.
            with self._lock:
                if queue:
                    self._deferred.drain(self._deallocate_locked)
                if kept:
                    key = (stream, nbytes)
                    ptrs = kept.get(key)
                    if ptrs:
                        ptr = ptrs.pop()
                        if not ptrs:
                            del kept[key]
                        self._kept_bytes -= nbytes
                        block = Block(ptr, nbytes, self.device, stream, tag, next_generation(),
                                      self._epoch, _LIVE, stream_owner)
                        try:
                            self._register(block, stream, stream_owner)
                        except BaseException:
                            # Only an eager fence can fail; its block went back to the pool.
                            block.state = _FREED
                            raise
                        return block
        try:
            ptr = driver.alloc_async(nbytes, stream)
        except DriverError as exc:
            if exc.code != CUDA_ERROR_OUT_OF_MEMORY:
                raise
            ptr = self._retry_after_oom(nbytes, stream)
        block = Block(ptr, nbytes, self.device, stream, tag, next_generation(), self._epoch,
                      _LIVE, stream_owner)
        with self._lock:
            live = self._live
            if ptr in live:
                # The driver returned an address we hold: never overwrite state.
                raise StreamSafeError(
                    f"the driver returned {ptr:#x}, which is still live as "
                    f"{live[ptr].block.describe()}; the pool is corrupt, report this"
                )
            self._register(block, stream, stream_owner)
        return block

    def _register(self, block: Block, stream: int, stream_owner: Any) -> None:
        """Make ``block`` live, ready after its allocation; caller holds the lock."""
        mark = self._marks.get(stream)
        if mark is None:
            mark = self._marks[stream] = Mark(stream, stream_owner)
        elif stream_owner is not None and mark.owner is None:
            mark.owner = stream_owner
        if self._eager:
            try:
                self._seal(mark)  # the allocation-ready event
            except BaseException:
                if mark.refs == 0:
                    mark.owner = None  # no use refers to it: keep no stream object alive
                self.driver.free_async(block.ptr, stream)
                raise
        mark.refs += 1
        nbytes = block.nbytes
        self._live[block.ptr] = _Entry(block, mark)
        self._index = None
        self._live_bytes += nbytes
        self._allocations += 1
        total = self._live_bytes + self._pending_bytes + self._kept_bytes
        if total > self._peak:
            self._peak = total

    def _add_pending(self, stream: int, nbytes: int, owner: Any) -> None:
        """Count ``nbytes`` whose free is queued on ``stream``; caller holds the lock."""
        self._pending_bytes += nbytes
        slot = self._pending.get(stream)
        if slot is None:
            self._pending[stream] = [nbytes, owner]
        else:
            slot[0] += nbytes
            if slot[1] is None:
                slot[1] = owner

    def _free_kept(self, limit: int = 0) -> None:
        """Queue the frees of the oldest kept blocks until at most ``limit``
        bytes stay kept (all of them by default); caller holds the lock.

        A failing free raises; what was freed is pending, the rest stays kept.
        """
        free = self.driver.free_async
        owners = self._kept_owners
        for key in list(self._kept):
            if self._kept_bytes <= limit:
                break
            stream, nbytes = key
            ptrs = self._kept[key]
            while ptrs and self._kept_bytes > limit:
                free(ptrs[-1], stream)
                ptrs.pop()
                self._kept_bytes -= nbytes
                self._add_pending(stream, nbytes, owners.get(stream))
            if not ptrs:
                del self._kept[key]
                if limit and not any(s == stream for s, _ in self._kept):
                    owners.pop(stream, None)
        if not self._kept:
            owners.clear()

    def _retry_after_oom(self, nbytes: int, stream: int) -> int:
        """Out of memory: give back everything we can, then try once more."""
        self.flush()
        try:
            self.reap_pending()
        except DriverError:
            pass
        self._trim_quietly()
        try:
            return self.driver.alloc_async(nbytes, stream)
        except DriverError as exc:
            if exc.code != CUDA_ERROR_OUT_OF_MEMORY:
                raise
            # The failed attempt can leave the pool holding what it reserved:
            # hand it back, so the caller's next (smaller) allocation can work.
            self._trim_quietly()
            with self._lock:
                live, pending = self._live_bytes, self._pending_bytes + self._kept_bytes
            raise OutOfMemory(nbytes, live, pending, str(exc)) from None

    def _trim_quietly(self) -> None:
        try:
            self.driver.pool_trim(0)
        except DriverError as exc:
            _log.warning("pool trim after out-of-memory failed: %s", exc)

    # ------------------------------------------------------------ validation
    def _entry(self, block: Block, what: str) -> _Entry:
        """The live entry of ``block``; caller holds the lock."""
        if block.epoch != self._epoch:
            raise StaleContext(
                f"{what}: {block.describe()} was made before the CUDA context was reset "
                f"(epoch {block.epoch}, now {self._epoch}); it no longer exists. "
                "Allocate it again in the current context."
            )
        if block.device != self.device:
            raise InvalidArgument(
                f"{what}: {block.describe()} belongs to device {block.device}, but this "
                f"resource serves device {self.device}; use that device's runtime"
            )
        entry = self._live.get(block.ptr)
        if entry is None or entry.block.generation != block.generation:
            now = (f"; the address now holds generation {entry.block.generation}"
                   if entry is not None else "")
            raise UseAfterFree(
                f"{what}: {block.describe()} is not live (already freed{now}). "
                "Do not use a block after deallocate; keep the array alive while it is in use."
            )
        return entry

    # ---------------------------------------------------------------- tracking
    def supports_tracking(self) -> bool:
        return True

    def _entries(self, uses: Sequence[Use], what: str) -> list[tuple[_Entry, int]]:
        """Validated entries of ``uses``; caller holds the lock."""
        live = self._live
        out: list[tuple[_Entry, int]] = []
        for block, access in uses:
            entry = live.get(block.ptr)
            if entry is None or entry.block is not block:
                entry = self._entry(block, what)  # a copy of the handle, or an error
            out.append((entry, access))
        return out

    def _open_mark(self, stream: int, owner: Any = None) -> Mark:
        """The stream's open mark; caller holds the lock."""
        mark = self._marks.get(stream)
        if mark is None:
            mark = self._marks[stream] = Mark(stream, owner)
        elif owner is not None and mark.owner is None:
            mark.owner = owner
        return mark

    def _seal(self, mark: Mark) -> Any:
        """The event of ``mark``, recorded now if it has none; caller holds the lock."""
        handle = mark.handle
        if handle is None:
            handle = mark.handle = self.events.record(mark.stream)
            if self._marks.get(mark.stream) is mark:
                del self._marks[mark.stream]  # later work needs a new mark
        return handle

    def _wait_all(self, stream: int, marks: list[Mark], owner: Any = None) -> None:
        """Queue waits of ``stream`` on ``marks``, each once; caller holds the lock.

        A stream that already waited for a mark is ordered after it for good
        (stream order), so it never waits for the same mark twice. The mark
        keeps ``owner`` (the waiting stream's object) alive while it is in use,
        so the waiter's handle cannot pass to a new stream that would then skip
        the wait; :meth:`retire_stream` forgets the waits of a retired handle.
        """
        wait = self.driver.stream_wait_event
        for mark in marks:
            waiters = mark.waiters
            if waiters is None:
                mark.waiters = waiters = {}
            elif stream in waiters:
                if owner is not None and waiters[stream] is None:
                    waiters[stream] = owner
                continue
            wait(stream, self._seal(mark))
            waiters[stream] = owner

    def preflight(self, uses: Sequence[Use], stream: int, owner: Any = None) -> None:
        if self._deferred:
            self._drain()
        with self._lock:
            marks: list[Mark] | None = None
            for entry, access in self._entries(uses, "preflight"):
                lw = entry.last_write
                if lw.stream != stream:
                    if marks is None:
                        marks = [lw]
                    else:
                        marks.append(lw)
                if access & 2 and entry.reads:
                    for s, mark in entry.reads.items():
                        if s != stream:
                            if marks is None:
                                marks = [mark]
                            else:
                                marks.append(mark)
            if marks is not None:
                self._wait_all(stream, marks, owner)

    def commit(self, uses: Sequence[Use], stream: int, owner: Any = None) -> None:
        """Record ``uses`` against the stream's current mark (sealed now when eager).

        ``owner`` is kept alive with the mark (the stream object, so the stream
        outlives every use recorded on it).
        """
        with self._lock:
            entries = self._entries(uses, "commit")
            if not entries:
                return
            mark = self._marks.get(stream)
            if mark is None:
                mark = self._marks[stream] = Mark(stream, owner)
            elif owner is not None and mark.owner is None:
                mark.owner = owner
            pool = self.events
            for entry, access in entries:
                if access & 2:
                    mark.refs += 1  # first, so ``mark`` never drops to 0 (and its owner) here
                    lw = entry.last_write
                    if lw is not mark:
                        _unref(lw, pool)
                        entry.last_write = mark
                    else:
                        mark.refs -= 1
                    if entry.reads:
                        for old in entry.reads.values():
                            _unref(old, pool)
                        entry.reads = {}
                else:
                    reads = entry.reads
                    prev = reads.get(stream)
                    if prev is not mark:
                        reads[stream] = mark
                        mark.refs += 1
                        if prev is not None:
                            _unref(prev, pool)
            if self._eager:
                self._seal(mark)

    def block_events(self, block: Block) -> tuple[Mark, dict[int, Mark]]:
        """Diagnostics: ``(last_write_mark, {read_stream: read_mark})`` of a live block."""
        with self._lock:
            entry = self._entry(block, "block_events")
            return entry.last_write, dict(entry.reads)

    # ------------------------------------------------------------------ freeing
    def deallocate(self, block: Block) -> None:
        if block.__class__ is not Block:
            check_block(block, "deallocate")
        with self._lock:
            self._deallocate_locked(block)

    def _deallocate_locked(self, block: Block) -> None:
        """:meth:`deallocate` with the lock held."""
        entry = self._live.get(block.ptr)
        if entry is None or entry.block is not block:
            entry = self._entry(block, "deallocate")  # a copy of the handle, or an error
        stream = block.stream
        if entry.reads or entry.last_write.stream != stream:
            marks = entry.waits_for(stream, Access.READ_WRITE)
            if marks:
                self._wait_all(stream, marks, block.stream_owner)
        nbytes = block.nbytes
        owner = block.stream_owner
        keep = (nbytes <= self.reuse_bytes
                and (owner is not None or stream in (0, 1, 2)))
        if keep and self._kept_bytes + nbytes > self.reuse_bytes:
            try:  # make room: the oldest kept blocks go back to the pool
                self._free_kept(self.reuse_bytes - nbytes)
            except DriverError:
                keep = False
        if not keep:
            self.driver.free_async(block.ptr, stream)
        # The free is queued (or the block kept): from here on nothing can fail.
        del self._live[block.ptr]
        self._index = None
        self._release_entry(entry)
        self._live_bytes -= nbytes
        if keep:
            ptrs = self._kept.get((stream, nbytes))
            if ptrs is None:
                self._kept[(stream, nbytes)] = [block.ptr]
            else:
                ptrs.append(block.ptr)
            self._kept_bytes += nbytes
            if owner is not None:
                self._kept_owners[stream] = owner
        else:
            self._add_pending(stream, nbytes, owner)
        self._frees += 1
        block.state = _FREED
        block.stream_owner = None

    def _release_entry(self, entry: _Entry) -> None:
        pool = self.events
        _unref(entry.last_write, pool)
        if entry.reads:
            for mark in entry.reads.values():
                _unref(mark, pool)
            entry.reads = {}

    def defer_free(self, block: Block) -> None:
        if block.__class__ is not Block:
            check_block(block, "defer_free")
        self._deferred.push(block)

    def flush(self) -> None:
        self._drain()

    def hold_frees(self) -> contextlib.AbstractContextManager[None]:
        return self._deferred.hold()

    def _drain(self) -> None:
        self._deferred.drain(self.deallocate)

    # --------------------------------------------------------------- accounting
    def bytes_outstanding(self) -> int:
        with self._lock:
            return self._live_bytes + self._pending_bytes + self._kept_bytes

    @property
    def live_bytes(self) -> int:
        return self._live_bytes

    @property
    def pending_bytes(self) -> int:
        """Bytes freed by their owner and not yet back in the pool (queued
        frees and blocks kept for reuse)."""
        return self._pending_bytes + self._kept_bytes

    def pending_per_stream(self) -> dict[int, int]:
        """Bytes freed and not yet back in the pool (queued frees and kept
        blocks), per stream."""
        with self._lock:
            out = {s: slot[0] for s, slot in self._pending.items()}
            for (s, nbytes), ptrs in self._kept.items():
                out[s] = out.get(s, 0) + nbytes * len(ptrs)
            return out

    def reap_pending(self) -> None:
        self._drain()
        with self._reap_lock:
            with self._lock:
                if self._kept:
                    self._free_kept()
                drained, self._pending = self._pending, {}
                # Forget the open marks no use refers to (streams come and go).
                for stream in [s for s, m in self._marks.items() if not m.refs]:
                    del self._marks[stream]
            self._sync_pending(drained)

    def _sync_pending(self, drained: dict[int, list[Any]]) -> None:
        """Synchronise the streams of ``drained`` pending frees and stop counting
        them; caller holds the reap lock. On a failure the rest stays pending."""
        items = list(drained.items())
        for i, (stream, (nbytes, _owner)) in enumerate(items):
            try:
                self.driver.stream_synchronize(stream)
            except BaseException:
                with self._lock:
                    for s, (n, owner) in items[i:]:
                        slot = self._pending.setdefault(s, [0, None])
                        slot[0] += n
                        if slot[1] is None:
                            slot[1] = owner
                raise
            with self._lock:
                self._pending_bytes -= nbytes

    def reap_completed(self) -> None:
        """Release the pending bytes of streams that have gone idle, without waiting.

        An idle stream (``cuStreamQuery``) has run every free queued on it.
        Called every few allocations, so that pending bytes stay bounded in a
        program that never reaps. Does nothing while another thread reaps or
        retires a stream.
        """
        if not self._reap_lock.acquire(blocking=False):
            return
        try:
            with self._lock:
                streams = list(self._pending)
            for stream in streams:
                try:
                    idle = self.driver.stream_query(stream)
                except DriverError:
                    continue
                if idle:
                    with self._lock:
                        slot = self._pending.pop(stream, None)
                        if slot is not None:
                            self._pending_bytes -= slot[0]
        finally:
            self._reap_lock.release()

    def find(self, address: int) -> Block | None:
        with self._lock:
            index = self._index
            if index is None:
                # Rebuilt on demand: the hot paths find blocks through their
                # arrays, so allocations and frees only mark it stale.
                index = self._index = sorted(self._live)
            i = bisect.bisect_right(index, address) - 1
            if i < 0:
                return None
            block = self._live[index[i]].block
            return block if address < block.ptr + block.nbytes else None

    def retire_stream(self, stream: int, destroy: Callable[[int], None] | None = None) -> None:
        """End ``stream``'s history, then call ``destroy(stream)`` if given
        (``DeviceRuntime.destroy_stream`` passes the driver's destroy).

        Runs queued frees, records the event of the stream's open mark (so
        uses recorded on the stream can still be waited for once it is gone),
        synchronises the stream's pending frees (a destroyed stream can no
        longer be synchronised), and renames the stream in every mark and read
        that refers to it and forgets which marks it waited for: a new stream
        that gets the same handle inherits nothing. The reap lock is held
        throughout, ``destroy`` included, so no concurrent reap synchronises the
        stream after it is gone. If ``destroy`` raises, the history is kept.
        """
        self._drain()
        with self._reap_lock:
            with self._lock:
                mark = self._marks.pop(stream, None)
                if mark is not None and mark.refs:
                    self._marks[stream] = mark
                    self._seal(mark)  # removes it from ``_marks``
                pending: dict[int, list[Any]] = {}
                if any(s == stream for s, _ in self._kept):
                    self._free_kept_of(stream)
                slot = self._pending.pop(stream, None)
                if slot is not None:
                    pending[stream] = slot
            self._sync_pending(pending)
            with self._lock:
                # Under the lock: no launch sees the handle between the destroy
                # and the forgetting. A failed destroy leaves the history as it was.
                if destroy is not None:
                    destroy(stream)
                self._forget_stream(stream)

    def _forget_stream(self, stream: int) -> None:
        """Rename ``stream`` in the marks and reads of live blocks and drop it
        from every mark's waiters; caller holds the lock."""
        tomb = next(_retired_streams)
        for entry in self._live.values():
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

    def _free_kept_of(self, stream: int) -> None:
        """Queue the frees of the blocks kept for reuse on ``stream``; caller holds the lock."""
        free = self.driver.free_async
        owner = self._kept_owners.get(stream)
        for key in [k for k in self._kept if k[0] == stream]:
            nbytes = key[1]
            ptrs = self._kept[key]
            while ptrs:
                free(ptrs[-1], stream)
                ptrs.pop()
                self._kept_bytes -= nbytes
                self._add_pending(stream, nbytes, owner)
            del self._kept[key]
        self._kept_owners.pop(stream, None)

    @property
    def tracker(self) -> AsyncResource:
        return self

    def blocks_on_stream(self, stream: int) -> list[Block]:
        """Live blocks allocated on ``stream``."""
        with self._lock:
            return [e.block for e in self._live.values() if e.block.stream == stream]

    def stats(self) -> ResourceStats:
        with self._lock:
            return ResourceStats(
                live_bytes=self._live_bytes,
                pending_bytes=self._pending_bytes + self._kept_bytes,
                peak_bytes=self._peak,
                live_blocks=len(self._live),
                allocations=self._allocations,
                frees=self._frees,
                deferred=len(self._deferred),
                events_in_use=self.events.in_use,
                events_idle=self.events.idle,
            )

    # ---------------------------------------------------------------- lifecycle
    @property
    def epoch(self) -> int:
        return self._epoch

    def reset_context(self) -> None:
        """Free every live block synchronously, forget all state and advance the epoch.

        Driver errors are ignored: when the context is already gone, so is
        its memory. Handles from before are refused with
        :class:`~numba_streamsafe.errors.StaleContext`.
        """
        with self._lock:
            self._epoch += 1
            entries = list(self._live.values())
            for entry in entries:
                self._release_entry(entry)
            self._live.clear()
            self._marks.clear()
            self._index = None
            self._pending.clear()
            kept = [ptr for ptrs in self._kept.values() for ptr in ptrs]
            self._kept.clear()
            self._kept_owners.clear()
            self._kept_bytes = 0
            self._live_bytes = 0
            self._pending_bytes = 0
            self._deferred.clear()
        for entry in entries:
            entry.block.state = BlockState.FREED
            entry.block.stream_owner = None
        for ptr in [entry.block.ptr for entry in entries] + kept:
            try:
                self.driver.free(ptr)
            except DriverError:
                pass
        self.events.forget()
