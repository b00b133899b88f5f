"""The tracking rules: a live block's dependency state (:class:`Entry`) and
the decisions of every tracked use: which marks it waits for before the work
(:func:`preflight_locked`) and what it records after (:func:`commit_locked`).

Part of the engine (:mod:`numba_streamsafe.compiled`), written in Cython's
pure-Python mode (C declarations in ``rules.pxd``): compiled where a
compiler is present, run as it is where none is.
"""

from __future__ import annotations

from typing import Any

import cython

from numba_streamsafe.resources.marks import Mark, MarkBook

__all__ = ["Entry", "resolve", "preflight_locked", "commit_locked", "COMPILED"]

#: Whether this module runs compiled (else it runs as Python source).
COMPILED: bool = cython.compiled

_WRITE = cython.declare(cython.int, 2)  # Access.WRITE


# --------------------------------------------------------------------- entries
@cython.cclass
class Entry:
    """Dependency state of one live block: the mark of its last write (first,
    of its allocation) and, per stream, the mark of its newest read since that
    write (a later mark on a stream covers the earlier ones). ``gone`` is set
    when the entry leaves its table (the block freed, released, replaced at
    its address, or the table cleared): whoever holds the entry can tell
    without a lookup."""

    def __init__(self, block: Any, ready: Mark) -> None:
        self.block = block
        self.last_write = ready
        self.reads = {}
        self.gone = False

    def waits_for(self, stream: Any, access: cython.int) -> list:
        """Marks of other streams that ``access`` on ``stream`` must wait for."""
        out = _waits(self, stream, access, None)
        return [] if out is None else out

    def release(self, marks: MarkBook) -> None:
        """Drop the entry's uses of its marks (the block is gone)."""
        marks.release(self.last_write)
        if self.reads:
            for mark in self.reads.values():
                marks.release(mark)
            self.reads = {}


# ------------------------------------------------------------------- the rules
@cython.cfunc
def _waits(entry: Entry, stream: Any, access: cython.int, marks: list | None) -> list | None:
    """The rule: a use of ``entry``'s block on ``stream`` waits for its last
    write on another stream, and a write also for its reads on other
    streams. Appends those marks to ``marks`` (made when None and one is
    needed) and returns it."""
    lw = entry.last_write
    if lw.stream != stream:
        if marks is None:
            marks = [lw]
        else:
            marks.append(lw)
    if access & _WRITE and entry.reads:
        for s, mark in entry.reads.items():
            if s != stream:
                if marks is None:
                    marks = [mark]
                else:
                    marks.append(mark)
    return marks


def resolve(table: Any, uses: Any, what: str) -> list:
    """The validated entries of ``uses`` (``(block, access)`` pairs), flattened
    as ``[entry, access, entry, access, ...]``; ``table.entry(block, what)``
    decides (and raises) for a block that is not the live one at its address.
    Caller holds the resource's lock."""
    live: dict = table.live
    out = []
    entry: Entry  # a typed binding, not a cast: free where the module runs as Python
    for pair in uses:
        block = pair[0]
        found = live.get(block.ptr)
        if found is None:
            entry = table.entry(block, what)
        else:
            entry = found
            if entry.block is not block:
                entry = table.entry(block, what)
        out.append(entry)
        out.append(int(pair[1]))
    return out


def preflight_locked(book: MarkBook, entries: list, stream: Any, owner: Any,
                     direct: cython.bint = False) -> cython.Py_ssize_t:
    """Queue on ``stream`` the waits that ``entries`` (from :func:`resolve`)
    need: a use waits for its block's last write on another stream, and a
    write also for the block's reads on other streams. Same-stream uses never
    wait. Returns how many uses stayed on their block's last writer's stream
    (also counted in ``book.same_stream``). Caller holds the resource's lock."""
    entry: Entry
    marks = None
    same: cython.Py_ssize_t = 0
    n: cython.Py_ssize_t = len(entries)
    i: cython.Py_ssize_t
    for i in range(0, n, 2):
        entry = entries[i]
        if entry.last_write.stream == stream:
            same += 1
        marks = _waits(entry, stream, entries[i + 1], marks)
    if same:
        book.same_stream += same
    if marks is not None:
        book.wait_all(stream, marks, owner, False, direct)
    return same


def commit_locked(book: MarkBook, entries: list, stream: Any, owner: Any,
                  eager: cython.bint, direct: cython.bint = False, into: Mark | None = None
                  ) -> None:
    """Record ``entries`` (from :func:`resolve`) on ``stream``'s open mark (or
    on ``into``: another device's use, sealed already): a write becomes the
    block's last write and ends its reads; a read becomes the block's read on
    ``stream``. With ``eager`` the mark's event is recorded now. Caller holds
    the resource's lock."""
    entry: Entry
    mark: Mark
    prev: Mark
    if not entries:
        return
    mark = book.current(stream, owner) if into is None else into
    n: cython.Py_ssize_t = len(entries)
    i: cython.Py_ssize_t
    for i in range(0, n, 2):
        entry = entries[i]
        access: cython.int = entries[i + 1]
        if access & _WRITE:
            mark.refs += 1  # first, so ``mark`` never drops to 0 (and its owner) here
            lw = entry.last_write
            if lw is not mark:
                book.release(lw)
                entry.last_write = mark
            else:
                mark.refs -= 1
            if entry.reads:
                for old in entry.reads.values():
                    book.release(old)
                entry.reads = {}
        else:
            reads = entry.reads
            earlier = reads.get(stream)
            if earlier is not mark:
                reads[stream] = mark
                mark.refs += 1
                if earlier is not None:
                    prev = earlier
                    book.release(prev)
    if eager:
        book.seal(mark, direct)
