"""The memory-resource contract and the base of resource decorators."""

from __future__ import annotations

import abc
import contextlib
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from numba_streamsafe.core.access import Access
from numba_streamsafe.core.blocks import Block, check_block
from numba_streamsafe.core.errors import InvalidSetting, StreamMisuse
from numba_streamsafe.core.settings import settings
from numba_streamsafe.resources.deferred import DeferredFrees
from numba_streamsafe.resources.tracking.marks import EventPool

T = TypeVar("T")

__all__ = ["DeferringAdaptor", "MemoryResource", "ResourceAdaptor", "ResourceStats", "Use"]

#: One declared use in a launch: the block and how it is accessed, all of it
#: (``(block, access)``) or its bytes ``lo .. hi - 1`` (``(block, access, lo,
#: hi)``, offsets into the block): uses conflict only where their bytes meet.
Use = tuple[Block, Access] | tuple[Block, Access, int, int]


@dataclass(frozen=True)
class ResourceStats:
    """A snapshot of a resource's accounting."""

    live_bytes: int
    pending_bytes: int
    peak_bytes: int
    live_blocks: int
    allocations: int
    frees: int
    deferred: int
    events_in_use: int
    events_idle: int

    @property
    def outstanding_bytes(self) -> int:
        return self.live_bytes + self.pending_bytes


class MemoryResource(abc.ABC):
    """A source of device blocks, ordered on streams.

    The contract every implementation keeps:

    * :meth:`allocate` orders the allocation on ``stream`` and returns a live
      block with a fresh generation, or raises with nothing allocated.
    * :meth:`deallocate` of a stale or unknown block raises
      :class:`~numba_streamsafe.core.errors.UseAfterFree` and changes nothing; a
      failure part-way leaves the block live so the call can be retried.
    * ``bytes_outstanding() == live + pending_free`` at every quiescent point.
    * A resource that does not track uses says so in :meth:`supports_tracking`
      and refuses :meth:`preflight` / :meth:`commit` with
      :class:`~numba_streamsafe.core.errors.StreamMisuse`.
    """

    device: int
    #: The event pool a tracking resource records its marks with (None: none).
    events: EventPool | None = None

    @abc.abstractmethod
    def allocate(self, nbytes: int, stream: int, tag: str = "", *, stream_owner: Any = None
                 ) -> Block:
        """Allocate ``nbytes`` ordered on ``stream``.

        ``stream_owner`` is kept alive until the block's free is complete, so
        the stream it owns cannot be destroyed under the block.
        """

    @abc.abstractmethod
    def deallocate(self, block: Block) -> None:
        """Free ``block`` ordered after every recorded use of it."""

    @abc.abstractmethod
    def bytes_outstanding(self) -> int:
        """Live bytes plus bytes whose free is queued but not yet known complete."""

    @abc.abstractmethod
    def reap_pending(self) -> None:
        """Synchronise streams with queued frees and release their bytes."""

    @abc.abstractmethod
    def find(self, address: int) -> Block | None:
        """The live block containing ``address``, or None."""

    @abc.abstractmethod
    def stats(self) -> ResourceStats:
        """A snapshot of the accounting."""

    def defer_free(self, block: Block) -> None:
        """Queue ``block`` for freeing at the next safe point.

        Safe to call from a garbage-collector finalizer on any thread, while
        any lock is held, and at interpreter shutdown: it takes no lock and
        makes no driver call.
        """
        raise NotImplementedError(f"{type(self).__name__} has no deferred frees")

    def flush(self) -> None:  # noqa: B027 - optional hook: nothing is queued by default
        """Free every block queued by :meth:`defer_free`."""

    def reset_context(self) -> None:  # noqa: B027 - optional hook
        """Release every block: their context is being reset. Old handles become stale."""

    def blocks_on_stream(self, stream: int) -> list[Block]:
        """Live blocks allocated on ``stream`` (none, for a resource that does not
        know streams)."""
        return []

    @property
    def tracker(self) -> MemoryResource:
        """The resource at the bottom of the stack (itself, unless an adaptor):
        the one whose diagnostics (``block_events``, ``pending_per_stream``...)
        describe the stack's state."""
        return self

    def retire_stream(self, stream: int, destroy: Callable[[int], None] | None = None) -> None:
        """End ``stream``'s history (its handle may pass to a new stream), then call
        ``destroy(stream)`` if given. A resource that keeps no per-stream state
        only calls ``destroy``."""
        if destroy is not None:
            destroy(stream)

    def hold_frees(self) -> contextlib.AbstractContextManager[None]:
        """Keep queued frees queued until the block exits (they still count as live)."""
        return contextlib.nullcontext()

    # The program's own ordering (events it records and waits for, the streams
    # and devices it synchronises), which a tracking resource uses to skip
    # waits already satisfied. A resource that tracks nothing ignores it.
    def program_clock(self, stream: int) -> dict[Any, int]:
        """A point of the program on ``stream`` with what it is ordered after
        (see :meth:`AsyncResource.program_clock`); empty here."""
        return {}

    def program_sync_clock(self, stream: int) -> tuple[dict[Any, int], Any]:
        """The point of a synchronise of ``stream`` that the host is about to
        make, and the mark it closed (see :meth:`AsyncResource.program_sync_clock`):
        :meth:`program_clock` and None here."""
        return self.program_clock(stream), None

    def program_point_all(self) -> int:
        """A point of the program on every stream of the device; 0 here."""
        return 0

    def program_waited(self, stream: int, clock: dict[Any, int],  # noqa: B027
                       owner: Any = None) -> None:
        """The program made ``stream`` (of object ``owner``) wait for an event
        whose :meth:`program_clock` is ``clock``."""

    def program_completed(self, clock: dict[Any, int],  # noqa: B027
                          stream: int | None = None) -> None:
        """The host saw a point of the program complete (its ``clock``; with
        ``stream``, a synchronise of that stream)."""

    def program_completed_all(self, point: int) -> None:  # noqa: B027
        """The host saw the whole device complete up to ``point``."""

    @property
    def epoch(self) -> int:
        """Context epoch; advanced by :meth:`reset_context`."""
        return 0

    def supports_tracking(self) -> bool:
        """Whether :meth:`preflight` and :meth:`commit` are available."""
        return False

    @property
    def checking(self) -> bool:
        """Whether the resource checks the uses instead of ordering them (check
        mode, :class:`~numba_streamsafe.resources.AsyncResource`'s ``check``)."""
        return False

    def _refuse(self, what: str) -> StreamMisuse:
        try:
            chosen = settings().resource == "direct"
        except InvalidSetting:  # a bad setting is refused where it is read
            chosen = False
        way_out = ("NUMBA_STREAMSAFE_RESOURCE=direct chose it for this process: unset it to have "
                   "the streams ordered, or turn tracking off (numba_streamsafe.tracking(False)) "
                   "and" if chosen else "build the runtime on AsyncResource, or")
        return StreamMisuse(
            f"{type(self).__name__} does not track block uses, so {what} cannot order "
            f"streams; {way_out} synchronise the streams yourself"
        )

    def borrow(self, ptr: int, nbytes: int, stream: int, tag: str = "", *,
               stream_owner: Any = None, keep: Any = None) -> Block:
        """Track memory another library allocated as a borrowed block (see
        ``AsyncResource.borrow``); a resource that does not track refuses."""
        raise self._refuse("borrowing another library's memory")

    def preflight(self, uses: Sequence[Use], stream: int, owner: Any = None) -> None:
        """Queue on ``stream`` the waits that the uses (:data:`Use`) of one
        launch need, before the launch is queued; each event is waited for once.

        ``owner`` is the launch stream's owning object (None for a raw handle),
        kept alive while the marks it waited for are in use. Nothing is queued
        when this raises.
        """
        raise self._refuse("preflight")

    def commit(self, uses: Sequence[Use], stream: int, owner: Any = None) -> None:
        """Record the uses of one launch on ``stream`` after it is queued, all
        against one mark of the stream (one event at most)."""
        raise self._refuse("commit")

    def fenced(self, uses: Sequence[Use], stream: int, owner: Any, work: Callable[..., T],
               args: tuple[Any, ...]) -> T:
        """``work(*args)``, which queues one launch or copy on ``stream``, between
        :meth:`preflight` and :meth:`commit` of ``uses``: nothing is queued
        when the preflight raises, nothing committed when the work raises."""
        self.preflight(uses, stream, owner)
        result = work(*args)
        self.commit(uses, stream, owner)
        return result

    # A launch on another device that uses this resource's blocks (peer access,
    # copies between devices). ``key`` names the launch stream in this
    # resource's state: ``DeviceRuntime.stream_key``, never one of its handles.
    def preflight_foreign(self, uses: Sequence[Use], key: int) -> list[Any]:
        """Seal and hold the marks a stream of another device (``key``) must wait
        for before ``uses``; the caller queues waits on their events
        (``mark.handle``), then calls :meth:`release_foreign`. Nothing is held
        when this raises."""
        raise self._refuse("a launch on another device")

    def release_foreign(self, held: Sequence[Any]) -> None:
        """Drop the holds :meth:`preflight_foreign` returned."""
        raise self._refuse("a launch on another device")

    def commit_foreign(self, uses: Sequence[Use], key: int, event: Any, pool: EventPool,
                       owner: Any = None) -> None:
        """Record ``uses`` by a stream of another device (``key``) whose ``event``
        (of that device's ``pool``) follows the work; the event goes back to
        ``pool`` when no block refers to it (or at once, on an error)."""
        raise self._refuse("a launch on another device")


class ResourceAdaptor(MemoryResource):
    """A resource that wraps another and forwards what it does not change."""

    def __init__(self, upstream: MemoryResource) -> None:
        self.upstream = upstream
        self.device = upstream.device

    def allocate(self, nbytes: int, stream: int, tag: str = "", *, stream_owner: Any = None
                 ) -> Block:
        return self.upstream.allocate(nbytes, stream, tag, stream_owner=stream_owner)

    def deallocate(self, block: Block) -> None:
        self.upstream.deallocate(block)

    def bytes_outstanding(self) -> int:
        return self.upstream.bytes_outstanding()

    def reap_pending(self) -> None:
        self.upstream.reap_pending()

    def find(self, address: int) -> Block | None:
        return self.upstream.find(address)

    def stats(self) -> ResourceStats:
        return self.upstream.stats()

    def defer_free(self, block: Block) -> None:
        self.upstream.defer_free(block)

    def flush(self) -> None:
        self.upstream.flush()

    def reset_context(self) -> None:
        self.upstream.reset_context()

    def hold_frees(self) -> contextlib.AbstractContextManager[None]:
        return self.upstream.hold_frees()

    @property
    def epoch(self) -> int:
        return self.upstream.epoch

    def supports_tracking(self) -> bool:
        return self.upstream.supports_tracking()

    def preflight(self, uses: Sequence[Use], stream: int, owner: Any = None) -> None:
        self.upstream.preflight(uses, stream, owner)

    def commit(self, uses: Sequence[Use], stream: int, owner: Any = None) -> None:
        self.upstream.commit(uses, stream, owner)

    def preflight_foreign(self, uses: Sequence[Use], key: int) -> list[Any]:
        return self.upstream.preflight_foreign(uses, key)

    def release_foreign(self, held: Sequence[Any]) -> None:
        self.upstream.release_foreign(held)

    def commit_foreign(self, uses: Sequence[Use], key: int, event: Any, pool: EventPool,
                       owner: Any = None) -> None:
        self.upstream.commit_foreign(uses, key, event, pool, owner)

    def retire_stream(self, stream: int, destroy: Callable[[int], None] | None = None) -> None:
        self.upstream.retire_stream(stream, destroy)

    def blocks_on_stream(self, stream: int) -> list[Block]:
        return self.upstream.blocks_on_stream(stream)

    @property
    def events(self) -> EventPool | None:  # type: ignore[override]
        return self.upstream.events

    @property
    def tracker(self) -> MemoryResource:
        return self.upstream.tracker

    @property
    def checking(self) -> bool:
        return self.upstream.checking


class DeferringAdaptor(ResourceAdaptor):
    """An adaptor whose own free path must see the blocks that finalizers free.

    :meth:`defer_free` queues the block here (no lock, no driver call:
    finalizer-safe) instead of in the upstream, and the queue drains through
    :meth:`_free_queued` at the next safe point: :meth:`flush`,
    :meth:`reap_pending`, :meth:`preflight`, and the subclass's
    ``allocate`` (which calls :meth:`_drain` when :attr:`_deferred` is not
    empty). :meth:`hold_frees` holds this queue and the upstream's;
    :meth:`reset_context` forgets the queued blocks (they are stale).
    """

    def __init__(self, upstream: MemoryResource) -> None:
        super().__init__(upstream)
        self._deferred = DeferredFrees()

    @abc.abstractmethod
    def _free_queued(self, block: Block) -> None:
        """Free ``block``, queued by a finalizer, through this adaptor's own path."""

    def _queued_error(self, block: Block, exc: Exception) -> bool:
        """An error of :meth:`_free_queued` other than a dead block or a driver
        error (see :meth:`DeferredFrees.drain`): True if dealt with, else it propagates."""
        return False

    def _drain(self) -> None:
        self._deferred.drain(self._free_queued, on_error=self._queued_error)

    def defer_free(self, block: Block) -> None:
        if block.__class__ is not Block:
            check_block(block, "defer_free")
        self._deferred.push(block)

    def flush(self) -> None:
        """Free every queued block here, then flush the upstream."""
        self._drain()
        self.upstream.flush()

    def reap_pending(self) -> None:
        """Free every queued block here, then reap the upstream's pending frees."""
        self._drain()
        self.upstream.reap_pending()

    def preflight(self, uses: Sequence[Use], stream: int, owner: Any = None) -> None:
        if self._deferred:
            self._drain()
        self.upstream.preflight(uses, stream, owner)

    def preflight_foreign(self, uses: Sequence[Use], key: int) -> list[Any]:
        if self._deferred:
            self._drain()
        return self.upstream.preflight_foreign(uses, key)

    @contextlib.contextmanager
    def hold_frees(self) -> Iterator[None]:
        with self._deferred.hold(), self.upstream.hold_frees():
            yield

    def reset_context(self) -> None:
        """Reset the upstream and forget the queued blocks (they are stale)."""
        self.upstream.reset_context()
        self._deferred.clear()
