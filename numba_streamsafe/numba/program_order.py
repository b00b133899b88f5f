"""The program's own ordering, told to the tracking resource: what transparent
mode's hooks on Numba's ``Event.record``, ``Event.wait``,
``Event.synchronize`` / ``query``, ``Stream.synchronize`` and the device
synchronise do around the call they wrap.

Part of the engine (:mod:`numba_streamsafe.compiled`), written in Cython's
pure-Python mode: compiled where a compiler is present (its C declarations
are in ``program_order.pxd``), run as it is where none is.

An event's point is kept on the event object (its :class:`EventState`: a
weak reference to the runtime, the point's clock and the mark the point
closed), so that a wait for the event, or a synchronise of it, orders what
the clock covers (``MarkBook.program_clock``). The mark borrows the
program's event (``MarkBook.program_record``): the library records no event
of its own where the program records one, until the program records that
event again (the mark then gets one of the library's, if a use still refers
to it). One lock per event keeps each call and its bookkeeping together.
Nothing is noted while a graph is captured on the device (a captured wait is
a graph node, not a wait of the stream), nor where the driver observer notes
every call of the process.

On a GPU the record and the wait of an event on a stream of the program's go
to libcuda directly (``cuEventRecord``, ``cuStreamWaitEvent``), as a
compiled launch does; where libcuda refuses, or on a default stream, Numba's
own call makes it (and raises Numba's error).
"""

from __future__ import annotations

import ctypes
import weakref
from collections.abc import Callable
from typing import Any

import cython

from numba_streamsafe._driver.libcuda import record_event, wait_event
from numba_streamsafe.core.streams import default_stream_handle, owns_handle, stream_handle
from numba_streamsafe.resources.tracking.lock import Lock
from numba_streamsafe.resources.tracking.marks import AT_SYNC, Mark, MarkBook
from numba_streamsafe.runtime import RUNTIMES

__all__ = ["record", "wait", "completed", "synchronised", "device_synchronised", "noting",
           "record_hook", "wait_hook", "stream_synchronize_hook", "event_completed_hook",
           "stream_ref", "cache_stream", "event_handle", "COMPILED"]

#: Whether this module runs compiled (else it runs as Python source).
COMPILED: bool = cython.compiled

@cython.cclass
class EventState:
    """What the library keeps of one of Numba's events, on the event itself
    (``_nss_state`` in its ``__dict__``, made on first use, :func:`_state`):
    its driver handle (read once, :func:`event_handle`), the lock that keeps
    each call on the event and its bookkeeping together, and the event's
    point: the runtime it was noted on (a weak reference), the point's clock
    (``MarkBook.program_clock``) and the mark it closed, or None for all
    three where no point is kept."""

    # The attributes as program_order.pxd declares them.
    handle: Any
    lock: Lock
    point_rt: Any
    point_clock: Any
    point_mark: Any

    def __init__(self) -> None:
        self.handle = None
        self.lock = Lock()
        self.point_rt = None
        self.point_clock = None
        self.point_mark = None


@cython.cfunc
def _state(event: Any) -> EventState:
    """The library's :class:`EventState` of ``event``."""
    d: dict = event.__dict__
    found = d.get("_nss_state")
    if found is None:
        found = d.setdefault("_nss_state", EventState())
    return found  # type: ignore[no-any-return]


@cython.ccall
def noting(rt: Any) -> cython.bint:
    """Whether the program's ordering is noted here on ``rt`` now: not while a
    graph is captured, nor where the driver observer notes every call of the
    process (Numba's events and synchronises among them), nor where the
    runtime's resource tracks nothing."""
    return _noted(rt) is not None


#: The :func:`_tracking` of the last runtime asked about.
_last_tracking: Any = None


def _forget_tracking(ref: Any) -> None:
    """The runtime of the kept tracking tuple died: the tuple (its mark book,
    and the program's events and streams its marks hold) is let go with it."""
    global _last_tracking
    last = _last_tracking
    if last is not None and last[2] is ref:
        _last_tracking = None


@cython.cfunc
def _tracking(rt: Any) -> tuple:
    """``(book, lock, ref)`` of ``rt``'s tracking resource: its mark book (None
    where it keeps none), the lock of its state, and a weak reference to
    ``rt`` (None for a runtime that takes none). Read once and kept on the
    runtime (``_nss_tracking``): a runtime's resource stack is fixed when it
    is made, and each read through it runs Python properties. The last
    runtime's is also kept here, found without the runtime's ``__dict__``
    (and let go when the runtime dies)."""
    global _last_tracking
    last = _last_tracking
    if last is not None and last[2]() is rt:  # the last runtime asked about
        return last  # type: ignore[no-any-return]
    d: dict = rt.__dict__
    found = d.get("_nss_tracking")
    if found is None:
        tracker = rt.resource.tracker
        book = getattr(tracker, "marks", None)
        try:
            ref = weakref.ref(rt, _forget_tracking)
        except TypeError:  # a runtime that takes no weak reference: not kept here
            ref = None
        found = (book, None if book is None else tracker.lock, ref)
        d["_nss_tracking"] = found
    _last_tracking = found if found[2] is not None else None
    return found  # type: ignore[no-any-return]


@cython.cfunc
def _noted(rt: Any) -> tuple | None:
    """``(book, lock, ref)`` of ``rt``'s tracking resource (:func:`_tracking`)
    where the program's ordering is noted now (:func:`noting`), else None."""
    if rt.capture is not None:
        return None
    found: tuple = _tracking(rt)
    book = found[0]
    if book is None:
        return None
    observed = cython.cast(MarkBook, book).observed
    if observed is not None and observed.whole_process:
        return None
    return found


@cython.cfunc
def _caught_up(noted: tuple) -> Lock:
    """Take the lock of a tracking resource and apply what the driver
    observer noted since (``noted``: its ``(book, lock, ref)``, as :func:`_noted`
    gives it); the caller gives the lock back."""
    book: MarkBook = noted[0]
    lock: Lock = noted[1]
    lock.take()
    try:
        if book.observed is not None:
            book.catch_up()
    except BaseException:
        lock.give()
        raise
    return lock


@cython.cfunc
def _runtime() -> Any:
    """The runtime a call queued now runs on (``target.launch_runtime``; the
    sole one without a question asked)."""
    rt = RUNTIMES.sole
    if rt is None:
        from numba_streamsafe.numba import target

        rt = target.launch_runtime()
    return rt


@cython.ccall
def stream_ref(rt: Any, stream: Any) -> tuple:
    """``(handle, owner)`` of a stream as Numba's calls take it (0 or None: the
    default stream): the handle a launch cached on the stream object for
    ``rt``, else the runtime's answer (``DeviceRuntime.stream_ref``), cached
    on a stream object that carries its handle for the next call
    (:func:`cache_stream`)."""
    if not stream:
        return (default_stream_handle(), None)
    cached = getattr(stream, "_nss_stream", None)
    if type(cached) is tuple and cached[0] is rt:
        return (cached[1], stream)
    ref = rt.stream_ref(stream)
    if stream_handle(stream) is not None:
        # Not a stand-in that carries no handle (the simulator's streams): the
        # runtime made its stream, and refuses the object once that is destroyed.
        cache_stream(rt, ref[1], ref[0])
    return ref


@cython.ccall
def cache_stream(rt: Any, owner: Any, handle: Any) -> object:
    """Cache the stream object ``owner``'s ``handle`` on it for ``rt``, where a
    launch and :func:`stream_ref` find it (``_nss_stream``: a stream's handle
    is fixed for its life); nothing for None (a raw handle) or an object that
    takes no attributes."""
    if owner is None:
        return None
    cached = getattr(owner, "_nss_stream", None)
    if type(cached) is tuple and len(cached) == 2 and cached[0] is rt:
        return None
    try:
        owner._nss_stream = (rt, handle)
    except AttributeError:
        pass
    return None


@cython.ccall
def event_handle(event: Any) -> Any:
    """The driver handle of a Numba event, as an int: of a cuda-python
    ``CUevent``, or of a ``ctypes.c_void_p`` (older numba-cuda releases).
    Read once and kept in the event's :class:`EventState`: an event's handle
    is fixed for its life."""
    return _handle(_state(event), event)


@cython.cfunc
def _handle(st: EventState, event: Any) -> Any:
    """:func:`event_handle` of ``event``, whose state is ``st``."""
    found = st.handle
    if found is not None:
        return found
    handle = event.handle
    if isinstance(handle, ctypes.c_void_p):
        found = int(handle.value or 0)
    else:
        found = int(handle)
    st.handle = found
    return found


def record_hook(original: Callable[..., Any]) -> Callable[..., Any]:
    """Numba's ``Event.record`` (``original``) as transparent mode hooks it on
    a GPU: :func:`record` on the current runtime, the event recorded through
    libcuda on a stream of the program's, else by ``original``."""
    @cython.binding(True)  # a method of Numba's class: bound to the event
    def record_event_(self: Any, stream: Any = 0) -> None:
        rt = _runtime()
        handle = stream_ref(rt, stream)[0]
        st: EventState = _state(self)
        _record(rt, st, self, handle, _handle(st, self), handle > 2, original, (self, stream))
    record_event_.__doc__ = original.__doc__
    record_event_.__name__ = "record"
    return record_event_


def wait_hook(original: Callable[..., Any]) -> Callable[..., Any]:
    """Numba's ``Event.wait`` (``original``) as transparent mode hooks it on a
    GPU: :func:`wait` on the current runtime, the wait queued through libcuda
    on a stream of the program's, else by ``original``."""
    @cython.binding(True)  # a method of Numba's class: bound to the event
    def wait_event_(self: Any, stream: Any = 0) -> None:
        rt = _runtime()
        ref = stream_ref(rt, stream)
        handle = ref[0]
        st: EventState = _state(self)
        _wait(rt, st, handle, ref[1], _handle(st, self), handle > 2, original, (self, stream))
    wait_event_.__doc__ = original.__doc__
    wait_event_.__name__ = "wait"
    return wait_event_


@cython.cfunc
def _still_borrowing(rt: Any, known: Any, held: Any) -> Any:
    """The mark of ``rt`` that still borrows the event's earlier record (the
    point's mark ``held`` and the weak reference ``known`` to its runtime,
    None where no point was kept), or None. A mark of another runtime that
    still borrows it gets its own event here."""
    if held is None or cython.cast(Mark, held).borrow is None:
        return None
    other = known()
    if other is rt:
        return held
    if other is not None:
        other.resource.tracker.program_unborrow(held)
    return None


@cython.ccall
def record(rt: Any, event: Any, stream: Any, handle: Any, direct: cython.bint,
           fallback: Callable[..., Any], args: tuple) -> None:
    """The program records ``event`` (driver handle ``handle``) on stream
    ``stream`` of runtime ``rt``: the point is taken first (what is queued
    there so far, its mark closed and borrowing the event), then the event
    is recorded, through libcuda where ``direct``, else (or where libcuda
    refuses) by ``fallback(*args)``, both under the resource's lock (a use on
    another stream that needs the closed mark meanwhile waits for the lock,
    not for an event not yet recorded); the point is kept once the record
    succeeded. Any mark that borrowed the event's earlier record gets an
    event of its own first."""
    _record(rt, _state(event), event, stream, handle, direct, fallback, args)


@cython.cfunc
def _record(rt: Any, st: EventState, event: Any, stream: Any, handle: Any,
            direct: cython.bint, fallback: Callable[..., Any], args: tuple) -> None:
    """:func:`record` of ``event``, whose state is ``st``."""
    book: MarkBook
    lock: Lock
    elock: Lock = st.lock
    elock.take()
    try:
        # A mark still borrowing the event's earlier record (not let go since)
        # gets its own event before the record; under the same hold of the
        # resource's lock as the new point where it is this runtime's.
        known = st.point_rt
        held = st.point_mark
        st.point_rt = st.point_clock = st.point_mark = None  # gone even if the below fails
        held = _still_borrowing(rt, known, held)
        noted = _noted(rt)
        if noted is None:  # not noted: the record alone
            if held is not None:
                rt.resource.tracker.program_unborrow(held)
            if not direct or record_event(handle, stream) != 0:
                fallback(*args)
            return
        book = noted[0]
        lock = _caught_up(noted)
        try:
            if held is not None:
                book.unborrow(held)
            clock, mark = book.program_record(stream, (event, handle))
            try:
                if not direct or record_event(handle, stream) != 0:
                    fallback(*args)
            except BaseException:
                if mark is not None:  # its own event, in place of the one not recorded
                    try:
                        book.unborrow(mark)
                    except BaseException:
                        # Not recorded either: the mark borrows nothing, and gets
                        # an event of its own when a use next needs one.
                        cython.cast(Mark, mark).borrow = None
                raise
        finally:
            lock.give()
        # The runtime's own weak reference (_tracking), made once with its tuple.
        st.point_rt = noted[2] if noted[2] is not None else weakref.ref(rt)
        st.point_clock = clock
        st.point_mark = mark
    finally:
        elock.give()


@cython.ccall
def wait(rt: Any, event: Any, stream: Any, owner: Any, handle: Any, direct: cython.bint,
         fallback: Callable[..., Any], args: tuple) -> None:
    """The program makes ``stream`` (of object ``owner``) wait for ``event``
    (driver handle ``handle``), through libcuda where ``direct``, else (or
    where libcuda refuses) by ``fallback(*args)``: once that succeeded, the
    stream is ordered after the event's point."""
    _wait(rt, _state(event), stream, owner, handle, direct, fallback, args)


@cython.cfunc
def _wait(rt: Any, st: EventState, stream: Any, owner: Any, handle: Any, direct: cython.bint,
          fallback: Callable[..., Any], args: tuple) -> None:
    """:func:`wait` for the event whose state is ``st``."""
    book: MarkBook
    lock: Lock
    elock: Lock = st.lock
    elock.take()
    try:
        known = st.point_rt
        clock = st.point_clock
        if not direct or wait_event(stream, handle) != 0:
            fallback(*args)
        if known is None or known() is not rt:
            return
        noted = _noted(rt)
        if noted is None:
            return
        book = noted[0]
        lock = _caught_up(noted)
        try:
            # The knowledge lasts while the stream's object does, where it owns
            # the handle; a wrapper of one made elsewhere may die with the stream alive.
            book.program_waited(stream, clock, owner if owns_handle(owner) else None)
        finally:
            lock.give()
    finally:
        elock.give()


@cython.ccall
def completed(event: Any, synchronize: Callable[..., Any], args: tuple = ()) -> object:
    """``synchronize(*args)`` waits on the host for ``event`` (or, a query,
    tells whether it completed): when it returns anything but False, the
    event's point is complete. Its result is returned. Under the event's lock,
    so a record of the event by another thread meanwhile cannot be taken for
    it."""
    book: MarkBook
    lock: Lock
    st: EventState = _state(event)
    elock: Lock = st.lock
    elock.take()
    try:
        known = st.point_rt
        clock = st.point_clock
        done = synchronize(*args)
        rt = known() if known is not None else None
        if done is not False and rt is not None:
            noted = _noted(rt)
            if noted is not None:
                book = noted[0]
                lock = _caught_up(noted)
                try:
                    book.program_completed(clock)
                finally:
                    lock.give()
        return done
    finally:
        elock.give()


@cython.ccall
def synchronised(rt: Any, stream: Any, synchronize: Callable[..., Any],
                 args: tuple = ()) -> object:
    """``synchronize(*args)`` waits on the host for stream ``stream`` of
    runtime ``rt``: complete up to now. The stream's open mark is closed
    first with no event (``MarkBook.program_record`` with ``AT_SYNC``: the
    host is about to see its work complete); if the synchronise fails, the
    mark gets its event. The mark book is called under the resource's lock,
    as :func:`record` calls it."""
    book: MarkBook
    lock: Lock
    noted = _noted(rt)
    if noted is None:
        synchronize(*args)
        return None
    book = noted[0]
    lock = _caught_up(noted)
    try:
        clock, mark = book.program_record(stream, AT_SYNC)
    finally:
        lock.give()
    try:
        synchronize(*args)
    except BaseException:
        if mark is not None:  # not seen complete: the mark gets its event
            try:
                rt.resource.tracker.program_unborrow(mark)
            except BaseException:
                pass  # not recorded either (a sticky error): a use that needs it records it
        raise
    lock = _caught_up(noted)
    try:
        book.program_completed(clock, stream)
    finally:
        lock.give()
    return None


def stream_synchronize_hook(original: Callable[..., Any]) -> Callable[..., Any]:
    """Numba's ``Stream.synchronize`` (``original``) as transparent mode hooks
    it on a GPU: :func:`synchronised` on the current runtime around it."""
    @cython.binding(True)  # a method of Numba's class: bound to the stream
    def synchronize_stream_(self: Any) -> None:
        rt = _runtime()
        synchronised(rt, stream_ref(rt, self)[0], original, (self,))
    synchronize_stream_.__doc__ = original.__doc__
    synchronize_stream_.__name__ = "synchronize"
    return synchronize_stream_


def event_completed_hook(original: Callable[..., Any]) -> Callable[..., Any]:
    """Numba's ``Event.synchronize`` or ``Event.query`` (``original``) as
    transparent mode hooks it on a GPU: :func:`completed` around it."""
    @cython.binding(True)  # a method of Numba's class: bound to the event
    def event_completed_(self: Any) -> Any:
        return completed(self, original, (self,))
    event_completed_.__doc__ = original.__doc__
    event_completed_.__name__ = original.__name__
    return event_completed_


def device_synchronised(rt: Any, synchronize: Callable[[], Any]) -> None:
    """``synchronize()`` waits on the host for ``rt``'s device (None: no
    runtime is installed there): complete up to now."""
    if rt is None or not noting(rt):
        synchronize()
        return
    tracker = rt.resource.tracker
    point = tracker.program_point_all()
    synchronize()
    tracker.program_completed_all(point)
