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

import itertools
import logging
import threading
import weakref
from typing import Any

import cython

from numba_streamsafe._driver.libcuda import record_event, wait_event
from numba_streamsafe.core.errors import DriverError
from numba_streamsafe.core.streams import owns_handle
from numba_streamsafe.core.tracehook import current_log
from numba_streamsafe.resources.tracking.lock import Lock

__all__ = ["Mark", "ForeignMark", "MarkBook", "EventPool", "retired_stream_id", "set_work",
           "current_work", "CLOSED", "BORROW_DONE", "AT_SYNC", "COMPILED"]

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
@cython.freelist(64)
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
    before the event is recorded. The streams that already wait for the
    mark's event are kept with their owning objects (None for a raw handle),
    alive while the mark is in use (:meth:`waiting`): the first in the mark
    itself (``waiter``, ``waiter_owner``), any others in ``waiters`` (None
    until there is a second). ``seq`` numbers marks in the order they are
    made: of two marks of one stream, the one with the higher ``seq`` stands
    for all the other does. ``origin`` is the stream
    it was made on as the program's clocks know it (``MarkBook.origin``),
    kept when a retired stream's marks are renamed (``stream`` then names no
    live stream): points taken on the stream reach the mark, points taken on
    a later stream at the same handle do not. In check mode ``seen`` lists the
    works whose uses the mark holds, ``(entries, what)`` (the uses as the
    rules resolved them, and the work), oldest first, for the reports.
    ``borrow`` is the program's event whose record closed the mark, as
    ``(event object, handle)`` (:meth:`MarkBook.program_record`): while the
    program does not record that event again, its handle is the mark's
    event, and the library records none of its own (``BORROW_DONE``: the
    mark's work is complete, the handle is the program's, never the pool's;
    ``AT_SYNC``: closed by a synchronise of its stream, with no event at all).
    Callers change a mark only under their resource's lock.
    """

    # The attributes as marks.pxd declares them (the compiled build's source of truth).
    seq: cython.ulonglong
    stream: Any
    origin: Any
    handle: Any
    refs: cython.Py_ssize_t
    owner: Any
    waiter: Any
    waiter_owner: Any
    has_waiter: cython.bint
    waiters: Any
    seen: Any
    borrow: Any

    def __init__(self, stream: int, owner: Any = None, origin: Any = None) -> None:
        _start(self, stream, owner, origin)

    def __repr__(self) -> str:
        state = "sealed" if self.handle is not None else "open"
        return f"<Mark stream={self.stream:#x} {state} refs={self.refs}>"

    def waiting(self) -> dict:
        """The streams that waited for the mark's event, each with its owning
        object (None for a raw handle)."""
        out: dict = {} if self.waiters is None else dict(self.waiters)
        if self.has_waiter:
            out[self.waiter] = self.waiter_owner
        return out


@cython.cfunc
@cython.exceptval(-1)
def _start(mark: Mark, stream: Any, owner: Any, origin: Any) -> cython.int:
    """A new mark of ``stream``: the next ``seq``, open, held by no use."""
    global _mark_seq
    _mark_seq += 1
    mark.seq = _mark_seq
    mark.stream = stream
    mark.origin = stream if origin is None else origin
    mark.handle = None
    mark.refs = 0
    mark.owner = owner
    clear_waiters(mark)
    mark.seen = None
    mark.borrow = None
    return 0


@cython.cfunc
@cython.inline
def _first_waiter(mark: Mark, stream: Any) -> cython.bint:
    """Whether ``stream`` is the waiter kept in ``mark`` itself."""
    return mark.has_waiter and (mark.waiter is stream or mark.waiter == stream)


def waited(mark: Mark, stream: Any, owner: Any) -> cython.bint:
    """Whether ``stream`` waited for ``mark``'s event; if so, ``owner`` (when
    not None) replaces a None owner kept for it."""
    if _first_waiter(mark, stream):
        if owner is not None and mark.waiter_owner is None:
            mark.waiter_owner = owner
        return True
    waiters = mark.waiters
    if waiters is not None and stream in waiters:
        if owner is not None and waiters[stream] is None:
            waiters[stream] = owner
        return True
    return False


def add_waiter(mark: Mark, stream: Any, owner: Any) -> cython.int:
    """``stream`` (owned by ``owner``, kept alive while the mark is in use)
    waits for ``mark``'s event (:func:`waited` for a stream that did).
    The first waiter is kept in the mark itself: most marks have one."""
    if waited(mark, stream, owner):
        return 0
    if not mark.has_waiter:
        mark.waiter = stream
        mark.waiter_owner = owner
        mark.has_waiter = True
    elif mark.waiters is None:
        mark.waiters = {stream: owner}
    else:
        mark.waiters[stream] = owner
    return 0


def drop_waiter(mark: Mark, stream: Any) -> cython.int:
    """``stream`` no longer counts as a waiter of ``mark`` (its history ended)."""
    if _first_waiter(mark, stream):
        mark.waiter = None
        mark.waiter_owner = None
        mark.has_waiter = False
    waiters = mark.waiters
    if waiters:
        waiters.pop(stream, None)
    return 0


def clear_waiters(mark: Mark) -> cython.int:
    """No stream counts as a waiter of ``mark`` any more (and none is kept alive)."""
    mark.waiter = None
    mark.waiter_owner = None
    mark.has_waiter = False
    mark.waiters = None
    return 0


@cython.cfunc
def _new_mark(stream: Any, owner: Any, origin: Any) -> Mark:
    """``Mark(stream, owner, origin)``, made without the Python call (a
    launch on a stream whose mark was sealed makes one)."""
    mark: Mark = Mark.__new__(Mark)
    _start(mark, stream, owner, origin)
    return mark


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
#: Per driver, the live handles its pools made: the library's own events, whose
#: records and waits the driver observer's notes leave out (those of every runtime
#: on that driver: another runtime's waits on its events are the library's too).
_library_events: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def library_events(driver: Any) -> set:
    """The live event handles the pools on ``driver`` made (shared by them)."""
    found = _library_events.get(driver)
    if found is None:
        found = _library_events.setdefault(driver, set())
    return found  # type: ignore[no-any-return]


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
        #: Idle handles: the first ``_nidle`` items of ``_idle`` (a stack).
        self._idle = []
        self._nidle = 0
        self.max_idle = max_idle
        self._lock = Lock()
        self.in_use = 0
        #: Events recorded over the pool's life (:meth:`record`).
        self.recorded = 0
        #: Advanced by :meth:`forget` (a context reset): handles given out before
        #: belong to a destroyed context; :class:`ForeignMark` compares it.
        self.generation = 0
        #: Every live handle the pools on ``driver`` made (their records and
        #: waits are the library's own, which the driver observer's notes leave
        #: out): :func:`library_events`, shared; :attr:`_made`, this pool's.
        self.owned = library_events(driver)
        self._made = set()

    @property
    def lock(self) -> Any:
        """The pool's lock (held only around its own state)."""
        return self._lock

    def acquire(self) -> Any:
        """Return an idle handle, creating one when none is idle."""
        lock: Lock = self._lock
        n: cython.Py_ssize_t
        lock.take()
        try:
            self.in_use += 1
            n = self._nidle
            if n:
                # A stack in a list that never shrinks: list.pop() would give the
                # list's memory back and take it again at the next release.
                self._nidle = n - 1
                handle = self._idle[n - 1]
                self._idle[n - 1] = None
                return handle
        finally:
            lock.give()
        try:
            handle = self.driver.event_create()
        except BaseException:
            lock.take()
            self.in_use -= 1
            lock.give()
            raise
        lock.take()
        try:
            self.owned.add(handle)
            self._made.add(handle)
        finally:
            lock.give()
        return handle

    def release(self, handle: Any) -> None:
        """Give ``handle`` back; destroyed when the pool already keeps ``max_idle``.

        Never raises: it runs when a mark loses its last user, in the middle
        of a resource's state update (a free, a commit, a context reset). An
        event the driver refuses to destroy is logged and leaked.
        """
        lock: Lock = self._lock
        n: cython.Py_ssize_t
        lock.take()
        try:
            if handle not in self._made:
                return  # made before a forget() (its context reset): not this pool's now
            self.in_use -= 1
            n = self._nidle
            if n < self.max_idle:
                if n < len(self._idle):
                    self._idle[n] = handle
                else:
                    self._idle.append(handle)
                self._nidle = n + 1
                return
            self.owned.discard(handle)
            self._made.discard(handle)
        finally:
            lock.give()
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
        return self._nidle

    def forget(self) -> None:
        """Destroy the idle handles, ignoring errors (their context may be gone),
        and forget the ones in use: given back later, they are dropped."""
        for handle in self._take_idle(True):
            try:
                self.driver.event_destroy(handle)
            except Exception:
                pass

    def close(self) -> None:
        """Destroy every idle handle."""
        for handle in self._take_idle(False):
            self.driver.event_destroy(handle)

    @cython.cfunc
    def _take_idle(self, all_handles: cython.bint) -> list:
        """The idle handles, taken out of the pool (no longer owned); with
        ``all_handles`` the ones in use are forgotten too (a new generation)."""
        self._lock.take()
        try:
            idle, self._idle = self._idle[:self._nidle], []
            self._nidle = 0
            if all_handles:
                self.in_use = 0
                self.generation += 1
                self.owned.difference_update(self._made)
                self._made.clear()
            else:
                self.owned.difference_update(idle)
                self._made.difference_update(idle)
        finally:
            self._lock.give()
        return idle


# ------------------------------------------------------------------- mark book
#: The handle of a mark closed in check mode, where no event is recorded.
CLOSED: str = "closed"

#: ``Mark.borrow`` of a mark whose work the host saw complete after its
#: stream was retired: its handle is the program's event (a wait for it may
#: wait for more than the mark, never for less), not the pool's.
BORROW_DONE: str = "borrow done"

#: ``Mark.borrow`` of a mark closed by a synchronise of its stream
#: (:meth:`MarkBook.program_record` with it): it has no event, since the host
#: is about to see its work complete (``MarkBook.program_completed``), after
#: which no wait needs it. A wait that needs it before that, or its stream's
#: retirement or capture, gets it an event recorded then on its stream, which
#: covers its work and what followed it there (:meth:`MarkBook.seal`,
#: :meth:`MarkBook.unborrow`). Only a mark whose stream object owns its handle
#: (``core.streams.owns_handle``: the stream lives while the mark keeps the
#: object alive) is closed so; any other records its event at the synchronise.
AT_SYNC: str = "at a synchronise"

#: Per thread, what the use being checked or recorded is (check mode's
#: reports): ``(label, stack, names, library)``, set by :func:`set_work`.
_work = threading.local()


def set_work(what: Any) -> None:
    """Check mode: the work whose uses this thread checks and records next
    (kept on the marks, named in the reports), where the caller does not hand
    it to the rules itself. ``what`` is ``(label, stack, names, library)``:
    the kernel or copy; the user's stack where it was queued (``(file,
    line)`` pairs, innermost first, or as
    :func:`~numba_streamsafe.core.sites.capture_stack` captures it, resolved
    when a race is reported);
    what names its arguments (a :class:`~numba_streamsafe.core.uses.Uses`
    with names, a direct launch's ``(names, arrays)``, or None); and who
    queued it (``"numba_streamsafe"``, ``"numba"``, another library's name,
    or None). Only made where races are reported; read back only for a report."""
    _work.what = what


def current_work() -> Any:
    """The work :func:`set_work` set on this thread (None: none)."""
    return getattr(_work, "what", None)


@cython.cfunc
@cython.inline
def _legacy(stream: Any) -> cython.bint:
    """Whether ``stream`` is the legacy default stream (0, or ``CU_STREAM_LEGACY``)."""
    return stream is not None and (stream == 0 or stream == 1)


#: The size a stream's clock grows to before it is first pruned (:meth:`MarkBook._prune`).
_PRUNE_AT = 64


@cython.cfunc
@cython.exceptval(-1)
def _join_clock(into: dict, other: dict) -> cython.int:
    """``into`` after ``other``: per key, the newer point."""
    for key, point in other.items():
        known = into.get(key)
        if known is None or point > known:
            into[key] = point
    return 0


@cython.cclass
class MarkBook:
    """The open mark of each stream, sealing, waits, and releasing marks; and
    what the program's own synchronisation orders (its *clocks*).

    Callers hold their resource's lock around every method.

    The program's ordering is kept as clocks: a clock maps a stream to the
    point (a mark sequence number) up to which something is ordered after its
    marks. ``done`` is the host's clock (what it saw complete), ``done_all``
    the point of the last device synchronise, and ``ordered`` per stream the
    clock it waited for (:meth:`program_waited`), kept while the stream's
    object lives. A clock taken where the program records an event carries
    what that stream was ordered after (:meth:`program_clock`), so a chain of
    events orders as CUDA orders it.

    In ordering mode a use skips the waits those clocks cover (counted in
    ``skipped``). In check mode (``checking``) nothing is waited for and no
    event is recorded: a use that needs a mark its clocks do not cover is a
    race, kept in ``races`` as ``(stream, mark, where, what, seen)`` until the
    resource reports it; the legacy default stream's implicit ordering with
    blocking streams counts as the program's. New memory, which the pool
    hands out in its stream's order, gets a mark of its own with an event
    (:meth:`seal_event`): a use on another stream waits for it, the library's
    own ordering, never reported (:meth:`verify`).

    In ordering mode a race check may watch the book (``reporting``): the
    waits are queued as always, and each one the program's own ordering did
    not make needed is also kept in ``races`` (:meth:`reportable`).

    Parameters
    ----------
    driver : Driver
        Queues the waits (and tells a stream's flags in check mode).
    events : EventPool
        Records the marks' events.
    checking : bool
        Check mode.
    """

    def __init__(self, driver: Any, events: EventPool, checking: bool = False) -> None:
        self.driver = driver
        self.events = events
        #: The open (not yet sealed) mark of each stream.
        self.open = {}
        #: Waits queued over the book's life (``cuStreamWaitEvent`` calls).
        self.waits = 0
        #: Uses that stayed on their block's last writer's stream (no wait needed).
        self.same_stream = 0
        #: The program's own ordering (the class's clocks): ``ordered`` maps a
        #: stream to ``[owner, clock]``, ``owner`` a weak reference to the
        #: stream's object (None for a raw handle or a default stream): once it
        #: is dead the handle may name a new stream, and the entry no longer counts.
        self.done_all = 0
        self.done = {}
        self.ordered = {}
        #: Moves on each time ``done`` or ``done_all`` do (the host saw work
        #: complete): a block's reads are scanned for complete ones only once
        #: it moved since their last scan (``rules._note_read``).
        self.completions = 1
        #: Waits not queued because the program's own ordering covered them.
        self.skipped = 0
        self.checking = checking
        #: Ordering mode: race checks watching the book (:meth:`reportable`); the
        #: races are then kept in ``races`` too, the waits still queued.
        self.reporting = 0
        #: The point a race check's watch began at: marks up to it hold uses
        #: made before it (unnamed), which it does not report.
        self.report_from = 0
        self.races = []
        #: The point of the legacy default stream's last use, up to which it is
        #: ordered after every blocking stream's marks (check mode, and ordering
        #: mode while a race check watches: :meth:`legacy_use`).
        self.legacy_point = 0
        #: Check mode: whether each stream is blocking (``cuStreamGetFlags``).
        self._flags = {}
        #: Check mode: the key of each destroyed blocking stream whose marks are
        #: still judged -> the legacy stream's point when it was destroyed
        #: (:meth:`ending`).
        self._legacy_ended = {}
        #: Other code's calls as the driver observer noted them
        #: (:class:`~numba_streamsafe.resources.observed.ObservedCalls`), applied
        #: before each decision (:meth:`catch_up`); None where none are observed.
        self.observed: Any = None
        #: The key in the clocks of the stream at each handle whose earlier
        #: stream was retired with marks still held (:meth:`origin`).
        self._origins = {}
        self._retired = 0
        #: The keys of retired streams whose marks are still held -> the
        #: newest point of their marks: once a device synchronise passes it,
        #: the key leaves the clocks (:meth:`program_completed_all`).
        self._retired_keys = {}
        #: Per stream, the marks closed where the program recorded an event
        #: and still borrowing it (:meth:`program_record`; some may have let go
        #: since: :meth:`unborrow_stream` skips those).
        self._borrowed = {}

    def catch_up(self) -> None:
        """Apply what other code did since the last call, as the driver
        observer noted it (event records, waits, synchronises, copies: see
        :attr:`observed`), so that the next decision knows it. Nothing where
        nothing is observed."""
        observed = self.observed
        if observed is not None:
            observed.catch_up_locked()

    def current(self, stream: Any, owner: Any = None) -> Mark:
        """The open mark of ``stream`` (made now if it has none); ``owner`` is
        kept with it when it has none yet."""
        mark: Mark
        found = self.open.get(stream)
        if found is None:
            mark = _new_mark(stream, owner,
                             self._origins.get(stream) if self._origins else None)
            self.open[stream] = mark
        else:
            mark = found
            if owner is not None and mark.owner is None:
                mark.owner = owner
        return mark

    def seal(self, mark: Mark, direct: cython.bint = False) -> Any:
        """The event of ``mark``, recorded now if it has none (in check mode
        none is recorded: the mark is closed, ``CLOSED``). A sealed mark is no
        longer its stream's open mark: later work gets a new one."""
        handle = mark.handle
        if handle is None and mark.borrow is AT_SYNC:
            mark.borrow = None  # needed before the host saw it complete: an event now
        if handle is None and mark.borrow is not None and mark.borrow is not BORROW_DONE:
            # Closed where the program recorded its event: that event is the mark's.
            handle = mark.handle = mark.borrow[1]
        elif handle is None:
            if self.checking:
                handle = CLOSED
            else:
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
        """Queue waits of ``stream`` on ``marks``, each once (never in check
        mode: the rules and the free verify the marks instead).

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
            if self.ordered_already(stream, mark, owner):
                continue
            handle = self.seal(mark, direct)
            if not direct or wait_event(stream, handle) != 0:
                self.driver.stream_wait_event(stream, handle)
            add_waiter(mark, stream, owner)
            self.waits += 1
            log = current_log()
            if log is not None:
                log.waited(stream, mark.stream, free)

    def verify(self, stream: Any, mark: Mark, owner: Any, where: tuple, what: Any = None,
               queued: cython.bint = False) -> None:
        """A use on ``stream`` needs ``mark`` (the rules decided), in check mode
        or while a race check watches an ordering book (:attr:`reporting`).

        In ordering mode the pair is a race (:meth:`race`, with the work
        ``what``, by default the thread's, :func:`set_work`) when
        :meth:`reportable`; the caller queues the wait as always. In check
        mode, unless the program orders ``stream`` after the mark, the pair is
        such a race -- or, for a mark that holds no use of the program (no
        note: new memory's, which the pool hands out in its stream's order, as
        :meth:`seal_event` made it), the library's own ordering: its wait is
        queued, as in ordering mode, and nothing is reported -- unless the use
        was ``queued`` already (another library's copy, which no wait can
        order any more): then that too is a race."""
        if not self.checking:
            if self.reportable(stream, mark):
                self.race(stream, mark, owner, where, current_work() if what is None else what)
            return
        if self.ordered_already(stream, mark, owner):
            return
        if (not queued and not mark.seen and mark.handle is not None
                and mark.handle is not CLOSED):
            self.wait_all(stream, [mark], owner)
        else:
            self.race(stream, mark, owner, where, current_work() if what is None else what)

    def seal_event(self, mark: Mark) -> Any:
        """:meth:`seal` with an event recorded in check mode too (for a mark
        closed without one, now): the library's own ordering, of new memory
        (:meth:`verify` waits for it) or of another device's use."""
        if self.checking and (mark.handle is None or mark.handle is CLOSED):
            handle = self.events.record(mark.stream)
            if self.open.get(mark.stream) is mark:
                del self.open[mark.stream]
            mark.handle = handle
            return handle
        return self.seal(mark)

    def race(self, stream: Any, mark: Mark, owner: Any, where: tuple, what: Any) -> None:
        """Keep the race of a use on ``stream`` that needs ``mark`` and is not
        ordered after it, in :attr:`races` with ``where`` (``(block, access,
        lo, hi, free)`` of the use), its work ``what`` and what the mark's uses
        touched (``Mark.seen``); the pair is not reported again (in check mode
        the stream counts as a waiter; in ordering mode the wait the library
        then queues makes it one)."""
        if self.checking:
            add_waiter(mark, stream, owner)
        seen = mark.seen  # the works so far: later ones are not this race's
        self.races.append((stream, mark, where, what, None if seen is None else list(seen)))

    def take_races(self) -> list:
        """The races found since the last call (check mode, or a race check's)."""
        races = self.races
        self.races = []
        return races

    def reportable(self, stream: Any, mark: Mark) -> cython.bint:
        """Ordering mode, while a race check watches (:attr:`reporting`):
        whether a use on ``stream`` that needs ``mark`` is a race of the
        program as written, the library's wait left out. It is unless the
        program's own synchronisation orders it (:meth:`ordered_already`
        without its side effects), the stream waited for the mark before
        (the pair was judged then), the mark is another device's, or it was
        made before the watch began (``report_from``). Where
        the legacy default stream takes part (the use or the mark is on it, or
        it had work since the mark was made) the pair is never reported: its
        implicit ordering with blocking streams is not followed in ordering
        mode, so such a pair may be ordered (a missed report, never a false one)."""
        if type(mark) is not Mark or mark.seq <= self.report_from:
            return False  # another device's, or made before the watch began
        if _legacy(stream) or _legacy(mark.stream) or mark.seq <= self.legacy_point:
            return False
        if waited(mark, stream, None):
            return False
        return not self._program_orders(stream, mark)

    @cython.cfunc
    @cython.exceptval(-1, check=True)
    def ordered_already(self, stream: Any, mark: Mark, owner: Any) -> cython.bint:
        """Whether ``stream`` is ordered after ``mark`` with no new wait: the
        mark's device was reset (its work is complete), the stream waited for
        it before (its ``owner`` is then kept with the wait), or the program's
        own synchronisation orders it (counted in :attr:`skipped`)."""
        foreign: cython.bint = type(mark) is not Mark
        if foreign and cython.cast(ForeignMark, mark).stale:
            return True
        if waited(mark, stream, owner):
            return True
        # The program's ordering is known for this device's streams only: a
        # foreign mark is work of another device, which no synchronise here covers.
        if not foreign and self._program_orders(stream, mark):
            self.skipped += 1
            if (mark.has_waiter or mark.waiters is not None) and self.complete(mark):
                # No stream waits for it any more: the streams that did may go
                # (their objects are no longer kept alive for it).
                clear_waiters(mark)
            return True
        return False

    @cython.cfunc
    @cython.exceptval(-1, check=True)
    def done_at_sync(self, mark: Mark) -> cython.bint:
        """Whether a device synchronise saw ``mark``'s work complete (no stream
        waits for it, and none need keep waiting: its waiters are let go), as
        :meth:`ordered_already` decides it and counts it in :attr:`skipped`.
        Never for another device's mark."""
        if type(mark) is not Mark or mark.seq > self.done_all:
            return False
        self.skipped += 1
        if mark.has_waiter or mark.waiters is not None:
            clear_waiters(mark)
        return True

    def complete_mark(self, stream: Any, owner: Any = None) -> Mark:
        """A mark of ``stream`` whose work the host saw complete (its point is
        before every host point): the ready mark of memory that needs no
        ordering anywhere, such as a kept block whose uses were all complete
        when it was freed. It is never any stream's open mark."""
        mark = _new_mark(stream, owner, None)
        mark.seq = 0
        return mark

    def complete(self, mark: Mark) -> cython.bint:
        """Whether the host saw the work of ``mark`` complete (a device
        synchronise, or a synchronise of a point of its stream after it): no
        use waits for it any more. Never for another device's mark."""
        if type(mark) is not Mark:
            return False
        seq = mark.seq
        if seq <= self.done_all:
            return True
        if not self.done:
            return False
        done = self.done.get(mark.origin)
        return done is not None and seq <= done

    @cython.cfunc
    @cython.exceptval(-1, check=True)
    def _program_orders(self, stream: Any, mark: Mark) -> cython.bint:
        """Whether the program's own synchronisation orders ``stream``'s next
        work after ``mark`` (a device synchronise, or :meth:`_covered`)."""
        return mark.seq <= self.done_all or (
            (self.done or self.ordered or self.checking) and self._covered(stream, mark))

    @cython.cfunc
    @cython.exceptval(-1, check=True)
    def _covered(self, stream: Any, mark: Mark) -> cython.bint:
        """Whether the program's own synchronisation already orders ``stream``'s
        next work after ``mark`` (complete, or ordered by an event; in check
        mode also by the legacy default stream)."""
        seq = mark.seq
        done = self.done.get(mark.origin)
        if done is not None and seq <= done:
            return True
        clock = None
        entry = self.ordered.get(stream)
        if entry is not None:
            ref = entry[0]
            if ref is not None and ref() is None:  # the stream object died: its handle
                del self.ordered[stream]           # may be a new stream's now
            else:
                clock = entry[1]
                upto = clock.get(mark.origin)
                if upto is not None and seq <= upto:
                    return True
        if not self.checking:
            return False
        return self._implied(stream, mark, clock)

    @cython.cfunc
    @cython.exceptval(-1, check=True)
    def _implied(self, stream: Any, mark: Mark, clock: Any) -> cython.bint:
        """Check mode: whether CUDA's implicit ordering of the legacy default
        stream with blocking streams orders ``stream``'s next work after
        ``mark`` (``clock``: what ``stream`` waited for, or None)."""
        s = mark.stream
        seq = mark.seq
        if _legacy(stream):  # after every blocking stream's earlier work
            return _legacy(s) or self._blocking_mark(mark)
        if self.blocking(stream) and self._after_legacy(mark):
            return True
        # An event recorded on (or a synchronise of) the legacy stream or a
        # blocking one covers the blocking streams' marks up to its ``None`` point.
        upto = self.done.get(None)
        if clock is not None:
            mine = clock.get(None)
            if mine is not None and (upto is None or mine > upto):
                upto = mine
        return upto is not None and seq <= upto and self._blocking_mark(mark)

    @cython.cfunc
    @cython.exceptval(-1, check=True)
    def _blocking_mark(self, mark: Mark) -> cython.bint:
        """Check mode: whether the legacy default stream's work is ordered after
        ``mark`` by CUDA's implicit ordering once queued after it: a mark of a
        blocking stream; of a destroyed one (renamed), only where the legacy
        stream had work after the mark before the stream was destroyed
        (:meth:`ending`), since CUDA orders later legacy work after none of a
        destroyed stream's work."""
        s = mark.stream
        if s is not None and s < 0:
            ended = self._legacy_ended.get(mark.origin) if self._legacy_ended else None
            return ended is not None and mark.seq <= ended
        return self.blocking(s)

    @cython.cfunc
    @cython.exceptval(-1, check=True)
    def _after_legacy(self, mark: Mark) -> cython.bint:
        """Check mode: whether the legacy default stream's earlier work is after
        ``mark`` (so a blocking stream's next work is): a mark of the legacy
        stream, one its clock covers, or a blocking stream's mark closed by
        its last use (``legacy_point``)."""
        s = mark.stream
        if _legacy(s):
            return True
        legacy = self.ordered.get(0)
        if legacy is not None:
            upto = legacy[1].get(mark.origin)
            if upto is not None and mark.seq <= upto:
                return True
        return mark.seq <= self.legacy_point and self._blocking_mark(mark)

    def blocking(self, stream: Any) -> cython.bint:
        """Check mode: whether ``stream`` and the legacy default stream wait for
        each other's work: the per-thread default stream and a blocking stream
        (its flags, read once per handle); never the legacy stream itself."""
        if stream is None or stream < 2:
            return False
        found = self._flags.get(stream)
        if found is None:
            try:
                found = bool(self.driver.stream_blocking(stream))
            except Exception:  # a stream gone, or a key that names none
                found = False
            self._flags[stream] = found
        return found  # type: ignore[no-any-return]

    def legacy_use(self, used: Any) -> None:
        """Work is queued on stream ``used`` now (check mode, and ordering mode
        while a race check watches). On the legacy default stream it comes
        after every blocking stream's earlier work: their open marks close,
        and the legacy stream's point moves on; in check mode what they
        waited for joins its clock (ordering mode's clocks, which skip waits,
        never count the implicit ordering). On another stream nothing happens."""
        if not _legacy(used):
            return
        for stream in [s for s in self.open if not _legacy(s) and self.blocking(s)]:
            self.retire(stream)
        self.legacy_point = _mark_seq
        if not self.checking:
            return
        clock = self._order_entry(0, None)[1]
        for stream, entry in list(self.ordered.items()):
            ref = entry[0]
            if ref is not None and ref() is None:  # the stream object died: its handle
                del self.ordered[stream]           # may be a new stream's now
            elif not _legacy(stream) and self.blocking(stream):
                _join_clock(clock, entry[1])

    # ------------------------------------------------ the program's own order
    def program_point(self, stream: Any) -> int:
        """A point of the program on ``stream`` (where it records an event or
        synchronises it): every mark of ``stream`` made so far is at or before
        it, and later uses of the stream get marks after it (its open mark is
        closed, :meth:`retire`, its event recorded through libcuda unless the
        driver has destroyed streams to check). Returns the point (a mark
        sequence number)."""
        self.retire(stream, not self.driver.destroyed_streams)
        return _mark_seq

    def program_record(self, stream: Any, borrow: Any) -> tuple:
        """The program records its event ``borrow`` (``(event object,
        handle)``) on ``stream`` now: returns ``(clock, mark)``, the point's
        :meth:`program_clock` and the mark it closed, or None. With
        :data:`AT_SYNC` for ``borrow``, the point is a synchronise of
        ``stream`` that the host is about to make: the mark is closed with no
        event where its stream object owns its handle, else sealed with one
        (see :data:`AT_SYNC`).

        In ordering mode the stream's open mark, when a use refers to it, is
        closed without an event of the library's: it *borrows* the program's
        (:attr:`Mark.borrow`), whose record covers the same work. A wait for
        the mark then waits for the program's event, until the program
        records that event again (:meth:`unborrow`, called before), the
        stream is retired or captured (:meth:`unborrow_stream`), or another
        device's stream waits for it (:meth:`hold_sealed`): the mark then
        gets an event of its own, recorded on its stream (which covers the
        mark and what followed it there). If the program's record fails, call
        :meth:`unborrow` on the mark returned. In check mode nothing is
        borrowed (no event is recorded), as :meth:`program_clock`."""
        mark: Mark
        found = None
        if not self.checking:
            found = self.open.get(stream)
            if (found is not None and borrow is AT_SYNC
                    and not owns_handle(cython.cast(Mark, found).owner)):
                # No object of the stream's that the mark keeps alive holds its handle:
                # the stream may be gone by the time a wait needs the mark's event, so
                # it is recorded now (program_clock's point seals the mark).
                found = None
            if found is not None:
                mark = found
                del self.open[stream]
                if mark.refs:
                    mark.borrow = borrow
                    held = self._borrowed.get(stream)
                    if held is None:
                        self._borrowed[stream] = [mark]
                    else:
                        if len(held) >= 8:  # drop the ones that let go since
                            held[:] = [m for m in held
                                       if cython.cast(Mark, m).borrow is not None]
                        held.append(mark)
                else:
                    found = None
        return self.program_clock(stream), found

    def unborrow(self, mark: Mark) -> None:
        """``mark`` stops borrowing the program's event (the program is about
        to record that event again, or see :meth:`program_record`): while a
        use refers to it, it gets an event of the library's, recorded now on
        its stream, in place of the program's. A mark whose stream has been
        retired meanwhile (only a stream ended behind the library's back, whose
        work the host saw complete) keeps the program's handle
        (``BORROW_DONE``) once the host waited for that event."""
        borrow = mark.borrow
        if borrow is None or borrow is BORROW_DONE:
            return
        if not mark.refs:
            mark.borrow = None
            mark.handle = None
            return
        if mark.stream < 0:
            if borrow is AT_SYNC:
                # Not reached where AT_SYNC applies (the mark keeps alive the object
                # that owns the stream's handle, and a retirement through the library
                # unborrows first): it keeps no borrow, as the marks ended() closed.
                mark.borrow = None
                return
            self.driver.event_synchronize(borrow[1])
            mark.handle = borrow[1]
            mark.borrow = BORROW_DONE
            return
        handle = self.events.record(mark.stream)
        mark.handle = handle
        mark.borrow = None

    def unborrow_stream(self, stream: Any) -> None:
        """:meth:`unborrow` every mark of ``stream`` that borrows the program's
        event (before the stream is retired, or captured: its events must be
        recorded while it lives, and outside the capture)."""
        held = self._borrowed.pop(stream, None)
        if held is not None:
            for m in held:
                self.unborrow(m)

    def program_clock(self, stream: Any) -> dict:
        """The clock of a point of the program on ``stream`` (an event recorded
        there, or a synchronise of it): the stream's :meth:`program_point` with
        what the stream is ordered after (its waits; in check mode the legacy
        default stream's implicit ordering, ``None`` standing for every
        blocking stream)."""
        clock: dict = {}
        if self.checking:
            if _legacy(stream):
                self.legacy_use(stream)
                clock[None] = self.legacy_point
            elif self.blocking(stream):  # after the legacy stream's earlier work
                clock[0] = self.program_point(0)
                legacy = self.ordered.get(0)
                if legacy is not None:
                    _join_clock(clock, legacy[1])
                if clock.get(None, 0) < self.legacy_point:
                    clock[None] = self.legacy_point
        elif self.reporting and _legacy(stream):  # a race check's bound (reportable)
            self.legacy_use(stream)
        entry = self.ordered.get(stream)
        if entry is not None and (entry[0] is None or entry[0]() is not None):
            _join_clock(clock, entry[1])
        clock[self.origin(stream)] = self.program_point(stream)
        return clock

    def program_waited(self, stream: Any, clock: dict, owner: Any = None) -> None:
        """The program made ``stream`` wait for an event whose :meth:`program_clock`
        is ``clock``: its next work is ordered after what the clock covers.
        ``owner`` is the stream's object (None for a raw handle or a default
        stream): the knowledge lasts while it lives, since its handle may
        name another stream after it."""
        if self.reporting and not self.checking and _legacy(stream):
            self.legacy_use(stream)  # a race check's bound (reportable)
        entry = self._order_entry(stream, owner)
        mine: dict = entry[1]
        _join_clock(mine, clock)
        if len(mine) > entry[2]:  # doubled since the last pruning: prune it
            self._prune(mine)
            entry[2] = max(_PRUNE_AT, len(mine) * 2)

    def _prune(self, clock: dict) -> cython.int:
        """Drop from ``clock`` (a stream's, in :attr:`ordered`) the points the
        host saw complete: those a device synchronise covers (``done_all``)
        and those the host's clock (``done``) covers for their key. Every
        judgement by a clock asks those first, so the clock needs them not;
        a program that makes a stream per step and hands each one's work to a
        long-lived stream would otherwise copy one key per step it ran into
        each point of that stream."""
        done: dict = self.done
        done_all = self.done_all
        gone = []
        for key, point in clock.items():
            if point <= done_all:
                gone.append(key)
            elif key is not None:
                seen = done.get(key)
                if seen is not None and point <= seen:
                    gone.append(key)
        for key in gone:
            del clock[key]
        return 0

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
        entry = [None if owner is None else weakref.ref(owner), {}, _PRUNE_AT]
        self.ordered[stream] = entry
        return entry

    def program_completed(self, clock: dict, stream: Any = None) -> None:
        """The host saw a point of the program complete (a synchronise of a
        stream, or of an event): ``clock`` is its :meth:`program_clock`. Where
        the point was a synchronise of ``stream``, that stream's clock drops
        what the host has now seen complete (all of it, unless the program
        made the stream wait for more since the point was taken): a
        long-lived stream that the program synchronises keeps a clock as
        small as what it waited for since, and the marks the synchronise
        closed with no event (:data:`AT_SYNC`) stay without one."""
        _join_clock(self.done, clock)
        self.completions += 1
        if stream is not None:
            entry = self.ordered.get(stream)
            if entry is not None and entry[1]:
                self._prune(entry[1])
            held = self._borrowed.get(stream)
            if held:  # the marks the synchronise closed (AT_SYNC) are complete now
                point = clock.get(self.origin(stream), 0)
                mark: Mark
                for m in held:
                    mark = m
                    if mark.borrow is AT_SYNC and mark.seq <= point:
                        mark.borrow = None
                held[:] = [m for m in held if cython.cast(Mark, m).borrow is not None]

    def program_completed_all(self, point: int) -> None:
        """The host saw every stream of the device complete up to ``point``
        (a device synchronise; the point taken with :meth:`program_point_all`).
        The clocks keep none of the points it covers."""
        self._completed_up_to(point)

    def _completed_up_to(self, point: Any) -> None:
        """Every mark up to ``point`` is complete (``done_all``). The keys of
        retired streams whose marks are all covered are forgotten, and no
        clock (the host's or a stream's) keeps a point it covers: every
        judgement asks ``done_all`` first. A retired stream's key leaves the
        clocks with them, since every point taken under it came before its
        retirement."""
        if point > self.done_all:
            self.done_all = point
            self.completions += 1
        done_all = self.done_all
        if self._retired_keys:
            for key in [k for k, newest in self._retired_keys.items() if newest <= done_all]:
                del self._retired_keys[key]
                self._legacy_ended.pop(key, None)
        done: dict = self.done
        for key in [k for k, p in done.items() if p <= done_all]:
            del done[key]
        for entry in self.ordered.values():
            if entry[1]:
                self._prune(entry[1])

    def program_point_all(self) -> int:
        """:meth:`program_point` of every stream with an open mark."""
        for stream in list(self.open):
            self.program_point(stream)
        return _mark_seq

    def ended(self, stream: Any) -> None:
        """``stream`` was destroyed behind the library's back (another library's,
        as the driver observer noted it) and the device was synchronised since,
        with nothing committed in between (the caller holds the resource's
        lock across both), so its work is complete: its open mark leaves the
        book without an event (none can be recorded on it any more; in check
        mode it is closed). In ordering mode every mark made so far counts as
        complete, and every stream's open mark is closed with it (no event
        needed: complete), so that later work gets marks after that point
        rather than joining marks the synchronise completed."""
        if self.checking:
            self.retire(stream)
            return
        self.open.clear()
        self._completed_up_to(_mark_seq)

    def ending(self, stream: Any, query: cython.bint = True) -> None:
        """``stream`` is about to be destroyed (call it while it still exists;
        with ``query`` False, where it may be gone already, its kind is taken
        only as read before). Check mode: where it is a blocking stream, the
        legacy default stream's work so far (up to :attr:`legacy_point`) stays
        ordered after its marks made before that work, and no later legacy
        work is (CUDA orders it after none of a destroyed stream's work): kept
        under the stream's key (:meth:`_blocking_mark`), since once the stream
        is gone, and its marks renamed, its kind can no longer be read.
        Nothing in ordering mode."""
        if not self.checking or not self.legacy_point:
            return
        if not (self.blocking(stream) if query else self._flags.get(stream, False)):
            return
        self._legacy_ended[self.origin(stream)] = self.legacy_point

    def forget_order(self, stream: Any, held: cython.bint = True) -> None:
        """``stream`` is retired: a new stream with its handle is ordered after
        nothing the old one was. Where blocks still hold marks of the old
        stream (``held``), the clocks know the new one by a new key
        (:meth:`origin`), so a point taken on it covers none of the old
        stream's marks. Where none holds one, no mark of the stream is judged
        any more: its key leaves the host's clock and every stream's, so that
        the clocks of a program that makes a stream per step stay as small as
        the streams it keeps."""
        self.ordered.pop(stream, None)
        self._flags.pop(stream, None)
        self._borrowed.pop(stream, None)  # renamed: unborrow() sees they are retired
        if not held and self._legacy_ended:
            self._legacy_ended.pop(self.origin(stream), None)  # no mark of it is judged
        if held:
            self._retired_keys[self.origin(stream)] = _mark_seq
            self._retired += 1
            self._origins[stream] = (stream, self._retired)
        else:
            key = self.origin(stream)
            if self.done:
                self.done.pop(key, None)
            for entry in self.ordered.values():
                clock: dict = entry[1]
                if clock:
                    clock.pop(key, None)

    def origin(self, stream: Any) -> Any:
        """The key the clocks know the stream at handle ``stream`` by (a mark's
        ``origin``): the handle itself, or, once a stream at that handle was
        retired while blocks held its marks (:meth:`forget_order`), the
        handle with a count of its own, so that points taken on a later
        stream there do not reach the marks of the earlier one."""
        if self._origins:
            found = self._origins.get(stream)
            if found is not None:
                return found
        return stream

    @cython.cfunc
    @cython.exceptval(check=False)
    def hold(self, mark: Mark) -> cython.void:
        """One more use of ``mark`` (a block state refers to it); :meth:`release`
        drops it. The count changes only here and in :meth:`release`. A C call
        of the compiled engine (not callable from Python when compiled)."""
        mark.refs += 1

    def hold_sealed(self, mark: Mark) -> cython.bint:
        """Record ``mark``'s event if it is not yet, and hold the mark (one more
        use) until :meth:`release`: the event stays recorded meanwhile (a
        stream of another device waits for it; in check mode too). Returns
        whether it is held: in check mode a mark with no stream to record on
        (one of a stream that ended) is not, and needs no wait."""
        if (self.checking and (mark.handle is None or mark.handle is CLOSED)
                and mark.stream < 0):
            return False
        if mark.borrow is not None:
            # Another device's stream waits for it, outside the lock: an event of
            # the library's, which the program cannot record again meanwhile.
            self.unborrow(mark)
        self.seal_event(mark)
        self.hold(mark)
        return True

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
            handle = mark.handle
            if mark.borrow is not None:  # the program's event, not the pool's
                mark.borrow = None
                mark.handle = handle = None
            if handle is not None:
                if type(mark) is Mark:
                    if handle is not CLOSED:
                        self.events.release(handle)
                    mark.handle = None
                else:
                    cython.cast(ForeignMark, mark).give_back()
            mark.owner = None
            clear_waiters(mark)
            mark.seen = None

    def retire(self, stream: Any, direct: cython.bint = False) -> None:
        """Close the open mark of ``stream``: seal it if a use refers to it (its
        uses can then still be waited for, once the stream is gone, captured
        by a graph, or after a point of the program; in check mode no event is
        recorded, the mark is ``CLOSED``); forget it otherwise. With
        ``direct`` the event is recorded through libcuda (as :meth:`seal`)."""
        mark = self.open.get(stream)
        if mark is not None:
            if cython.cast(Mark, mark).refs:
                self.seal(mark, direct)
            else:
                del self.open[stream]

    def forget_unused(self) -> None:
        """Forget the open marks no use refers to (streams come and go)."""
        for stream in [s for s, m in self.open.items() if not cython.cast(Mark, m).refs]:
            del self.open[stream]

    def clear(self) -> None:
        self.completions += 1
        self.open.clear()
        self.done.clear()
        self.ordered.clear()
        self._flags.clear()
        self._legacy_ended.clear()
        self._origins.clear()
        self._retired_keys.clear()
        self._borrowed.clear()
        self.races = []
