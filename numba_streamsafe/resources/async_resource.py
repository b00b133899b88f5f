"""AsyncResource: stream-ordered blocks with per-block dependency tracking.

It is made of parts that each own their state: the live blocks and their
dependency state (:class:`~.tracking.block_table.BlockTable`), the marks and
waits (:class:`~.tracking.marks.MarkBook`, over an
:class:`~.tracking.marks.EventPool`), the freed bytes not yet back where they
came from (:class:`~.reaping.Reaper`), where new memory comes from
(:class:`~.upstream.MemorySource`) and the finalizer-safe queue
(:class:`~.deferred.DeferredFrees`). The resource holds the lock they are
changed under, and its figures.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import warnings
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import numba_streamsafe.resources.tracking.rules as rules
from numba_streamsafe._driver.base import CUDA_ERROR_OUT_OF_MEMORY, Driver
from numba_streamsafe._driver.observer import quiet
from numba_streamsafe.core import tracehook
from numba_streamsafe.core.access import Access
from numba_streamsafe.core.blocks import (
    Block,
    BlockState,
    check_block,
    check_int,
    next_generation_fast,
    positive_size,
)
from numba_streamsafe.core.errors import (
    DriverError,
    InvalidArgument,
    OutOfMemory,
    StreamSafeError,
)
from numba_streamsafe.core.sites import capture_stack
from numba_streamsafe.core.streams import MAX_DEFAULT_STREAM, resource_stream
from numba_streamsafe.resources.base import MemoryResource, ResourceStats, Use
from numba_streamsafe.resources.deferred import DeferredFrees
from numba_streamsafe.resources.observed import ObservedCalls
from numba_streamsafe.resources.races import RaceLog
from numba_streamsafe.resources.reaping import Reaper
from numba_streamsafe.resources.tracking.block_table import BlockTable
from numba_streamsafe.resources.tracking.lock import Lock
from numba_streamsafe.resources.tracking.marks import (
    AT_SYNC,
    EventPool,
    ForeignMark,
    Mark,
    MarkBook,
)
from numba_streamsafe.resources.tracking.rules import Entry
from numba_streamsafe.resources.upstream import Upstream, memory_source

__all__ = ["AsyncResource", "AsyncOptions", "POOL_KEEP_ALL"]

_log = logging.getLogger("numba_streamsafe")
T = TypeVar("T")
#: Whether the observer's absence was told (once per process).
_told_unobserved = False


def _say_unobserved(why: str | None) -> None:
    """Say once that other code's CUDA calls are not observed, and why."""
    global _told_unobserved
    if _told_unobserved:
        return
    _told_unobserved = True
    why = why or "no observer on this driver"
    warnings.warn(
        f"numba_streamsafe: other libraries' CUDA calls are not observed ({why}); only "
        "Numba's own events, synchronises and copies are followed, so work that CuPy, "
        "PyTorch or cuda.core orders may be reported as races",
        RuntimeWarning, stacklevel=4)

#: ``release_threshold`` that keeps every freed byte in the pool.
POOL_KEEP_ALL = (1 << 64) - 1

#: Streams whose pending frees are checked for completion every this many allocations.
_REAP_EVERY = 64

_LIVE = BlockState.LIVE
_FREED = BlockState.FREED
_WRITE = Access.WRITE


@dataclasses.dataclass(frozen=True)
class AsyncOptions:
    """The settings of an :class:`AsyncResource` (see its parameters).

    Raises
    ------
    InvalidArgument
        A field out of its range (the message names it).
    """

    fences: str = "lazy"
    max_idle_events: int = 1024
    reuse_bytes: int = 64 << 20
    release_threshold: int | None = None
    ipc: bool = False
    upstream: Upstream | None = None
    check: bool = False
    observe: bool = False

    def __post_init__(self) -> None:
        if not isinstance(self.ipc, bool):
            raise InvalidArgument(f"ipc must be True or False, got {self.ipc!r}")
        if not isinstance(self.check, bool):
            raise InvalidArgument(f"check must be True or False, got {self.check!r}")
        if not isinstance(self.observe, bool):
            raise InvalidArgument(f"observe must be True or False, got {self.observe!r}")
        if self.upstream is not None:
            if not isinstance(self.upstream, Upstream):
                raise InvalidArgument(
                    f"upstream must have a name and allocate(nbytes, stream) and "
                    f"deallocate(ptr, stream) methods, got {self.upstream!r}; for RMM pass "
                    "RmmUpstream(rmm.mr.get_current_device_resource())")
            if self.ipc:
                raise InvalidArgument("ipc=True allocates with cuMemAlloc (what CUDA IPC "
                                      "exports) and takes no upstream: pass one or the other")
        if self.fences not in ("lazy", "eager"):
            raise InvalidArgument(f"fences must be 'lazy' or 'eager', got {self.fences!r}")
        check_int("max_idle_events", self.max_idle_events, 0,
                   what=" (idle events the pool keeps)")
        check_int("reuse_bytes", self.reuse_bytes, 0)
        if self.release_threshold is not None:
            check_int("release_threshold", self.release_threshold, 0, POOL_KEEP_ALL,
                       " (or None)")


class AsyncResource(MemoryResource):
    """Blocks from ``cuMemAllocAsync``, freed with ``cuMemFreeAsync``, fully tracked.

    Each block keeps the mark of its last write (first, of its allocation)
    and, per stream, the mark of its newest read since that write. Before a
    use on another stream the resource queues ``cuStreamWaitEvent`` for the
    hazards the access implies; before the free, the alloc stream waits for
    every cross-stream mark, so the pool cannot hand the address to anyone
    while a use is in flight. Same-stream uses never wait.

    All blocks of one launch share one :class:`~numba_streamsafe.resources.tracking.marks.Mark`
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
    options : AsyncOptions, optional
        The settings below as one value; keyword arguments override its fields.
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
    upstream : Upstream or None
        Where new memory comes from instead of the device's stream-ordered
        pool, such as an RMM resource
        (:class:`~numba_streamsafe.resources.upstream.RmmUpstream`); None:
        ``cuMemAllocAsync`` / ``cuMemFreeAsync``. Not with ``ipc``.
    check : bool
        Check mode (``NUMBA_STREAMSAFE_MODE=check``): the resource queues no
        wait for the program's uses and frees every block at once; a use (or
        free) that needs a mark the program's own ordering does not cover is
        a race, reported in :attr:`race_log` as it is found. New memory is
        the one thing it orders: each allocation records an event, which a
        first use on another stream waits for (the pool hands memory out in
        its stream's order), never reported.
    observe : bool
        Learn the ordering and the copies other code makes on the device's
        context (CuPy, PyTorch, cuda.core, a C extension; Numba too) from the
        driver's observer (CUPTI's callbacks, :meth:`Driver.observe`): an
        event record, wait or synchronise of theirs orders the uses as
        Numba's own do (a wait it satisfies is skipped, in check mode no race
        is reported), and a copy or fill of theirs that touches a block is a
        use of it. Where the observer cannot run, a warning says why (once)
        and only Numba's own ordering is followed. CUPTI takes one subscriber:
        a profiler cannot run meanwhile. Default: off (check mode turns it on).
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

    def __init__(self, driver: Driver, options: AsyncOptions | None = None, **overrides: Any
                 ) -> None:
        try:
            opts = dataclasses.replace(options or AsyncOptions(), **overrides)
        except TypeError as exc:
            raise InvalidArgument(f"AsyncResource: {exc}; the options are "
                                  f"{[f.name for f in dataclasses.fields(AsyncOptions)]}") from None
        if opts.release_threshold is not None:
            driver.set_pool_attribute("RELEASE_THRESHOLD", opts.release_threshold)
        self.options = opts
        self.fences = opts.fences
        self._eager = opts.fences == "eager"
        self.driver = driver
        #: IPC mode (``ipc=True``): blocks are ``cuMemAlloc`` allocations, which
        #: CUDA IPC can export (pool memory cannot be opened with
        #: ``cuIpcOpenMemHandle``); they are tracked as any block, and freed after
        #: their uses by ``cuMemFree`` once their stream has completed them.
        self.ipc = opts.ipc
        self.source = memory_source(driver, opts.upstream, opts.ipc)
        #: Where new memory comes from (``memory_stats()["upstream"]``).
        self.upstream_name = self.source.name
        self._alloc = self.source.alloc
        self._free = self.source.free
        self.device = driver.device
        self.events = EventPool(driver, opts.max_idle_events)
        self._lock = Lock()
        self._table = BlockTable(self.device)
        self.marks = MarkBook(driver, self.events, opts.check)
        #: Check mode's reports; in ordering mode those of the race checks that
        #: watched (:meth:`watch_races`), None before the first.
        self.race_log: RaceLog | None = RaceLog() if opts.check else None
        if opts.check:
            tracehook.name_arguments_for_good()  # the reports name the arguments
            # A simulated driver's own checker is not the one that reports.
            system = getattr(driver, "system", None)
            if system is not None:
                system.reports = False
        #: Whether blocks keep the user's stacks where they were allocated and
        #: freed, for the race reports: check mode, a race check watching
        #: (:meth:`watch_races`), or a driver that checks accesses (told them).
        self._sites = bool(opts.check or driver.traces_accesses)
        self._reaper = Reaper(driver, self._lock, self._free, opts.reuse_bytes)
        # Read (never written) on every allocation and free.
        self._pending = self._reaper.pending
        self._kept = self._reaper.kept
        self._live = self._table.live
        self._deferred = DeferredFrees()
        self._deferred_queue = self._deferred.queue  # truthiness checked on every allocation
        #: Figures of :meth:`counters`: allocations and frees (count and bytes)
        #: over the resource's life, peak live bytes, peak outstanding bytes
        #: (live, pending and kept).
        self._allocations = 0
        self._allocated_bytes = 0
        self._frees = 0
        self._freed_bytes = 0
        self._live_peak = 0
        self._peak = 0
        #: Other code's calls on the device's context, as the driver observer
        #: notes them (``observe=True``), or None.
        self.observed: ObservedCalls | None = None
        if opts.observe:
            self._observe(driver)

    def _observe(self, driver: Driver) -> None:
        """Learn the ordering other code makes (its event records, waits,
        synchronises, copies and fills) from the driver's observer; where it
        cannot run, say why once (warnings) and follow Numba's own only."""
        source = driver.observe()
        if source is None:
            _say_unobserved(driver.observe_failure())
            return
        self.observed = ObservedCalls(self.marks, self._table, self.events, source,
                                      bool(source.whole_process), self._stream_ended_locked)
        self.marks.observed = self.observed
        if source.whole_process:
            # The library's own allocations and frees are its ordering, not the
            # program's (a pool's events, say): not noted.
            alloc, free = self._alloc, self._free

            def alloc_quietly(nbytes: int, stream: int) -> int:
                with quiet():
                    return alloc(nbytes, stream)  # type: ignore[no-any-return]

            def free_quietly(ptr: int, stream: int) -> None:
                with quiet():
                    free(ptr, stream)

            self._alloc, self._free = alloc_quietly, free_quietly

    def _stream_ended_locked(self, stream: int) -> None:
        """Another library destroyed ``stream`` (the driver observer noted it):
        no call may name it any more, so where the resource keeps anything on
        it the device is synchronised (not noted: the library's own), its
        kept blocks go back to the pool on the legacy stream, its queued frees
        count as done, the blocks allocated on it will be freed on the legacy
        stream, and its open mark leaves the book (``MarkBook.ended``).
        Caller holds the lock."""
        blocks = self._table.on_stream(stream)
        if not (blocks or self._kept.has_stream(stream) or stream in self._pending.slots
                or stream in self.marks.open):
            return
        with quiet():
            self.driver.synchronize()
        free = self._free
        self._kept.free_stream(stream, lambda ptr, _stream: free(ptr, 0), self._pending)
        self._pending.release_stream(stream)
        for block in blocks:
            block.stream = 0
            block.stream_owner = None
        self.marks.ended(stream)

    def catch_up(self) -> None:
        """Apply what other code did since the last decision (the driver
        observer's notes: see :attr:`observed`) and report the races that
        found (check mode), as the next launch or copy would: for a race check
        or a summary that ends now."""
        if self.observed is None:
            return
        with self._lock:
            self.marks.catch_up()
        if self.marks.races:
            self.report_races()

    def fenced(self, uses: Sequence[Use], stream: int, owner: Any, work: Callable[..., T],
               args: tuple[Any, ...]) -> T:
        self.preflight(uses, stream, owner)
        observed = self.observed
        if observed is not None and observed.whole_process:
            with quiet():  # the library's own copy: recorded by the commit, not noted
                result = work(*args)
        else:
            result = work(*args)
        self.commit(uses, stream, owner)
        return result

    @property
    def reuse_bytes(self) -> int:
        """The most bytes of freed blocks kept for reuse (see the parameter).
        Set lower, the oldest kept blocks past the new limit are freed at once."""
        return self._reaper.reuse_bytes

    @reuse_bytes.setter
    def reuse_bytes(self, nbytes: int) -> None:
        check_int("reuse_bytes", nbytes, 0)
        self._reaper.set_reuse_bytes(nbytes)

    # ------------------------------------------------------------ allocation
    def allocate(self, nbytes: int, stream: int, tag: str = "", *, stream_owner: Any = None
                 ) -> Block:
        if nbytes.__class__ is not int or nbytes <= 0:
            nbytes = positive_size(nbytes, tag)
        if stream.__class__ is not int or stream < 0:
            stream = resource_stream(stream, "AsyncResource.allocate")
        if stream > MAX_DEFAULT_STREAM:
            self.driver.check_stream(stream)
        if self._pending and not self._allocations % _REAP_EVERY:
            self._reaper.reap_completed()
        if self._deferred_queue or self._kept:
            # Queued frees and the kept block under one lock: the common
            # free-then-allocate cycle of one size makes no driver call.
            with self._lock:
                if self.observed is not None:
                    self.marks.catch_up()
                block = self._reuse_locked(nbytes, stream, tag, stream_owner)
            if self.marks.races:  # found at the queued frees just made
                self.report_races()
            if block is not None:
                return block
        block = self._allocate_new(nbytes, stream, tag, stream_owner)
        if self.marks.races:  # found in what other code did meanwhile (check mode)
            self.report_races()
        return block

    def _reuse_locked(self, nbytes: int, stream: int, tag: str, stream_owner: Any
                      ) -> Block | None:
        """Run the queued frees (the one queued free of this size on this stream
        fused with the allocation, :meth:`_recycle_locked`), then take a kept
        block of ``nbytes`` on ``stream``; None when there is none. Caller
        holds the lock."""
        queue = self._deferred_queue
        if queue:
            if (len(queue) == 1 and not self._eager and tracehook.active is None
                    and not self._deferred.held and not self.marks.checking
                    and not self.marks.reporting):  # new memory's own mark: see _ready_mark
                block = self._recycle_locked(queue, nbytes, stream, tag, stream_owner)
                if block is not None:
                    return block
            self._deferred.drain(self._deallocate_locked)
        ptr = self._kept.take(stream, nbytes)
        if ptr is None:
            return None
        idle = self._kept.taken_idle(ptr)
        block = Block(ptr, nbytes, self.device, stream, tag, next_generation_fast(),
                      self._table.epoch, _LIVE, stream_owner)
        try:
            self._register(block, stream, stream_owner, idle)
        except BaseException:
            # Only an eager fence can fail; its block went back to the pool.
            block.state = _FREED
            raise
        return block

    def _recycle_locked(self, queue: Any, nbytes: int, stream: int, tag: str,
                        stream_owner: Any) -> Block | None:
        """The free-then-allocate cycle of one size on one stream, fused: when
        the one block queued for freeing (``queue``) has ``nbytes`` on
        ``stream``, is used on no other stream and would be kept for reuse, it
        is freed and its address allocated again as a new block (a new
        generation) in one step, with no driver call and no detour through the
        kept blocks. The state afterwards is what the free, the keep and the
        take would leave. None, with the queue as it was, when the block does
        not qualify. Caller holds the lock, and checked that the queue is
        not held, that nothing traces and that fences are lazy."""
        try:
            old = queue.popleft()
        except IndexError:  # drained meanwhile by a flush on another thread
            return None
        entry = self._live.get(old.ptr)
        if queue or entry is None or not self._recyclable(old, entry, nbytes, stream):
            queue.appendleft(old)
            return None
        if entry.idle(self.marks):  # as _register takes an idle kept block
            mark = self.marks.complete_mark(stream, stream_owner)
        else:
            mark = self.marks.current(stream, stream_owner)
        old.state = _FREED
        old.stream_owner = None
        block = Block(old.ptr, nbytes, self.device, stream, tag, next_generation_fast(),
                      self._table.epoch, _LIVE, stream_owner)
        # The new block's use of the stream's open mark (its allocation point)
        # begins; the free's use of the old block's last write ends.
        self._table.replace(entry, block, mark, self.marks)
        entry.release(self.marks)
        self._frees += 1
        self._freed_bytes += nbytes
        self._allocations += 1
        self._allocated_bytes += nbytes
        return block

    def _recyclable(self, old: Block, entry: Entry, nbytes: int, stream: int) -> bool:
        """Whether the queued ``old`` may be freed and reallocated in one step
        (:meth:`_recycle_locked`): the live block of its entry, of ``nbytes`` on
        ``stream``, used on no other stream, owned, and small enough to keep."""
        return (entry.block is old and old.nbytes == nbytes and old.stream == stream
                and entry.only_on(stream)
                and not old.borrowed and nbytes <= self._reaper.reuse_bytes
                and (old.stream_owner is not None or stream <= MAX_DEFAULT_STREAM))

    def _allocate_new(self, nbytes: int, stream: int, tag: str, stream_owner: Any) -> Block:
        """A block of new memory (the device's pool, the upstream, or ``cuMemAlloc``
        in IPC mode), retried once after giving memory back when there is none."""
        try:
            ptr = self._alloc(nbytes, stream)
        except DriverError as exc:
            if exc.code != CUDA_ERROR_OUT_OF_MEMORY:
                raise
            ptr = self._retry_after_oom(nbytes, stream)
        block = Block(ptr, nbytes, self.device, stream, tag, next_generation_fast(),
                      self._table.epoch, _LIVE, stream_owner)
        with self._lock:
            if self.observed is not None:
                self.marks.catch_up()
            live = self._live
            if ptr in live:
                # The driver returned an address we hold: never overwrite state.
                raise StreamSafeError(
                    f"the driver returned {ptr:#x}, which is still live as "
                    f"{live[ptr].block.describe()}; the pool is corrupt, report this"
                )
            self._register(block, stream, stream_owner)
        return block

    def _register(self, block: Block, stream: int, stream_owner: Any, idle: bool = False
                  ) -> None:
        """Make ``block`` live, ready after its allocation; caller holds the lock.
        ``idle``: a kept block whose uses were all complete when it was freed,
        ready everywhere now (in ordering mode; check mode and a race check keep
        new memory's own mark). Where races are reported the block keeps the
        user's stack (and a checking driver is told it)."""
        if self._sites:
            block.allocated = capture_stack()
            if self.driver.traces_accesses:
                self.driver.trace_sites(block.ptr, allocated=block.allocated)
        marks = self.marks
        if idle and not (marks.checking or marks.reporting or self._eager):
            mark = marks.complete_mark(stream, stream_owner)
        else:
            mark = self._ready_mark(stream, stream_owner, self._free, block.ptr)
        table = self._table
        table.add(block, mark, self.marks)
        live = table.live_bytes
        self._allocations += 1
        self._allocated_bytes += block.nbytes
        if live > self._live_peak:
            self._live_peak = live
        total = live + self._reaper.nbytes
        if total > self._peak:
            self._peak = total
        if tracehook.active is not None:
            tracehook.active.allocated(self, block, stream)

    def _ready_mark(self, stream: int, owner: Any, undo: Any, ptr: int) -> Any:
        """The mark a new block on ``stream`` is ready after: the stream's open
        mark, which keeps ``owner``, its event recorded now with eager fences.
        If that recording fails, ``undo(ptr, stream)`` gives the memory back
        and the error is raised. In check mode, and while a race check
        watches in ordering mode, the mark is the allocation's alone, its
        event recorded at once (the stream's open mark is closed before it):
        a wait for new memory is the library's, never the program's race.
        Caller holds the lock."""
        marks = self.marks
        alone = bool(marks.checking or marks.reporting)
        mark = None
        try:
            if alone:  # a mark of its own, which no use of the program shares
                marks.retire(stream)
            mark = marks.current(stream, owner)
            if alone:
                marks.seal_event(mark)  # the ready event, in check mode too
            elif self._eager:
                marks.seal(mark)  # the ready event
        except BaseException:
            if mark is not None:
                marks.let_go(mark)  # no use refers to it: keep no stream object alive
            undo(ptr, stream)
            raise
        return mark

    # ---------------------------------------------------------------- tracking
    @property
    def tracker(self) -> AsyncResource:
        return self

    def supports_tracking(self) -> bool:
        return True

    def preflight(self, uses: Sequence[Use], stream: int, owner: Any = None) -> None:
        if self._deferred_queue:
            self._drain()
        with self._lock:
            rules.preflight_locked(self.marks, rules.resolve(self._table, uses, "preflight"),
                                   stream, owner)

    def commit(self, uses: Sequence[Use], stream: int, owner: Any = None) -> None:
        """Record ``uses`` against the stream's current mark (sealed now when eager).

        ``owner`` is kept alive with the mark (the stream object, so the stream
        outlives every use recorded on it).
        """
        with self._lock:
            entries = rules.resolve(self._table, uses, "commit")
            rules.commit_locked(self.marks, entries, stream, owner, self._eager)
        if self.marks.races:
            self.report_races()

    @property
    def checking(self) -> bool:
        """Whether the resource checks instead of ordering (check mode)."""
        return bool(self.marks.checking)

    @property
    def reporting(self) -> bool:
        """Whether uses are kept for race reports: check mode, or a race check
        watching in ordering mode (:meth:`watch_races`)."""
        return bool(self.marks.checking or self.marks.reporting)

    def watch_races(self, on: bool) -> RaceLog | None:
        """Start (``on``) or end one race check's watch in ordering mode.

        While at least one watches, the waits are queued as always, and each
        the program's own ordering did not make needed (two conflicting uses
        of the program on two streams, neither ordered after the other; or a
        free after a use on another stream) is reported to :attr:`race_log`
        as check mode reports it. Only uses made while watching are named
        (its first start closes every open mark: later uses get marks after
        that point, ``MarkBook.report_from``); its last end hands the races
        still pending (found at a free) to the log.
        Where the legacy default stream takes part a race may go unreported
        (its implicit ordering is not followed in ordering mode); a reported
        one is always a race of the program as written. A checking resource
        checks everything already: nothing changes.

        Returns
        -------
        RaceLog or None
            Where the races are reported (None for a checking resource's
            own, which it reports to anyway)."""
        with self._lock:
            marks = self.marks
            if marks.checking:
                return None
            if on:
                if self.race_log is None:
                    tracehook.name_arguments_for_good()  # the reports name the arguments
                    self.race_log = RaceLog(strict=True)
                if not marks.reporting:  # the uses from here on get marks after the point
                    marks.report_from = marks.program_point_all()
                marks.reporting += 1
                self._sites = True
            elif marks.reporting:
                marks.reporting -= 1
                self._sites = bool(marks.reporting or self.driver.traces_accesses)
            races = marks.take_races() if not marks.reporting else []
        if races and self.race_log is not None:
            self.race_log.add(races)  # found at a free after the block's last launch
        return self.race_log

    def report_races(self) -> None:
        """Check mode: report the races found since the last report
        (:attr:`race_log`); raises
        :class:`~numba_streamsafe.core.errors.RaceDetected` where a race check
        stops at the first."""
        if self.race_log is None:
            return
        with self._lock:
            races = self.marks.take_races()
        if races:
            self.race_log.report(races)

    # The engine's view (numba_streamsafe.numba.launch.launcher reads these once per
    # kernel and runtime, then takes the lock and the table itself).
    @property
    def lock(self) -> Any:
        """The lock every change of the tracking state is made under."""
        return self._lock

    @property
    def table(self) -> BlockTable:
        """The live blocks and their entries (read under :attr:`lock`)."""
        return self._table

    @property
    def deferred_queue(self) -> Any:
        """The frees queued by finalizers, run at the next allocation or launch."""
        return self._deferred_queue

    @property
    def eager(self) -> bool:
        """Whether every launch's event is recorded at once (``fences="eager"``)."""
        return self._eager

    def seal_open(self, stream: int) -> None:
        """Record the event of ``stream``'s open mark now, if a use refers to it.

        For uses recorded on a stream the library knows only by its handle (a
        consumer's stream named by DLPack or the CUDA Array Interface): its
        object may be destroyed without the library knowing, and an event
        recorded now stays valid for later waits, where a late record on a
        destroyed stream would fail (or crash the driver).
        """
        with self._lock:
            if self.observed is not None:
                self.marks.catch_up()
            mark = self.marks.open.get(stream)
            if mark is not None and self.marks.in_use(mark):
                self.marks.seal(mark)
            self.marks.unborrow_stream(stream)

    # ------------------------------------------------------------------ freeing
    def deallocate(self, block: Block) -> None:
        if block.__class__ is not Block:
            check_block(block, "deallocate")
        if self._sites and not block.freed:
            block.freed = capture_stack()  # where the free was asked for, for the reports
        with self._lock:
            self._deallocate_locked(block)
        if self.marks.races:
            self.report_races()

    def _deallocate_locked(self, block: Block) -> None:
        """:meth:`deallocate` with the lock held."""
        if self.observed is not None:
            self.marks.catch_up()
        entry = self._live.get(block.ptr)
        if entry is None or entry.block is not block:
            entry = self._table.entry(block, "deallocate")  # another handle, or an error
        if block.borrowed:
            self._release_borrowed_locked(entry, entry.block)
            return
        stream = block.stream
        self._before_free_locked(entry, block)
        nbytes = block.nbytes
        owner = block.stream_owner
        keep = self._reaper.keeps(nbytes, stream, owner)
        idle = keep and entry.idle(self.marks)  # before its marks are let go
        if not keep:
            if block.freed and self.driver.traces_accesses:
                self.driver.trace_sites(block.ptr, freed=block.freed)
            self._free(block.ptr, stream)
        # The free is queued (or the block kept): from here on nothing can fail.
        self._table.remove(entry)
        entry.release(self.marks)
        if keep:
            self._kept.put(stream, nbytes, block.ptr, owner, idle)
        else:
            self._pending.add(stream, nbytes, owner)
        self._frees += 1
        self._freed_bytes += nbytes
        block.state = _FREED
        block.stream_owner = None
        if tracehook.active is not None:
            tracehook.active.freed(self, block, stream, "kept" if keep else "queued")

    def _before_free_locked(self, entry: Entry, block: Block) -> None:
        """Order the free of ``block`` on its stream after every use of it on
        other streams: their waits queued on the stream (in check mode each
        verified instead: the free is a write of all of it). Caller holds the lock."""
        stream = block.stream
        if stream <= 1 and (self.marks.checking or self.marks.reporting):
            self.marks.legacy_use(stream)  # a free on the legacy stream is work there
        if entry.only_on(stream):
            return
        marks = entry.waits_for(stream, Access.READ_WRITE)
        if self.marks.checking or self.marks.reporting:  # each a race, or new memory's wait
            where = (block, int(Access.READ_WRITE), 0, block.nbytes, True)
            for mark in marks:
                self.marks.verify(stream, mark, block.stream_owner, where)
        if marks and not self.marks.checking:
            self.marks.wait_all(stream, marks, block.stream_owner, free=True)

    def defer_free(self, block: Block) -> None:
        if block.__class__ is not Block:
            check_block(block, "defer_free")
        if self._sites:
            block.freed = capture_stack()  # the user's line that dropped it, for the reports
        self._deferred_queue.append(block)  # DeferredFrees.push, inline
        if tracehook.active is not None:
            tracehook.active.deferred(self, block)

    def flush(self) -> None:
        self._drain()

    def hold_frees(self) -> contextlib.AbstractContextManager[None]:
        return self._deferred.hold()

    def _drain(self) -> None:
        self._deferred.drain(self.deallocate)

    # ---------------------------------------------------------------- borrowing
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
        stream = resource_stream(stream, "AsyncResource.borrow", "borrow(ptr, nbytes, stream)")
        if stream > MAX_DEFAULT_STREAM:
            self.driver.check_stream(stream)
        if self._pending:
            self._reaper.reap_completed()  # drop what released borrowed blocks kept, once done
        with self._lock:
            if self.observed is not None:
                self.marks.catch_up()
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
            if self._sites:  # where it was handed over: the reports' allocation site
                block.allocated = capture_stack()
                self.driver.trace_sites(ptr, allocated=block.allocated)
            mark = self._ready_mark(stream, stream_owner, self.driver.release_foreign, ptr)
            self._table.add(block, mark, self.marks)
            if tracehook.active is not None:
                tracehook.active.allocated(self, block, stream)
        if self.marks.races:  # found at the queued frees just made
            self.report_races()
        return block

    def _release_borrowed_locked(self, entry: Entry, block: Block) -> None:
        """The release of a borrowed block (:meth:`borrow`); caller holds the lock."""
        stream = block.stream
        self._before_free_locked(entry, block)
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

    # ------------------------------------------------- uses by other devices
    def preflight_foreign(self, uses: Sequence[Use], key: int) -> list[Mark]:
        """The marks a stream of another device must wait for before ``uses``
        (blocks of this device), sealed, each held (one more use) until
        :meth:`release_foreign`: their events stay recorded while the caller
        queues the waits on its stream (``cuStreamWaitEvent`` takes an event of
        another device). ``key`` is the stream's key in this device's state
        (``DeviceRuntime.stream_key``): uses recorded under it need no wait.

        Nothing is held when this raises (a block freed or stale).
        """
        if self._deferred:
            self._drain()
        with self._lock:
            held: list[Mark] = []
            try:
                entries = rules.resolve(self._table, uses, "preflight")
                for mark in rules.needed_locked(entries, key):
                    if isinstance(mark, ForeignMark) and mark.stale:
                        continue
                    if self.marks.complete(mark):  # the host saw it complete
                        continue
                    if not any(m is mark for m in held) and self.marks.hold_sealed(mark):
                        held.append(mark)
            except BaseException:
                for mark in held:
                    self.marks.release(mark)
                raise
            return held

    def release_foreign(self, held: Sequence[Mark]) -> None:
        """Drop the holds of :meth:`preflight_foreign` (the waits are queued)."""
        with self._lock:
            for mark in held:
                self.marks.release(mark)

    def commit_foreign(self, uses: Sequence[Use], key: int, event: Any, pool: EventPool,
                       owner: Any = None) -> None:
        """Record ``uses`` of this device's blocks by a stream of another device,
        known here as ``key``, whose launch ``event`` (of ``pool``, that device's
        event pool) was recorded after the work: later uses and the blocks'
        frees on this device wait for it. ``owner`` (the stream's object) is kept
        alive while a use refers to it. On an error the event goes back to ``pool``.
        """
        try:
            with self._lock:
                entries = rules.resolve(self._table, uses, "commit")
                mark = ForeignMark(key, owner, event, pool)
                rules.commit_locked(self.marks, entries, key, None, False, False, mark)
        except BaseException:
            pool.release(event)
            raise
        if not self.marks.in_use(mark):
            mark.give_back()

    # ------------------------------------------------------------- diagnostics
    def block_events(self, block: Block) -> tuple[Mark, dict[int, Mark]]:
        """Diagnostics: ``(last_write_mark, {read_stream: read_mark})`` of a live
        block; of a block whose ranges were used apart (:meth:`block_ranges`),
        its newest write mark and the newest read mark of each stream."""
        with self._lock:
            return self._table.entry(block, "block_events").newest()  # type: ignore[no-any-return]

    def block_ranges(self, block: Block) -> tuple[tuple[int, int, dict[int, Mark],
                                                        dict[int, Mark]], ...]:
        """Diagnostics: the dependency state of a live block by byte range:
        ``(lo, hi, {stream: write mark}, {stream: read mark})`` per range, in
        order (one range while every use covered the whole block)."""
        with self._lock:
            return self._table.entry(block, "block_ranges").uses()  # type: ignore[no-any-return]

    def find(self, address: int) -> Block | None:
        with self._lock:
            return self._table.find(address)

    def blocks_on_stream(self, stream: int) -> list[Block]:
        """Live blocks allocated on ``stream``."""
        with self._lock:
            return self._table.on_stream(stream)

    # ------------------------------------------------- the program's own order
    def program_clock(self, stream: int) -> dict[Any, int]:
        """A point of the program on ``stream`` (an event recorded there, or a
        synchronise of it), with what the stream is ordered after: the uses
        queued there so far are before it, later ones after
        (``MarkBook.program_clock``)."""
        with self._lock:
            if self.observed is not None:
                self.marks.catch_up()
            return self.marks.program_clock(stream)  # type: ignore[no-any-return]

    def program_record(self, stream: int, event: Any, handle: Any) -> tuple[dict[Any, int], Any]:
        """The program records its event ``event`` (of driver handle
        ``handle``) on ``stream`` now: returns the point's clock, as
        :meth:`program_clock`, and the mark the point closed, which borrows
        the program's event in place of one of the library's
        (``MarkBook.program_record``), or None. Before the program records
        ``event`` again, or if this record fails, pass that mark to
        :meth:`program_unborrow`."""
        with self._lock:
            if self.observed is not None:
                self.marks.catch_up()
            return self.marks.program_record(stream, (event, handle))  # type: ignore[no-any-return]

    def program_sync_clock(self, stream: int) -> tuple[dict[Any, int], Any]:
        """The point of a synchronise of ``stream`` that the host is about to
        make: its clock, as :meth:`program_clock`, and the mark it closed, with
        no event of the library's since the host is about to see its work
        complete (``MarkBook.program_record`` with ``AT_SYNC``), or None. Tell
        the completion with :meth:`program_completed`; if the synchronise
        fails, pass the mark to :meth:`program_unborrow`."""
        with self._lock:
            if self.observed is not None:
                self.marks.catch_up()
            return self.marks.program_record(stream, AT_SYNC)  # type: ignore[no-any-return]

    def program_unborrow(self, mark: Any) -> None:
        """The program is about to record again the event a mark of
        :meth:`program_record` borrows: the mark gets an event of its own if a
        use still refers to it (``MarkBook.unborrow``)."""
        with self._lock:
            self.marks.unborrow(mark)

    def program_point_all(self) -> int:
        """A point of the program on every stream (a device synchronise)."""
        with self._lock:
            if self.observed is not None:
                self.marks.catch_up()
            return self.marks.program_point_all()  # type: ignore[no-any-return]

    def program_waited(self, stream: int, clock: dict[Any, int], owner: Any = None) -> None:
        """The program made ``stream`` (of object ``owner``, None for a raw
        handle) wait for an event whose :meth:`program_clock` is ``clock``:
        later uses on it skip the waits the clock covers (in check mode they
        are not races)."""
        with self._lock:
            if self.observed is not None:
                self.marks.catch_up()
            self.marks.program_waited(stream, clock, owner)

    def program_completed(self, clock: dict[Any, int], stream: int | None = None) -> None:
        """The host saw a point of the program complete (its :meth:`program_clock`;
        ``stream``: the point was a synchronise of that stream,
        ``MarkBook.program_completed``)."""
        with self._lock:
            if self.observed is not None:
                self.marks.catch_up()
            self.marks.program_completed(clock, stream)

    def program_completed_all(self, point: int) -> None:
        """The host saw the device complete up to ``point`` (``program_point_all``)."""
        with self._lock:
            if self.observed is not None:
                self.marks.catch_up()
            self.marks.program_completed_all(point)

    # ----------------------------------------------------------------- reaping
    def reap_pending(self) -> None:
        self._drain()
        self._reaper.reap_all(self.marks.forget_unused)

    def reap_completed(self) -> None:
        """Release the pending bytes of streams that have gone idle, without
        waiting (:meth:`Reaper.reap_completed`); called every few allocations,
        so that pending bytes stay bounded in a program that never reaps."""
        self._reaper.reap_completed()

    def retire_stream(self, stream: int, destroy: Callable[[int], None] | None = None) -> None:
        """End ``stream``'s history, then call ``destroy(stream)`` if given
        (``DeviceRuntime.destroy_stream`` passes the driver's destroy).

        Runs queued frees, records the event of the stream's open mark, and
        of its marks that borrow the program's events (so uses recorded on
        the stream can still be waited for once it is gone),
        synchronises the stream's pending frees (a destroyed stream can no
        longer be synchronised), and renames the stream in every mark and read
        that refers to it and forgets which marks it waited for: a new stream
        that gets the same handle inherits nothing. No other thread reaps
        meanwhile, ``destroy`` included, so no concurrent reap synchronises the
        stream after it is gone. If ``destroy`` raises, the history is kept.
        """
        self._drain()
        with self._reaper.exclusive():
            with self._lock:
                if self.observed is not None:  # what other code did on it first
                    self.marks.catch_up()
                self.marks.retire(stream)
                self.marks.unborrow_stream(stream)
                pending = self._reaper.take_stream(stream)
            self._reaper.sync(pending)
            with self._lock:
                # Under the lock: no launch sees the handle between the destroy
                # and the forgetting. A failed destroy leaves the history as it was.
                self.marks.ending(stream)
                if destroy is not None:
                    destroy(stream)
                held = self._table.forget_stream(stream)
                self.marks.forget_order(stream, held != 0)

    def _retry_after_oom(self, nbytes: int, stream: int) -> int:
        """Out of memory: give back everything we can, then try once more."""
        self.flush()
        try:
            self.reap_pending()
        except DriverError:
            pass
        self._trim_quietly()
        try:
            return self._alloc(nbytes, stream)
        except DriverError as exc:
            if exc.code != CUDA_ERROR_OUT_OF_MEMORY:
                raise
            # The failed attempt can leave the pool holding what it reserved:
            # hand it back, so the caller's next (smaller) allocation can work.
            self._trim_quietly()
            with self._lock:
                live = self._table.live_bytes
                pending = self._reaper.nbytes
            raise OutOfMemory(nbytes, live, pending, str(exc)) from None

    def _trim_quietly(self) -> None:
        try:
            self.driver.pool_trim(0)
        except DriverError as exc:
            _log.warning("pool trim after out-of-memory failed: %s", exc)

    # ----------------------------------------------------------------- figures
    def bytes_outstanding(self) -> int:
        with self._lock:
            return self._table.live_bytes + self._reaper.nbytes

    @property
    def live_bytes(self) -> int:
        return self._table.live_bytes

    @property
    def pending_bytes(self) -> int:
        """Bytes freed by their owner and not yet back in the pool (queued
        frees and blocks kept for reuse)."""
        return self._reaper.nbytes

    def pending_per_stream(self) -> dict[int, int]:
        """Bytes freed and not yet back in the pool (queued frees and kept
        blocks), per stream."""
        with self._lock:
            return self._reaper.per_stream()

    def stats(self) -> ResourceStats:
        with self._lock:
            return ResourceStats(
                live_bytes=self._table.live_bytes,
                pending_bytes=self._reaper.nbytes,
                peak_bytes=self._peak,
                live_blocks=self._table.blocks,
                allocations=self._allocations,
                frees=self._frees,
                deferred=len(self._deferred),
                events_in_use=self.events.in_use,
                events_idle=self.events.idle,
            )

    def counters(self) -> dict[str, int]:
        """The figures behind :func:`numba_streamsafe.memory_stats` (see there)."""
        with self._lock:
            return {
                "live_bytes": self._table.live_bytes,
                "live_peak": self._live_peak,
                "live_blocks": self._table.blocks,
                "allocated_bytes": self._allocated_bytes,
                "freed_bytes": self._freed_bytes,
                "allocations": self._allocations,
                "frees": self._frees,
                "pending_bytes": self._pending.nbytes,
                "kept_bytes": self._kept.nbytes,
                "outstanding_peak": self._peak,
                "deferred_frees": len(self._deferred),
                "waits": self.marks.waits,
                "waits_skipped": self.marks.skipped,
                "events_recorded": self.events.recorded,
                "events_in_use": self.events.in_use,
                "same_stream_uses": self.marks.same_stream,
            }

    def reset_peaks(self) -> None:
        """Start the peak figures again from the current ones."""
        with self._lock:
            self._live_peak = self._table.live_bytes
            self._peak = self._table.live_bytes + self._reaper.nbytes

    # ---------------------------------------------------------------- lifecycle
    @property
    def epoch(self) -> int:
        return self._table.epoch

    def reset_context(self) -> None:
        """Free every live block synchronously, forget all state and advance the epoch.

        Borrowed blocks are forgotten, not freed (their memory is their
        producer's); the others, and the kept ones, go back to their memory
        source (:meth:`MemorySource.give_back_now`): when the context is
        already gone, so is its memory, and errors are dropped. Handles from
        before are refused with :class:`~numba_streamsafe.core.errors.StaleContext`.
        """
        with self._lock:
            entries = self._table.clear()
            for entry in entries:
                entry.release(self.marks)
            self.marks.clear()
            kept = self._reaper.clear()
            self._deferred.clear()
        for entry in entries:
            entry.block.state = BlockState.FREED
            entry.block.stream_owner = None
            entry.block.keep = None
        for ptr in [e.block.ptr for e in entries if not e.block.borrowed] + kept:
            self.source.give_back_now(ptr)
        self.events.forget()
