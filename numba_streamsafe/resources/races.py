"""Check mode's reports: the races a checking resource's mark book found
(``MarkBook.races``), described as the simulator's checker describes its
hazards and handed to the race checks in progress."""

from __future__ import annotations

import threading
from typing import Any

from numba_streamsafe._driver.sim_model import tell_watchers
from numba_streamsafe.core.access import Access
from numba_streamsafe.core.hazards import FREE, Hazard, Side
from numba_streamsafe.core.uses import Uses

__all__ = ["RaceLog", "describe"]

_WRITE = int(Access.WRITE)


class RaceLog:
    """The races one tracking resource found, in check mode or while race
    checks watched it in ordering mode, as :class:`Hazard` s (``hazards``, in
    the order found). Race checks (:func:`numba_streamsafe.race_check` and
    check mode's own) collect them as they collect a simulated system's."""

    #: The hazards here are the user's reports (as a simulated system's are
    #: unless a checking resource reports instead).
    reports = True

    def __init__(self, strict: bool = False) -> None:
        self.hazards: list[Hazard] = []
        #: Only races against a use the mark noted count (an ordering resource's
        #: log: a wait for new memory's allocation is no race of the program).
        self.strict = strict
        self._lock = threading.Lock()

    def report(self, races: list[tuple[Any, ...]]) -> None:
        """Describe ``races`` (``MarkBook.take_races``) and tell the race checks
        in progress; raises :class:`~numba_streamsafe.core.errors.RaceDetected`
        where one stops at the first."""
        self.add(races)
        tell_watchers(self)

    def add(self, races: list[tuple[Any, ...]]) -> None:
        """Describe ``races`` into :attr:`hazards`, telling no race check (they
        collect them when they next look)."""
        found = [hazard for stream, mark, where, what, seen in races
                 for hazard in describe(stream, mark, where, what, seen, self.strict)]
        with self._lock:
            self.hazards.extend(found)


def describe(stream: Any, mark: Any, where: tuple[Any, ...], what: Any,
             seen: list[Any] | None, strict: bool = False) -> list[Hazard]:
    """The hazards of a use on ``stream`` (``where``: ``(block, access, lo,
    hi, free)``; ``what``: its work, ``(label, stack, names, library)``, see
    :func:`~numba_streamsafe.resources.tracking.marks.set_work`) that needs
    ``mark``, which the program does not order it after: against the last
    write of those bytes the mark's uses made (read- or write-after-write)
    and, for a write, against their last read if it came after
    (write-after-read). The earlier sides are the works the mark noted
    (``seen``, its ``Mark.seen``). Where the mark noted none, a hazard against
    its unnamed work is made, or with ``strict`` none (the race was against
    no use of the program: say, the allocation of new memory)."""
    block, access, lo, hi, free = where
    later_write = bool(access & _WRITE) or free
    if block is not None and free:
        lo, hi = 0, block.nbytes
    ptr = block.ptr if block is not None else 0
    allocated = block.allocated if block is not None else ()
    freed = block.freed if block is not None and free else ()
    if free:  # where the user dropped the memory
        second = Side(FREE, None, stream, freed)
    else:
        second = _side(what, stream, ptr, lo, hi)
    out = []
    for kind, e_what, e_lo, e_hi in _earlier(seen, block, lo, hi, later_write):
        first = _side(e_what, mark.stream, ptr, e_lo, e_hi)
        first_lo, first_hi = max(lo, e_lo), min(hi, e_hi)
        out.append(Hazard(kind, ptr + first_lo, str(first), str(second), first, second,
                          max(first_hi - first_lo, 0), allocated, freed))
    if not out and not strict:  # what the mark's uses were is not known (no note)
        kind = "write-after-write" if later_write else "read-after-write"
        first = Side("work", None, mark.stream)
        out.append(Hazard(kind, ptr + lo, str(first), str(second), first, second, hi - lo,
                          allocated, freed))
    return out


def _earlier(seen: list[Any] | None, block: Any, lo: int, hi: int, later_write: bool
             ) -> list[tuple[str, Any, int, int]]:
    """``(kind, what, lo, hi)`` of the noted uses in ``seen`` (a mark's works,
    ``(entries, what)``, oldest first) over the bytes ``lo .. hi - 1`` of
    ``block`` that conflict with the later use, as the simulator's checker
    keeps them: per range the last write, and for a later write the reads
    since it (a write of the mark's stream ends the reads before it). Only
    uses of this allocation count, not of an earlier one at its address."""
    if not seen or block is None:
        return []
    ptr, generation = block.ptr, block.generation
    kind = "write-after-write" if later_write else "read-after-write"
    written: list[tuple[int, int]] = []  # later writes' bytes (within lo .. hi - 1)
    named: set[tuple[int, int, bool]] = set()
    out = []
    for entries, what in reversed(seen):  # newest first
        for i in range(0, len(entries), 4):
            entry, access, s_lo, s_hi = entries[i:i + 4]
            if entry.block.ptr != ptr or entry.block.generation != generation:
                continue
            if s_lo <= 0 and s_hi >= entry.size:
                s_lo, s_hi = 0, entry.nbytes
            write = bool(access & _WRITE)
            key = (s_lo, s_hi, write)
            c_lo, c_hi = max(s_lo, lo), min(s_hi, hi)
            if c_lo >= c_hi or key in named or _within(written, c_lo, c_hi):
                continue  # no shared byte, named already, or a later write's bytes
            named.add(key)
            if write:
                out.append((kind, what, s_lo, s_hi))
                written.append((c_lo, c_hi))
            elif later_write:
                out.append(("write-after-read", what, s_lo, s_hi))
    out.reverse()  # oldest first
    return out


def _within(ranges: list[tuple[int, int]], lo: int, hi: int) -> bool:
    """Whether ``ranges`` together cover every byte of ``lo .. hi - 1``."""
    for r_lo, r_hi in sorted(ranges):
        if r_lo > lo:
            return False
        lo = max(lo, r_hi)
        if lo >= hi:
            return True
    return False


def _side(what: Any, stream: Any, ptr: int, lo: int, hi: int) -> Side:
    """One side of a hazard: the work's label, the argument over those bytes,
    the stream, the user's stack, who queued it."""
    if what is None:
        return Side("work", None, stream)
    label, stack, names = what[0], what[1], what[2]
    library = what[3] if len(what) > 3 else None
    return Side(label, _name(names, ptr, lo, hi), stream, stack or (), library)


def _name(names: Any, ptr: int, lo: int, hi: int) -> str | None:
    """The argument of ``names`` (a :class:`Uses`, or a direct launch's
    ``(names, arrays)``) over the bytes ``lo .. hi - 1`` of the block at ``ptr``."""
    if names is None:
        return None
    found: list[str] = []
    if isinstance(names, Uses):
        if names.names is None:
            return None
        for (b, _, b_lo, b_hi), name in zip(names.blocks, names.names, strict=False):
            if b.ptr == ptr and b_lo == lo and b_hi == hi:
                found.append(name)
    else:
        shown, arrays = names
        for k in range(0, len(arrays), 2):
            f = arrays[k]
            if f.ptr == ptr and f.lo == lo and f.hi == hi:
                found.append(shown[k // 2])
    return "+".join(found) or None
