"""Marks, their events and the book that keeps them: the tracking engine's state.

Part of the engine (:mod:`numba_streamsafe.compiled`), written in Cython's
pure-Python mode: the package build compiles this file where a compiler is
present (its C declarations are in ``marks.pxd``), and it runs as it is where
none is.

A :class:`Mark` stands for "everything queued on its stream so far"; a
:class:`MarkBook` keeps the open mark of each stream, records a mark's event
when another stream first has to wait for it (*sealing* it), queues those
waits once per waiting stream, and gives a mark's event back to the
:class:`EventPool` when no use refers to it any more. The rules that decide
which marks a use waits for and records are :mod:`.rules`.
"""

from __future__ import annotations

import collections
import itertools
import logging
import weakref
from typing import Any

import cython

from numba_streamsafe._driver.libcuda import record_event, wait_event
from numba_streamsafe.core.errors import DriverError
from numba_streamsafe.core.tracehook import current_log
from numba_streamsafe.resources.tracking.lock import Lock

__all__ = ["Mark", "ForeignMark", "MarkBook", "EventPool", "retired_stream_id",
           "COMPILED"]

#: Whether this module runs compiled (else it runs as Python source).
COMPILED: bool = cython.compiled

_log = logging.getLogger("numba_streamsafe")

#: Identities given to the marks and reads of retired streams: negative, so
#: never the handle of a stream that exists (handles are >= 0).
_retired_streams = itertools.count(-2, -1)

#: The sequence number of the newest mark: marks of one stream are made in
#: stream order, so of two marks of a stream the one with the higher number
#: covers the other.
_mark_seq = cython.declare(cython.ulonglong, 0)


def retired_stream_id() -> int:
    """A fresh identity for the history of a retired stream (never a live handle)."""
    return next(_retired_streams)


# ----------------------------------------------------------------------- marks
@cython.cclass
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
    before the event is recorded. ``waiters`` maps the streams that already
    wait for the mark's event to their owning objects (None for a raw
    handle), kept alive while the mark is in use. ``seq`` numbers marks in
    the order they are made: of two marks of one stream, the one with the
    higher ``seq`` stands for all the other does. Callers change a mark only
    under their resource's lock.
    """

    def __init__(self, stream: int, owner: Any = None) -> None:
        global _mark_seq
        _mark_seq += 1
        self.seq = _mark_seq
        self.stream = stream
        self.handle = None
        self.refs = 0
        self.owner = owner
        self.waiters = None

    def __repr__(self) -> str:
        state = "sealed" if self.handle is not None else "open"
        return f"<Mark stream={self.stream:#x} {state} refs={self.refs}>"


@cython.cclass
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

    def __init__(self, key: int, owner: Any, event: Any, pool: Any) -> None:
        Mark.__init__(self, key, owner)
        self.handle = event
        self.pool = pool
        self.generation = pool.generation

    @property
    def stale(self) -> bool:
        return bool(self.pool.generation != self.generation)

    def give_back(self) -> None:
        """Return the event to its device's pool (unless stale)."""
        handle, self.handle = self.handle, None
        if handle is not None and not self.stale:
            self.pool.release(handle)

    def __repr__(self) -> str:
        return f"<ForeignMark key={self.stream} refs={self.refs}{' stale' if self.stale else ''}>"


# ------------------------------------------------------------------ the events
@cython.cclass
class EventPool:
    """A free list of timing-disabled events.

    A handle may be reused as soon as no mark refers to it: a
    ``cuStreamWaitEvent`` already queued captured the event as it was when the
    wait was queued, so re-recording the handle later does not disturb it.

    Parameters
    ----------
    driver : Driver
        Backend that creates, records and destroys the events.
    max_idle : int
        Idle handles kept; more are destroyed on release.
    """

    def __init__(self, driver: Any, max_idle: int = 1024) -> None:
        self.driver = driver
        self._idle = collections.deque()
        self.max_idle = max_idle
        self._lock = Lock()
        self.in_use = 0
        #: Events recorded over the pool's life (:meth:`record`).
        self.recorded = 0
        #: Advanced by :meth:`forget` (a context reset): handles given out before
        #: belong to a destroyed context; :class:`ForeignMark` compares it.
        self.generation = 0

    @property
    def lock(self) -> Any:
        """The pool's lock (held only around its own state)."""
        return self._lock

    def acquire(self) -> Any:
        """Return an idle handle, creating one when none is idle."""
        with self._lock:
            self.in_use += 1
            if self._idle:
                return self._idle.pop()
        try:
            return self.driver.event_create()
        except BaseException:
            with self._lock:
                self.in_use -= 1
            raise

    def release(self, handle: Any) -> None:
        """Give ``handle`` back; destroyed when the pool already keeps ``max_idle``.

        Never raises: it runs when a mark loses its last user, in the middle
        of a resource's state update (a free, a commit, a context reset). An
        event the driver refuses to destroy is logged and leaked.
        """
        with self._lock:
            self.in_use -= 1
            if len(self._idle) < self.max_idle:
                self._idle.append(handle)
                return
        try:
            self.driver.event_destroy(handle)
        except DriverError as exc:
            _log.warning("could not destroy event %r (it is leaked): %s", handle, exc)

    def record(self, stream: Any, direct: cython.bint = False) -> Any:
        """A pooled event recorded on ``stream`` (through libcuda when
        ``direct`` and the module runs compiled, else the driver layer)."""
        handle = self.acquire()
        if not direct or record_event(handle, stream) != 0:
            try:
                self.driver.event_record(handle, stream)
            except BaseException:
                self.release(handle)
                raise
        self.recorded += 1
        return handle

    @property
    def idle(self) -> int:
        """Handles waiting in the pool."""
        return len(self._idle)

    def forget(self) -> None:
        """Destroy the idle handles, ignoring errors (their context may be gone),
        and forget the ones in use."""
        with self._lock:
            idle, self._idle = list(self._idle), collections.deque()
            self.in_use = 0
            self.generation += 1
        for handle in idle:
            try:
                self.driver.event_destroy(handle)
            except Exception:
                pass

    def close(self) -> None:
        """Destroy every idle handle."""
        with self._lock:
            idle, self._idle = list(self._idle), collections.deque()
        for handle in idle:
            self.driver.event_destroy(handle)


# ------------------------------------------------------------------- mark book
@cython.cclass
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

    def __init__(self, driver: Any, events: EventPool) -> None:
        self.driver = driver
        self.events = events
        #: The open (not yet sealed) mark of each stream.
        self.open = {}
        #: Waits queued over the book's life (``cuStreamWaitEvent`` calls).
        self.waits = 0
        #: Uses that stayed on their block's last writer's stream (no wait needed).
        self.same_stream = 0
        #: The program's own ordering (:meth:`program_point` and the calls after
        #: it): marks up to ``done_all`` (by ``seq``) are complete; ``done``:
        #: stream -> seq up to which its marks are complete; ``ordered``:
        #: consumer stream -> ``[owner, {producer stream: seq up to which the
        #: consumer is ordered after the producer's marks}]``, where ``owner``
        #: is a weak reference to the consumer's stream object (None for a raw
        #: handle or a default stream): once it is dead the handle may name a
        #: new stream, and the entry no longer counts.
        self.done_all = 0
        self.done = {}
        self.ordered = {}
        #: Waits not queued because the program's own ordering covered them.
        self.skipped = 0

    def current(self, stream: Any, owner: Any = None) -> Mark:
        """The open mark of ``stream`` (made now if it has none); ``owner`` is
        kept with it when it has none yet."""
        mark: Mark
        found = self.open.get(stream)
        if found is None:
            mark = Mark(stream, owner)
            self.open[stream] = mark
        else:
            mark = found
            if owner is not None and mark.owner is None:
                mark.owner = owner
        return mark

    def seal(self, mark: Mark, direct: cython.bint = False) -> Any:
        """The event of ``mark``, recorded now if it has none. A sealed mark is
        no longer its stream's open mark: later work gets a new one."""
        handle = mark.handle
        if handle is None:
            handle = self.events.record(mark.stream, direct)
            mark.handle = handle
            if self.open.get(mark.stream) is mark:
                del self.open[mark.stream]
            log = current_log()
            if log is not None:
                log.sealed(self.driver.device, mark.stream)
        return handle

    def wait_all(self, stream: Any, marks: list, owner: Any = None, free: cython.bint = False,
                 direct: cython.bint = False) -> None:
        """Queue waits of ``stream`` on ``marks``, each once.

        A stream that already waited for a mark is ordered after it for good
        (stream order), so it never waits for the same mark twice. The mark
        keeps ``owner`` (the waiting stream's object) alive while it is in use,
        so the waiter's handle cannot pass to a new stream that would then skip
        the wait; ``BlockTable.forget_stream`` drops a retired handle's waits.
        With ``direct`` the events and waits go through libcuda (the compiled
        launch path), unless the driver has destroyed streams to check.
        """
        mark: Mark
        if direct and self.driver.destroyed_streams:
            direct = False
        for m in marks:
            mark = m
            if self._ordered_already(stream, mark, owner):
                continue
            waiters = mark.waiters
            if waiters is None:
                waiters = mark.waiters = {}
            handle = self.seal(mark, direct)
            if not direct or wait_event(stream, handle) != 0:
                self.driver.stream_wait_event(stream, handle)
            waiters[stream] = owner
            self.waits += 1
            log = current_log()
            if log is not None:
                log.waited(stream, mark.stream, free)

    @cython.cfunc
    @cython.exceptval(-1, check=True)
    def _ordered_already(self, stream: Any, mark: Mark, owner: Any) -> cython.bint:
        """Whether ``stream`` is ordered after ``mark`` with no new wait: the
        mark's device was reset (its work is complete), the stream waited for
        it before (its ``owner`` is then kept with the wait), or the program's
        own synchronisation orders it (counted in :attr:`skipped`)."""
        foreign: cython.bint = type(mark) is not Mark
        if foreign and cython.cast(ForeignMark, mark).stale:
            return True
        waiters = mark.waiters
        if waiters is not None and stream in waiters:
            if owner is not None and waiters[stream] is None:
                waiters[stream] = owner
            return True
        # The program's ordering is known for this device's streams only: a
        # foreign mark is work of another device, which no synchronise here covers.
        if not foreign and (mark.seq <= self.done_all or ((self.done or self.ordered)
                                                          and self._covered(stream, mark))):
            self.skipped += 1
            return True
        return False

    @cython.cfunc
    @cython.exceptval(check=False)
    def _covered(self, stream: Any, mark: Mark) -> cython.bint:
        """Whether the program's own synchronisation already orders ``stream``'s
        next work after ``mark`` (complete, or ordered by an event)."""
        seq = mark.seq
        done = self.done.get(mark.stream)
        if done is not None and seq <= done:
            return True
        entry = self.ordered.get(stream)
        if entry is None:
            return False
        ref = entry[0]
        if ref is not None and ref() is None:  # the stream object died: its handle
            del self.ordered[stream]           # may be a new stream's now
            return False
        upto = entry[1].get(mark.stream)
        return upto is not None and seq <= upto

    # ------------------------------------------------ the program's own order
    def program_point(self, stream: Any) -> int:
        """A point of the program on ``stream`` (where it records an event or
        synchronises it): every mark of ``stream`` made so far is at or before
        it, and later uses of the stream get marks after it (its open mark is
        closed: sealed if a use refers to it, else forgotten). Returns the point
        (a mark sequence number)."""
        self.retire(stream)
        return _mark_seq

    def program_waited(self, stream: Any, producer: Any, point: int, owner: Any = None
                       ) -> None:
        """The program made ``stream`` wait for ``producer``'s ``point`` (an
        event recorded there): its next work is ordered after every mark of
        ``producer`` up to the point. ``owner`` is the stream's object (None
        for a raw handle or a default stream): the knowledge lasts while it
        lives, since its handle may name another stream after it."""
        entry = self._order_entry(stream, owner)
        if point > entry[1].get(producer, 0):
            entry[1][producer] = point

    def _order_entry(self, stream: Any, owner: Any) -> list:
        """The entry of ``stream`` in :attr:`ordered`: made anew where there is
        none, where its stream object died (the handle names another stream
        now) or where ``owner`` is another object."""
        entry = self.ordered.get(stream)
        if entry is not None:
            known = entry[0]
            if known is None:
                if owner is not None:
                    entry[0] = weakref.ref(owner)
                return entry  # type: ignore[no-any-return]
            alive = known()
            if alive is not None and (owner is None or alive is owner):
                return entry  # type: ignore[no-any-return]
        if len(self.ordered) > 256:  # forget the entries of dead streams
            for key in [k for k, e in self.ordered.items()
                        if e[0] is not None and e[0]() is None]:
                del self.ordered[key]
        entry = [None if owner is None else weakref.ref(owner), {}]
        self.ordered[stream] = entry
        return entry

    def program_completed(self, stream: Any, point: int) -> None:
        """The host saw ``stream``'s ``point`` complete (a synchronise of the
        stream, or of an event recorded there)."""
        if point > self.done.get(stream, 0):
            self.done[stream] = point

    def program_completed_all(self, point: int) -> None:
        """The host saw every stream of the device complete up to ``point``
        (a device synchronise; the point taken with :meth:`program_point_all`)."""
        if point > self.done_all:
            self.done_all = point

    def program_point_all(self) -> int:
        """:meth:`program_point` of every stream with an open mark."""
        for stream in list(self.open):
            self.program_point(stream)
        return _mark_seq

    def forget_order(self, stream: Any) -> None:
        """``stream`` is retired: a new stream with its handle is ordered after
        nothing the old one was."""
        self.ordered.pop(stream, None)

    @cython.cfunc
    @cython.exceptval(check=False)
    def hold(self, mark: Mark) -> cython.void:
        """One more use of ``mark`` (a block state refers to it); :meth:`release`
        drops it. The count changes only here and in :meth:`release`. A C call
        of the compiled engine (not callable from Python when compiled)."""
        mark.refs += 1

    def hold_sealed(self, mark: Mark) -> None:
        """Record ``mark``'s event if it is not yet, and hold the mark (one more
        use) until :meth:`release`: the event stays recorded meanwhile (a
        stream of another device waits for it)."""
        self.seal(mark)
        self.hold(mark)

    def in_use(self, mark: Mark) -> cython.bint:
        """Whether a use refers to ``mark``."""
        return mark.refs != 0

    def let_go(self, mark: Mark) -> None:
        """Keep no stream object alive for ``mark`` if no use refers to it (a
        mark made for a use that did not happen)."""
        if mark.refs == 0:
            mark.owner = None

    def release(self, mark: Mark) -> None:
        """Drop one use of ``mark``; at none, its event goes back to the pool and
        it keeps no stream object alive (an open mark stays open until its
        stream's next use)."""
        mark.refs -= 1
        if mark.refs == 0:
            if mark.handle is not None:
                if type(mark) is Mark:
                    self.events.release(mark.handle)
                    mark.handle = None
                else:
                    cython.cast(ForeignMark, mark).give_back()
            mark.owner = None
            mark.waiters = None

    def retire(self, stream: Any) -> None:
        """Close the open mark of ``stream``: seal it if a use refers to it (its
        uses can then still be waited for, once the stream is gone or after a
        point of the program); forget it otherwise."""
        mark = self.open.get(stream)
        if mark is not None:
            if cython.cast(Mark, mark).refs:
                self.seal(mark)
            else:
                del self.open[stream]

    def forget_unused(self) -> None:
        """Forget the open marks no use refers to (streams come and go)."""
        for stream in [s for s, m in self.open.items() if not cython.cast(Mark, m).refs]:
            del self.open[stream]

    def clear(self) -> None:
        self.open.clear()
        self.done.clear()
        self.ordered.clear()
