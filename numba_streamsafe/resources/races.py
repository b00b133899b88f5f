"""Check mode's reports: the races a checking resource's mark book found
(``MarkBook.races``), described as the simulator's checker describes its
hazards and handed to the race checks in progress."""

from __future__ import annotations

import threading
from typing import Any

from numba_streamsafe._driver.sim_model import Hazard, Side, tell_watchers
from numba_streamsafe.core.access import Access
from numba_streamsafe.core.sites import site_text
from numba_streamsafe.core.uses import Uses

__all__ = ["RaceLog", "describe"]

_WRITE = int(Access.WRITE)


class RaceLog:
    """The races one checking resource found, as :class:`Hazard` s (``hazards``,
    in the order found). Race checks (:func:`numba_streamsafe.race_check` and
    check mode's own) collect them as they collect a simulated system's."""

    #: The hazards here are the user's reports (as a simulated system's are
    #: unless a checking resource reports instead).
    reports = True

    def __init__(self) -> None:
        self.hazards: list[Hazard] = []
        self._lock = threading.Lock()

    def report(self, races: list[tuple[Any, ...]]) -> None:
        """Describe ``races`` (``MarkBook.take_races``) and tell the race checks
        in progress; raises :class:`~numba_streamsafe.core.errors.RaceDetected`
        where one stops at the first."""
        found = [hazard for race in races for hazard in describe(*race)]
        with self._lock:
            self.hazards.extend(found)
        tell_watchers(self)


def describe(stream: Any, mark: Any, where: tuple[Any, ...], what: Any,
             seen: list[Any] | None) -> list[Hazard]:
    """The hazards of a use on ``stream`` (``where``: ``(block, access, lo,
    hi, free)``; ``what``: its work, ``(label, site, names)``) that needs
    ``mark``, which the program does not order it after: against the last
    write of those bytes the mark's uses made (read- or write-after-write)
    and, for a write, against their last read if it came after
    (write-after-read). The earlier sides are the works the mark noted
    (``seen``, its ``Mark.seen``)."""
    block, access, lo, hi, free = where
    later_write = bool(access & _WRITE) or free
    if block is not None and free:
        lo, hi = 0, block.nbytes
    ptr = block.ptr if block is not None else 0
    if free:
        second = Side("cuMemFreeAsync", None, stream, None)
    else:
        second = _side(what, stream, ptr, lo, hi)
    out = []
    for kind, e_what, e_lo, e_hi in _earlier(seen, block, lo, hi, later_write):
        first = _side(e_what, mark.stream, ptr, e_lo, e_hi)
        first_lo, first_hi = max(lo, e_lo), min(hi, e_hi)
        out.append(Hazard(kind, ptr + first_lo, str(first), str(second), first, second,
                          max(first_hi - first_lo, 0)))
    if not out:  # what the mark's uses were is not known (no note)
        kind = "write-after-write" if later_write else "read-after-write"
        first = Side("work", None, mark.stream, None)
        out.append(Hazard(kind, ptr + lo, str(first), str(second), first, second, hi - lo))
    return out


def _earlier(seen: list[Any] | None, block: Any, lo: int, hi: int, later_write: bool
             ) -> list[tuple[str, Any, int, int]]:
    """``(kind, what, lo, hi)`` of the noted uses in ``seen`` (a mark's works,
    ``(entries, what)``, oldest first) over the bytes ``lo .. hi - 1`` of
    ``block`` that conflict with the later use: the last write of each range
    a work used, and for a later write the last use of each range if it was
    a read (a read after the write)."""
    if not seen or block is None:
        return []
    last_use, last_write = _last_uses(seen, block, lo, hi)
    kind = "write-after-write" if later_write else "read-after-write"
    out = [(kind, what, s_lo, s_hi) for (s_lo, s_hi), what in reversed(last_write.items())]
    if later_write:
        out += [("write-after-read", what, s_lo, s_hi)
                for (s_lo, s_hi), (access, what) in reversed(last_use.items())
                if not access & _WRITE]
    return out


def _last_uses(seen: list[Any], block: Any, lo: int, hi: int
               ) -> tuple[dict[tuple[int, int], tuple[int, Any]], dict[tuple[int, int], Any]]:
    """Per range of ``block`` a work of ``seen`` used over ``lo .. hi - 1``:
    the last use ``(access, what)``, and the last write's work. Only uses of
    this allocation count, not of an earlier one at its address."""
    ptr, generation = block.ptr, block.generation
    last_use: dict[tuple[int, int], tuple[int, Any]] = {}
    last_write: dict[tuple[int, int], Any] = {}
    for entries, what in reversed(seen):  # newest first: the first found is the last
        for i in range(0, len(entries), 4):
            entry, access, s_lo, s_hi = entries[i:i + 4]
            if entry.block.ptr != ptr or entry.block.generation != generation:
                continue
            if s_lo <= 0 and s_hi >= entry.size:
                s_lo, s_hi = 0, entry.nbytes
            if s_lo < hi and s_hi > lo:
                last_use.setdefault((s_lo, s_hi), (access, what))
                if access & _WRITE:
                    last_write.setdefault((s_lo, s_hi), what)
    return last_use, last_write


def _side(what: Any, stream: Any, ptr: int, lo: int, hi: int) -> Side:
    """One side of a hazard: the work's label, the argument over those bytes,
    the stream, the user's line."""
    if what is None:
        return Side("work", None, stream, None)
    label, _, names = what
    return Side(label, _name(names, ptr, lo, hi), stream, site_text(what[1]))


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
