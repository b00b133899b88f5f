"""Other code's CUDA calls, applied to a tracking resource's state.

The driver observer (:mod:`numba_streamsafe._driver.observer`, CUPTI's
callbacks) notes every event record and wait, every synchronise, every
one-dimensional copy and fill and every stream created or destroyed on a
context, whoever makes them; the simulated driver's stand-in
(:class:`~numba_streamsafe._driver.sim_observer.SimObserver`) notes the calls
made through it. :class:`ObservedCalls` drains those notes under the
resource's lock before each decision (``MarkBook.catch_up``) and tells the
mark book what they order, as transparent mode's hooks tell it Numba's own:

* an event record takes a point of the program on its stream
  (``MarkBook.program_clock``), kept by the event's handle; a wait for the
  event orders its stream after that point, a synchronise or a query that
  found it complete makes the point complete for the host;
* a stream or device synchronise makes what was queued so far complete;
* a copy or fill that touches a block of the resource is a use of it on its
  stream: in check mode checked like a Numba copy (a race is reported, with
  the API's name and the caller's line where its stack was kept), in ordering
  mode recorded so that later uses on other streams wait for it;
* a stream destroyed ends its history (a new stream with its handle inherits
  nothing), and its stream creator is kept for the reports.

The resource's own event records and waits (its pool's events) are left out,
and its own copies are not noted (``observer.quiet``).
"""

from __future__ import annotations

from typing import Any

from numba_streamsafe._driver import observer
from numba_streamsafe.core.access import Access
from numba_streamsafe.core.sites import user_frames
from numba_streamsafe.core.streams import note_stream_created, stream_origin
from numba_streamsafe.resources.tracking import rules

__all__ = ["ObservedCalls"]

_READ = int(Access.READ)
_WRITE = int(Access.WRITE)


class ObservedCalls:
    """The calls ``source`` noted on one context, applied to a resource.

    Parameters
    ----------
    book : MarkBook
        The resource's mark book (its program clocks, checks and races).
    table : BlockTable
        The resource's live blocks (a copy's addresses are looked up there).
    pool : EventPool
        The resource's events: those of every pool on its driver
        (``EventPool.owned``) are the library's own, whose records and waits
        are not noted.
    source : object
        Has ``pending()`` (a cheap look) and ``drain()`` (the records since
        the last drain, oldest first, each
        ``(kind, cbid, stream, event, dst, src, bytes, flags, thread, stack)``
        as :class:`numba_streamsafe._driver.observer.Slot` gives them) and
        ``lost`` (records dropped, never seen).
    whole_process : bool
        The source sees every call of the process, Numba's own included (the
        driver observer): the Numba layer then leaves Numba's events and
        synchronises to it instead of hooking them.
    ended : callable
        ``ended(stream)``: another library destroyed ``stream``; the resource
        moves what it keeps on it (blocks allocated there, frees queued or
        kept there) off it, since no call may name it any more.

    Notes
    -----
    Every method is called with the resource's lock held.
    """

    def __init__(self, book: Any, table: Any, pool: Any, source: Any,
                 whole_process: bool, ended: Any) -> None:
        self.book = book
        self.ended = ended
        self.table = table
        self.pool = pool
        self.source = source
        self.whole_process = whole_process
        #: The clock of each event's last record (by handle), until it is destroyed.
        self.clocks: dict[int, dict[Any, int]] = {}
        #: Records applied, and copies or fills found to touch a block.
        self.applied = 0
        self.uses = 0
        #: Inside :meth:`catch_up_locked` (a copy's check drains no newer records
        #: before the older ones are applied).
        self._applying = False

    @property
    def lost(self) -> int:
        """Records the source dropped (its buffer was full): their ordering is unknown."""
        return int(getattr(self.source, "lost", 0))

    def catch_up_locked(self) -> None:
        """Apply the records noted since the last call, oldest first."""
        source = self.source
        if self._applying or not source.pending():
            return
        self._applying = True
        try:
            for record in source.drain():
                self.apply(record)
        finally:
            self._applying = False

    def apply(self, record: tuple[Any, ...]) -> None:
        """Apply one record (see the class's ``source``)."""
        kind, cbid, stream, event, dst, src, nbytes, flags, _thread, stack = record
        self.applied += 1
        if kind in (observer.COPY, observer.MEMSET):
            self._use(kind, cbid, stream, dst, src, nbytes, flags, stack)
        elif kind == observer.STREAM_CREATED:
            self._created(stream, stack)
            self._forget(stream)
        elif kind == observer.STREAM_DESTROYED:
            if stream > 2:
                self.book.ending(stream, False)  # gone already: its kind as read before
                self.ended(stream)
            self._forget(stream)
        elif kind == observer.EVENT_DESTROY:
            self.clocks.pop(event, None)
        elif event not in self.pool.owned:  # the library's own records and waits: not noted
            self._order(kind, stream, event)

    def _order(self, kind: int, stream: int, event: int) -> None:
        """An event record or wait, or a synchronise: what it orders."""
        book = self.book
        if kind == observer.EVENT_RECORD:
            self.clocks[event] = book.program_clock(stream)
        elif kind == observer.STREAM_WAIT:
            clock = self.clocks.get(event)
            if clock is not None:
                book.program_waited(stream, clock, None)
        elif kind == observer.STREAM_SYNC:
            _stream_synchronised(book, stream)
        elif kind in (observer.EVENT_SYNC, observer.EVENT_QUERY):
            clock = self.clocks.get(event)
            if clock is not None:
                book.program_completed(clock)
        elif kind == observer.CTX_SYNC:
            book.program_completed_all(book.program_point_all())

    def _created(self, stream: int, stack: Any) -> None:
        """Who made ``stream``, for the reports: the library whose frames the
        creator's stack shows innermost, where it was kept (else not known),
        and the user's line. Numba's own streams are noted as they are made."""
        known = stream_origin(stream)
        if known is not None and known.library == "numba":
            return  # noted by the Numba layer when it was made (this is that creation)
        note_stream_created(stream, _library_of(stack) or "another library",
                            user_frames(stack))

    def _forget(self, stream: int) -> None:
        """A stream with handle ``stream`` ended or began: a later stream with
        the handle inherits none of its history."""
        if stream <= 2:
            return
        held = self.table.forget_stream(stream)
        self.book.forget_order(stream, held != 0)

    def _use(self, kind: int, cbid: int, stream: int, dst: int, src: int, nbytes: int,
             flags: int, stack: Any) -> None:
        """A copy or fill on ``stream``: a write of ``dst`` and a read of
        ``src`` where they are blocks of the resource, checked (check mode) and
        recorded like the library's own copies; a synchronous one also orders
        the host (``flags``)."""
        book = self.book
        if flags & observer.SYNC_BEFORE:
            _stream_synchronised(book, stream)
        uses = []
        if nbytes > 0:
            for ptr, access in ((dst, _WRITE), (src, _READ if kind == observer.COPY else 0)):
                block = self.table.find(ptr) if ptr and access else None
                if block is not None:
                    lo = ptr - block.ptr
                    uses.append((block, access, lo, min(lo + nbytes, block.nbytes)))
        if uses:
            self.uses += 1
            entries = rules.resolve(self.table, uses, "a copy of another library")
            name = cbid if isinstance(cbid, str) else observer.callback_name(cbid)
            library = _library_of(stack)
            what = (f"{name} ({library or 'not Numba'})", user_frames(stack), None, library)
            rules.preflight_locked(book, entries, stream, None, False, what, True)
            rules.commit_locked(book, entries, stream, None, False, False, None, what)
        if flags & observer.SYNC_AFTER:
            _stream_synchronised(book, stream)


def _stream_synchronised(book: Any, stream: int) -> None:
    """The host waited for ``stream`` (another library's synchronise, or its
    synchronous copy), noted after the fact: complete up to now."""
    book.program_completed(book.program_clock(stream), stream)


def _library_of(frames: Any) -> str | None:
    """The installed package whose frames are innermost in ``frames`` (a
    caller's stack as the observer keeps it: ``(code or file name, line)``),
    say ``"torch"``; None where the innermost frames are the user's (a library
    called from compiled code makes no frame of its own) or none were kept."""
    if not frames:
        return None
    for code, _line in frames:
        name = getattr(code, "co_filename", code)
        for marker in ("site-packages", "dist-packages"):
            at = name.find(marker)
            if at >= 0:
                rest = name[at + len(marker) + 1:].replace("\\", "/").split("/")
                if rest and rest[0] and not rest[0].startswith("numba"):
                    return rest[0].removesuffix(".py")
                break
        else:
            return None
    return None
