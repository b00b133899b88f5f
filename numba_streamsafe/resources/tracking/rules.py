"""The tracking rules: a live block's dependency state (:class:`Entry`, by
byte range: :class:`Span`) and the decisions of every tracked use: which
marks it waits for before the work (:func:`preflight_locked`) and what it
records after (:func:`commit_locked`).

A use names the bytes it may touch as ``lo .. hi - 1``, offsets into its
block (a view's span: from its lowest to one past its highest byte, the
whole extent of a strided or reversed view). Two uses conflict only where
their spans share a byte and one of them writes.

Part of the engine (:mod:`numba_streamsafe.compiled`), written in Cython's
pure-Python mode (C declarations in ``rules.pxd``): compiled where a
compiler is present, run as it is where none is.
"""

from __future__ import annotations

from typing import Any

import cython

from numba_streamsafe.resources.tracking.marks import Mark, MarkBook, current_work, drop_waiter

__all__ = ["Entry", "Span", "MAX_SPANS", "resolve", "needed_locked", "preflight_locked",
           "commit_locked", "COMPILED"]

#: Whether this module runs compiled (else it runs as Python source).
COMPILED: bool = cython.compiled

_WRITE = cython.declare(cython.int, 2)  # Access.WRITE

#: The most ranges a block's entry keeps apart. Past it, neighbouring ranges
#: merge into one that keeps the marks of both: a later use of either waits
#: for what a use of both would (more waits, never fewer).
MAX_SPANS: int = 64
_MAX_SPANS = cython.declare(cython.Py_ssize_t, 64)


# ----------------------------------------------------------------------- spans
@cython.cclass
class Span:
    """The dependency state of the bytes ``lo .. hi - 1`` of a block: the
    marks of the writes a use must wait for (one per stream; one mark, of the
    last write, unless neighbouring ranges were merged) and, per stream, the
    mark of its newest read since. Each mark held counts one use of it
    (``MarkBook.hold``). ``scanned`` is the book's ``completions`` when the
    reads were last scanned for complete ones (:func:`_note_read`). Only
    :class:`Entry` changes a span."""

    def __init__(self, lo: cython.Py_ssize_t, hi: cython.Py_ssize_t, writes: dict,
                 reads: dict) -> None:
        self.lo = lo
        self.hi = hi
        self.writes = writes
        self.reads = reads
        self.scanned = 0

    def __repr__(self) -> str:
        return (f"<Span {self.lo}..{self.hi} writes={sorted(self.writes)} "
                f"reads={sorted(self.reads)}>")


@cython.cfunc
@cython.exceptval(-1)
def _hold_all(book: MarkBook, marks: dict) -> cython.int:
    """One more use of every mark of ``marks`` (a copy of a span's dict)."""
    for mark in marks.values():
        book.hold(mark)
    return 0


@cython.cfunc
@cython.exceptval(-1)
def _release_all(book: MarkBook, marks: dict) -> cython.int:
    """Drop the uses ``marks`` hold."""
    for mark in marks.values():
        book.release(mark)
    return 0


@cython.cfunc
@cython.exceptval(-1)
def _join(book: MarkBook, into: dict, other: dict) -> cython.int:
    """``into`` holds, per stream, the newer mark of its own and ``other``'s;
    the uses of the marks left out are dropped (``other`` is consumed)."""
    m: Mark
    cur: Mark
    for stream, mark in other.items():
        m = mark
        found = into.get(stream)
        if found is None:
            into[stream] = m
            continue
        cur = found
        if cur is m:
            book.release(m)
        elif m.seq > cur.seq:
            into[stream] = m
            book.release(cur)
        else:
            book.release(m)
    return 0


@cython.cfunc
@cython.exceptval(-1)
def _all_complete(book: MarkBook, marks: dict) -> cython.int:
    """1 when the host saw every mark of ``marks`` complete, else 0."""
    for mark in marks.values():
        if not book.complete(mark):
            return 0
    return 1


@cython.cfunc
def _others(marks: dict, stream: Any, out: list | None) -> list | None:
    """Append the marks of ``marks`` that are not of ``stream`` to ``out``
    (made when None and one is needed) and return it."""
    for s, mark in marks.items():
        if s != stream:
            if out is None:
                out = [mark]
            else:
                out.append(mark)
    return out


# --------------------------------------------------------------------- entries
@cython.cclass
class Entry:
    """Dependency state of one live block.

    While every use covered the whole block (the common case) the state is
    uniform: the mark of its last write (first, of its allocation) and, per
    stream, the mark of its newest read since that write (a later mark on a
    stream covers the earlier ones); ``spans`` is None. A use of part of the
    block splits the state into :class:`Span` s, sorted and covering the
    block; neighbours with the same marks join again, a write of the whole
    block makes it uniform again, and at most :data:`MAX_SPANS` are kept.

    ``size`` is the block's size as a Python int, ``nbytes`` the same as a
    C integer. ``scanned``: as :class:`Span`'s, for the uniform state's
    reads. ``gone`` is set when the entry leaves its table (the block freed,
    released, replaced at its address, or the table cleared): whoever holds
    the entry can tell without a lookup. Only this module changes an entry's
    state; callers hold the resource's lock.
    """

    def __init__(self, block: Any, ready: Mark) -> None:
        self.block = block
        self.size = block.nbytes
        self.nbytes = block.nbytes
        self.last_write = ready
        self.reads = {}
        self.scanned = 0
        self.spans = None
        self.gone = False

    def waits_for(self, stream: Any, access: cython.int, lo: cython.Py_ssize_t = 0,
                  hi: cython.Py_ssize_t = -1) -> list:
        """Marks of other streams that ``access`` on ``stream`` to the bytes
        ``lo .. hi - 1`` (default: the whole block) must wait for."""
        out = _waits(self, stream, access, lo, self.nbytes if hi < 0 else hi, None, None)
        return [] if out is None else out

    def idle(self, book: MarkBook) -> bool:
        """Whether the host saw every use the entry holds complete
        (``MarkBook.complete``): no stream, of this device or another, need
        wait for any of them."""
        span: Span
        if self.spans is None:
            if not book.complete(self.last_write):
                return False
            return _all_complete(book, self.reads)
        for s in self.spans:
            span = s
            if not _all_complete(book, span.writes) or not _all_complete(book, span.reads):
                return False
        return True

    def only_on(self, stream: Any) -> bool:
        """Whether every use the entry holds is of ``stream`` (a use there, a
        free say, then waits for nothing)."""
        span: Span
        if self.spans is None:
            if self.last_write.stream != stream:
                return False
            return _only(self.reads, stream)
        for s in self.spans:
            span = s
            if not _only(span.writes, stream) or not _only(span.reads, stream):
                return False
        return True

    def uses(self) -> tuple:
        """Diagnostics: ``((lo, hi, {stream: write mark}, {stream: read mark}), ...)``,
        one item per range (one for a uniform entry)."""
        span: Span
        if self.spans is None:
            return ((0, self.nbytes, {self.last_write.stream: self.last_write},
                     dict(self.reads)),)
        out = []
        for s in self.spans:
            span = s
            out.append((span.lo, span.hi, dict(span.writes), dict(span.reads)))
        return tuple(out)

    def newest(self) -> tuple:
        """Diagnostics: ``(write mark, {stream: read mark})``: the newest write
        mark of any range and each stream's newest read mark (a uniform
        entry's last write and reads)."""
        span: Span
        if self.spans is None:
            return self.last_write, dict(self.reads)
        last = None
        reads: dict = {}
        for s in self.spans:
            span = s
            for mark in span.writes.values():
                if last is None or cython.cast(Mark, mark).seq > cython.cast(Mark, last).seq:
                    last = mark
            for stream, mark in span.reads.items():
                found = reads.get(stream)
                if found is None or cython.cast(Mark, mark).seq > cython.cast(Mark, found).seq:
                    reads[stream] = mark
        return last, reads

    def release(self, marks: MarkBook) -> None:
        """Drop the entry's uses of its marks (the block is gone)."""
        span: Span
        if self.spans is None:
            marks.release(self.last_write)
            if self.reads:
                _release_all(marks, self.reads)
                self.reads = {}
            return
        for s in self.spans:
            span = s
            _release_all(marks, span.writes)
            _release_all(marks, span.reads)
        self.spans = None
        self.reads = {}

    def forget_stream(self, stream: Any, tomb: Any) -> int:
        """Rename ``stream`` to ``tomb`` in the marks and reads the entry holds
        and drop it from those marks' waiters (the stream's history ends).
        Returns how many of the entry's uses were the stream's."""
        span: Span
        n: cython.int = 0
        if self.spans is None:
            m: Mark = self.last_write
            if m.stream == stream:
                m.stream = tomb
                n = 1
            drop_waiter(m, stream)
            return n + _forget(self.reads, stream, tomb)
        for s in self.spans:
            span = s
            n += _forget(span.writes, stream, tomb)
            n += _forget(span.reads, stream, tomb)
        return n


@cython.cfunc
def _only(marks: dict, stream: Any) -> cython.bint:
    for s in marks:
        if s != stream:
            return False
    return True


@cython.cfunc
@cython.exceptval(-1)
def _forget(marks: dict, stream: Any, tomb: Any) -> cython.int:
    """:meth:`Entry.forget_stream` over one dict of marks; 1 if it held the
    stream's mark, else 0."""
    m: Mark
    n: cython.int = 0
    found = marks.pop(stream, None)
    if found is not None:
        m = found
        m.stream = tomb
        marks[tomb] = m
        n = 1
    for mark in marks.values():
        drop_waiter(mark, stream)
    return n


# ------------------------------------------------------------------- the rules
@cython.cfunc
def _waits(entry: Entry, stream: Any, access: cython.int, lo: cython.Py_ssize_t,
           hi: cython.Py_ssize_t, marks: list | None, book: MarkBook | None) -> list | None:
    """The rule: a use of the bytes ``lo .. hi - 1`` of ``entry``'s block on
    ``stream`` waits for the writes of those bytes on other streams, and a
    write also for their reads on other streams. Appends those marks to
    ``marks`` (made when None and one is needed) and returns it. With
    ``book``, a use of bytes last written on ``stream`` alone counts in
    ``book.same_stream``."""
    if lo >= hi:
        return marks  # touches no byte
    if entry.spans is None:
        return _uniform_waits(entry, stream, access, marks, book)
    return _span_waits(entry.spans, stream, access, lo, hi, marks, book)


@cython.cfunc
@cython.inline
def _uniform_waits(entry: Entry, stream: Any, access: cython.int, marks: list | None,
                   book: MarkBook | None) -> list | None:
    """:func:`_waits` of an entry whose bytes share one state (every byte a
    use may touch has it)."""
    lw = entry.last_write
    if lw.stream != stream:
        if book is not None and book.done_at_sync(lw):
            pass  # ordered already, as MarkBook.ordered_already would decide it
        elif marks is None:
            marks = [lw]
        else:
            marks.append(lw)
    elif book is not None:
        book.same_stream += 1
    if access & _WRITE and entry.reads:
        marks = _others(entry.reads, stream, marks)
    return marks


@cython.cfunc
def _span_waits(spans: list, stream: Any, access: cython.int, lo: cython.Py_ssize_t,
                hi: cython.Py_ssize_t, marks: list | None, book: MarkBook | None) -> list | None:
    """:func:`_waits` over the ranges of a split entry that ``lo .. hi - 1``
    (not empty) meets."""
    span: Span
    n: cython.Py_ssize_t
    same: cython.bint = True
    for s in spans:
        span = s
        if span.hi <= lo:
            continue
        if span.lo >= hi:
            break
        n = 0 if marks is None else len(marks)
        marks = _others(span.writes, stream, marks)
        if marks is not None and len(marks) != n:
            same = False
        if access & _WRITE and span.reads:
            marks = _others(span.reads, stream, marks)
    if book is not None and same:
        book.same_stream += 1
    return marks


def resolve(table: Any, uses: Any, what: str) -> list:
    """The validated entries of ``uses`` (``(block, access)`` pairs for the
    whole block, or ``(block, access, lo, hi)`` for its bytes ``lo .. hi - 1``),
    flattened as ``[entry, access, lo, hi, ...]`` with the span clipped to
    the block; ``table.entry(block, what)`` decides (and raises) for a block
    that is not the live one at its address. A use of no bytes (an empty
    view) is validated and left out: it waits for nothing and records
    nothing. Caller holds the resource's lock."""
    live: dict = table.live
    out = []
    entry: Entry  # a typed binding, not a cast: free where the module runs as Python
    for use in uses:
        block = use[0]
        found = live.get(block.ptr)
        if found is None:
            entry = table.entry(block, what)
        else:
            entry = found
            if entry.block is not block:
                entry = table.entry(block, what)
        if len(use) > 2:
            lo = max(use[2], 0)
            hi = min(use[3], entry.nbytes)
            if lo >= hi:
                continue
        else:  # the whole block (Python ints as they are: no new objects)
            lo = 0
            hi = entry.size
        out.append(entry)
        out.append(int(use[1]))
        out.append(lo)
        out.append(hi)
    return out


def needed_locked(entries: list, stream: Any) -> list:
    """The marks ``entries`` (from :func:`resolve`) on ``stream`` wait for,
    as :func:`preflight_locked` decides them, without queuing anything
    (a mark may be named more than once). Caller holds the resource's lock."""
    marks = None
    i: cython.Py_ssize_t
    for i in range(0, len(entries), 4):
        marks = _waits(entries[i], stream, entries[i + 1], entries[i + 2], entries[i + 3], marks,
                       None)
    return [] if marks is None else marks


def preflight_locked(book: MarkBook, entries: list, stream: Any, owner: Any,
                     direct: cython.bint = False, what: Any = None,
                     queued: cython.bint = False) -> cython.Py_ssize_t:
    """Queue on ``stream`` the waits that ``entries`` (from :func:`resolve`)
    need: a use waits for the writes of its bytes on other streams, and a
    write also for their reads on other streams. Same-stream uses never
    wait. Returns how many uses touched bytes last written on the launch
    stream alone (also counted in ``book.same_stream``). Caller holds the
    resource's lock.

    In check mode (``book.checking``) nothing is queued: each mark the rule
    names is verified instead (one the program's own ordering does not cover
    is a race of the work ``what``, by default the thread's ``current_work``).
    While a race check watches an ordering book (``book.reporting``) the
    waits are queued and each wait the program's ordering did not make
    needed is kept as such a race too (``MarkBook.reportable``).

    With ``queued`` the work was queued already (another library's copy, as
    the driver observer noted it): no wait can order it any more, so none
    is queued, and in check mode a mark it needs that only the library's own
    wait would have ordered (new memory's) is a race too."""
    entry: Entry
    marks = None
    if book.observed is not None:  # what other code did first (the driver observer)
        book.catch_up()
    before: cython.Py_ssize_t = book.same_stream
    n: cython.Py_ssize_t = len(entries)
    i: cython.Py_ssize_t
    if book.checking:
        _verify_locked(book, entries, stream, owner, current_work() if what is None else what,
                       queued)
        return book.same_stream - before
    if book.reporting:
        _verify_locked(book, entries, stream, owner, current_work() if what is None else what,
                       queued)
    if queued:
        return book.same_stream - before
    for i in range(0, n, 4):
        entry = entries[i]
        if entry.spans is None:  # _waits's dispatch, without reading the span it ignores
            marks = _uniform_waits(entry, stream, entries[i + 1], marks, book)
        else:
            marks = _waits(entry, stream, entries[i + 1], entries[i + 2], entries[i + 3], marks,
                           book)
    if marks is not None:
        book.wait_all(stream, marks, owner, False, direct)
    return book.same_stream - before


def commit_locked(book: MarkBook, entries: list, stream: Any, owner: Any,
                  eager: cython.bint, direct: cython.bint = False, into: Mark | None = None,
                  what: Any = None) -> None:
    """Record ``entries`` (from :func:`resolve`) on ``stream``'s open mark (or
    on ``into``: another device's use, sealed already): a write becomes the
    last write of its bytes and ends their reads; a read becomes their read
    on ``stream``. With ``eager`` the mark's event is recorded now. In check
    mode the mark notes the work ``what`` (by default the thread's
    ``current_work``) with ``entries`` (``Mark.seen``).
    Caller holds the resource's lock."""
    entry: Entry
    mark: Mark
    if not entries:
        return
    if book.observed is not None:  # what other code did first (the driver observer)
        book.catch_up()
    mark = book.current(stream, owner) if into is None else into
    n: cython.Py_ssize_t = len(entries)
    i: cython.Py_ssize_t
    lo: cython.Py_ssize_t
    hi: cython.Py_ssize_t
    for i in range(0, n, 4):
        entry = entries[i]
        access: cython.int = entries[i + 1]
        lo = entries[i + 2]
        hi = entries[i + 3]
        if entry.spans is None and lo <= 0 and hi >= entry.nbytes:
            _record_whole(book, entry, mark, stream, access)
        elif lo < hi:
            _record_span(book, entry, mark, stream, access, lo, hi)
    if (book.checking or book.reporting) and into is None:
        _note_locked(mark, entries, current_work() if what is None else what)
    if eager:
        book.seal(mark, direct)


@cython.cfunc
@cython.exceptval(-1)
def _note_locked(mark: Mark, entries: list, what: Any) -> cython.int:
    """``mark``'s uses ``entries`` were the work ``what`` (check mode, or a
    race check watching), kept for a later report: ``(entries, what)`` is
    appended to ``mark.seen``, newest last. A report reads the works back
    (:func:`~numba_streamsafe.resources.races.describe`); nothing is decided
    here, which keeps a launch to one tuple and one append (a work with the
    same uses as the last replaces it). Past :data:`_MAX_SEEN` works the
    list is compacted (:func:`_compact`)."""
    seen: list = mark.seen
    if seen is None:
        seen = mark.seen = []
    elif seen and cython.cast(tuple, seen[-1])[0] == entries:
        seen[-1] = (entries, what)  # the same uses again (a loop): the newer is the one named
        return 0
    seen.append((entries, what))
    if len(seen) > _MAX_SEEN:
        _compact(seen)
    return 0


#: Works a mark keeps for the reports before they are compacted.
_MAX_SEEN = cython.declare(cython.Py_ssize_t, 512)


@cython.cfunc
@cython.exceptval(-1)
def _compact(seen: list) -> cython.int:
    """Keep of a mark's works only those a report can name: per block entry,
    range and kind of access (read or write) the newest use, of blocks not
    freed (a report names, per range, the last write and the reads after
    it, so an older use of the same range and kind is never named). Past
    half of :data:`_MAX_SEEN` works still, the oldest are dropped (a report
    then names the work less precisely)."""
    entry: Entry
    named: set = set()
    kept: list = []
    i: cython.Py_ssize_t
    for k in range(len(seen) - 1, -1, -1):  # newest first
        work = seen[k]
        entries: list = work[0]
        new: cython.bint = False
        for i in range(0, len(entries), 4):
            entry = entries[i]
            if entry.gone:
                continue
            key = (entry, entries[i + 2], entries[i + 3], entries[i + 1] & _WRITE)
            if key not in named:
                named.add(key)
                new = True
        if new:
            kept.append(work)
    kept.reverse()
    if len(kept) > _MAX_SEEN // 2:
        del kept[:len(kept) - _MAX_SEEN // 2]
    seen[:] = kept
    return 0


@cython.cfunc
@cython.exceptval(-1)
def _verify_locked(book: MarkBook, entries: list, stream: Any, owner: Any, what: Any,
                   queued: cython.bint) -> cython.int:
    """Every mark :func:`_waits` names for ``entries`` on ``stream``, once,
    handed to ``MarkBook.verify`` with the work ``what``: check mode's
    preflight (a race, or new memory's wait), or a watched ordering book's
    reports (the waits are queued after, as always; which races were
    conflicting uses of the program, not say the allocation of new memory,
    the report decides from the marks' notes)."""
    entry: Entry
    n: cython.Py_ssize_t = len(entries)
    i: cython.Py_ssize_t
    counted = book if book.checking else None  # ordering mode counts its own preflight's
    book.legacy_use(stream)  # on the legacy stream: after every blocking stream's work
    for i in range(0, n, 4):
        entry = entries[i]
        marks = _waits(entry, stream, entries[i + 1], entries[i + 2], entries[i + 3], None,
                       counted)
        if marks is not None:
            where = (entry.block, entries[i + 1], entries[i + 2], entries[i + 3], False)
            for k, m in enumerate(marks):
                if m not in marks[:k]:
                    book.verify(stream, m, owner, where, what, queued)
    return 0


@cython.cfunc
@cython.inline
@cython.exceptval(-1)
def _record_whole(book: MarkBook, entry: Entry, mark: Mark, stream: Any,
                  access: cython.int) -> cython.int:
    """A use of the whole block whose state is uniform."""
    if access & _WRITE:
        lw = entry.last_write
        if lw is not mark:
            book.hold(mark)
            book.release(lw)
            entry.last_write = mark
        if entry.reads:
            _release_all(book, entry.reads)
            entry.reads = {}
    else:
        entry.scanned = _note_read(book, entry.reads, stream, mark, entry.scanned)
    return 0


@cython.cfunc
@cython.inline
@cython.exceptval(-1)
def _note_read(book: MarkBook, reads: dict, stream: Any, mark: Mark,
               scanned: cython.longlong) -> cython.longlong:
    """``mark`` becomes the read of ``stream`` in ``reads``: it covers the
    stream's earlier read, whose use ends (a stream that read before keeps
    its place: the dict is not reordered). Where the host saw work complete
    since ``reads`` were last scanned (``scanned``, against the book's
    ``completions``), every read it saw complete is dropped first
    (:func:`_drop_complete`): a block that stream after stream reads keeps
    the reads of the streams since the host last waited, not one per stream
    ever made (whose objects the marks would keep alive), and a program that
    never waits pays no scan. Returns the new ``scanned``."""
    prev: Mark
    earlier = reads.get(stream)
    if earlier is mark:
        return scanned
    if reads and scanned != book.completions:
        _drop_complete(book, reads)
        scanned = book.completions
        earlier = reads.get(stream)  # dropped with the others if complete
    reads[stream] = mark
    book.hold(mark)
    if earlier is not None:
        prev = earlier
        book.release(prev)
    return scanned


@cython.cfunc
@cython.exceptval(-1)
def _drop_complete(book: MarkBook, reads: dict) -> cython.int:
    """Drop the reads of ``reads`` whose work the host saw complete
    (``MarkBook.complete``): no later write waits for them."""
    m: Mark
    done = None
    for stream, mark in reads.items():
        if book.complete(mark):
            if done is None:
                done = [stream]
            else:
                done.append(stream)
    if done is not None:
        for stream in done:
            m = reads.pop(stream)
            book.release(m)
    return 0


@cython.cfunc
@cython.exceptval(-1)
def _record_span(book: MarkBook, entry: Entry, mark: Mark, stream: Any, access: cython.int,
                 lo: cython.Py_ssize_t, hi: cython.Py_ssize_t) -> cython.int:
    """A use of the bytes ``lo .. hi - 1`` (not empty), or of the whole block
    whose state is split."""
    span: Span
    if access & _WRITE and lo <= 0 and hi >= entry.nbytes:
        # A write of the whole block orders every range before it.
        book.hold(mark)
        entry.release(book)
        entry.last_write = mark
        return 0
    if entry.spans is None:
        entry.spans = [Span(0, entry.nbytes, {entry.last_write.stream: entry.last_write},
                            entry.reads)]
        entry.last_write = None
        entry.reads = {}
    spans: list = entry.spans
    first: cython.Py_ssize_t = _split(book, spans, lo)
    end: cython.Py_ssize_t = _split(book, spans, hi)
    k: cython.Py_ssize_t
    if end == first + 1:  # one range, used again as it was last: nothing changes
        span = spans[first]
        if access & _WRITE:
            if not span.reads and len(span.writes) == 1 and span.writes.get(stream) is mark:
                return 0
        elif span.reads.get(stream) is mark:
            return 0
    for k in range(first, end):
        span = spans[k]
        if access & _WRITE:
            book.hold(mark)
            _release_all(book, span.writes)
            _release_all(book, span.reads)
            span.writes = {stream: mark}
            span.reads = {}
        else:
            span.scanned = _note_read(book, span.reads, stream, mark, span.scanned)
    _coalesce(book, spans, first - 1 if first > 0 else 0, end + 1)
    if len(spans) > _MAX_SPANS:
        _bound(book, spans)
    _settle(entry)
    return 0


@cython.cfunc
@cython.exceptval(-1)
def _split(book: MarkBook, spans: list, at: cython.Py_ssize_t) -> cython.Py_ssize_t:
    """The index of the span that begins at ``at`` (``len(spans)`` at the
    end), splitting the span that holds ``at`` in two when none begins there;
    the new right part holds its own uses of the marks."""
    span: Span
    lo: cython.Py_ssize_t = 0
    hi: cython.Py_ssize_t = len(spans)
    mid: cython.Py_ssize_t
    while lo < hi:  # the first span that ends after ``at``
        mid = (lo + hi) // 2
        span = spans[mid]
        if span.hi <= at:
            lo = mid + 1
        else:
            hi = mid
    if lo == len(spans):
        return lo
    span = spans[lo]
    if span.lo == at:
        return lo
    writes = dict(span.writes)
    reads = dict(span.reads)
    _hold_all(book, writes)
    _hold_all(book, reads)
    spans.insert(lo + 1, Span(at, span.hi, writes, reads))
    span.hi = at
    return lo + 1


@cython.cfunc
@cython.exceptval(-1)
def _coalesce(book: MarkBook, spans: list, first: cython.Py_ssize_t,
              end: cython.Py_ssize_t) -> cython.int:
    """Join neighbours among ``spans[first:end]`` that hold the same marks."""
    left: Span
    right: Span
    k: cython.Py_ssize_t
    if end > len(spans):
        end = len(spans)
    k = end - 1
    while k > first:
        left = spans[k - 1]
        right = spans[k]
        if left.writes == right.writes and left.reads == right.reads:
            left.hi = right.hi
            _release_all(book, right.writes)
            _release_all(book, right.reads)
            del spans[k]
        k -= 1
    return 0


@cython.cfunc
@cython.exceptval(-1)
def _bound(book: MarkBook, spans: list) -> cython.int:
    """Halve ``spans`` by merging neighbours in pairs until at most
    :data:`MAX_SPANS` are left; a merged range keeps the newer mark of each
    stream of both (its uses wait for what a use of either would)."""
    left: Span
    right: Span
    k: cython.Py_ssize_t
    while len(spans) > _MAX_SPANS:
        merged = []
        for k in range(0, len(spans) - 1, 2):
            left = spans[k]
            right = spans[k + 1]
            _join(book, left.writes, right.writes)
            _join(book, left.reads, right.reads)
            left.hi = right.hi
            merged.append(left)
        if len(spans) % 2:
            merged.append(spans[len(spans) - 1])
        spans[:] = merged
        _coalesce(book, spans, 0, len(spans))
    return 0


@cython.cfunc
@cython.exceptval(-1)
def _settle(entry: Entry) -> cython.int:
    """Make the entry uniform again when one span with one write mark is left."""
    span: Span
    spans: list = entry.spans
    if len(spans) == 1:
        span = spans[0]
        if len(span.writes) == 1:
            for mark in span.writes.values():
                entry.last_write = mark
            entry.reads = span.reads
            entry.scanned = span.scanned
            entry.spans = None
    return 0
