"""Marks: the points on a stream that block uses are recorded against, and the
waits on them.

A :class:`Mark` stands for "everything queued on its stream so far"; a
:class:`MarkBook` keeps the open mark of each stream, records a mark's event
when another stream first has to wait for it (*sealing* it), queues those
waits once per waiting stream, and gives a mark's event back to the pool when
no use refers to it any more.
"""

from __future__ import annotations

import itertools
from typing import Any

from numba_streamsafe import tracehook
from numba_streamsafe._driver.base import Driver
from numba_streamsafe.hot import hot as _hot
from numba_streamsafe.resources.events import EventPool

__all__ = ["Mark", "ForeignMark", "MarkBook", "retired_stream_id"]

#: Identities given to the marks and reads of retired streams: negative, so
#: never the handle of a stream that exists (handles are >= 0).
_retired_streams = itertools.count(-2, -1)


def retired_stream_id() -> int:
    """A fresh identity for the history of a retired stream (never a live handle)."""
    return next(_retired_streams)


class Mark:
    """A point on a stream that uses of blocks are recorded against.

    Every block used by a launch on ``stream`` refers to the stream's current
    mark. The mark stands for "all work queued on ``stream`` so far": once an
    event is recorded for it (the mark is *sealed*), waiting on that event
    orders a consumer after every use that refers to the mark. A sealed mark
    accepts no more uses; the stream gets a fresh mark.

    ``refs`` counts the block states holding the mark; at zero a sealed mark's
    event goes back to the pool. ``owner`` keeps the stream's owning object
    alive while a use refers to the mark, so the stream cannot be destroyed
    before the event is recorded. Callers change a mark only under their
    resource's lock.
    """

    __slots__ = ("stream", "handle", "refs", "owner", "waiters")

    def __init__(self, stream: int, owner: Any = None) -> None:
        self.stream = stream
        self.handle: Any = None
        self.refs = 0
        self.owner = owner
        #: Streams that already wait for this mark's event, each with its owning
        #: object (None for a raw handle), kept alive while the mark is in use.
        self.waiters: dict[int, Any] | None = None

    def __repr__(self) -> str:
        state = "sealed" if self.handle is not None else "open"
        return f"<Mark stream={self.stream:#x} {state} refs={self.refs}>"


class ForeignMark(Mark):
    """A use by a stream of another device, recorded in this device's blocks.

    ``stream`` is the key this device knows the foreign stream by (negative,
    so never one of its own handles); the event was recorded on the foreign
    stream, after the launch, from the foreign device's pool, and goes back to
    that pool (``pool``) when no block refers to the mark. The mark is sealed
    from the start: this device never records it, it only waits for it, which
    CUDA allows across devices. After a context reset of the foreign device
    (``pool.generation`` moved on) its work is complete and its event gone:
    the mark is *stale*, waits skip it and its event is not given back.
    """

    __slots__ = ("pool", "generation")

    def __init__(self, key: int, owner: Any, event: Any, pool: EventPool) -> None:
        super().__init__(key, owner)
        self.handle = event
        self.pool = pool
        self.generation = pool.generation

    @property
    def stale(self) -> bool:
        return self.pool.generation != self.generation

    def give_back(self) -> None:
        """Return the event to its device's pool (unless stale)."""
        handle, self.handle = self.handle, None
        if handle is not None and not self.stale:
            self.pool.release(handle)

    def __repr__(self) -> str:
        return f"<ForeignMark key={self.stream} refs={self.refs}{' stale' if self.stale else ''}>"


class MarkBook:
    """The open mark of each stream, sealing, waits, and releasing marks.

    Callers hold their resource's lock around every method.

    Parameters
    ----------
    driver : Driver
        Queues the waits.
    events : EventPool
        Records the marks' events.
    """

    __slots__ = ("driver", "events", "open", "waits")

    def __init__(self, driver: Driver, events: EventPool) -> None:
        self.driver = driver
        self.events = events
        #: The open (not yet sealed) mark of each stream.
        self.open: dict[int, Mark] = {}
        #: Waits queued over the book's life (``cuStreamWaitEvent`` calls).
        self.waits = 0

    def current(self, stream: int, owner: Any = None) -> Mark:
        """The open mark of ``stream`` (made now if it has none); ``owner`` is
        kept with it when it has none yet."""
        mark = self.open.get(stream)
        if mark is None:
            mark = self.open[stream] = Mark(stream, owner)
        elif owner is not None and mark.owner is None:
            mark.owner = owner
        return mark

    def seal(self, mark: Mark) -> Any:
        """The event of ``mark``, recorded now if it has none. A sealed mark is
        no longer its stream's open mark: later work gets a new one."""
        handle = mark.handle
        if handle is None:
            handle = mark.handle = self.events.record(mark.stream)
            if self.open.get(mark.stream) is mark:
                del self.open[mark.stream]
            if tracehook.active is not None:
                tracehook.active.sealed(self.driver.device, mark.stream)
        return handle

    def wait_all(self, stream: int, marks: list[Mark], owner: Any = None,
                 free: bool = False) -> None:
        """Queue waits of ``stream`` on ``marks``, each once.

        A stream that already waited for a mark is ordered after it for good
        (stream order), so it never waits for the same mark twice. The mark
        keeps ``owner`` (the waiting stream's object) alive while it is in use,
        so the waiter's handle cannot pass to a new stream that would then skip
        the wait; :meth:`forget_waits` drops a retired handle's waits.
        """
        wait = self.driver.stream_wait_event
        for mark in marks:
            if mark.__class__ is not Mark and isinstance(mark, ForeignMark) and mark.stale:
                continue  # its device was reset: its work is complete
            waiters = mark.waiters
            if waiters is None:
                mark.waiters = waiters = {}
            elif stream in waiters:
                if owner is not None and waiters[stream] is None:
                    waiters[stream] = owner
                continue
            wait(stream, self.seal(mark))
            waiters[stream] = owner
            self.waits += 1
            if tracehook.active is not None:
                tracehook.active.waited(stream, mark.stream, free)

    def release(self, mark: Mark) -> None:
        """Drop one use of ``mark``; at none, its event goes back to the pool and
        it keeps no stream object alive (an open mark stays open until its
        stream's next use)."""
        mark.refs -= 1
        if mark.refs == 0:
            if mark.handle is not None:
                if mark.__class__ is Mark:
                    self.events.release(mark.handle)
                    mark.handle = None
                elif isinstance(mark, ForeignMark):
                    mark.give_back()
            mark.owner = None
            mark.waiters = None

    def retire(self, stream: int) -> None:
        """Seal the open mark of ``stream`` if a use refers to it (its uses can
        then still be waited for once the stream is gone); forget it otherwise."""
        mark = self.open.get(stream)
        if mark is not None:
            if mark.refs:
                self.seal(mark)
            else:
                del self.open[stream]

    def forget_unused(self) -> None:
        """Forget the open marks no use refers to (streams come and go)."""
        for stream in [s for s, m in self.open.items() if not m.refs]:
            del self.open[stream]

    def clear(self) -> None:
        self.open.clear()


if _hot is not None:  # the compiled hot path handles marks of exactly this class
    _hot.set_mark_type(Mark)
